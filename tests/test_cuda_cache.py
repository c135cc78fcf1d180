"""The expert cache on a GPU (ExpertCache("cuda:0", ...), gpu_backend="cupy"; the same body on sim:0): the static
placement's logits, runtime counts equal to the replay's, and a mixed plan (--n-cpu-moe 1) caching only the CPU's
experts. The cupy cases skip without a CUDA device (tests/gpu_backends.py); on a machine with a GPU,
`pytest tests/test_cuda_cache.py` checks there what tests/test_dynamic_runtime*.py check on the sim device.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_backends import BACKENDS, GPU

import moert
from moert.dynamic import ExpertCache, cacheable, expert_bytes, replay
from moert.testing import write_tiny

# an f32 KV cache: the logits are compared at 1e-4 (f16, the default, rounds K and V: 3e-4..5e-4 off)
KW = dict(context_size=64, n_batch=4, warmup=False, progress=False, kv=moert.KVConfig("f32", "f32"))
PROMPT = np.array([5, 9, 2, 33, 17, 4, 41, 8, 12, 3, 27])                 # three chunks of n_batch 4
STEPS = (3, 5, 7, 9, 11, 13)


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])
def path(request, tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("cuda_cache") / f"{request.param}.gguf", request.param, seed=3)


def run(m):
    return [m.forward(PROMPT)] + [m.forward(np.array([t])) for t in STEPS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement", [dict(cpu_moe=True), dict(n_cpu_moe=1)])
@pytest.mark.parametrize("slots, policy, prefetch", [(2, "lru", None), (3, "lfu", "next-router")])
def test_cache_logits_and_counts(path, placement, slots, policy, prefetch, backend):
    static = moert.load(path, **KW, **placement, gpu_backend=backend)
    ref = run(static)
    static.close()
    cache = ExpertCache(GPU[backend], slots, policy, prefetch=prefetch)
    m = moert.load(path, **KW, **placement, gpu_backend=backend, expert_cache=cache, trace=True)
    logits = run(m)
    for a, b in zip(ref, logits):                                         # prefill, then each decode step
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    st, r = m.stats.cache, replay(m.trace, cache, plan=m.plan)
    for f in ("hits", "misses", "admissions", "evictions"):
        assert getattr(st, f).tolist() == getattr(r, f).tolist(), f
    assert st.hits.sum() > 0
    mask = cacheable(m.plan, m.config.n_layer, m.config.n_expert)
    assert (st.hits + st.misses)[~mask.any(axis=1)].sum() == 0          # the GPU's own experts never ask
    moved = m.stats.total.transfers[GPU[backend]]
    assert moved.weight_bytes == st.weight_bytes
    if prefetch is None:
        assert st.weight_bytes == int((r.admissions * expert_bytes(path)).sum())
    m.close()
