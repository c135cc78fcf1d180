"""Fused dequantize-and-dot kernels (kernels/matmul.py) against their NumPy reference twins.

Tolerance: both sides are float32 sums of the same C products in different orders (the kernels in
vector lanes and sub-block partial sums, the reference in BLAS order). Each rounding moves a partial
sum by at most 2^-24 of itself, and every partial sum is bounded by sum_c |w_rc x_tc|, so
|fast - ref| <= C * 2^-24 * sum|w x| in the worst case and about sqrt(C) * 2^-24 * sum|w x| typically
(1.4e-6 for C = 512). We check |fast - ref| <= 1e-5 * sum|w x|: a dequantization slip (a wrong nibble,
scale or sign) moves the result by a whole weight, orders of magnitude more.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from test_quants import random_tensor

from moert.errors import UnsupportedTypeError
from moert.kernels import matmul as mm
from moert.kernels import qblocks, simd
from moert.kernels.qtensor import QTensor
from moert.quants import TYPES, dequantize, quantize

TYPES_UNDER_TEST = ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16", "F32"]
COLS = {"Q4_K": 512, "Q5_K": 768, "Q6_K": 512, "Q8_0": 96, "F16": 100, "BF16": 300, "F32": 77}


def weight(name: str, rows: int, cols: int, seed: int = 0) -> QTensor:
    """Random bytes for block types (any quant values, finite fp16 scales); Gaussian for F16/BF16/F32."""
    rng = np.random.default_rng(seed)
    if name in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
        return QTensor(random_tensor(name, (rows, cols), rng), name, (rows, cols))
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    return QTensor(w if name == "F32" else quantize(w, name), name, (rows, cols))


def assert_close(got: np.ndarray, want: np.ndarray, x: np.ndarray, w: QTensor, rel: float = 1e-5) -> None:
    bound = np.abs(x).reshape(-1, w.shape[1]) @ np.abs(dequantize(w.raw, w.type, w.shape)).T
    err = np.abs(got.reshape(bound.shape) - want.reshape(bound.shape))
    assert np.all(err <= rel * bound + 1e-30), f"max err / bound {np.max(err / (bound + 1e-30)):.3g}"


@pytest.mark.parametrize("name", TYPES_UNDER_TEST)
@pytest.mark.parametrize("T", [1, 2, 3, 9, 17])
def test_matmul_matches_reference(name, T):
    w = weight(name, 37, COLS[name], seed=T)                          # 37 rows: not a multiple of 8
    x = np.random.default_rng(T).standard_normal((T, w.shape[1]), dtype=np.float32)
    got = mm.matmul(x, w)
    assert got.shape == (T, 37) and got.dtype == np.float32
    assert_close(got, mm.matmul_ref(x, w), x, w)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "F16"])
def test_matvec_parallel_equals_serial(name):
    """Large enough for the parallel driver; each row is summed the same way whatever the threads."""
    w = weight(name, 1000, 1024)
    x = np.random.default_rng(1).standard_normal(1024, dtype=np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        serial = mm.matvec(x, w)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        parallel = mm.matvec(x, w)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(serial, parallel)
    assert_close(parallel, mm.matvec_ref(x, w), x, w)
    out = np.empty(1000, np.float32)
    assert mm.matvec(x, w, out=out) is out


@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K", "Q8_0", "BF16"])
@pytest.mark.parametrize("T", [1, 5])
def test_rows_over_a_block_range(name, T):
    """`rows` on rows [3, 20) and blocks [1, 3): the partial products the MoE kernel's down split uses."""
    bs = max(TYPES[name].block_size, 1)
    cols = 4 * bs if bs > 1 else 4 * 64
    w = weight(name, 23, cols)
    x = np.random.default_rng(2).standard_normal((T, cols), dtype=np.float32)
    b0, b1 = (1, 3) if bs > 1 else (64, 192)
    c0, c1 = b0 * bs, b1 * bs
    out = np.full((T, 23), -7.0, np.float32)
    serial, _ = mm.kernels_for(name)
    serial(mm.raw_rows(w), x, out, 3, 20, b0, b1, mm.table(name))
    dense = dequantize(w.raw, w.type, w.shape)
    want = x[:, c0:c1] @ dense[3:20, c0:c1].T
    bound = np.abs(x[:, c0:c1]) @ np.abs(dense[3:20, c0:c1]).T
    assert np.all(np.abs(out[:, 3:20] - want) <= 1e-5 * bound)
    assert np.all(out[:, :3] == -7.0) and np.all(out[:, 20:] == -7.0)


