"""The fused one-token layer (moert/fused.py, kernels/decode.py) against its twin, the architecture's Python block:
same logits to 1e-5, same greedy tokens, same routing stats and KV cache (on this machine bit for bit: the same
kernels in the same order); and where it must not run, it does not."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert.demo import demo_model_path
from moert.kvcache import load
from moert.testing import write_qwen3moe

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def greedy(m, fused: bool, steps: int = 24):
    """Greedy decode after an 8-token prompt: the tokens, each step's logits (steps, V), the stats and KV cache."""
    m.fused_decode = fused
    m.reset()
    m.stats.reset()
    logits = m.forward(np.arange(3, 11), last_only=True)
    tokens, out = [], []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        logits = m.forward(np.asarray(tokens[-1:]))
        out.append(logits[-1].copy())
    kv = [(load(k, 0, m.position).copy(), load(v, 0, m.position).copy()) for k, v in zip(m.kv.k, m.kv.v)]
    return tokens, np.array(out), m.stats.decode, kv


def check_twins(m, steps: int = 24):
    t1, l1, s1, kv1 = greedy(m, True, steps)
    t0, l0, s0, kv0 = greedy(m, False, steps)
    assert "layer" in s1.time and not {"attention", "router", "experts"} & set(s1.time)    # the fused step ran
    assert "layer" not in s0.time and "experts" in s0.time                               # the Python block ran
    assert t1 == t0
    np.testing.assert_allclose(l1, l0, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(s1.expert_counts, s0.expert_counts)
    for (k1, v1), (k0, v0) in zip(kv1, kv0):
        np.testing.assert_allclose(k1, k0, rtol=0, atol=1e-5)
        np.testing.assert_allclose(v1, v0, rtol=0, atol=1e-5)


@pytest.mark.parametrize("act_quant, repack, kv", [(None, False, "f16"), (None, False, "f32"), ("int8", False, "f16"),
                                                    ("int8", True, "f32"), ("int16", False, "f16")])
def test_demo_model_fused_equals_block(act_quant, repack, kv):
    """Over a greedy run (each step's x from the KV cache both wrote), f16 (the default) or f32 caches: the router's
    matmul is the block's own NumPy call on both paths, so even x rounded to int8 / int16 comes out the same (bit
    for bit here; a router summed in another order moved x by an ulp, flipped a rounding, and drifted)."""
    check_twins(moert.load(demo_model_path(), gpu_layers=0, context_size=64, progress=False, act_quant=act_quant,
                           repack=repack, cache_type_k=kv, cache_type_v=kv))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Types the fused kernel must bind per layer: F16 q, Q6_K v, Q4_K output, Q4_0 ffn_down (a Q8_0 copy)."""
    return write_qwen3moe(tmp_path_factory.mktemp("f") / "m.gguf", n_layer=2, n_expert=8, n_expert_used=3,
                          types={r"attn_q\.": "F16", r"attn_v": "Q6_K", r"attn_output": "Q4_K", r"ffn_down": "Q4_0"},
                          seed=5, n_embd=256, head_dim=64)


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_mixed_types_fused_equals_block(mixed, kv):
    check_twins(moert.load(mixed, gpu_layers=0, progress=False, cache_type_k=kv, cache_type_v=kv), steps=12)


def test_not_fused_where_the_block_must_run(mixed):
    """A GPU expert layer, a bf16 KV cache, a full trace: the block runs (no "layer" time); a routing-only trace
    keeps the fused step and records the same routing as the block does."""
    m = moert.load(mixed, gpu_backend="sim", gpu_layers=0, overrides=[(r"blk\.1\.ffn_.*_exps", "sim:0")],
                   progress=False)
    m.forward(np.arange(3, 11))
    m.forward(np.asarray([5]))
    assert m.stats.last.layer_time[0].sum() > 0 and "layer" in m.stats.last.time      # layer 0: all on the CPU
    assert m.stats.last.time["experts"].keys() == {"sim:0"}                            # layer 1: the block

    m = moert.load(mixed, gpu_layers=0, cache_type_k="bf16", progress=False)         # a bf16 K cache: the block
    m.forward(np.arange(3, 11))
    m.forward(np.asarray([5]))
    assert "layer" not in m.stats.last.time and "attention" in m.stats.last.time

    traces = []
    for fused, full in ((True, False), (False, False), (True, True)):
        m = moert.load(mixed, gpu_layers=0, progress=False)
        m.fused_decode = fused
        m.trace_start(full=full)
        m.forward(np.arange(3, 11))
        m.forward(np.asarray([5]))
        assert ("layer" in m.stats.last.time) == (fused and not full)
        traces.append(m.trace_stop())
    np.testing.assert_array_equal(traces[0].ids, traces[1].ids)
    np.testing.assert_allclose(traces[0].weights, traces[1].weights, rtol=0, atol=1e-6)


@pytest.mark.parametrize("act_quant, kv", [(None, "f16"), ("int8", "f32")])
def test_fused_on_two_threads_equals_block(monkeypatch, act_quant, kv):
    """Where q/k/v, the output and the experts would each be a parallel region (matmul's threshold set to 0 here, as
    big weights are), the fused step runs those regions on 2 threads (kernels/decode.py layer_kernels_n): the same
    logits, tokens, routing and cache as the block on 2 threads."""
    import numba

    from moert.kernels import matmul
    from moert.models.qwen3moe import FUSED

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    monkeypatch.setattr(matmul, "_PARALLEL_MIN_BYTES", 0)
    m = moert.load(demo_model_path(), gpu_layers=0, threads=2, context_size=64, progress=False, act_quant=act_quant,
                   cache_type_k=kv, cache_type_v=kv, stall_guard=False)
    check_twins(m, steps=12)
    steps = m._fused[FUSED]
    assert all(s.threads(m.position) == 2 and s.halves_n is not None for s in steps if s is not None)
    assert any(s is not None for s in steps)
