"""Expert caches replayed over traces (moert/dynamic): each policy on hand-computed sequences, the Numba fast
path against its plain-Python twin, Belady against brute force and against every other policy."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import moert
from moert import ArgumentError
from moert.dynamic import ExpertCache, accesses, replay
from moert.dynamic.cache import CacheError
from moert.dynamic.kernels import next_use
from moert.dynamic.policies import NEVER, POLICIES
from moert.dynamic.requests import chunks, next_use_numpy
from moert.trace import Trace


def trace_of(ids, n_expert: int, prefill=None, positions=None, header=None) -> Trace:
    """A Trace from ids (N, L, K)."""
    ids = np.asarray(ids, dtype=np.int32)
    N = ids.shape[0]
    pre = np.zeros(N, bool) if prefill is None else np.asarray(prefill, bool)
    pos = np.arange(N) if positions is None else np.asarray(positions)
    return Trace(n_expert, pos, pre, ids, np.ones(ids.shape, np.float32), None, dict(header or {}))


def sequence(experts, n_expert: int = 5) -> Trace:
    """One layer, one expert per token, decode tokens: the requests are `experts` in order."""
    return trace_of(np.array(experts)[:, None, None], n_expert)


def random_trace(seed: int, N: int = 60, L: int = 3, K: int = 2, E: int = 8, prefill: bool = True) -> Trace:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(E, 0.4), size=L)                         # skewed per layer
    ids = np.array([[rng.choice(E, K, replace=False, p=p[il]) for il in range(L)] for _ in range(N)])
    pre = np.zeros(N, bool)
    if prefill:
        pre[:N // 3] = True                                             # a prompt, then decode
    return trace_of(ids, E, pre, header={"n_batch": 7})


def run(t, slots, policy, per_layer=True, **kw):
    return replay(t, ExpertCache("sim:0", slots, policy, per_layer, **kw))


# -- hand-computed sequences -----------------------------------------------------------------------------

SEQ = [0, 0, 0, 1, 2, 1, 2, 0]


def test_lru_by_hand():
    # 0m 0h 0h 1m [0 1] 2m evicts 0 [1 2] 1h 2h 0m evicts 1
    r = run(sequence(SEQ), 2, "lru")
    assert (r.hits.tolist(), r.misses.tolist(), r.admissions.tolist(), r.evictions.tolist()) == ([4], [4], [4], [2])


def test_lfu_by_hand():
    # counts survive: 2m evicts 1 (1 use) [0 2]; 1m evicts 2 [0 1]; 2m evicts 1 (2 uses, older) [0 2]; 0h
    r = run(sequence(SEQ), 2, "lfu")
    assert (r.hits.tolist(), r.misses.tolist(), r.evictions.tolist()) == ([3], [5], [3])


def test_belady_by_hand():
    # 2m: next uses 0 -> 7, 1 -> 5, 2 -> 6: evict 0 [1 2]; 1h 2h; 0m never again, nor 1, 2: not admitted
    r = run(sequence(SEQ), 2, "belady")
    assert (r.hits.tolist(), r.misses.tolist(), r.admissions.tolist(), r.evictions.tolist()) == ([4], [4], [3], [1])


def test_static_by_hand():
    # counts 0: 4, 1: 2, 2: 2 -> keeps {0, 1} (the tie to the lower id); 2 is never admitted
    r = run(sequence(SEQ), 2, "static")
    assert (r.hits.tolist(), r.misses.tolist(), r.admissions.tolist(), r.evictions.tolist()) == ([4], [4], [2], [0])
    # a hot set from another trace: expert 2 and 4
    r = run(sequence(SEQ), 2, "static", hot=np.array([[0, 0, 5, 0, 3]]))
    assert (r.hits.tolist(), r.admissions.tolist()) == ([1], [1])


@pytest.mark.parametrize("half_life, hits", [(1.0, 1), (4.0, 2)])
def test_lfru_by_hand(half_life, hits):
    # A A B C A at steps 0..4, two slots. At C (step 3): CRF(A) = 2^-3l + 2^-2l, CRF(B) = 2^-l.
    # l = 1: A 0.375 < B 0.5, A goes and its last request misses; l = 1/4: A 1.30 > B 0.84, B goes, A hits.
    r = run(sequence([0, 0, 1, 2, 0]), 2, "lfru", half_life=half_life)
    assert r.hits.tolist() == [hits]


def test_pool_and_per_layer_by_hand():
    # two layers, one expert each per token: layer 0 asks 0 1 0, layer 1 asks 3 3 3 (interleaved by token)
    t = trace_of([[[0], [3]], [[1], [3]], [[0], [3]]], 4)
    per = run(t, 1, "lru")
    assert per.hits.tolist() == [0, 2]                 # layer 0: 0 1 0 all miss with one slot
    pool = run(t, 2, "lru", per_layer=False)           # requests 0 3 1 3 0 3: 1 evicts 0, 0 evicts 1
    assert (pool.hits.tolist(), pool.misses.tolist()) == ([0, 2], [3, 1])


def test_prompt_chunks_request_each_expert_once():
    # three prompt tokens in one chunk select {0,1} {1,2} {0,2}: one request each for 0, 1, 2; then decode 1
    t = trace_of([[[0, 1]], [[1, 2]], [[2, 0]], [[1, 3]]], 4, prefill=[1, 1, 1, 0])
    a = accesses(t)
    assert (a.keys.tolist(), a.step.tolist()) == ([0, 1, 2, 1, 3], [0, 0, 0, 1, 1])
    assert a.nxt.tolist() == [NEVER, 3, NEVER, NEVER, NEVER]
    # n_batch 2 cuts the prompt after two tokens: {0,1,2} then {0,2}
    assert accesses(t, n_batch=2).keys.tolist() == [0, 1, 2, 0, 2, 1, 3]
    # positions that restart make a new chunk even without n_batch
    t2 = trace_of([[[0, 1]], [[0, 1]]], 4, prefill=[1, 1], positions=[0, 0])
    assert chunks(t2).tolist() == [0, 1]


# -- fast path == plain-Python twin ----------------------------------------------------------------------

@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("per_layer", [True, False])
def test_fast_equals_twin(policy, per_layer):
    for seed in range(4):
        t = random_trace(seed)
        for slots in (0, 1, 3, 8 if per_layer else 20):
            c = ExpertCache("sim:0", slots, policy, per_layer, half_life=3.0)
            a, b = replay(t, c), replay(t, c, fast=False)
            for f in ("hits", "misses", "admissions", "evictions", "cold"):
                assert getattr(a, f).tolist() == getattr(b, f).tolist(), (seed, slots, f)


def test_next_use_and_accesses_twins():
    t = random_trace(7, N=200)
    a, b = accesses(t), accesses(t, fast=False)
    assert a.keys.tolist() == b.keys.tolist() and a.nxt.tolist() == b.nxt.tolist()
    keys = np.random.default_rng(1).integers(0, 9, 500).astype(np.int64)
    assert next_use(keys, 9, NEVER).tolist() == next_use_numpy(keys).tolist()


# -- Belady is optimal -----------------------------------------------------------------------------------

def brute_force_hits(keys: list[int], slots: int) -> int:
    """Most hits any cache of `slots` keys can have on `keys` (on a miss: admit evicting any resident, or not)."""
    @functools.cache
    def best(i: int, cache: frozenset) -> int:
        if i == len(keys):
            return 0
        k = keys[i]
        if k in cache:
            return 1 + best(i + 1, cache)
        options = [best(i + 1, cache)]                                  # not admitted
        if len(cache) < slots:
            options.append(best(i + 1, cache | {k}))
        else:
            options += [best(i + 1, (cache - {v}) | {k}) for v in cache]
        return max(options)
    return best(0, frozenset())


def test_belady_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n, E, slots = int(rng.integers(1, 11)), int(rng.integers(2, 6)), int(rng.integers(1, 4))
        seq = rng.integers(0, E, n).tolist()
        assert run(sequence(seq, E), slots, "belady").hits.sum() == brute_force_hits(seq, slots), (seq, slots)


@pytest.mark.parametrize("per_layer", [True, False])
def test_belady_beats_every_policy(per_layer):
    for seed in range(6):
        t = random_trace(100 + seed, N=120)
        for slots in ((1, 2, 4, 6) if per_layer else (2, 6, 12)):
            best = run(t, slots, "belady", per_layer).hits.sum()
            for p in ("lru", "lfu", "lfru", "static"):
                assert run(t, slots, p, per_layer).hits.sum() <= best, (seed, slots, p)


# -- bad input -------------------------------------------------------------------------------------------

def test_bad_caches_say_what_to_do():
    with pytest.raises(ArgumentError, match="slots"):
        ExpertCache("sim:0", -1)
    with pytest.raises(ArgumentError, match="lru"):
        ExpertCache("sim:0", 4, policy="fifo")
    with pytest.raises(ArgumentError, match="next-router"):
        ExpertCache("sim:0", 4, prefetch="yes")
    with pytest.raises(ArgumentError, match="prefetch=None"):
        ExpertCache("sim:0", 4, "belady", prefetch="next-router")
    with pytest.raises(CacheError, match="ExpertCache"):
        replay(sequence(SEQ), 4)
    with pytest.raises(CacheError, match="same model"):
        run(sequence(SEQ), 2, "static", hot=np.ones((3, 5)))


def test_insert_is_a_prefetch_not_a_request():
    from moert.dynamic.policies import LFU, LRU

    p = LRU(1)
    assert p.insert(3, 0, 0) == (True, -1)                              # brought in before it is asked for
    assert p.access(3, 1, 0, NEVER) == (True, False, -1)                # so the request hits
    assert p.insert(4, 2, 1) == (True, 3)                               # the next prefetch evicts it
    assert p.access(3, 3, 1, NEVER) == (False, True, 4)
    q = LFU(2)
    q.access(1, 0, 0, NEVER), q.access(1, 1, 0, NEVER)                  # 1 asked twice
    assert q.insert(2, 2, 0) == (True, -1) and q.insert(3, 3, 0) == (True, 2)   # 2 and 3 once each: 2 older


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_prefetch_never_overfills_the_cache(policy):
    p = POLICIES[policy](2, frozenset({1, 2})) if policy == "static" else POLICIES[policy](2)
    for t, key in enumerate([1, 2, 3, 4, 1, 5]):
        admitted, evicted = p.insert(key, t, t)
        assert len(p.resident) <= 2 and (not admitted or key in p.resident) and evicted not in p.resident
    if policy == "belady":                       # an inserted key is never asked for again: never worth a slot
        assert p.resident == {1, 2}


@pytest.mark.parametrize("policy", sorted(set(POLICIES) - {"belady"}))      # the optimum takes no prediction
@pytest.mark.parametrize("per_layer", [True, False])
def test_fast_equals_twin_with_prefetch(policy, per_layer):
    from moert.dynamic.requests import accesses, decide

    for seed in range(4):
        t = random_trace(seed)
        rng = np.random.default_rng(seed + 10)
        N, L, _ = t.ids.shape                      # guesses for layers 1.. at random tokens: some right, some wrong
        tok, lay = rng.integers(0, N, 80), rng.integers(1, L, 80)
        t.prefetch = np.stack([tok, lay, rng.integers(0, t.n_expert, 80)], axis=1)
        for slots in (0, 1, 3, 8 if per_layer else 20):
            c = ExpertCache("sim:0", slots, policy, per_layer, half_life=3.0, prefetch="next-router", hot=t)
            a, b = replay(t, c), replay(t, c, fast=False)
            for f in ("hits", "misses", "admissions", "evictions", "prefetch_admissions"):
                assert getattr(a, f).tolist() == getattr(b, f).tolist(), (seed, slots, f)
            acc, counts = accesses(t), c.hot_counts(t) if policy == "static" else None
            rows = moert.dynamic.requests.prefetches(t, c)
            fast, twin = decide(acc, c, counts, rows), decide(acc, c, counts, rows, fast=False)
            for x, y in zip(fast, twin):                # per request and per insert, copies included
                assert np.array_equal(x, y), (seed, slots)
        assert a.prefetch_admissions.sum() > 0 or policy == "static"
