"""The expert cache at run time (moert/dynamic/runtime.py): the logits of the static placement, in prefill and
decode, on several architectures and policies; counts equal to the replay's on the run's own trace; weight
bytes counted apart from activations; bad caches refused with what to do."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert.dynamic import ExpertCache, expert_bytes, replay
from moert.dynamic.cache import CacheError
from moert.testing import write_tiny

KW = dict(cpu_moe=True, gpu_backend="sim", context_size=64, n_batch=4, warmup=False)
PROMPT = np.array([5, 9, 2, 33, 17, 4, 41, 8, 12, 3, 27])                 # three chunks of n_batch 4
STEPS = (3, 5, 7, 9, 11, 13)


@pytest.fixture(scope="module", params=["qwen3moe", "olmoe", "deepseek2", "gpt-oss"])
def model(request, tmp_path_factory):
    path = write_tiny(tmp_path_factory.mktemp("cache") / f"{request.param}.gguf", request.param, seed=3)
    m = moert.load(path, **KW, trace=True)
    logits = [m.forward(PROMPT)] + [m.forward(np.array([t])) for t in STEPS]
    trace = m.trace_stop()
    m.close()
    return path, logits, trace


def run(path, cache):
    m = moert.load(path, **KW, expert_cache=cache, trace=True)
    logits = [m.forward(PROMPT)] + [m.forward(np.array([t])) for t in STEPS]
    return m, logits


@pytest.mark.parametrize("slots, policy, per_layer", [(1, "lru", True), (2, "lfu", True), (3, "lfru", False),
                                                      (2, "static", True), (0, "lru", True)])
def test_same_logits_and_replay_counts(model, slots, policy, per_layer):
    path, ref, trace = model
    cache = ExpertCache("sim:0", slots, policy, per_layer, hot=trace, half_life=4.0)
    m, logits = run(path, cache)
    for a, b in zip(ref, logits):                                         # prefill, then each decode step
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
        assert (a.argmax(axis=-1) == b.argmax(axis=-1)).all()
    st, r = m.stats.cache, replay(m.trace, cache)
    assert m.trace.ids.tolist() == trace.ids.tolist()                     # the same routing as the static run
    for f in ("hits", "misses", "admissions", "evictions"):
        assert getattr(st, f).tolist() == getattr(r, f).tolist(), f
    assert st.hits.sum() + st.misses.sum() > 0
    assert st.weight_bytes == int((r.admissions * expert_bytes(path)).sum())
    moved = m.stats.total.transfers["sim:0"]
    assert moved.weight_bytes == st.weight_bytes and moved.weight_count >= st.admissions.sum()
    m.close()


def test_hits_run_on_the_cache_device(model):
    path, _, _ = model
    m, _ = run(path, ExpertCache("sim:0", 8, "lru"))                      # every expert fits: repeats hit
    assert m.stats.cache.hits.sum() > 0
    assert m.stats.total.time["experts"].get("sim:0", 0) > 0
    m.close()


def test_warmup_leaves_the_cache_alone(model):
    path, _, _ = model
    m = moert.load(path, **{**KW, "warmup": True}, expert_cache=ExpertCache("sim:0", 2))
    assert m.stats.cache.hits.sum() == m.stats.cache.misses.sum() == 0 and not m.expert_cache.resident
    m.close()


def test_bad_caches_are_refused(model):
    path = model[0]
    with pytest.raises(CacheError, match="replays"):
        moert.load(path, **KW, expert_cache=ExpertCache("sim:0", 2, "belady"))
    with pytest.raises(CacheError, match="sim:1"):
        moert.load(path, **KW, expert_cache=ExpertCache("sim:1", 2))
    with pytest.raises(CacheError, match="cpu_moe"):
        moert.load(path, **{**KW, "cpu_moe": False}, expert_cache=ExpertCache("sim:0", 2))
    with pytest.raises(CacheError, match="hot="):
        moert.load(path, **KW, expert_cache=ExpertCache("sim:0", 2, "static"))


def test_prefetch_next_router(model, tmp_path):
    from moert.cost.machines import preset
    from moert.dynamic.requests import chunks

    path, ref, _ = model
    cache = ExpertCache("sim:0", 2, "lru", prefetch="next-router")
    m = moert.load(path, **KW, expert_cache=cache, trace=True, hardware="rtx3090+ryzen-7950x")
    logits = [m.forward(PROMPT)] + [m.forward(np.array([t])) for t in STEPS]
    for a, b in zip(ref, logits):
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    st, log, t = m.stats.cache, m.expert_cache.prefetch_log, m.trace
    r = replay(t, cache, prefetch=log)                                    # the run's predictions, replayed
    saved = moert.Trace.load(t.save(tmp_path / "t.npz"))                  # ... and as the trace keeps them
    assert saved.prefetch.tolist() == t.prefetch.tolist() and len(t.prefetch) == sum(len(g) for _, _, g in log)
    for f in ("hits", "misses", "admissions", "evictions", "prefetch_admissions"):
        assert getattr(st, f).tolist() == getattr(r, f).tolist(), f
        assert getattr(st, f).tolist() == getattr(replay(saved, cache), f).tolist(), f
    assert st.weight_bytes == replay(saved, cache, expert_bytes=expert_bytes(path)).bytes   # misses' + prefetches'
    # precision and recall, recounted from the trace: each prediction against the experts that chunk's tokens chose
    chunk = chunks(t)
    L = t.n_layer
    right, guessed, asked = np.zeros(L), np.zeros(L), np.zeros(L)
    for step, layer, guess in log:
        actual = set(t.ids[chunk == step, layer].reshape(-1).tolist()) - {-1}
        right[layer] += len(actual & set(guess))
        guessed[layer] += len(guess)
        asked[layer] += len(actual)
    moe = guessed > 0
    routed = (t.ids[:, :, 0] >= 0).any(axis=0)                          # layers with routed experts
    consecutive = int((routed[1:] & routed[:-1]).sum())                 # a layer whose next one routes
    assert moe.sum() == consecutive and np.isnan(st.precision[~moe]).all()
    assert np.allclose(st.precision[moe], right[moe] / guessed[moe])
    assert np.allclose(st.recall[moe], right[moe] / asked[moe])
    # on the virtual clock the prefetch copies hide behind the layer's expert compute: at most the link's time
    copies = int(st.prefetch_admissions.sum()) * (3 + 3 * ("gpt-oss" in str(path)))
    nbytes = int((st.prefetch_admissions * expert_bytes(path)).sum())
    took = m.stats.total.time["transfers"].get("cpu->sim:0 prefetch", 0.0)
    assert 0.0 <= took <= preset("rtx3090+ryzen-7950x").link.seconds(nbytes, copies) + 1e-12
    m.close()