@pytest.mark.parametrize("act_quant", [None, pytest.param("int8", marks=pytest.mark.skipif(not simd.available(),
                                                                                         reason="no AVX2"))])
def test_group_is_three_calls_in_one_region(act_quant):
    """q, k, v in one parallel region (PreparedGroup, mixed types) give each Prepared's numbers (the same row
    kernels, inlined in another function: LLVM may order a batch's float sums differently there)."""
    ws = [weight("Q4_K", 600, 1024, 1), weight("Q4_K", 100, 1024, 2), weight("Q6_K", 100, 1024, 3)]
    g = mm.PreparedGroup(ws, act_quant)
    assert g.kernel is not None and g.bytes >= 1 << 18                      # big enough to go parallel
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        for T in (1, 5):
            x = np.random.default_rng(T).standard_normal((T, 1024), dtype=np.float32)
            for got, p, w in zip(g(x), g.parts, ws):
                assert_close(got, p(x), x, w)
    finally:
        numba.set_num_threads(before)


def test_f16_conversion_is_numpy_bit_for_bit():
    """The vectorizable fp16 -> float32 bit trick on all 65536 patterns: subnormals, inf, NaN payloads."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    buf = np.empty(1 << 16, np.float32)
    qblocks.f16_bits(h.view(np.uint8), 0, 1 << 16, buf)
    np.testing.assert_array_equal(buf.view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))


def test_any_scale_bits_match_reference():
    """Fully random Q4_K bytes, read-only as from a file map: still the reference's numbers."""
    raw = random_tensor("Q4_K", (9, 256), np.random.default_rng(5))
    raw.flags.writeable = False
    w = QTensor(raw, "Q4_K", (9, 256))
    x = np.random.default_rng(6).standard_normal((2, 256), dtype=np.float32)
    assert_close(mm.matmul(x, w), mm.matmul_ref(x, w), x, w)


def test_errors_name_the_problem():
    w = weight("Q4_K", 4, 256)
    with pytest.raises(ValueError, match=r"x \(2, 100\) does not match the weight \(4, 256\)"):
        mm.matmul(np.zeros((2, 100), np.float32), w)
    with pytest.raises(ValueError, match="2-D weight"):
        mm.matmul(np.zeros((1, 256), np.float32), QTensor(w.raw, "Q4_K", (1, 4, 256)))
    with pytest.raises(UnsupportedTypeError, match="Q2_K"):
        mm.matmul(np.zeros((1, 256), np.float32), QTensor(w.raw, "Q2_K", (4, 256)))
    assert mm.matmul(np.zeros((0, 256), np.float32), w).shape == (0, 4)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_one_token_dots_avx512_avx2_and_numba_fallback(name):
    """The table's one-token dot is kernels/simd_f32z.py's (16 lanes) on a CPU with AVX-512F, simd_f32.py's
    on one with AVX2 only, and the Numba loop (kernels/qblocks.py) elsewhere: each the CPU can run, against the
    twin, on random block bytes (any quants, any scales), over 1 to 5 blocks a row."""
    from moert.kernels import simd_f32, simd_f32z
    from moert.kernels.blockdot import sums32
    from moert.kernels.dequant import F16_TO_F32

    n = name.lower()
    fallback, avx2, avx512 = (getattr(mod, f"dot1_{n}") for mod in (qblocks, simd_f32, simd_f32z))
    want_entry = avx512 if simd_f32z.available() and simd.available() else avx2 if simd.available() else fallback
    assert mm.TYPES[name].dot1 is want_entry
    runs = [fallback] + ([avx2] if simd.available() else []) + ([avx512] if simd_f32z.available() else [])
    for cols in (256, 1024, 1280):
        w = weight(name, 29, cols, seed=9 + cols)
        x = (np.random.default_rng(cols).standard_normal(cols) * 3).astype(np.float32)
        xs = sums32(x[None])[0]
        raw, nb = mm.raw_rows(w), cols // 256
        dense = dequantize(w.raw, w.type, w.shape).astype(np.float64)
        want, bound = dense @ x, np.abs(dense) @ np.abs(x.astype(np.float64))
        for fn in runs:
            got = np.array([fn(raw[r], x, xs, nb, F16_TO_F32) for r in range(29)])
            assert np.all(np.abs(got - want) <= 1e-5 * bound), (fn, cols)


