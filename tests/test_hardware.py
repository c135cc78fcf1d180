"""moert.cost's hardware: preset figures, combining parts, the effective rates, calibrate's assembly, the CLI."""

from __future__ import annotations

import json

import pytest

import moert
from moert import cost
from moert.cli.main import main


def test_cpu_peak_is_channels_times_mts_times_8_bytes():
    # by hand: 2 x 5200 MT/s x 8 B = 83.2 GB/s; 12 x 4800 x 8 = 460.8; 2 x 5600 x 8 = 89.6
    assert cost.CPUS["ryzen-7950x"].mem_bw_gbs == pytest.approx(83.2)
    assert cost.CPUS["ryzen-7600"].mem_bw_gbs == pytest.approx(83.2)
    assert cost.CPUS["ryzen-9950x"].mem_bw_gbs == pytest.approx(89.6)
    assert cost.CPUS["i9-14900k"].mem_bw_gbs == pytest.approx(89.6)   # ark.intel.com says 89.6 too
    assert cost.CPUS["epyc-9554"].mem_bw_gbs == pytest.approx(460.8)


def test_pcie_per_direction():
    # 16 lanes x 16 GT/s x 128/130 / 8 = 31.51 GB/s; gen 5 doubles it
    assert cost.LINKS["pcie4x16"].bw_gbs == pytest.approx(31.508, abs=1e-3)
    assert cost.LINKS["pcie5x16"].bw_gbs == pytest.approx(63.015, abs=1e-3)


def test_required_presets_exist():
    for g in ("rtx3060", "rtx3090", "rtx4070", "rtx4090", "rtx5090", "h100-pcie"):
        assert g in cost.GPUS
    assert cost.GPUS["rtx3090"].bw_gbs == 936 and cost.GPUS["rtx3060"].mem_gib == 12
    for c in ("ryzen-7600", "ryzen-7950x", "ryzen-9950x", "i9-14900k", "epyc-9554"):
        assert c in cost.CPUS


def test_preset_combines_parts_and_picks_the_slower_pcie():
    hw = cost.preset("rtx3090+ryzen-7950x")
    assert isinstance(hw, moert.Hardware)
    assert [g.name for g in hw.gpus] == ["rtx3090"] and hw.cpu.name == "ryzen-7950x"
    assert hw.link.name == "pcie4x16"                      # a PCIe 4.0 card in a PCIe 5.0 platform
    assert cost.preset("rtx5090+ryzen-9950x").link.name == "pcie5x16"
    assert cost.preset("rtx5090+ryzen-9950x+pcie4x16").link.name == "pcie4x16"   # explicit link wins
    two = cost.preset("2x rtx3090+epyc-9554")
    assert len(two.gpus) == 2 and two.gpu_memory() == ["24GiB", "24GiB"]
    assert cost.preset("ryzen-7600").gpus == () and cost.preset("ryzen-7600").link is None


def test_preset_errors_name_the_part_and_the_known_ones():
    with pytest.raises(cost.HardwareError, match="unknown part 'rtx9999'.*rtx3090"):
        cost.preset("rtx9999+ryzen-7950x")
    with pytest.raises(cost.HardwareError, match="names no CPU"):
        cost.preset("rtx3090")
    with pytest.raises(cost.HardwareError, match="two CPUs"):
        cost.preset("ryzen-7600+ryzen-7950x")


def test_impossible_figures_are_refused():
    with pytest.raises(cost.HardwareError, match="bw_gbs must be > 0"):
        moert.GPU("x", 12, 0, 10)
    with pytest.raises(cost.HardwareError, match="bw_efficiency"):
        moert.CPU("x", 8, 80, bw_efficiency=1.5)
    with pytest.raises(cost.HardwareError, match="threads must be >= 1"):
        cost.CPUS["ryzen-7600"].read_gbs(0)


