"""The fused MoE layer kernel (kernels/moe_fused.py) against its reference twin and kernels.moe.moe_ffn.

Tolerance as in test_kernels_matmul.py, one level deeper: the hidden activations h carry the gate/up
float32 reordering error (about 1e-6 relative) into the down projection, and the router-weighted sum
adds K terms. Outputs are compared as |fast - ref| <= 1e-4 * (scale of the output), where the scale is
the weighted sum of |down| @ |h| over the selected experts: a bound on every partial sum involved.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from test_quants import random_tensor

from moert.kernels import moe_fused as mf
from moert.kernels.moe import group_by_expert, group_by_expert_ref, moe_ffn
from moert.kernels.qtensor import QTensor
from moert.quants import dequantize, quantize


def experts(gate_type: str, down_type: str, E: int, F: int, D: int, seed: int = 0):
    """gate, up (E, F, D) and down (E, D, F) with small Gaussian weights (quantized)."""
    rng = np.random.default_rng(seed)

    def one(shape, t):
        w = (rng.standard_normal(shape, dtype=np.float32) * 0.05).astype(np.float32)
        return QTensor(w if t == "F32" else quantize(w, t), t, shape)
    return one((E, F, D), gate_type), one((E, F, D), gate_type), one((E, D, F), down_type)


def routing(T: int, E: int, K: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    w = rng.random((T, K), dtype=np.float32)
    return ids, w / w.sum(1, keepdims=True)


def scale(x, ids, weights, gate, up, down) -> np.ndarray:
    """(T, 1): sum_k w * max over D of |down_e| @ |h_e| -- a bound on the output's partial sums."""
    out = np.zeros((x.shape[0], 1), np.float32)
    for t in range(x.shape[0]):
        for k, e in enumerate(ids[t]):
            g, u, d = (dequantize(q.raw.reshape(q.shape[0], -1)[e], q.type, q.shape[1:]) for q in (gate, up, down))
            h = np.abs(x[t] @ g.T) * np.abs(x[t] @ u.T)
            out[t] += weights[t, k] * np.max(np.abs(d) @ h)
    return out


@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("Q5_K", "Q8_0"), ("F16", "BF16"), ("F32", "F32")])
@pytest.mark.parametrize("T", [1, 3, 17])
def test_fused_matches_reference(types, T):
    E, F, D, K = 5, 512, 256, 3
    gate, up, down = experts(*types, E, F, D, seed=T)
    x = np.random.default_rng(T).standard_normal((T, D), dtype=np.float32)
    ids, w = routing(T, E, K, seed=T)
    got = mf.moe_ffn_fused(x, ids, w, gate, up, down)
    want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)
    assert got.shape == (T, D) and got.dtype == np.float32
    tol = 1e-4 * scale(x, ids, w, gate, up, down)
    assert np.all(np.abs(got - want) <= tol)
    assert np.all(np.abs(got - moe_ffn(x, ids, w, gate, up, down)) <= tol)  # the existing CPU path agrees


@pytest.mark.parametrize("act", ["swiglu", "geglu", "swiglu_oai"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_activations_and_biases_match_the_twin(act, with_bias):
    """The expert executor takes the semantics (mlx-lm's SwitchGLU(activation=, bias=)): the fused kernel,
    the per-expert CPU path and the twin agree for every activation, with and without per-expert biases.
    Gates are scaled up so swiglu_oai's clamps at +-7 are reached."""
    E, F, D, K, T = 6, 512, 256, 2, 9
    gate, up, down = experts("Q8_0", "Q4_K", E, F, D, seed=4)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, D), dtype=np.float32) * 8
    ids, w = routing(T, E, K, seed=5)
    b = (tuple(rng.standard_normal(s, dtype=np.float32) for s in ((E, F), (E, F), (E, D))) if with_bias else None)
    want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down, act=act, biases=b)
    got = mf.moe_ffn_fused(x, ids, w, gate, up, down, act=act, biases=b)
    slow = moe_ffn(x, ids, w, gate, up, down, act=act, biases=b)
    tol = 2e-4 * (np.abs(want).max() + 1)
    assert np.abs(got - want).max() <= tol and np.abs(slow - want).max() <= tol
    if act == "swiglu_oai":      # the clamps matter on these inputs: without them the result differs
        assert np.abs(mf.moe_ffn_fused_ref(x, ids, w, gate, up, down, act="swiglu", biases=b) - want).max() > 10 * tol
    skip = ids.copy()
    skip[::2, 0] = -1                                                   # slots another device runs
    np.testing.assert_allclose(mf.moe_ffn_fused(x, skip, w, gate, up, down, act=act, biases=b),
                               mf.moe_ffn_fused_ref(x, skip, w, gate, up, down, act=act, biases=b), atol=tol, rtol=0)


