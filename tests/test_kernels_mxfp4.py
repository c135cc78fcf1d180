"""MXFP4 kernels (kernels/mxfp4.py) against their NumPy twins and gguf-py: dequantization bit for bit, the
fused row dots (float and int8 activations) to float32 reordering, and the fused MoE layer on MXFP4 experts
with gpt-oss's clamped SwiGLU and biases. Tolerances as in test_kernels_matmul.py."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from test_kernels_matmul import assert_close
from test_quants import assert_bits_equal, oracle, random_tensor

from moert import kernels
from moert.kernels import matmul as mm
from moert.kernels import moe_fused as mf
from moert.kernels import mxfp4 as mx
from moert.kernels import simd
from moert.kernels.moe import moe_ffn
from moert.kernels.qtensor import QTensor
from moert.quants import dequantize, quantize
from moert.quants.dequant import e8m0_half

VARIANTS = ["table", "avx2"] if simd.available() else ["table"]     # the AVX2 one is what runs, where it can


def variant(name: str, kind: str = ""):
    return getattr(mx, f"rows{kind}_{name}")


def weight(rows: int, cols: int, seed: int = 0) -> QTensor:
    """Random MXFP4 bytes (any code, scales 2^-28 .. 2^11), (rows, cols)."""
    rng = np.random.default_rng(seed)
    raw = random_tensor("MXFP4", (rows, cols), rng)
    raw.reshape(-1, 17)[:, 0] = rng.integers(100, 140, raw.size // 17)
    return QTensor(raw, "MXFP4", (rows, cols))


def test_e8m0_table_and_every_exponent():
    """Every E8M0 byte (0, 1: subnormal halves; 255: 2^127) with every code, bit for bit as gguf-py."""
    assert_bits_equal(mx.E8M0_HALF, e8m0_half(np, np.arange(256, dtype=np.uint8)))
    raw = np.zeros((256, 17), np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = (np.arange(16) * 17).astype(np.uint8)                  # every code, low and high nibble
    with np.errstate(over="ignore"):
        want = oracle(raw, "MXFP4", (256, 32))
        got = kernels.dequantize(raw, "MXFP4", (256, 32))
        assert_bits_equal(mx.dequant_ref(raw).reshape(256, 32), want)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("T", [1, 3, 17])
def test_matmul_matches_reference(T):
    w = weight(37, 320, seed=T)                                         # 37 rows, 10 blocks: odd sizes
    x = np.random.default_rng(T).standard_normal((T, 320), dtype=np.float32)
    got = mm.matmul(x, w)
    assert got.shape == (T, 37) and got.dtype == np.float32
    assert_close(got, mm.matmul_ref(x, w), x, w)


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("T", [1, 2, 3, 5])
def test_rows_over_a_block_range(T, kind):
    """Rows [3, 20), blocks [1, 11) of 12: the partial products the MoE kernel's down split uses; 1-5 tokens
    (the AVX2 kernels take them 4, 3, 2 and 1 at a time)."""
    w = weight(23, 384)
    x = np.random.default_rng(2).standard_normal((T, 384), dtype=np.float32)
    got = np.full((T, 23), np.nan, np.float32)
    want = got.copy()
    variant(kind, "1" if T == 1 else "")(w.raw, x, got, 3, 20, 1, 11, mx.E8M0_HALF)
    mx.rows_ref(w.raw, x, want, 3, 20, 1, 11)
    assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 20:]).all()
    sub = QTensor(w.raw[3:20, 17:187], "MXFP4", (17, 320))
    assert_close(got[:, 3:20], want[:, 3:20], x[:, 32:352], sub)


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("T", [1, 3, 6])
def test_int8_activations(T, kind):
    """x rounded to int8 per 32 (llama.cpp's Q8_0 for MXFP4): the quantizer as its twin, bit for bit; the dot as
    the exact dot of the rounded values; and within the rounding bound of the float result."""
    w = weight(29, 256, seed=3)
    x = np.random.default_rng(4).standard_normal((T, 256), dtype=np.float32)
    x8, xd = mx.quantize_q8(x)
    r8, rd = mx.quantize_q8_ref(x)
    np.testing.assert_array_equal(x8, r8)
    assert_bits_equal(xd, rd)
    got, want = np.empty((T, 29), np.float32), np.empty((T, 29), np.float32)
    variant(kind, "_q8")(w.raw, x8, xd, got, 0, 29, 0, 8, mx.E8M0_HALF)
    mx.rows_q8_ref(w.raw, x8, xd, want, 0, 29, 0, 8)
    assert_close(got, want, x, w)
    W = np.abs(dequantize(w.raw, "MXFP4", w.shape))
    bound = (np.repeat(xd, 32, axis=1) / 2) @ W.T                      # each x moves by at most step / 2
    assert np.all(np.abs(got - mm.matmul_ref(x, w)) <= bound * 1.001 + 1e-6 * (np.abs(x) @ W.T))


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("T", [1, 2, 3, 5])
def test_int8_rows_over_a_block_range(T, kind):
    """The int8 rows on rows [3, 20), blocks [1, 10) of 12 (the MoE down split's partial products; an odd count,
    so the AVX2 loop's block pairs end in a single one): the AVX2 kernel's x block sums (its unsigned-weight
    offset) must be those of the blocks it reads."""
    w = weight(23, 384, seed=5)
    x = np.random.default_rng(6).standard_normal((T, 384), dtype=np.float32)
    x8, xd = mx.quantize_q8(x)
    got = np.full((T, 23), np.nan, np.float32)
    want = got.copy()
    variant(kind, "_q8")(w.raw, x8, xd, got, 3, 20, 1, 10, mx.E8M0_HALF)
    mx.rows_q8_ref(w.raw, x8, xd, want, 3, 20, 1, 10)
    assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 20:]).all()
    xf = (x8.astype(np.float32) * np.repeat(xd, 32, axis=1))[:, 32:320]
    assert_close(got[:, 3:20], want[:, 3:20], xf, QTensor(w.raw[3:20, 17:170], "MXFP4", (17, 288)))


@pytest.mark.parametrize("act_quant", [None, "int8"] if simd.available() else [None])
def test_parallel_equals_serial(act_quant):
    """matmul.Prepared on an MXFP4 weight (float, and int8 x per 32), one thread and two: the same bits."""
    w = weight(1000, 1024)                                              # 544 kB: the parallel driver
    assert w.raw.nbytes >= mm._PARALLEL_MIN_BYTES
    x = np.random.default_rng(1).standard_normal((1, 1024), dtype=np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        serial = mm.Prepared(w, act_quant)(x)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        parallel = mm.Prepared(w, act_quant)(x)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(serial, parallel)
    want = np.empty_like(serial)
    if act_quant:
        mx.rows_q8_ref(w.raw, *mx.quantize_q8_ref(x), want, 0, 1000, 0, 32)
    else:
        mx.rows_ref(w.raw, x, want, 0, 1000, 0, 32)
    assert_close(serial, want, x, w)


@pytest.mark.parametrize("T", [1, 6])
def test_fused_moe_layer_on_mxfp4_experts(T):
    """gpt-oss's layer: MXFP4 gate/up/down, the clamped SwiGLU, per-expert biases; fused kernel, the per-expert
    CPU path and the twin agree (gates scaled so the clamps at +-7 are reached); with act_quant="int8" (x and
    the hidden units rounded to int8 per 32) within a few per cent of the float result."""
    E, F, D, K = 4, 96, 64, 2
    rng = np.random.default_rng(T)

    def one(shape):
        return QTensor(quantize(rng.standard_normal(shape, dtype=np.float32) * 0.1, "MXFP4"), "MXFP4", shape)
    gate, up, down = one((E, F, D)), one((E, F, D)), one((E, D, F))
    x = rng.standard_normal((T, D), dtype=np.float32) * 8
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    w = rng.random((T, K), dtype=np.float32)
    b = tuple(rng.standard_normal(s, dtype=np.float32) for s in ((E, F), (E, F), (E, D)))
    want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down, act="swiglu_oai", biases=b)
    got = mf.moe_ffn_fused(x, ids, w, gate, up, down, act="swiglu_oai", biases=b)
    slow = moe_ffn(x, ids, w, gate, up, down, act="swiglu_oai", biases=b)
    tol = 2e-5 * (np.abs(want).max() + 1)
    assert np.abs(got - want).max() <= tol and np.abs(slow - want).max() <= tol
    assert mf.supports(gate, up, down)
    if simd.available():
        q = mf.PreparedExperts(gate, up, down, act_quant="int8", act="swiglu_oai", biases=b)(x, ids, w)
        err = np.linalg.norm(q - want) / np.linalg.norm(want)
        assert 1e-5 < err < 3e-2, err                                   # rounded, and not by much