def test_hardware_is_frozen_and_gpus_become_a_tuple():
    hw = moert.Hardware(cpu=cost.CPUS["ryzen-7600"], gpus=[cost.GPUS["rtx4070"]])
    assert hw.gpus == (cost.GPUS["rtx4070"],) and hw.link.name == "pcie4x16"
    with pytest.raises(AttributeError):
        hw.cpu = cost.CPUS["ryzen-7950x"]


def test_cpu_rates_scale_with_threads_up_to_the_bandwidth():
    cpu = moert.CPU("c", 8, 80.0, bw_efficiency=0.5, kernel_gbs=(("Q4_K", 3.0), ("Q4_K/int8", 9.0)),
                    bw_1thread_gbs=12.0)
    assert cpu.read_gbs(1) == pytest.approx(12.0)          # one thread: its own measured stream
    assert cpu.read_gbs(8) == pytest.approx(40.0)          # all of them: 80 x 0.5
    assert cpu.matvec_gbs("Q4_K", 2) == pytest.approx(6.0)            # kernel-bound: 2 x 3
    assert cpu.matvec_gbs("Q4_K", 8, act_quant="int8") == pytest.approx(40.0)   # 8 x 9 > 40: memory-bound
    assert cpu.matvec_gbs("Q6_K", 4) == pytest.approx(40.0)           # no measured kernel: memory-bound
    assert cpu.matvec_gbs("Q4_K", 64) == cpu.matvec_gbs("Q4_K", 8)    # capped at the cores


def test_ccd_links_cap_the_cores_reads_below_the_drams_share():
    # by hand: 2 CCDs x 32 B x 2.0 GHz = 128 GB/s < 0.7 x 256 = 179.2: the links bound it; 1 x 32 x 2.0 = 64 > 58.2
    capped = moert.CPU("two links", 16, 256.0, ccds=2, fclk_ghz=2.0)
    assert capped.fabric_gbs == pytest.approx(128.0)
    assert capped.read_gbs() == pytest.approx(128.0) and capped.read_gbs(8) == pytest.approx(64.0)
    assert moert.CPU("no cap", 16, 256.0).read_gbs() == pytest.approx(179.2)
    assert cost.CPUS["ryzen-ai-max-395"].read_gbs() == pytest.approx(128.0)
    assert cost.CPUS["ryzen-7600"].read_gbs() == pytest.approx(0.7 * 83.2)      # 64 GB/s link: DRAM bounds it
    assert cost.CPUS["ryzen-7950x"].read_gbs() == pytest.approx(0.7 * 83.2)
    with pytest.raises(cost.HardwareError, match="ccds and fclk_ghz go together"):
        moert.CPU("x", 8, 80.0, ccds=1)


def test_a_ccd_cap_slows_expert_bound_cpu_decode_by_its_ratio():
    from moert import zoo

    plan = moert.plan(zoo.path("gpt-oss-20b"), gpu_layers=0)
    free = moert.CPU("c", 16, 256.0)                                   # reads 179.2 GB/s
    capped = moert.CPU("c", 16, 256.0, ccds=2, fclk_ghz=2.0)           # reads 128
    a, b = (moert.predict(plan, moert.Hardware(cpu=c), n_prompt=0, n_gen=1) for c in (free, capped))
    fixed = free.call_us * 1e-6                                        # each op's call, beside its reads
    mem = [(pa.seconds - pa.ops * fixed, pb.seconds - pb.ops * fixed) for pa, pb in zip(a.parts, b.parts)
           if pa.phase == "decode" and pa.bound == "memory"]
    assert mem and all(tb == pytest.approx(ta * 179.2 / 128.0) for ta, tb in mem)
    assert b.decode_tok_s < a.decode_tok_s


def test_link_time_is_latency_plus_bytes_over_bandwidth():
    link = moert.Link(10.0, latency_us=5.0, efficiency=0.5)
    assert link.seconds(0, copies=3) == pytest.approx(15e-6)
    assert link.seconds(5e9) == pytest.approx(5e-6 + 1.0)   # 5 GB at 10 x 0.5 GB/s


