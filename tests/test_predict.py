"""moert.predict: properties of the cost model on zoo twins (no weights needed, so every case is fast)."""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest

import moert
import moert.cost.launch
from moert import cost
from moert.cost import zoo
from moert.cost.shape import expert_sets
from moert.errors import PlacementError


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOERT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _plan(model="qwen3-30b-a3b", hw=None, **kw):
    hw = hw or cost.preset("rtx4090+ryzen-7950x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.plan(zoo.path(model), gpu_backend="sim", gpu_memory=hw.gpu_memory() or None, **kw)


def test_more_expert_layers_on_the_gpu_never_predict_slower_decode():
    hw = cost.preset("rtx4090+ryzen-7950x")
    for order in ("first", "last"):
        speeds = [moert.predict(_plan(hw=hw, n_cpu_moe=n, n_cpu_moe_from=order), hw).decode_tok_s
                  for n in (48, 40, 32, 24, 16, 8, 0)]                  # fewer CPU layers = more GPU experts
        assert speeds == sorted(speeds), (order, speeds)
        assert speeds[-1] > 3 * speeds[0]                               # and it matters a lot


def test_a_split_of_each_layers_experts_lands_between_all_cpu_and_all_gpu():
    hw = cost.preset("rtx4090+ryzen-7950x")
    p = _plan(hw=hw, cpu_moe=True)
    half = {e.name: {"cpu": range(0, 64), "sim:0": range(64, 128)} for e in p if "_exps." in e.name}
    cpu = moert.predict(p, hw).decode_tok_s
    split = moert.predict(p, hw, experts=half).decode_tok_s
    gpu = moert.predict(_plan(hw=hw), hw).decode_tok_s
    assert cpu < split < gpu


def test_expert_ranges_must_cover_every_expert_once():
    p = _plan(cpu_moe=True)
    with pytest.raises(PlacementError, match="cover experts 0..127"):
        moert.predict(p, cost.preset("rtx4090+ryzen-7950x"),
                      experts={"blk.0.ffn_up_exps.weight": {"cpu": range(0, 100)}})


def test_a_placement_that_does_not_fit_is_reported():
    hw = cost.preset("rtx4070+ryzen-7950x")                          # 12 GiB; the model is 17.3 GiB
    full = moert.predict(_plan(hw=hw), hw)
    assert not full.fits and full.memory["gpu0"]["need"] > full.memory["gpu0"]["capacity"]
    assert "DOES NOT FIT" in full.table()
    assert moert.predict(_plan(hw=hw, cpu_moe=True), hw).fits


def test_uniform_routing_reads_k_of_e_experts_per_token_and_the_expected_distinct_set_per_batch():
    hw = cost.preset("rtx4090+ryzen-7950x")
    p = _plan(hw=hw, cpu_moe=True)
    layer0 = sum(e.nbytes for e in p if e.name.startswith("blk.0.") and "_exps." in e.name)
    r = moert.predict(p, hw, n_prompt=16, n_gen=1, policy="none")
    dec = [x for x in r.parts if x.phase == "decode" and x.layer == 0 and x.stage == "experts"]
    assert sum(x.bytes for x in dec) == pytest.approx(layer0 * 8 / 128)            # K/E of the bytes
    pre = [x for x in r.parts if x.phase == "prefill" and x.layer == 0 and x.stage == "experts"]
    assert sum(x.bytes for x in pre) == pytest.approx(layer0 * (1 - (1 - 8 / 128) ** 16))   # E(1-(1-K/E)^B)/E


def test_a_trace_changes_what_a_batch_reads():
    import numpy as np

    hw = cost.preset("rtx4090+ryzen-7950x")
    p = _plan(hw=hw, cpu_moe=True)
    uniform = np.full((48, 128), 10)
    hot = np.zeros((48, 128), dtype=int)
    hot[:, :8] = 10                                                      # every token picks the same 8 experts
    base = moert.predict(p, hw, n_prompt=64, policy="none")
    assert moert.predict(p, hw, n_prompt=64, policy="none", trace=uniform).prefill_s == pytest.approx(base.prefill_s)
    skew = moert.predict(p, hw, n_prompt=64, policy="none", trace=hot)
    bytes_of = lambda r: sum(x.bytes for x in r.parts if x.phase == "prefill" and x.stage == "experts")  # noqa: E731
    assert bytes_of(skew) < 0.2 * bytes_of(base)
    with pytest.raises(PlacementError, match="trace has shape"):
        moert.predict(p, hw, trace=np.zeros((3, 3)))


def test_decode_time_grows_linearly_with_depth():
    """Linear where every kernel keeps its rate (ggml's mul_mat attention: -fa off); llama.cpp's CPU flash-attention
    kernel slows as each head's positions outgrow the caches (moert/cost/kinds.py, read at two depths): faster."""
    hw = cost.preset("rtx3060+ryzen-7600")
    p = _plan(hw=hw, gpu_layers=20)
    t = [moert.predict(p, hw, depth=d, n_prompt=0, flash_attn=False).decode_s for d in (0, 8192, 16384)]
    assert t[0] < t[1] < t[2]
    assert t[2] - t[1] == pytest.approx(t[1] - t[0], rel=1e-9)
    t = [moert.predict(p, hw, depth=d, n_prompt=0).decode_s for d in (0, 8192, 16384)]
    assert t[2] - t[1] > 1.2 * (t[1] - t[0])


def test_cpu_decode_scales_with_threads_until_memory_saturates():
    cpu = moert.CPU("c", 16, 80.0, bw_efficiency=0.75, bw_1thread_gbs=10.0)   # 60 GB/s in all: 6 threads fill it
    hw = moert.Hardware(cpu=cpu)
    p = _plan(hw=hw, gpu_layers=0)
    t = {n: moert.predict(p, hw, threads=n, n_prompt=0).decode_s for n in (1, 2, 4, 8, 16)}
    assert t[1] > t[2] > t[4] > t[8]
    # bandwidth-bound: more threads, the same (but for attention's FLOPs, which more threads do faster: < 1%)
    assert t[16] <= t[8] and t[8] == pytest.approx(t[16], rel=0.01)
    assert t[1] / t[4] == pytest.approx(4, rel=0.1)                      # per-thread-bound: near linear


def test_op_offload_policies():
    hw = cost.preset("rtx4090+ryzen-7950x")
    p = _plan(hw=hw, cpu_moe=True)
    stages = lambda r: {x.stage for x in r.parts if x.phase == "prefill"}  # noqa: E731
    assert "offload" in stages(moert.predict(p, hw, n_prompt=512))             # B >= 32: used experts copied
    assert "offload" not in stages(moert.predict(p, hw, n_prompt=16))          # B < 32: computed on the CPU
    assert "offload" not in stages(moert.predict(p, hw, n_prompt=512, policy="none"))
    # ik_llama.cpp: MoE matmuls offloaded only when B >= 32 E/K = 512 for 128 experts, 8 used
    assert "offload" not in stages(moert.predict(p, hw, n_prompt=256, n_ubatch=256, policy="ik_llama.cpp"))
    assert "offload" in stages(moert.predict(p, hw, n_prompt=512, policy="ik_llama.cpp"))
    with pytest.raises(PlacementError, match="policy"):
        moert.predict(p, hw, policy="vllm")


def test_ik_llama_cpp_adds_a_cpu_resident_down_bias_on_the_cpu_between_offloaded_matmuls():
    """gpt-oss with its expert biases in RAM (`-ot exps=CPU`): ik_llama.cpp never offloads the down projection's
    bias-add (ADD_ID, ne[1] = K < 32), so each layer's B x K x D output crosses to the host and back around a CPU
    add; mainline offloads it, and with the biases on the GPU (ik's --n-cpu-moe pattern, `exps.weight`) there is
    nothing to add on the CPU."""
    hw = cost.preset("rtx4090+ryzen-7950x")
    B, n = 2048, 24                                                     # u-batch; gpt-oss-20b's layers
    crossings = lambda r: [x for x in r.parts if x.phase == "prefill" and x.stage == "transfer"]  # noqa: E731
    cpu_adds = lambda r: [x for x in r.parts if x.phase == "prefill" and x.device == "cpu"]  # noqa: E731
    biases_in_ram = _plan("gpt-oss-20b", hw, overrides="exps=CPU")
    ik = moert.predict(biases_in_ram, hw, n_prompt=B, n_ubatch=B, n_gen=1, policy="ik_llama.cpp")
    main = moert.predict(biases_in_ram, hw, n_prompt=B, n_ubatch=B, n_gen=1, policy="llama.cpp")
    on_gpu = moert.predict(_plan("gpt-oss-20b", hw, overrides=r"exps\.weight=CPU"), hw, n_prompt=B, n_ubatch=B,
                           n_gen=1, policy="ik_llama.cpp")
    K, D = 4, 2880
    extra = sum(x.bytes for x in crossings(ik)) - sum(x.bytes for x in crossings(main))
    assert extra == pytest.approx(n * (2 * B * K * D * 4 + B * K * 4))  # out and back, and the ids, per layer
    assert len(cpu_adds(ik)) == n and not cpu_adds(main) and not cpu_adds(on_gpu)
    assert sum(x.bytes for x in crossings(on_gpu)) == pytest.approx(sum(x.bytes for x in crossings(main)))
    assert ik.prefill_tok_s < 0.9 * main.prefill_tok_s                 # it costs: ~0.1 ms a token over PCIe
    assert ik.decode_tok_s == main.decode_tok_s                         # one token: no offload, nothing moves


def test_hybrid_decode_with_plain_launches_is_never_faster_than_with_graph_replay():
    hw = cost.preset("rtx4090+ryzen-7950x")
    for kw in ({"cpu_moe": True}, {"n_cpu_moe": 8}, {"n_cpu_moe": 40}):
        p = _plan(hw=hw, **kw)
        r = {g: moert.predict(p, hw, graphs=g) for g in ("per-split", "one-per-device", "none")}
        assert r["one-per-device"].decode_tok_s < r["per-split"].decode_tok_s, kw   # several GPU splits a token
        assert r["none"].decode_tok_s <= r["one-per-device"].decode_tok_s, kw
        assert r["one-per-device"].prefill_tok_s == r["per-split"].prefill_tok_s      # prefill is never graphed
        assert r["one-per-device"].settings["graphs"] == "one-per-device"
    with pytest.raises(PlacementError, match="graphs"):
        moert.predict(_plan(hw=hw, cpu_moe=True), hw, graphs="sometimes")


def test_overlapped_plain_launches_land_between_graph_replay_and_the_additive_rule():
    hw = cost.preset("rtx4090+ryzen-7950x")
    decode = lambda parts: sum(x.seconds for x in parts if x.phase == "decode")  # noqa: E731
    for model, kw in (("qwen3-30b-a3b", {"cpu_moe": True}), ("qwen3-30b-a3b", {"n_cpu_moe": 8}),
                      ("gpt-oss-20b", {"n_cpu_moe": 12}), ("qwen3-30b-a3b", {})):
        base = moert.predict(_plan(model, hw=hw, **kw), hw)                # per-split: every kernel replays
        for g in ("one-per-device", "none"):
            over = moert.cost.launch.apply(base.parts, hw, g)
            add = moert.cost.launch.apply(base.parts, hw, g, overlap=False)
            assert base.decode_s <= decode(over) * (1 + 1e-12) and decode(over) <= decode(add) * (1 + 1e-12), (kw, g)
            assert decode(over) == pytest.approx(moert.predict(_plan(model, hw=hw, **kw), hw, graphs=g).decode_s)
            assert [x.seconds for x in over if x.phase == "prefill"] == [x.seconds for x in base.parts
                                                                         if x.phase == "prefill"]


def test_a_split_of_small_kernels_pays_its_launches_and_one_of_big_kernels_hides_them():
    hw = cost.preset("rtx4090+ryzen-7950x")
    g = hw.gpus[0]
    from moert.cost.predict import Part as P
    small = [P("decode", "gpu0", 0, "attention", ops=20, seconds=20 * g.launch_us * 1e-6 + 5e-6),
             P("decode", "cpu", 0, "experts", ops=7, seconds=1e-3)]
    big = [P("decode", "gpu0", 1, "experts", ops=20, seconds=20 * g.launch_us * 1e-6 + 1e-3)]
    out = moert.cost.launch.apply(small + big, hw, "none")
    assert out[0].seconds == pytest.approx(20 * g.launch_us_nograph * 1e-6) and out[0].bound == "overhead"
    assert out[1] == small[1] and out[2] == big[0]                      # the CPU part; a kernel-bound split


def test_graph_policy_leaves_cpu_only_and_single_split_gpu_decode_alone():
    hw = cost.preset("rtx4090+ryzen-7950x")
    cpu = cost.preset("ryzen-7950x")
    cpu_plan = _plan(hw=cpu, gpu_layers=0)
    gpu_plan = _plan(hw=hw)                                              # all on the GPU: one split a token
    for p, h in ((cpu_plan, cpu), (gpu_plan, hw)):
        a, b = (moert.predict(p, h, graphs=g) for g in ("per-split", "one-per-device"))
        assert a.decode_s == b.decode_s and a.prefill_s == b.prefill_s
    two = cost.preset("2x rtx3090+epyc-9554")                        # a layer split: one split per GPU
    p = _plan(hw=two)
    assert moert.cost.launch.splits(moert.predict(p, two).parts) == {"gpu0": 1, "gpu1": 1}
    assert moert.predict(p, two, graphs="one-per-device").decode_s == moert.predict(p, two).decode_s
    assert moert.predict(p, two, graphs="none").decode_s > moert.predict(p, two).decode_s


def test_decode_crossings_are_latency_bound_and_absent_when_all_is_on_the_gpu():
    hw = cost.preset("rtx4090+ryzen-7950x")
    r = moert.predict(_plan(hw=hw, cpu_moe=True), hw)
    hops = [x for x in r.parts if x.phase == "decode" and x.stage == "transfer" and x.ops > 1.5]
    assert len(hops) == 2 * 48 and all(x.bound == "latency" for x in hops)   # two crossings per layer:
    # P(at least one of 8 picks lands on the CPU's 128 experts) = 1: the activations there and back, two copies of
    # 2048 floats; and the router's selection to the CPU split, its ids and weights (8 x 4 bytes each), ggml's
    # scheduler copying each input of a split made on another backend
    acts = [x for x in hops if x.bytes == pytest.approx(2 * 2048 * 4)]
    picks = [x for x in hops if x.bytes == pytest.approx(2 * 8 * 4)]
    assert len(acts) == len(picks) == 48 and all(x.ops == pytest.approx(2.0) for x in hops)
    assert sum(x.seconds for x in picks) == pytest.approx(48 * 2 * hw.link.latency_us * 1e-6, rel=0.01)
    full = moert.predict(_plan(hw=hw), hw)
    assert not [x for x in full.parts if x.stage == "transfer" and x.layer not in (None, 0)]


def test_plans_for_more_gpus_than_the_hardware_has_are_refused():
    hw = cost.preset("rtx4090+ryzen-7950x")
    two = _plan(hw=cost.preset("2x rtx3090+epyc-9554"))
    with pytest.raises(PlacementError, match="1 GPU"):
        moert.predict(two, hw)


def test_every_zoo_architecture_predicts_and_serializes():
    hw = cost.preset("h100-pcie+epyc-9554")
    for name in ("deepseek-v3", "gpt-oss-20b", "glm-4.5-air", "glm-4.7-flash", "mixtral-8x7b", "qwen1.5-moe-a2.7b"):
        r = moert.predict(_plan(name, hw=hw, cpu_moe=True), hw)
        assert 0 < r.decode_tok_s < 1e4 and 0 < r.prefill_tok_s < 1e6, name
        d = json.loads(json.dumps(r.to_dict()))
        assert d["bound"]["decode"] and len(d["parts"]) == len(r.parts)


def test_moert_predict_is_the_function_and_carries_its_validation():
    import importlib

    import moert.cost.predict as mod

    assert moert.predict is mod.predict and mod.Prediction is moert.Prediction
    assert moert.predict.VALIDATION is mod.VALIDATION and moert.predict.trust() == mod.trust()
    with pytest.raises(ModuleNotFoundError):                    # no module of that name to shadow the function
        importlib.import_module("moert.predict")


def test_strategies_return_rules_that_fit_and_compare_ranks_them(capsys):
    from moert.cli.main import main
    from moert.cost import strategies

    hw = cost.preset("rtx4070+ryzen-7950x")                          # 12 GiB for a 17.3 GiB model
    m = str(zoo.path("qwen3-30b-a3b"))
    n, rules = strategies.smallest_fitting(m, hw, 4096, lambda k: strategies.cpu_layers(m, k, "first"))
    assert 0 < n < 48 and strategies.fits(m, rules, hw, 4096)
    assert not strategies.fits(m, strategies.cpu_layers(m, n - 1, "first"), hw, 4096)   # the smallest n
    fo = strategies.fit_order(m, hw, 4096)
    assert strategies.fits(m, fo, hw, 4096)
    assert main(["compare", "zoo:olmoe-1b-7b", "--hardware", "rtx4070+ryzen-7950x", "--gpu-mem", "3GiB",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    best = [r for r in rows if r["best"]]
    assert len(best) == 1 and best[0]["fits"]
    cpu_moe = next(r for r in rows if r["strategy"].startswith("all experts"))
    assert best[0]["tg"] >= cpu_moe["tg"] and cpu_moe["gpu_share"] == 0


def test_compare_reads_c_as_llama_cpp_does_and_any_gpu_size(capsys):
    from moert.cli.compare import context_of
    from moert.cli.main import main
    from moert.errors import ArgumentError

    path = str(zoo.path("gpt-oss-20b"))
    assert context_of(path, 0) == 131072 and context_of(path, 2048) == 2048    # 0: the model's context_length
    with pytest.raises(ArgumentError, match="-c -5: give a context size"):
        context_of(path, -5)
    assert main(["compare", "zoo:olmoe-1b-7b", "--hardware", "rtx3090+ryzen-7950x", "--gpu-mem", "1KiB"]) == 0
    assert "nothing fits: give the GPU more memory" in capsys.readouterr().out
    hw = cost.preset("rtx3090+ryzen-7950x")
    from dataclasses import replace

    sizes = [replace(hw, gpus=(replace(hw.gpus[0], mem_gib=g),)).gpu_memory() for g in (24, 1.5, 1 / 2**20)]
    assert sizes == [["24GiB"], ["1.5GiB"], ["1024"]]                       # bytes where GiB would round


def test_compare_says_when_no_override_is_needed_and_how_far_to_trust_it(capsys):
    from moert.cli.main import main

    assert main(["compare", "zoo:olmoe-1b-7b", "--hardware", "rtx4090+ryzen-7950x"]) == 0   # 24 GiB: all fits
    out = capsys.readouterr().out
    assert "no experts on the CPU" in out and "-ot ''" not in out
    assert "last 0 layers" not in out                                     # the same placement, one row
    assert "llama-server -m olmoe-1b-7b-Q4_K_M.gguf -ngl 99 -c 4096 -ctk f16 -fa on" in out   # no -ot needed
    assert "how far to trust it: checked against" in out and "ranked right" in out


def test_compare_bars_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from moert.plots import compare_bars

    rows = [dict(strategy="a", fits=True, pp=100.0, tg=20.0, best=True),
            dict(strategy="b", fits=False, pp=300.0, tg=40.0, best=False),
            dict(strategy="c", fits=False, pp=None, tg=None, best=False)]            # nothing of that kind fits
    p = compare_bars(rows, tmp_path / "c.png")
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000


def test_expert_set_strategies_and_a_trace():
    """Equal share, random (the control) and a trace's hot experts per layer place the same bytes on the GPU;
    with a skewed trace the hot ones serve far more selections there and are predicted faster. A plan of expert
    pieces predicts what the same sets given as `experts=` do."""
    import dataclasses

    from moert.cost import strategies as S
    from moert.cost.machines import preset

    model = moert.zoo.path("olmoe-1b-7b")
    hw = preset("rtx3060+ryzen-7600")
    hw = dataclasses.replace(hw, gpus=[dataclasses.replace(hw.gpus[0], mem_gib=2.5)])
    rng = np.random.default_rng(0)
    E, K, L = 64, 8, 16
    p = 1 / np.arange(1, E + 1) ** 1.1
    counts = np.zeros((L, E))
    for il in range(L):
        perm = rng.permutation(E)
        for _ in range(300):
            counts[il, perm[rng.choice(E, K, replace=False, p=p / p.sum())]] += 1
    rules = {n: f(model, hw, 4096) for n, f in (("equal", S.equal_share), ("random", S.random_experts))}
    rules["hot"] = S.hot_per_layer(model, hw, 4096, counts)
    plans = {n: S.hardware_plan(model, r, hw) for n, r in rules.items()}
    on_gpu = {n: p.bytes_by_device()["sim:0"] for n, p in plans.items()}
    assert on_gpu["equal"] == on_gpu["random"] == on_gpu["hot"] > 0
    uniform = {n: moert.predict(plans[n], hw, n_prompt=64, n_gen=16).decode_tok_s for n in ("equal", "random")}
    assert uniform["equal"] == pytest.approx(uniform["random"], rel=1e-9)   # which experts: no matter, uniformly
    preds = {n: moert.predict(p, hw, n_prompt=64, n_gen=16, trace=counts) for n, p in plans.items()}
    assert all(r.fits for r in preds.values())
    share = {n: sum(v for d, v in _hits(plans[n], counts).items() if d != "cpu") for n in plans}
    assert share["hot"] > 1.5 * share["equal"] and preds["hot"].decode_tok_s > preds["equal"].decode_tok_s
    sets = {n: {d: list(ids) for d, ids in s.items()} for n, s in expert_sets(plans["hot"]).items()}
    whole = S.hardware_plan(model, S.all_cpu_experts(model), hw)
    via = moert.predict(whole, hw, n_prompt=64, n_gen=16, trace=counts, experts=sets)
    assert via.decode_tok_s == pytest.approx(preds["hot"].decode_tok_s, rel=1e-9)


def _hits(plan, counts) -> dict:
    from moert.trace import Trace

    t = Trace(counts.shape[1], np.zeros(0, np.int64), np.zeros(0, bool), np.zeros((0, counts.shape[0], 1), np.int32),
              np.zeros((0, counts.shape[0], 1), np.float32))
    t.counts = lambda: counts            # the shares from the counts alone
    return t.hits(plan)


def test_bad_arguments_are_typed_errors():
    from moert.errors import ArgumentError

    hw = cost.preset("rtx3090+ryzen-7950x")
    p = moert.plan(zoo.path("olmoe-1b-7b"), gpu_backend="sim", gpu_memory=hw.gpu_memory(), cpu_moe=True)
    for kw, msg in ((dict(n_prompt=-1), "n_prompt must be an integer >= 0"), (dict(depth=-10), "depth must be"),
                    (dict(threads=0), "threads must be an integer >= 1"), (dict(n_ubatch=0), "n_ubatch must be"),
                    (dict(kv_bytes=0), "kv_bytes must be > 0"), (dict(act_quant="int4"), "act_quant='int4'"),
                    (dict(n_ctx=-1), "n_ctx must be"), (dict(n_gen=2.5), "n_gen must be an integer")):
        with pytest.raises(ArgumentError, match=re.escape(msg)):
            moert.predict(p, hw, **kw)
    with pytest.raises(PlacementError, match="trace is a str, not an array of selection counts"):
        moert.predict(p, hw, trace="nonsense")
    with pytest.raises(PlacementError, match=r"trace has shape \(3,\)"):
        moert.predict(p, hw, trace=[1, 2, 3])
    with pytest.raises(PlacementError, match="or counts whose sum is"):              # finite counts, infinite sums
        moert.predict(p, hw, trace=np.full((16, 64), 1e308))
    with pytest.raises(PlacementError, match="negative, NaN or infinite"):
        moert.predict(p, hw, trace=-np.ones((16, 64)))
    assert moert.predict(p, hw, n_prompt=0, n_gen=0, kv_bytes=34 / 32).prefill_tok_s == 0.0   # no prompt test


def test_a_long_prompt_costs_one_forward_per_u_batch_size_and_sums_exactly():
    import moert.cost.predict as pm

    hw = cost.preset("rtx3090+ryzen-7950x")
    p = moert.plan(zoo.path("olmoe-1b-7b"), gpu_backend="sim", gpu_memory=hw.gpu_memory(), cpu_moe=True)
    for policy, depth in (("llama.cpp", 0), ("ik_llama.cpp", 3000)):
        r = moert.predict(p, hw, n_prompt=5000, n_ubatch=512, depth=depth, policy=policy)
        model = pm.CostModel(p, hw)
        q = pm.selection(p.metadata, None, model.shape.n_layer)
        each = sum(x.seconds for start in range(0, 5000, 512)                 # every u-batch at its own position
                   for x in pm._forward(model, q, min(512, 5000 - start), depth + start + min(512, 5000 - start) / 2,
                                        "prefill", policy))
        assert r.prefill_s == pytest.approx(each, rel=1e-12)
    import time

    t0 = time.perf_counter()
    assert moert.predict(p, hw, n_prompt=10**9, n_ubatch=1).prefill_tok_s > 0   # 1e9 u-batches: no loop over them
    assert time.perf_counter() - t0 < 5


def test_experts_split_within_a_layer_receive_the_selection_only_where_the_router_is_not():
    hw = cost.preset("rtx3090+ryzen-7950x")
    p = moert.plan(zoo.path("olmoe-1b-7b"), gpu_backend="sim", gpu_memory=hw.gpu_memory())   # all on the GPU
    names = [e.name for e in p if e.name.startswith("blk.0.ffn_") and "exps" in e.name]
    half = {n: {"sim:0": range(0, 32), "cpu": range(32, 64)} for n in names}             # layer 0: half on the CPU
    hops = [x for x in moert.predict(p, hw, experts=half).parts if x.phase == "decode" and x.device == "link"
            and x.layer is not None and x.stage == "transfer"]
    p_cpu = 1 - math.comb(32, 8) / math.comb(64, 8)                  # a token picks one of the CPU's 32 at least
    acts = [x for x in hops if x.bytes == pytest.approx(2 * 2048 * 4 * p_cpu)]
    picks = [x for x in hops if x.bytes == pytest.approx(2 * 8 * 4 * p_cpu)]          # ids + weights, K = 8 each
    assert len(acts) == len(picks) == 1 and all(x.layer == 0 and x.ops == pytest.approx(2 * p_cpu) for x in hops
                                                if x in acts + picks)
    whole = [x for x in moert.predict(p, hw).parts if x.phase == "decode" and x.device == "link"
             and x.layer is not None and x.ops > 1.5]
    assert not whole                           # all on the GPU: no round trip (only the embedding row goes up)
