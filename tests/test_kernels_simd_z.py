"""The 512-bit int8 Q4_K and Q6_K rows (kernels/simd_z.py) against the AVX2 rows and the NumPy twin: the same int32
sums per block (float lanes added in another order), x put in its sub-block order by z_x8 as its twin does, and the
kernel table taking them exactly where the CPU has AVX-512BW.
Skipped on a CPU without it (nothing there can run them)."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_matmul import weight

from moert.kernels import matmul as mm
from moert.kernels import matmul_q as mq
from moert.kernels import simd, simd_z
from moert.quants import dequantize

needs = pytest.mark.skipif(not (simd_z.available() and simd.available()), reason="no AVX-512BW")


def test_table_takes_the_512_bit_rows_where_the_cpu_has_them():
    q4, q6 = (mm.TYPES[t].quant[mq.QMAX[2]] for t in ("Q4_K", "Q6_K"))
    if simd_z.available() and simd.available():
        assert (q4, q6) == ((simd_z.rows8_q4_kz, simd_z.x_q4_kz), (simd_z.rows8_q6_kz, mq.x_q6_k))
    else:
        assert (q4, q6) == ((mq.rows8_q4_k, mq.x_q4_k), (mq.rows8_q6_k, mq.x_q6_k))


def test_order_swaps_the_middle_sub_blocks_of_each_half():
    assert sorted(simd_z.ORDER) == list(range(8))
    assert all(simd_z.ORDER[simd_z.ORDER[k]] == k for k in range(8))       # its own inverse


@needs
def test_z_x8_matches_twin():
    x8 = np.random.default_rng(1).integers(-127, 128, (3, 768), dtype=np.int8)
    got = simd_z.z_x8(x8)
    np.testing.assert_array_equal(got, simd_z.z_x8_ref(x8))
    np.testing.assert_array_equal(got[:, 32:64], x8[:, 64:96])             # sub-block 2 second
    np.testing.assert_array_equal(got[:, 256 + 160:256 + 192], x8[:, 256 + 192:256 + 224])   # 6 at 5


def _assert_rows(got, avx2, w, xq, xd, b0, b1):
    """got (the 512-bit rows) within 1e-5 of sum |w x| of the float64 twin over blocks b0..b1, and within 1e-6 of the
    AVX2 rows (avx2)."""
    W = dequantize(w.raw, w.type, w.shape).astype(np.float64)[:, 256 * b0:256 * b1]
    steps = np.repeat(xd.astype(np.float64), 256, axis=1)[:, 256 * b0:256 * b1]
    xs = xq.astype(np.float64)[:, 256 * b0:256 * b1] * steps                # the values the kernels see
    want, mag = xs @ W.T, np.abs(xs) @ np.abs(W).T
    assert np.all(np.abs(got - want) <= 1e-5 * mag)
    assert np.all(np.abs(got - avx2) <= 1e-6 * mag)


@needs
@pytest.mark.parametrize("T", [1, 2, 4, 7, 8, 9, 15, 16, 64])
@pytest.mark.parametrize("cols, b0, b1", [(768, 0, 3), (1280, 1, 4)])
def test_rows_match_avx2_rows_and_twin(T, cols, b0, b1):
    """Every token count (one call up to 7, then 7 a call and the rest) and a block range, as an expert part reads."""
    w = weight("Q4_K", 19, cols, seed=T)
    rng = np.random.default_rng(cols + T)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 10, cols)).astype(np.float32)
    x[:, b0 * 256:] *= np.float32(3.0)
    raw = mm.raw_rows(w)
    xq, x8, xd, xb = mq.quantize_rows(x, 127)
    got, avx2 = (np.full((T, 19), np.nan, np.float32) for _ in range(2))
    simd_z.rows8_q4_kz(raw, *simd_z.x_q4_kz(xq, x8, xd, xb), got, 0, 19, b0, b1, mm.table("Q4_K"))
    mq.rows8_q4_k(raw, *mq.x_q4_k(xq, x8, xd, xb), avx2, 0, 19, b0, b1, mm.table("Q4_K"))
    _assert_rows(got, avx2, w, xq, xd, b0, b1)


@needs
@pytest.mark.parametrize("T", [1, 3, 7, 8, 16, 64])
@pytest.mark.parametrize("cols, b0, b1", [(768, 0, 3), (1280, 1, 4)])
def test_q6_k_rows_match_avx2_rows_and_twin(T, cols, b0, b1):
    w = weight("Q6_K", 19, cols, seed=T + 1)
    rng = np.random.default_rng(cols - T)
    x = (rng.standard_normal((T, cols)) * rng.uniform(0.01, 10, cols)).astype(np.float32)
    raw = mm.raw_rows(w)
    xq, x8, xd, xb = mq.quantize_rows(x, 127)
    got, avx2 = (np.full((T, 19), np.nan, np.float32) for _ in range(2))
    simd_z.rows8_q6_kz(raw, *mq.x_q6_k(xq, x8, xd, xb), got, 0, 19, b0, b1, mm.table("Q6_K"))
    mq.rows8_q6_k(raw, *mq.x_q6_k(xq, x8, xd, xb), avx2, 0, 19, b0, b1, mm.table("Q6_K"))
    _assert_rows(got, avx2, w, xq, xd, b0, b1)
