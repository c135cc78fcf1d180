"""predict with an expert cache (moert/dynamic/predict.py): equal to the virtual clock of a run with that cache on
the run's own trace (the sim GPU's expert time and the weight copies), close to the static prediction when the
cache holds nothing, and refused for plans it does not model."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import moert
from moert.dynamic import ExpertCache
from moert.dynamic.cache import CacheError
from moert.testing import write_tiny

HW = "rtx3090+ryzen-7950x"


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("cpred") / "q.gguf", "qwen3moe", seed=5)


def plan_of(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.plan(path, cpu_moe=True, gpu_backend="sim")


@pytest.mark.parametrize("slots, policy, prefetch", [(4, "lru", None), (4, "lfu", None), (4, "lru", "next-router"),
                                                     (4, "lfu", "next-router")])
def test_prediction_equals_the_virtual_clock_of_the_run(path, slots, policy, prefetch):
    cache = ExpertCache("sim:0", slots, policy, prefetch=prefetch)
    m = moert.load(path, cpu_moe=True, gpu_backend="sim", context_size=64, n_batch=4, warmup=False, hardware=HW,
                   expert_cache=cache, trace=True)
    m.forward(np.array([5, 6, 7, 8, 5, 6]))                      # a prompt of two chunks: the second hits
    for t in (3, 1, 4, 1, 5, 9, 2, 6, 5, 3):
        m.forward(np.array([t]))
    trace = m.trace
    p = moert.predict(m.plan, moert.cost.machines.preset(HW), n_prompt=6, n_gen=10, cache=cache, trace=trace)
    assert (trace.prefetch is not None) == bool(prefetch)
    for phase, st, n in (("decode", m.stats.decode, m.stats.decode.calls), ("prefill", m.stats.prefill, 1)):
        def term(stage, device="link", phase=phase, n=n):
            return n * sum(q.seconds for q in p.parts if q.phase == phase and q.stage == stage and q.device == device)
        assert st.time["experts"].get("sim:0", 0) == pytest.approx(term("experts", "gpu0"), rel=1e-9), phase
        assert st.time["transfers"].get("cpu->sim:0 weights", 0) == pytest.approx(term("cache copy"), rel=1e-9)
        assert st.time["transfers"].get("cpu->sim:0 prefetch", 0) == pytest.approx(term("prefetch copy"), rel=1e-9)
        assert term("experts", "gpu0") > 0
    assert (sum(q.seconds for q in p.parts if q.stage == "prefetch copy") > 0) == bool(prefetch)
    assert m.stats.cache.hits.sum() > 0 and p.settings["cache"]["decode_hit_rate"] > 0
    assert p.settings["cache"]["prefill"] == "the trace's prompt chunks"
    m.close()


def test_prefetch_overlap_by_hand():
    from moert.cost.hardware import Link
    from moert.dynamic.predict import overlap

    link = Link(bw_gbs=10.0, latency_us=10.0, efficiency=0.5)      # 5 GB/s effective, 10 us a copy
    copy = 3 * link.seconds(1_000_000, 1)                          # gate, up, down of 1 MB: 3 x (10 + 200) us
    assert copy == pytest.approx(630e-6)
    assert overlap(copy, 500e-6) == pytest.approx(130e-6)          # the window hides 500 us of it
    assert overlap(copy, 630e-6) == 0.0 and overlap(copy, 1.0) == 0.0
    assert overlap(copy, 0.0) == pytest.approx(630e-6)             # nothing to hide behind: all of it


def test_a_prefetching_cache_needs_the_runs_predictions(path):
    m = moert.load(path, cpu_moe=True, gpu_backend="sim", context_size=64, warmup=False, trace=True)
    m.forward(np.arange(1, 6))
    hw = moert.cost.machines.preset(HW)
    with pytest.raises(CacheError, match="trace=True"):
        moert.predict(m.plan, hw, cache=ExpertCache("sim:0", 2, prefetch="next-router"), trace=m.trace)
    m.close()


def test_an_empty_cache_predicts_about_the_static_plan(path):
    m = moert.load(path, cpu_moe=True, gpu_backend="sim", context_size=64, warmup=False, trace=True)
    m.forward(np.arange(1, 9))
    for t in range(12):
        m.forward(np.array([t + 3]))
    hw, plan, trace = moert.cost.machines.preset(HW), m.plan, m.trace
    static = moert.predict(plan, hw, n_prompt=8, n_gen=12, trace=trace.counts())
    empty = moert.predict(plan, hw, n_prompt=8, n_gen=12, cache=ExpertCache("sim:0", 0), trace=trace)
    # the same CPU experts and crossings, counted per token rather than from expected selection chances
    assert empty.decode_s == pytest.approx(static.decode_s, rel=0.05)
    assert empty.prefill_s == pytest.approx(static.prefill_s, rel=0.05)
    m.close()


def test_plans_it_does_not_model_are_refused(path):
    hw = moert.cost.machines.preset(HW)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpu_experts = moert.plan(path, gpu_backend="sim")
    m = moert.load(path, cpu_moe=True, gpu_backend="sim", context_size=64, warmup=False, trace=True)
    m.forward(np.arange(1, 5))
    with pytest.raises(CacheError, match="n_cpu_moe"):
        moert.predict(gpu_experts, hw, cache=ExpertCache("sim:0", 2), trace=m.trace)
    from moert.placement.rules import EXPERT_REGEX, TensorOverride, expert_layer_regex

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        split = moert.plan(path, [TensorOverride(expert_layer_regex(0), "sim:0", experts=[0, 1]),
                                  TensorOverride(EXPERT_REGEX, "cpu")], gpu_backend="sim")
    with pytest.raises(CacheError, match="split between the CPU and a GPU"):
        moert.predict(split, hw, cache=ExpertCache("sim:0", 2), trace=m.trace)
    with pytest.raises(CacheError, match="moert.Trace"):
        moert.predict(plan_of(path), hw, cache=ExpertCache("sim:0", 2), trace=m.trace.counts())
    m.close()


def test_a_mixed_plan_predicts_its_cached_layers_as_the_clock_runs_them(path):
    cache = ExpertCache("sim:0", 2, "lru", prefetch="next-router")
    m = moert.load(path, n_cpu_moe=1, gpu_backend="sim", context_size=64, n_batch=4, warmup=False, hardware=HW,
                   expert_cache=cache, trace=True)
    m.forward(np.array([5, 6, 7, 8, 5, 6, 7, 8]))
    for t in (3, 1, 4, 1, 5, 9, 2, 6, 5, 3):
        m.forward(np.array([t]))
    p = moert.predict(m.plan, moert.cost.machines.preset(HW), n_prompt=8, n_gen=10, cache=cache, trace=m.trace)
    assert p.settings["cache"]["cached_layers"] == [0]
    n, dec = m.stats.decode.calls, m.stats.decode
    # decode on sim:0: layer 0's hits (predicted with the cache) and layer 1's own GPU experts (the clock's term
    # for each token's selection, recomputed here: predict keeps its static expectation for that layer)
    hits = sum(q.seconds for q in p.parts if q.phase == "decode" and q.stage == "experts" and q.device == "gpu0"
               and q.layer == 0)
    cost, dec_ids = m.clock.cost, m.trace.ids[~m.trace.prefill, 1]                       # (n, K) layer 1
    own = 0.0
    for ids in dec_ids:
        items, used = cost.expert_load(1, 1, counts=np.bincount(ids, minlength=m.config.n_expert))["sim:0"]
        own += cost.stage("clock", "sim:0", 1, "experts", items, len(items), 1, used).seconds
    assert dec.time["experts"]["sim:0"] == pytest.approx(hits * n + own, rel=1e-9) and hits > 0
    for phase, st, k in (("decode", dec, n), ("prefill", m.stats.prefill, 1)):
        copies = sum(q.seconds for q in p.parts if q.phase == phase and q.stage == "cache copy")
        assert st.time["transfers"].get("cpu->sim:0 weights", 0) == pytest.approx(copies * k, rel=1e-9)
        assert all(q.layer == 0 for q in p.parts if q.stage in ("cache copy", "prefetch copy"))
    assert m.stats.cache.misses[1] == 0 and m.stats.cache.misses[0] > 0
    m.close()