def test_calibrate_assembles_a_cpu_from_its_measurements(monkeypatch):
    from moert.cost import calibrate as cal

    monkeypatch.setattr(cal, "read_bandwidth", lambda mib, rounds, threads: 10.0 if threads == 1 else 15.0)
    monkeypatch.setattr(cal, "kernel_rates", lambda mib, rounds: ({"Q4_K": 2.5}, {"Q4_K": 20.0}))
    monkeypatch.setattr(cal, "call_overhead_us", lambda n: 3.0)
    quiet = {"layer_us": 100.0, "token_us": 50.0, "layer_us_spread": (90.0, 110.0), "busy": False,
             "median_over_min": 1.2, "negative_slope": False}
    monkeypatch.setattr(cal, "model_overheads", lambda steps, detail=False: quiet)
    monkeypatch.setattr(cal, "attention_gflops", lambda rounds: 12.0)
    cpu = cal.calibrate(threads=2)
    assert cpu.cores == 2 and cpu.mem_bw_gbs == 15.0 and cpu.bw_1thread_gbs == 10.0
    assert cpu.layer_us == 100.0 and cpu.token_us == 50.0 and cpu.call_us == 3.0
    assert "layer_us 100 (rounds 90-110)" in cpu.source and "busy" not in cpu.source
    assert cpu.matvec_gbs("Q4_K", 2) == pytest.approx(5.0) and cpu.matmul_gflops("Q4_K", 2) == pytest.approx(40.0)
    assert cpu.matmul_gflops("KV", 2) == pytest.approx(24.0)           # the prompt attention's measured rate


def test_calibrate_on_a_busy_machine_measures_again_keeps_the_calmer_run_and_warns(monkeypatch):
    from moert.cost import calibrate as cal

    runs = iter([{"layer_us": 900.0, "token_us": 50.0, "layer_us_spread": (100.0, 5000.0), "busy": True,
                  "median_over_min": 6.0, "negative_slope": False},
                 {"layer_us": 120.0, "token_us": 40.0, "layer_us_spread": (100.0, 140.0), "busy": True,
                  "median_over_min": 2.5, "negative_slope": False}])
    monkeypatch.setattr(cal, "read_bandwidth", lambda mib, rounds, threads: 10.0)
    monkeypatch.setattr(cal, "kernel_rates", lambda mib, rounds: ({"Q4_K": 2.5}, {"Q4_K": 20.0}))
    monkeypatch.setattr(cal, "call_overhead_us", lambda n: 3.0)
    monkeypatch.setattr(cal, "model_overheads", lambda steps, detail=False: next(runs))
    monkeypatch.setattr(cal, "attention_gflops", lambda rounds: 12.0)
    with pytest.warns(UserWarning, match="busy"):
        cpu = cal.calibrate(threads=1)
    assert cpu.layer_us == 120.0 and cpu.token_us == 40.0 and "busy" in cpu.source


def test_kernel_rates_measure_each_type_and_mode():
    from moert.cost.calibrate import kernel_rates

    gbs, gflops = kernel_rates(mib=1, rounds=1, types=("Q8_0", "Q4_K", "MXFP4", "F32"))
    from moert.kernels import simd

    int8 = {"Q4_K/int8", "MXFP4/int8"} if simd.available() else set()   # int8 needs AVX2
    assert set(gbs) == {"Q8_0", "Q4_K", "Q4_K/int16", "MXFP4", "F32"} | int8
    assert set(gflops) == {k + s for k in {"Q8_0", "Q4_K", "MXFP4", "F32", "*"} | int8 for s in ("", "@8")}
    assert (gflops["*"], gflops["*@8"]) == (gflops["F32"], gflops["F32@8"])   # no kernel: kept as float32
    assert all(v > 0 for v in [*gbs.values(), *gflops.values()])