def test_glu_definitions():
    """moert.activations.glu against the formulas written out (llama.cpp ggml_swiglu_oai for gpt-oss)."""
    from moert.activations import glu

    g = np.array([-9.0, -1.0, 0.5, 3.0, 8.0], np.float32)
    u = np.array([-8.0, 2.0, -0.5, 1.0, 9.0], np.float32)
    sig = lambda v: 1 / (1 + np.exp(-v.astype(np.float64)))
    np.testing.assert_allclose(glu(g, u, "swiglu"), g * sig(g) * u, rtol=1e-5, atol=1e-6)   # float32 tanh
    gelu = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    np.testing.assert_allclose(glu(g, u, "geglu"), gelu * u, rtol=1e-5, atol=1e-6)
    gc, uc = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
    np.testing.assert_allclose(glu(g, u, "swiglu_oai"), gc * sig(1.702 * gc) * (uc + 1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown activation 'relu'"):
        glu(g, u, "relu")


def test_random_bytes_and_odd_sizes():
    """Fully random Q4_K/Q6_K bytes (any quant values, finite scales), F = 768 (3 down blocks), 17 tokens."""
    rng = np.random.default_rng(9)
    E, F, D, K, T = 4, 768, 256, 2, 17
    gate = QTensor(random_tensor("Q4_K", (E, F, D), rng).reshape(E, F, -1), "Q4_K", (E, F, D))
    up = QTensor(random_tensor("Q4_K", (E, F, D), rng).reshape(E, F, -1), "Q4_K", (E, F, D))
    down = QTensor(random_tensor("Q6_K", (E, D, F), rng).reshape(E, D, -1), "Q6_K", (E, D, F))
    x = rng.standard_normal((T, D), dtype=np.float32) * np.float32(1e-3)
    ids, w = routing(T, E, K, seed=3)
    with np.errstate(over="ignore", invalid="ignore"):
        got = mf.moe_ffn_fused(x, ids, w, gate, up, down)
        want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)
        tol = 1e-4 * scale(x, ids, w, gate, up, down)
    assert np.all(np.isfinite(want)) and np.all(np.abs(got - want) <= tol)


def test_same_result_for_any_threads_and_parts():
    """Items are summed the same way wherever they run (one thread takes the serial kernel, two the parallel
    one: the same results, bit for bit); parts split the down product exactly."""
    E, F, D, K, T = 8, 768, 256, 2, 3
    gate, up, down = experts("Q4_K", "Q6_K", E, F, D)
    x = np.random.default_rng(1).standard_normal((T, D), dtype=np.float32)
    ids, w = routing(T, E, K)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = mf.moe_ffn_fused(x, ids, w, gate, up, down)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two = mf.moe_ffn_fused(x, ids, w, gate, up, down)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, two)
    assert mf.parts_for(8, 3, 2) == 1 and mf.parts_for(8, 3, 16) == 3 and mf.parts_for(1, 3, 2) == 3
    args = [a for t in (gate, up, down) for a in (mf._raw3(t), mf.table(t.type))]
    kernel = mf.layer_kernel(gate.type, down.type)
    none = np.zeros((0, 0), np.float32)                                 # no biases
    split = kernel(x, ids, w, *args, D // 256, 3, 256, 3, 0, none, none, none, 2)   # 3 parts of 256 hidden units
    tol = 1e-4 * scale(x, ids, w, gate, up, down)
    assert np.all(np.abs(split - one) <= tol)


def test_errors():
    gate, up, down = experts("Q4_K", "Q6_K", 2, 256, 256)
    x, (ids, w) = np.zeros((1, 256), np.float32), routing(1, 2, 1)
    with pytest.raises(ValueError, match="expert shapes do not fit"):
        mf.moe_ffn_fused(x, ids, w, gate, up, QTensor(down.raw, "Q6_K", (2, 256, 512)))
    with pytest.raises(ValueError, match="gate is Q4_K but up is Q6_K"):
        mf.moe_ffn_fused(x, ids, w, gate, QTensor(down.raw, "Q6_K", (2, 256, 256)), down)
    assert mf.moe_ffn_fused(np.zeros((0, 256), np.float32), ids[:0], w[:0], gate, up, down).shape == (0, 256)


def test_every_compiled_variant_has_a_name_of_its_own():
    """Per-type closures share one code object; under one name, two variants compiled first in two processes
    collided when a third loaded both from the disk cache ("NRT_adapt_ndarray_to_python: descr is NULL",
    found by the semantic fuzzer). Each variant now has its own name, hence its own cache file and symbols."""
    from moert.kernels import matmul as mm

    names = {mf.layer_kernel(a, b, q).py_func.__qualname__
             for a, b, q in (("Q8_0", "Q8_0", 0), ("Q4_K", "Q6_K", 0), ("Q4_K", "Q6_K", 2))}
    names |= {f.py_func.__qualname__ for t in ("Q8_0", "Q4_K") for f in mm.kernels_for(t, 0)}
    names |= {mm.TYPES[t].rows.py_func.__qualname__ for t in ("Q8_0", "Q4_K")}
    assert len(names) == 9 and all("<locals>" not in n for n in names)


@pytest.mark.parametrize("T,K,E", [(1, 2, 4), (7, 3, 16), (64, 8, 128)])
def test_group_by_expert_matches_its_twin(T, K, E):
    """The counting sort both MoE kernels group tokens with, against kernels.moe.group_by_expert_ref: -1 slots
    (experts of another device) skipped, stable within an expert."""
    rng = np.random.default_rng(T * K)
    ids = rng.integers(-1, E, size=(T, K)).astype(np.int32)
    offsets, slots = group_by_expert(ids, E)
    ref_offsets, ref_slots = group_by_expert_ref(ids, E)
    assert np.array_equal(offsets, ref_offsets) and np.array_equal(slots, ref_slots)
    assert offsets[-1] == np.count_nonzero(ids >= 0)


def test_tanh_fast_matches_its_twin_and_tanh():
    """kernels/glu.py's rational tanh: the Numba copy equals its NumPy twin to a float32 rounding or two
    (FMA contraction), both stay within 4e-7 of float64 tanh, from 0 through the clamp to huge |x|."""
    from numba import njit

    from moert.kernels.glu import TANH_CLAMP, tanh_fast, tanh_fast_ref

    @njit
    def each(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = tanh_fast(x[i])
        return out

    x = np.concatenate([np.linspace(-12, 12, 200001, dtype=np.float32),
                        np.float32([0, 1e-6, -3e-4, 4e-4, TANH_CLAMP, 9, -1e4, 3e38])])
    exact = np.tanh(x.astype(np.float64))
    got, ref = each(x), tanh_fast_ref(x)
    assert np.abs(got - ref).max() <= 2.5e-7
    assert np.abs(got - exact).max() <= 4e-7 and np.abs(ref - exact).max() <= 4e-7
    assert got[x == 0][0] == 0 and got[-1] == 1 and got[-2] == -1


@pytest.mark.parametrize("act", [0, 1, 2])
def test_act_mul_matches_glu(act):
    """kernels/glu.py's act_mul (vector loops, tanh_fast) against moert.activations.glu (np.tanh) on a part's
    columns [f0, f1), with per-expert biases; columns outside the part are left alone."""
    from moert.activations import ACTS, glu
    from moert.kernels.glu import act_mul

    rng = np.random.default_rng(act)
    g, u = (rng.standard_normal((5, 96), dtype=np.float32) * 6 for _ in range(2))
    gb, ub = (rng.standard_normal((3, 96), dtype=np.float32) for _ in range(2))
    want = glu(g[:, 32:64] + gb[2, 32:64], u[:, 32:64] + ub[2, 32:64], ACTS[act])
    got = g.copy()
    act_mul(got, u.copy(), 32, 64, act, gb, ub, 2)
    np.testing.assert_allclose(got[:, 32:64], want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
    assert np.array_equal(got[:, :32], g[:, :32]) and np.array_equal(got[:, 64:], g[:, 64:])
