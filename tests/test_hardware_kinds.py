"""Kinds of parts (moert/cost/kinds.py): a term of a kind reaches a part described by its spec sheet as it reaches
a preset; every preset says its kind; a kind moert does not know is an error."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import moert
from moert import cost
from moert.cost import kinds, presets, roofline


def _plan(hw, model="gpt-oss-20b"):
    return moert.plan(moert.zoo.path(model), gpu_backend="sim", gpu_memory=hw.gpu_memory())


def test_a_card_described_by_its_spec_sheet_as_rocm_rdna3_predicts_as_the_preset():
    xt = presets.GPUS["rx7900xt"]
    mine = moert.GPU("my navi31", 20, 800, 103, pcie_gen=4, api="rocm", arch="rdna3", memory="gddr6",
                     tier="consumer")
    assert mine.bw_efficiency == xt.bw_efficiency == kinds.RDNA3_DGPU_BW
    cpu = presets.CPUS["ryzen-5900x"]
    a, b = (moert.Hardware(cpu=cpu, gpus=[g], link=moert.Link.pcie(4)) for g in (xt, mine))
    p = _plan(a)
    ra, rb = moert.predict(p, a, n_prompt=512), moert.predict(p, b, n_prompt=512)
    assert (ra.decode_tok_s, ra.prefill_tok_s) == (rb.decode_tok_s, rb.prefill_tok_s)
    # the same card under Vulkan, or one with no kind stated, keeps the default share: decode is faster
    for other in (replace(mine, api="vulkan", bw_efficiency=0.0), moert.GPU("unknown", 20, 800, 103)):
        assert other.bw_efficiency == kinds.GPU_BW_SHARE
        hw = moert.Hardware(cpu=cpu, gpus=[other], link=moert.Link.pcie(4))
        assert moert.predict(p, hw, n_prompt=512).decode_tok_s > 1.2 * ra.decode_tok_s
    # a share given outright wins over the kind's
    assert moert.GPU("set", 20, 800, 103, api="rocm", arch="rdna3", bw_efficiency=0.7).bw_efficiency == 0.7


def test_a_json_file_carries_the_kind_fields(tmp_path):
    f = tmp_path / "card.json"
    f.write_text(json.dumps({"name": "w7800 by hand", "mem_gib": 32, "bw_gbs": 576, "fp16_tflops": 90.5,
                             "api": "rocm", "arch": "rdna3", "memory": "gddr6", "tier": "workstation"}))
    hw = cost.preset(f"{f}+ryzen-7950x")
    assert hw.gpus[0].bw_efficiency == presets.GPUS["w7800"].bw_efficiency == kinds.RDNA3_DGPU_BW
    c = tmp_path / "cpu.json"
    c.write_text(json.dumps({"name": "xeon", "cores": 28, "mem_bw_gbs": 140.8, "vendor": "intel",
                             "generation": "cascade-lake", "isa": "avx512-vnni", "tier": "server", "sockets": 2}))
    cpu = cost.preset(str(c)).cpu
    assert (cpu.vendor, cpu.generation, cpu.isa, cpu.tier, cpu.sockets) == ("intel", "cascade-lake", "avx512-vnni",
                                                                            "server", 2)


def test_every_preset_part_says_its_kind_and_sockets_multiply():
    for name, g in presets.GPUS.items():
        assert g.api and g.arch and g.memory and g.tier, name
    for name, c in presets.CPUS.items():
        assert c.vendor and c.generation and c.isa and c.tier and c.sockets == 1, name
    two = cost.preset("2x epyc-9374f").cpu
    assert (two.sockets, two.vendor, two.isa) == (2, "amd", "avx512-vnni")
    assert cost.numa_view(two, "isolate").sockets == 1 and cost.numa_view(two, "distribute").sockets == 2


@pytest.mark.parametrize("bad, field", [(dict(api="cudaa"), "api='cudaa'"), (dict(arch="rdna9"), "arch='rdna9'"),
                                        (dict(tier="gaming"), "tier='gaming'")])
def test_a_kind_moert_does_not_know_is_a_hardware_error_naming_the_choices(bad, field):
    with pytest.raises(cost.HardwareError, match=field) as e:
        moert.GPU("x", 8, 272, 30, **bad)
    assert "use one of" in str(e.value)
    with pytest.raises(cost.HardwareError, match="isa='sse4'"):
        moert.CPU("x", 8, 80.0, isa="sse4")


def test_the_int8_path_of_each_isa_sets_a_cpu_prefill_rate():
    """kinds.int8_macs_per_cycle from the engines' sources: llama.cpp's 256-bit dpbusd (64 MACs a cycle) or
    maddubs + madd without VNNI (32); ik_llama.cpp's 512-bit dpbusd on two 512-bit pipes (128); the fitted parts
    (Zen 4: flops_per_cycle 32, VNNI) keep their fp32-based rate."""
    zen4 = cost.CPUS["epyc-9374f"]
    assert kinds.cpu_int8_x(zen4, "llama.cpp") == kinds.cpu_int8_x(zen4, "ik_llama.cpp") == 1.0
    skx = cost.CPUS["xeon-gold-6138"]                                 # AVX-512 without VNNI, two 512-bit FMA units
    assert skx.isa == "avx512" and skx.flops_per_cycle == 64
    assert kinds.cpu_int8_x(skx, "llama.cpp") == kinds.cpu_int8_x(skx, "ik_llama.cpp") == 32 / 128
    gnr = cost.CPUS["xeon-6980p"]                                     # AMX parts have VNNI: 128 in ik, 64 in mainline
    assert (kinds.cpu_int8_x(gnr, "ik_llama.cpp"), kinds.cpu_int8_x(gnr, "llama.cpp")) == (1.0, 0.5)
    assert kinds.cpu_int8_x(replace(skx, isa=""), "llama.cpp") == 1.0    # not stated: the fp32-based rate
    hw = cost.preset("xeon-gold-6138")
    p = moert.plan(moert.zoo.path("qwen3-30b-a3b"), gpu_layers=0)
    def experts(h):                      # the experts' MAC time: their seconds less reads (they add) and fixed costs
        return sum(x.seconds - x.bytes / (1e9 * h.cpu.read_gbs()) - x.ops * roofline.op_us(h.cpu) * 1e-6
                   for x in moert.predict(p, h, n_prompt=512).parts if x.phase == "prefill" and x.stage == "experts")
    vnni = moert.Hardware(cpu=replace(hw.cpu, isa="avx512-vnni"))
    assert experts(hw) == pytest.approx(2 * experts(vnni), rel=1e-6)    # half the MACs a cycle, twice the time


def test_cpu_decode_attention_at_depth_is_costed_by_its_flops():
    """A DeepSeek-V3 token at depth 32768 on a CPU: each layer's attention does 2 x 32768 x 128 x (576 + 512) FLOPs
    over 32768 x 576 f16 latents: at the CPU's float rate that outweighs the read, so the part is compute-bound and
    takes FLOPs at llama.cpp's one-query rate (attn_1q_flops_per_cycle a core-cycle, below peak x
    compute_efficiency here; ik_llama.cpp keeps the latter)."""
    hw = cost.preset("epyc-9554")
    p = moert.plan(moert.zoo.path("deepseek-v3"), gpu_layers=0)
    r = moert.predict(p, hw, n_prompt=0, n_gen=1, depth=32768, flash_attn=False)   # ggml's mul_mat attention
    (att,) = [x for x in r.parts if x.phase == "decode" and x.layer == 5 and x.stage == "attention" and
              x.flops > 1e9]
    flops = 2 * 32768.5 * 128 * (576 + 512)
    assert att.flops == pytest.approx(flops, rel=1e-3) and att.bound == "compute"
    rate = hw.cpu.cores * hw.cpu.ghz * hw.cpu.attn_1q_flops_per_cycle * 1e9
    assert rate < hw.cpu.peak_gflops * hw.cpu.compute_efficiency * 1e9
    assert att.seconds == pytest.approx(flops / rate + att.ops * hw.cpu.call_us * 1e-6, rel=1e-3)
    r = moert.predict(p, hw, n_prompt=0, n_gen=1, depth=32768, policy="ik_llama.cpp")
    (att,) = [x for x in r.parts if x.phase == "decode" and x.layer == 5 and x.stage == "attention" and
              x.flops > 1e9]
    rate = hw.cpu.peak_gflops * hw.cpu.compute_efficiency * 1e9
    assert att.seconds == pytest.approx(flops / rate + att.ops * hw.cpu.call_us * 1e-6, rel=1e-3)


def test_the_other_sockets_read_through_the_links_without_numa():
    """Without --numa the weights sit on one node and the other socket's half of the work reads through the links:
    at most remote x s / (s - 1) = 2 x 34 GB/s on Skylake-SP (McCalpin's 8160), where a node's share is above it."""
    one = replace(cost.CPUS["xeon-gold-6138"], bw_efficiency=0.87)     # ~112 of 128 GB/s, as McCalpin read locally
    two = cost.sockets(one, 2)
    assert kinds.remote_read_gbs(one) == pytest.approx(34.0)
    assert cost.numa_view(two, "none").read_gbs() == pytest.approx(68.0)
    assert cost.numa_view(two, "isolate").read_gbs() == pytest.approx(one.read_gbs())
    assert cost.numa_view(two, "distribute").read_gbs() == pytest.approx(2 * one.read_gbs())
    assert kinds.remote_read_gbs(cost.CPUS["ryzen-7950x"]) == 0.0          # a desktop part: no socket link


def test_llama_cpps_amx_tiles_speed_dense_prefill_matmuls_only():
    """llama.cpp's AMX buffer takes 2-D MUL_MAT weights of its types (attention here), never the routed experts'
    MUL_MAT_ID: on an AMX part a compute-bound attention projection takes half the time of the same part without AMX,
    the experts the same time; ik_llama.cpp (no AMX path) and decode are unchanged."""
    amx = cost.CPUS["xeon-8480-qyfs"]
    assert amx.isa == "amx" and kinds.amx_gemm_x(amx, "llama.cpp", "Q8_0") == 2.0
    assert kinds.amx_gemm_x(amx, "ik_llama.cpp", "Q8_0") == kinds.amx_gemm_x(amx, "llama.cpp", "IQ2_XXS") == 1.0
    vnni = replace(amx, isa="avx512-vnni")
    p = moert.plan(moert.zoo.path("qwen3-30b-a3b", "Q8_0"), gpu_layers=0)

    def parts(cpu, policy):
        r = moert.predict(p, moert.Hardware(cpu=cpu), n_prompt=512, n_gen=1, policy=policy, ram_gib=0)
        pick = {s: [x for x in r.parts if x.phase == "prefill" and x.layer == 3 and x.stage == s and x.flops > 0]
                for s in ("attention", "experts")}
        return pick, r.decode_s

    (a, dec_a), (v, dec_v) = parts(amx, "llama.cpp"), parts(vnni, "llama.cpp")
    proj_a, proj_v = (max(d["attention"], key=lambda x: x.flops) for d in (a, v))   # q/k/v/o, not the KV part
    assert proj_v.bound == "compute" and proj_a.seconds < 0.75 * proj_v.seconds
    assert [x.seconds for x in a["experts"]] == pytest.approx([x.seconds for x in v["experts"]])
    assert dec_a == pytest.approx(dec_v)
    (ia, _), (iv, _) = parts(amx, "ik_llama.cpp"), parts(vnni, "ik_llama.cpp")
    assert [x.seconds for x in ia["attention"]] == pytest.approx([x.seconds for x in iv["attention"]])


def test_server_dram_shares_and_gmi_wide_links_belong_to_the_kind():
    """Skylake-SP's cores read McCalpin's ~112 of 128 GB/s a socket (kinds.SERVER_READ_SHARE); a Zen 5 server part of
    at most 8 CCDs a socket joins each CCD by two GMI links (64 B a fabric clock), Zen 4 and 16-CCD parts by one."""
    sky = cost.CPUS["xeon-gold-6138"]
    assert sky.read_gbs() == pytest.approx(112.0 * cost.ddr_gbs(6, 2666) / 128)     # 0.875 of its 127.97 GB/s
    assert cost.CPUS["xeon-8480-qyfs"].bw_efficiency == presets.SERVER_BW_EFFICIENCY   # no reading: the stand-in
    turin, genoa = cost.CPUS["epyc-9355"], cost.CPUS["epyc-9374f"]
    assert (kinds.gmi_links_per_ccd(turin), turin.fabric_gbs) == (2, 8 * 2 * 32 * 2.0)
    assert (kinds.gmi_links_per_ccd(genoa), genoa.fabric_gbs) == (1, 8 * 32 * 2.0)
    assert kinds.gmi_links_per_ccd(cost.sockets(turin, 2)) == 2                       # per socket, not per machine
    assert kinds.gmi_links_per_ccd(replace(turin, ccds=16, cores=128)) == 1            # 16 CCDs: one link each
    assert turin.read_gbs(4) == pytest.approx(2 * 32 * 2.0)                           # 4 threads: one CCD's two links


def test_a_server_cpu_described_by_its_spec_sheet_reads_its_kinds_dram_share():
    """The DRAM share is the kind's (kinds.cpu_bw_share), so a part given by its fields gets what a preset of the same
    kind gets: Skylake-SP's reading, the many-channel share, or the desktop's; a stated share wins."""
    sky = moert.CPU("my 6138", 20, cost.ddr_gbs(6, 2666), 6, 2666, vendor="intel", generation="skylake-sp",
                    tier="server")
    genoa = moert.CPU("my genoa", 32, cost.ddr_gbs(12, 4800), 12, 4800, generation="zen4", tier="server")
    assert sky.bw_efficiency == cost.CPUS["xeon-gold-6138"].bw_efficiency == 112 / 128
    assert genoa.bw_efficiency == cost.CPUS["epyc-9374f"].bw_efficiency == kinds.MANY_CHANNEL_BW_SHARE
    assert moert.CPU("desk", 8, 76.8, 2, 4800).bw_efficiency == kinds.CPU_BW_SHARE
    assert moert.CPU("mine", 8, 76.8, bw_efficiency=0.5, tier="server").bw_efficiency == 0.5


def test_an_intel_mesh_server_core_reads_at_its_own_rate_so_a_few_threads_fill_the_socket():
    """A core's DRAM read rate is its misses in flight over the latency (kinds.CORE_READ_GBS: 18.5 GB/s, one Emerald
    Rapids core), so n threads of a Xeon 6980P read min(n x 18.5, the socket's share), not n / 128 of it; a part
    described by its spec sheet gets the same, a measured rate wins, and a kind without a reading keeps the linear
    share (Skylake-SP) or its CCD links (AMD)."""
    gnr = cost.CPUS["xeon-6980p"]
    whole = gnr.mem_bw_gbs * gnr.bw_efficiency                                    # 276 GB/s
    assert gnr.bw_1thread_gbs == 18.5
    assert gnr.read_gbs(4) == pytest.approx(4 * 18.5)                             # below the socket's share: per core
    assert gnr.read_gbs(32) == gnr.read_gbs(128) == pytest.approx(whole)          # 32 x 18.5 > 276: saturated
    mine = moert.CPU("my 6980p", 128, cost.ddr_gbs(12, 6400), 12, 6400, vendor="intel",
                     generation="granite-rapids", tier="server")
    assert mine.read_gbs(32) == mine.read_gbs(128)
    assert moert.CPU("measured", 128, 600.0, vendor="intel", generation="granite-rapids", tier="server",
                     bw_1thread_gbs=2.0).read_gbs(32) == pytest.approx(64.0)
    sky = cost.CPUS["xeon-gold-6138"]
    assert sky.bw_1thread_gbs == 0 and sky.read_gbs(10) == pytest.approx(sky.read_gbs() / 2)
    assert kinds.core_read_gbs(cost.CPUS["epyc-9355"]) == 0
    # so a 6980P decodes as fast on 32 threads as on all 128 (its figures in bench/published.json: 7.8 and 7.9 t/s)
    p = moert.plan(moert.zoo.path("deepseek-v3"), gpu_layers=0)
    hw = moert.Hardware(cpu=gnr)
    t32, t128 = (moert.predict(p, hw, n_prompt=0, n_gen=16, threads=t).decode_tok_s for t in (32, 128))
    assert t32 == pytest.approx(t128, rel=0.05)
    linear = moert.Hardware(cpu=replace(gnr, generation="", bw_1thread_gbs=0.0))        # the old linear share
    assert moert.predict(p, linear, n_prompt=0, n_gen=16, threads=32).decode_tok_s < 0.5 * t32
