"""The cost model's cited terms (GPU tile fill, ik_llama.cpp's CPU GEMM, CCD-limited bandwidth) and its ranges."""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from dataclasses import replace

import pytest

import moert
from moert import cost
from moert.cost import coverage, roofline, zoo
from moert.cost import predict as cost_predict
from moert.cost import range as cost_range


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOERT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _plan(hw, model="qwen3-30b-a3b", **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not hw.gpus:
            return moert.plan(zoo.path(model), gpu_layers=0)
        return moert.plan(zoo.path(model), gpu_backend="sim", gpu_memory=hw.gpu_memory(), **kw)


def test_tile_fill_is_half_at_16_tokens_per_expert_and_absent_for_mat_vec():
    assert roofline.tile_fill(16, 512) == 0.5
    assert roofline.tile_fill(1, 8) == 1.0                       # batch <= 8: MMVQ, bandwidth-bound
    assert roofline.tile_fill(4, 512) < roofline.tile_fill(128, 512) < 1.0
    # PR 26977's ratio it was read from: x2.49 from 4 to 16 columns per expert
    assert roofline.tile_fill(16, 512) / roofline.tile_fill(4, 512) == pytest.approx(2.5, abs=0.05)


def test_a_cpu_parts_reads_and_macs_add_where_a_gpus_overlap(monkeypatch):
    """roofline.CPU_ADDS: on a CPU a batch's weight reads and its MACs take turns (ik_llama.cpp converts a block of
    rows, then multiplies it), so their times add; the attention kernel's measured rate has its reads inside (the
    larger counts); on a GPU the larger counts."""
    from moert.cost.predict import CostModel

    hw = cost.preset("rtx4090+ryzen-7950x")
    c = CostModel(_plan(hw), hw)
    cpu, w = hw.cpu, ("Q4_K", 4e8, 1e10, 32)                 # 400 MB of weights, 10 GFLOP at 32 tokens a matmul
    t_mem = w[1] / (1e9 * cpu.read_gbs())
    t_cmp = w[2] / (1e9 * cpu.matmul_gflops("Q4_K", tokens=32))
    fixed = 3 * roofline.op_us(cpu) * 1e-6
    assert 0.1 < t_mem / t_cmp < 10                           # both count
    assert roofline.part_time("cpu", [w], 3, c, 512)[0] == pytest.approx(t_mem + t_cmp + fixed)
    kv = ("KV", 1e6, 5e11, 512, 4096.0)                       # compute-bound attention: its reads do not add
    t_kv = kv[2] / (1e9 * roofline.kv_gflops(cpu, c.threads, 512, c, 4096.0))
    assert roofline.part_time("cpu", [w, kv], 3, c, 512)[0] == pytest.approx(t_mem + t_cmp + t_kv + fixed)
    g = hw.gpus[0]
    t_gpu = max(w[1] / (1e9 * g.read_gbs()), w[2] / (1e12 * g.matmul_tflops() * roofline.tile_fill(32, 512)))
    assert roofline.part_time("gpu:0", [w], 3, c, 512)[0] == pytest.approx(t_gpu + 3 * g.launch_us * 1e-6)
    monkeypatch.setattr(roofline, "CPU_ADDS", False)         # the roofline's max
    assert roofline.part_time("cpu", [w], 3, c, 512)[0] == pytest.approx(max(t_mem, t_cmp) + fixed)


def test_all_gpu_prefill_pays_the_tile_fill_where_its_experts_are_compute_bound(monkeypatch):
    hw = cost.preset("rtx4090+ryzen-7950x")
    p = _plan(hw)

    def speeds():
        return [moert.predict(p, hw, n_prompt=4096, n_ubatch=ub).prefill_tok_s for ub in (512, 4096)]
    with_fill = speeds()
    monkeypatch.setattr(roofline, "MMQ_HALF_FILL_TOKENS", 0.0)      # every tile full: the term off
    without = speeds()
    # never faster; at u-batch 4096 (256 tokens per expert, fill 0.94) the compute-bound experts slow by at most 1/0.94
    small, big = (w / o for w, o in zip(with_fill, without))
    assert small <= 1.0 and 0.93 < big < 1.0


def test_ik_llama_cpp_cpu_prefill_uses_its_faster_gemm_and_decode_is_unchanged():
    hw = cost.preset("ryzen-7950x")
    p = _plan(hw)
    main, ik = (moert.predict(p, hw, n_prompt=512, policy=pol) for pol in ("llama.cpp", "ik_llama.cpp"))
    assert main.decode_tok_s == pytest.approx(ik.decode_tok_s, rel=1e-3)   # llama.cpp: its FA decode kernel
    assert 1.5 < ik.prefill_tok_s / main.prefill_tok_s <= cost_predict.IK_CPU_GEMM_X + 1e-9


def test_an_ik_llama_cpp_build_before_its_on_the_fly_repacking_runs_cpu_prompts_at_its_own_kernels_rate():
    hw = cost.preset("ryzen-7950x")
    p = _plan(hw)

    def run(**kw):
        return moert.predict(p, hw, n_prompt=512, policy="ik_llama.cpp", **kw)
    today, june, may, may_rtr = run(), run(build="2025-06-18"), run(build="2025-05-20"), run(build="2025-05-20",
                                                                                           repack=True)
    assert today.prefill_tok_s == june.prefill_tok_s == may_rtr.prefill_tok_s   # -rtr: interleaved kernels, no change
    assert may.decode_tok_s == today.decode_tok_s                                  # decode is not a GEMM
    # the CPU experts' compute time of the prompt grows by PR 534's Q4_0 factor, x1.93, where nothing else changed
    def cpu_compute(r):                  # seconds less the fixed cost per op and the reads (which add on a CPU)
        return sum(x.seconds - x.ops * roofline.op_us(hw.cpu) * 1e-6 - x.bytes / (1e9 * hw.cpu.read_gbs())
                   for x in r.parts
                   if x.phase == "prefill" and x.device == "cpu" and x.bound == "compute" and x.stage == "experts")
    assert cpu_compute(may) == pytest.approx(cpu_compute(today) * 300.9 / 155.6, rel=1e-6)
    assert cost_predict.ik_cpu_gemm_x("2025-05-20") == pytest.approx(721.49 / 282.49 * 155.6 / 300.9)
    main = moert.predict(p, hw, n_prompt=512, build="2025-05-20", flash_attn=False)   # mainline: no such term (its
    assert main.prefill_tok_s == moert.predict(p, hw, n_prompt=512, flash_attn=False).prefill_tok_s   # FA's aside)
    with pytest.raises(moert.errors.ArgumentError, match="YYYY-MM-DD"):
        run(build="May 2025")


def test_fewer_threads_than_cores_keep_the_links_of_the_ccds_they_use():
    cpu = cost.CPUS["epyc-9b14"]                                 # 96 cores on 12 CCDs, 64 GB/s a link
    assert cpu.read_gbs(8) == pytest.approx(64.0)                    # one CCD's link
    assert cpu.read_gbs(16) == pytest.approx(128.0)
    assert cpu.read_gbs(48) == cpu.read_gbs(96) == pytest.approx(cpu.mem_bw_gbs * cpu.bw_efficiency)
    intel = cost.CPUS["i9-14900k"]                               # no CCDs: proportional, as before
    assert intel.read_gbs(12) == pytest.approx(intel.read_gbs() / 2)


def test_every_prediction_carries_its_classes_range():
    for name, kind in (("ryzen-7950x", "cpu-only"), ("rtx4090+ryzen-7950x", "all-GPU")):
        hw = cost.preset(name)
        r = moert.predict(_plan(hw), hw)
        assert r.kind() == kind
        for phase, v in (("decode", r.decode_tok_s), ("prefill", r.prefill_tok_s)):
            lo, hi = r.likely(phase)
            s = coverage.widened(cost_range.VALIDATION["classes"][f"{phase}, {kind}"]["spread68"],
                                 len(r.extrapolating_in((phase,))), cost_range.VALIDATION["held_out"]["spread68"])
            assert lo < v < hi and math.log(hi / v) == pytest.approx(s) and math.log(v / lo) == pytest.approx(s)
        assert "likely" in r.table() and r.to_dict()["likely"]["decode"] == list(r.likely("decode"))
    hw = cost.preset("rtx4090+ryzen-7950x")
    assert moert.predict(_plan(hw, cpu_moe=True), hw).kind() == "hybrid"


def test_a_best_is_named_only_beyond_the_same_box_ratio_spread_else_the_simplest_flags_of_the_tie():
    def row(name, tg, ot):
        return {"strategy": name, "tg": tg, "fits": True, "ot": ot}
    s = cost_range.VALIDATION["ratio_spread68"]
    far = [row("fast", 100, "x" * 50), row("slow", 100 * math.exp(-2 * s), "")]
    assert cost_range.choose(far)["strategy"] == "fast" and "by more than" in far[0]["why"]
    near = [row("fast", 100, "x" * 50), row("close", 100 * math.exp(-s / 2), "xx"), row("slow", 50, "")]
    best = cost_range.choose(near)
    assert best["strategy"] == "close" and "ties" in best["why"]
    assert [r["tied"] for r in near] == [True, True, False]
    assert cost_range.choose([{**row("x", 10, ""), "fits": False}]) is None


def test_sliding_window_layers_stop_growing_with_depth(monkeypatch):
    hw = cost.preset("rtx4090+ryzen-7950x")
    p = _plan(hw, model="gpt-oss-20b")

    def slowdown():
        near, far = (moert.predict(p, hw, n_prompt=0, n_gen=32, depth=d).decode_s for d in (0, 32768))
        return far / near
    with_swa = slowdown()
    monkeypatch.setattr(cost_predict, "SWA_PERIOD", {})                # every layer attends over the whole cache
    without = slowdown()
    assert 1.0 < with_swa < without                    # half of gpt-oss's layers look back 128 positions only
    monkeypatch.undo()
    model = cost_predict.CostModel(p, hw)
    assert [model.slides(i) for i in range(4)] == [True, False, True, False] and model.swa_window == 128


def test_many_channel_parts_read_a_smaller_share_of_their_dram_than_desktops():
    from moert.cost import presets

    for name in ("epyc-9b14", "epyc-9554", "epyc-7343", "threadripper-pro-5975wx", "threadripper-pro-3995wx"):
        assert cost.CPUS[name].bw_efficiency == presets.SERVER_BW_EFFICIENCY == 0.45, name
    assert cost.CPUS["ryzen-7950x"].bw_efficiency == 0.7
    # the mlc figure it was read from: 256 GiB/s of 12 x DDR5-6400 per socket
    assert abs(256 * 2**30 / 1e9 / cost.ddr_gbs(12, 6400) - presets.SERVER_BW_EFFICIENCY) < 0.01


def test_mla_attention_is_costed_in_latent_space_as_llama_cpp_runs_it():
    # DeepSeek-V3's twin carries llama.cpp's MLA metadata: 128 query heads over one shared latent KV head of 576
    # (kv_lora 512 + rope 64), values of 512. A decoded token at depth d then reads d x 576 cached values a layer
    # and does 2 x d x 128 x (576 + 512) FLOPs there, on top of the depth-0 token's.
    hw = cost.preset("epyc-9554")
    p = _plan(hw, "deepseek-v3")
    depth, n_gen = 8192, 1

    def attention(r):
        parts = [x for x in r.parts if x.phase == "decode" and x.stage == "attention" and x.layer == 3]
        return sum(x.flops for x in parts), sum(x.bytes for x in parts)
    (f0, b0), (f1, b1) = (attention(moert.predict(p, hw, n_prompt=0, n_gen=n_gen, depth=d, kv_bytes=2))
                          for d in (0, depth))
    assert f1 - f0 == pytest.approx(2 * depth * 128 * (576 + 512), rel=0.01)
    assert b1 - b0 == pytest.approx(depth * 576 * 2, rel=0.01)


def test_op_offload_from_mmapped_weights_runs_at_most_at_half_the_achieved_dram_rate():
    """Link.staged: pageable (mmap'd) weights cross the host's DRAM twice on their way to the staging array, so a
    dual-channel DDR5-2000 box (32 GB/s peak, 0.7 of it achieved: 22.4 GB/s, / 2 = 11.2 GB/s) copies below its PCIe
    4.0 x16 link's 25.2 GB/s, and a 12-channel server (460.8 GB/s peak) does not."""
    link = moert.Link(31.5, 10.0)                                        # 0.8 efficiency: 25.2 GB/s
    slow = moert.CPU("ddr5-2000 desktop", 6, cost.ddr_gbs(2, 2000), 2, 2000)
    staged = link.staged(slow)
    assert staged.bw_gbs * staged.efficiency == pytest.approx(11.2)
    assert staged.seconds(11.2e9, 0) == pytest.approx(1.0)
    server = moert.CPU("12-channel server", 32, cost.ddr_gbs(12, 4800), 12, 4800)
    assert link.staged(server) is link
    # in predict: prefill's offload copies take 25.2 / 11.2 = 2.25x as long with mmap as from pinned memory
    hw = moert.Hardware(cpu=slow, gpus=cost.preset("rtx4090+ryzen-7950x").gpus, link=link)
    p = _plan(hw=hw, cpu_moe=True)
    off = {m: sum(x.seconds for x in moert.predict(p, hw, n_prompt=512, mmap=m).parts
                  if x.phase == "prefill" and x.stage == "offload") for m in (True, False)}
    copies = sum(x.ops for x in moert.predict(p, hw, n_prompt=512).parts
                 if x.phase == "prefill" and x.stage == "offload")
    lat = copies * 10e-6
    assert (off[True] - lat) / (off[False] - lat) == pytest.approx(25.2 / 11.2, rel=1e-6)


def test_numa_nodes_a_two_socket_cpu_and_what_each_numa_mode_reads():
    """cost.sockets and numa_view on hand numbers: two sockets of 16 cores and 8 x DDR5-6250 (400 GB/s each)."""
    one = moert.CPU("s", 16, 400.0, 8, 6250, call_us=0.0, source="hand")   # no per-op cost: bytes alone
    two = cost.sockets(one, 2)
    assert (two.cores, two.mem_bw_gbs, two.mem_channels, two.numa_nodes) == (32, 800.0, 16, 2)
    none, dist, iso = (cost.numa_view(two, m) for m in ("none", "distribute", "isolate"))
    assert (none.cores, none.read_gbs()) == (32, one.read_gbs())  # every core, one node's memory
    assert none.read_gbs(16) == one.read_gbs(16) and none.read_gbs(8) == pytest.approx(one.read_gbs(8))
    assert dist == two                                           # node-local pages: all of it
    assert (iso.cores, iso.mem_bw_gbs, iso.mem_channels) == (16, 400.0, 8) == (one.cores, one.mem_bw_gbs, 8)
    assert cost.numa_view(one, "isolate") is one             # one node: nothing to choose
    assert cost.preset("2x epyc-9374f").cpu.numa_nodes == 2
    assert cost.preset("rtx4090+2x epyc-9374f").cpu.cores == 64
    with pytest.raises(cost.HardwareError, match="from 1 to 8"):
        cost.preset("9x epyc-9374f")
    with pytest.raises(cost.HardwareError, match="numa='spread'"):
        cost.numa_view(two, "spread")
    # in predict: CPU-only decode of a big MoE reads one node's memory without --numa (as one socket does),
    # twice that with distribute; the prompt (compute-bound) uses every core unless isolated
    hw2, hw1 = moert.Hardware(cpu=two), moert.Hardware(cpu=one)
    p = _plan(hw1, "qwen3-235b-a22b")
    r = {m: moert.predict(p, hw2, n_prompt=512, numa=m) for m in ("none", "distribute", "isolate")}
    solo = moert.predict(p, hw1, n_prompt=512)
    mem = lambda x: sum(q.seconds for q in x.parts if q.phase == "decode" and q.bound == "memory")  # noqa: E731
    assert mem(r["none"]) == pytest.approx(mem(solo)) and mem(r["distribute"]) == pytest.approx(mem(solo) / 2)
    assert r["isolate"].decode_s == pytest.approx(solo.decode_s)
    assert r["none"].prefill_s < 0.6 * r["isolate"].prefill_s and r["none"].settings["numa"] == "none"


def test_compare_takes_numa_and_puts_it_on_the_llama_server_line(capsys):
    import json

    from moert.cli.main import main

    tg = {}
    for extra in ([], ["--numa", "distribute"]):
        assert main(["compare", "zoo:qwen3-30b-a3b", "--hardware", "2x epyc-9374f", "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        tg[out["numa"]] = max(r["tg"] for r in out["rows"] if r["tg"])
        assert out["numa_nodes"] == 2
    assert tg["distribute"] > 1.5 * tg["none"]
    assert "--numa distribute" in out["commands"]["llama-server"]


def test_rocm_on_navi31_reads_the_share_its_dense_decode_figures_give():
    """presets.RDNA3_DGPU_BW is the geometric mean of three dense llama.cpp decode figures read as the file's bytes
    over the token's time (the sources in presets.py), recomputed here from the quoted numbers; the Navi 31 presets
    read at it, the others keep the GPU default, and an all-GPU decode's memory-bound parts on an RX 7900 XT take
    up to 0.8 / 0.58 of the time they would take at the default (the output matrix, one large mat-vec, all of it;
    parts with many small kernels less, their fixed per-kernel cost unchanged)."""
    from moert.cost.presets import RDNA3_DGPU_BW

    gib = float(1 << 30)
    shares = [7.17 * gib * 67.20 / 800e9,                  # llama.cpp #4763: RX 7900 XT, llama 7B Q8_0, tg128
              3.56 * gib * (129 + 144) / 2 / 960e9,        # llama.cpp #20934: RX 7900 XTX, Llama-7B Q4_0
              4.58 * gib * 105.75 / 960e9]                 # llama.cpp PR 26284: RX 7900 XTX, llama 8B Q4_K_M, tg64
    assert [round(s, 2) for s in shares] == [0.65, 0.54, 0.54]
    assert round(math.prod(shares) ** (1 / 3), 2) == RDNA3_DGPU_BW == 0.58
    for name in ("rx7900xt", "rx7900xtx", "w7800"):
        assert cost.preset(f"{name}+ryzen-7950x").gpus[0].bw_efficiency == RDNA3_DGPU_BW
    for name in ("radeon-8060s+ryzen-ai-max-395", "rtx3090+ryzen-7950x", "rtx4090+ryzen-7950x"):
        assert cost.preset(name).gpus[0].bw_efficiency == 0.8
    hw = cost.preset("rx7900xt+ryzen-5900x")
    cuda_like = replace(hw, gpus=[replace(hw.gpus[0], bw_efficiency=0.8)])
    p = _plan(hw, model="gpt-oss-20b")

    def memory_s(h):
        out = defaultdict(float)
        for x in moert.predict(p, h).parts:
            if x.phase == "decode" and x.device == "gpu0" and x.bound == "memory":
                out[x.stage] += x.seconds
        return out

    slow, fast = memory_s(hw), memory_s(cuda_like)
    assert slow.keys() == fast.keys() >= {"attention", "experts", "output"}
    assert slow["output"] / fast["output"] == pytest.approx(0.8 / 0.58, rel=0.01)
    assert all(1.2 < slow[k] / fast[k] <= 0.8 / 0.58 + 1e-9 for k in slow)