def test_attention_rate_counts_the_flops_as_the_cost_model_does(monkeypatch):
    from moert.cost import calibrate as cal

    monkeypatch.setattr(cal, "_best", lambda fn, rounds: (fn(), 0.5)[1])    # runs it once, "takes" 0.5 s
    # by hand: 2 x 64 tokens x 32 mean positions x 32 heads x (128 + 128) / 0.5 s = 67.1 MFLOP/s
    assert cal.attention_gflops(rounds=1) == pytest.approx(2 * 64 * 32 * 32 * 256 / 0.5 / 1e9)
    plan = moert.plan(moert.zoo.path("qwen3-30b-a3b"), gpu_layers=0)
    cpu = moert.CPU("c", 1, 10.0, kernel_gflops=(("KV", 2.0),))
    r = moert.predict(plan, moert.Hardware(cpu=cpu), n_prompt=64, n_gen=1)
    kv = [p for p in r.parts if p.phase == "prefill" and p.stage == "attention" and p.layer == 0][-1]
    assert kv.flops == pytest.approx(2 * 64 * 32 * 32 * 256)                 # the same count, on the same shape
    assert kv.seconds == pytest.approx(kv.flops / 2e9 + kv.ops * cpu.call_us * 1e-6)


def test_cli_hardware_list(capsys):
    assert main(["hardware", "list"]) == 0
    out = capsys.readouterr().out
    assert "rtx3090" in out and "460.8" in out and "31.5 GB/s" in out
    assert "256-bit LPDDR5X-8000" in out and "4 x 51.2 GB/s" in out          # Strix Halo's memory; 5975WX's links
    assert main(["hardware", "list", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cpus"]["ryzen-7950x"]["mem_channels"] == 2 and d["gpus"]["h100-pcie"]["mem_gib"] == 80


def test_an_x8_card_gets_an_x8_link():
    hw = cost.preset("rtx4060+ryzen-7600")
    assert hw.link.name == "pcie4x8" and hw.link.bw_gbs == pytest.approx(15.754, abs=1e-3)   # 8 x 16 x 128/130 / 8


def test_cli_hardware_calibrate_prints_the_measured_cpu(monkeypatch, capsys):
    from moert.cost import calibrate as cal

    monkeypatch.setattr(cal, "read_bandwidth", lambda mib, rounds, threads: 7.5)
    monkeypatch.setattr(cal, "kernel_rates", lambda mib, rounds: ({"Q4_K": 2.5}, {"Q4_K": 20.0}))
    monkeypatch.setattr(cal, "call_overhead_us", lambda n: 3.0)
    monkeypatch.setattr(cal, "model_overheads", lambda steps, detail=False: {
        "layer_us": 100.0, "token_us": 50.0, "layer_us_spread": (100.0, 100.0), "busy": False, "median_over_min": 1.0,
        "negative_slope": False})
    monkeypatch.setattr(cal, "attention_gflops", lambda rounds: 12.0)
    assert main(["hardware", "calibrate", "-t", "1"]) == 0
    out = capsys.readouterr().out
    assert "7.50 GB/s (1 thread)" in out and "100 us per layer" in out and "Q4_K" in out
    assert "prompt attention 12.00 GFLOP/s" in out
    assert main(["hardware", "calibrate", "-t", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel_gbs"] == [["Q4_K", 2.5]]


def test_matmul_rate_between_the_8_and_64_token_measurements():
    cpu = moert.CPU("c", 4, 40.0, kernel_gflops=(("Q4_K", 40.0), ("Q4_K@8", 10.0)))
    assert cpu.matmul_gflops("Q4_K", 1, tokens=64) == pytest.approx(40.0)
    assert cpu.matmul_gflops("Q4_K", 1, tokens=8) == pytest.approx(10.0)
    assert cpu.matmul_gflops("Q4_K", 1, tokens=2) == pytest.approx(10.0)           # not extrapolated
    assert cpu.matmul_gflops("Q4_K", 1, tokens=8 * 8 ** 0.5) == pytest.approx(20.0)  # halfway in log tokens
    assert cpu.matmul_gflops("Q4_K", 2, tokens=64) == pytest.approx(80.0)
