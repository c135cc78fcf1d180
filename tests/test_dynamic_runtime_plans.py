"""The expert cache beside experts the plan keeps on a GPU (--n-cpu-moe N: only the CPU's experts are cached,
the GPU's are no requests), and a forward that fails leaving the cache, its stats and the trace as they were."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert.dynamic import ExpertCache, cacheable, replay
from moert.placement.rules import EXPERT_REGEX, TensorOverride, expert_layer_regex
from moert.testing import write_tiny

KW = dict(gpu_backend="sim", context_size=64, n_batch=4, warmup=False)
PROMPT = np.array([5, 9, 2, 33, 17, 4, 41, 8, 12, 3, 27])                 # three chunks of n_batch 4
STEPS = (3, 5, 7, 9, 11, 13)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("plans") / "q.gguf", "qwen3moe", seed=3)


def run(m):
    return [m.forward(PROMPT)] + [m.forward(np.array([t])) for t in STEPS]


SPLIT = [TensorOverride(expert_layer_regex(0), "sim:0", experts=[0, 1, 2, 3]), TensorOverride(EXPERT_REGEX, "cpu")]
PLACEMENTS = {"--n-cpu-moe 1": (dict(n_cpu_moe=1), [[True] * 8, [False] * 8]),
              "layer 0's experts 0-3 on the GPU": (dict(overrides=SPLIT), [[False] * 4 + [True] * 4, [True] * 8])}


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("prefetch", [None, "next-router"])
def test_a_mixed_plan_caches_only_the_cpu_experts(path, placement, prefetch):
    where, cpu = PLACEMENTS[placement]
    static = moert.load(path, **where, **KW)
    ref = run(static)
    static.close()
    cache = ExpertCache("sim:0", 2, "lru", prefetch=prefetch)
    m = moert.load(path, **where, **KW, expert_cache=cache, trace=True)
    logits = run(m)
    for a, b in zip(ref, logits):
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    mask = cacheable(m.plan, m.config.n_layer, m.config.n_expert)
    assert mask.tolist() == cpu                                          # the experts the plan put on the CPU
    st, ids = m.stats.cache, m.trace.ids
    for il in range(m.config.n_layer):                                   # a request per chunk of each CPU expert
        assert st.hits[il] + st.misses[il] <= np.isin(ids[:, il], np.flatnonzero(mask[il])).sum()
    assert (st.hits + st.misses)[~mask.any(axis=1)].sum() == 0 and st.misses.sum() > 0
    r = replay(m.trace, cache, plan=m.plan)
    for f in ("hits", "misses", "admissions", "evictions"):
        assert getattr(st, f).tolist() == getattr(r, f).tolist(), f
    assert replay(m.trace, cache).misses.sum() > st.misses.sum()         # without the plan: the GPU's ask too
    assert m.stats.total.time["experts"].get("sim:0", 0) > 0             # the GPU's own experts ran there
    m.close()


def state(m):
    c = m.expert_cache
    return ([p.state() for p in c.policies], sorted(c.resident), c.t, c.step, c.prefetch_log,
            {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in vars(m.stats.cache).items()},
            sorted(a for a in c.dev.allocations() if a[0].startswith("expert cache")),   # the copies held there
            m.position, m.trace.ids.tolist(), m.trace.prefetch.tolist())


@pytest.mark.parametrize("policy, per_layer", [("lfu", True), ("lru", False)])
def test_a_failed_forward_leaves_the_cache_as_it_was(path, policy, per_layer):
    cache = ExpertCache("sim:0", 2, policy, per_layer, prefetch="next-router")
    a = moert.load(path, cpu_moe=True, **KW, expert_cache=cache, trace=True)
    want = run(a)
    b = moert.load(path, cpu_moe=True, **KW, expert_cache=cache, trace=True)
    got = [b.forward(PROMPT)]
    before, calls = state(b), []
    real = b.expert_cache.run

    def failing(m, il, *args):                        # the second chunk's last layer raises
        calls.append(il)
        if len(calls) == 2 * m.config.n_layer:
            raise RuntimeError("a layer failed")
        return real(m, il, *args)
    b.expert_cache.run = failing
    with pytest.raises(RuntimeError, match="a layer failed"):
        b.forward(PROMPT[:8])                                               # two chunks: the first one completes
    del b.expert_cache.run
    assert len(calls) == 2 * b.config.n_layer
    assert state(b) == before
    got += [b.forward(np.array([t])) for t in STEPS]
    for x, y in zip(want, got):
        assert np.array_equal(x, y)
    assert state(b) == state(a)
    a.close()
    b.close()