def test_mxfp4_one_token_dot_avx512():
    """MXFP4's one-token rows are kernels/simd_f32z.py's (16 lanes, blocks four at a time) on a CPU with AVX-512F,
    mxfp4_avx2.py's on one with AVX2 only: the 16-lane ones against the twin and the AVX2 ones, 1 to 9 rows, 1 to
    13 blocks (the four-block loop and every tail of 0-3), and a block range not starting at 0 (the MoE split)."""
    from moert.kernels import mxfp4, simd_f32z
    from moert.kernels.mxfp4_avx2 import rows1_avx2

    assert mxfp4.rows1 is (simd_f32z.rows1_mxfp4 if simd_f32z.available() and simd.available()
                           else rows1_avx2 if simd.available() else mxfp4.rows1_table)
    if not simd_f32z.available():
        pytest.skip("no AVX-512F on this CPU")
    rng = np.random.default_rng(31)
    for rows, nb, b0 in [(1, 1, 0), (2, 3, 0), (3, 4, 0), (5, 5, 0), (9, 13, 0), (4, 7, 2), (7, 13, 5)]:
        raw = rng.integers(0, 256, (rows, 17 * nb), dtype=np.uint8)
        raw[:, ::17] = rng.integers(100, 140, (rows, nb))                # scales 2^-28 .. 2^11
        x = (rng.standard_normal((1, 32 * nb)) * 3).astype(np.float32)
        got, avx2, want = (np.full((1, rows), np.nan, np.float32) for _ in range(3))
        simd_f32z.rows1_mxfp4(raw, x, got, 0, rows, b0, nb, mxfp4.E8M0_HALF)
        rows1_avx2(raw, x, avx2, 0, rows, b0, nb, mxfp4.E8M0_HALF)
        mxfp4.rows_ref(raw, x, want, 0, rows, b0, nb)
        w = QTensor(np.ascontiguousarray(raw[:, 17 * b0:]), "MXFP4", (rows, 32 * (nb - b0)))
        assert_close(got, want, x[:, 32 * b0:], w)
        assert_close(got, avx2, x[:, 32 * b0:], w)


def test_one_table_entry_per_type_says_which_kernels_it_has():
    """kernels/ktypes.TYPES holds each GGML type once; a type with a dequantize kernel only (Q4_0, Q5_0) is
    refused by the matmul drivers and the fused MoE kernel, which take MATMUL_TYPES."""
    from moert import kernels
    from moert.kernels import ktypes, moe_fused

    assert ktypes.MATMUL_TYPES == {"F32", "F16", "BF16", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"}
    assert kernels.DEQUANT_TYPES == {"F16", "BF16", "Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q5_K", "Q6_K", "MXFP4"}
    assert set(ktypes.TYPES) == ktypes.MATMUL_TYPES | kernels.DEQUANT_TYPES
    rng = np.random.default_rng(0)
    w = QTensor(quantize(rng.standard_normal((4, 64), dtype=np.float32), "Q5_0"), "Q5_0", (4, 64))
    with pytest.raises(UnsupportedTypeError, match="Q5_0"):
        mm.matmul(np.zeros((1, 64), np.float32), w)
    e = QTensor(quantize(rng.standard_normal((2, 64, 64), dtype=np.float32), "Q5_0"), "Q5_0", (2, 64, 64))
    assert not moe_fused.supports(e, e, e)
