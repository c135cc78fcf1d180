"""MXFP4 (gpt-oss's experts) on the CPU: dequantization and fused dequantize-and-dot row kernels.

    dequant(blocks, y, e8m0)                   (n, 17) uint8 blocks -> (n, 32) float32, bit-exact with ggml
    rows1(w, x, out, r0, r1, b0, b1, e8m0)     out[0, r] = row r . x for ONE token (decode)
    rows(w, x, out, r0, r1, b0, b1, e8m0)      out[t, r] for a batch (prefill, an expert's tokens)
    rows_q8(w, x8, xd, out, r0, r1, b0, b1, e8m0)   the same with x rounded to int8 per 32 (llama.cpp's Q8_0;
                                               act_quant="int8" in the fused MoE layer)
    quantize_q8(x)                             x (T, C) -> x8 (T, C) int8, xd (T, C/32) float32 steps
    dequant_ref, rows_ref, rows_q8_ref, quantize_q8_ref   the NumPy twins (moert/quants/dequant.py underneath)

rows1, rows and rows_q8 are the AVX2 variants (kernels/mxfp4_avx2.py: pshufb decode, LLVM IR as simd.py) on a CPU
with AVX2, else the portable Numba ones (`*_table`); rows1 is kernels/simd_f32z.py's 16-lane one where the CPU
also has AVX-512F; tests compare each with the twins. x (and x8, xd) must be
C-contiguous, as every caller's is: the AVX2 variants read them at flat offsets (and refuse other layouts).

Block layout (moert/quants/dequant.py draws it too):

    | e u8 (E8M0) | qs[16]: nibble codes, weight j low nibble of qs[j], weight j+16 the high nibble |
    0             1                                                                                17
    w = 2^(e-128) * v(code), v = 2 * E2M1: (0, 1, 2, 3, 4, 6, 8, 12, then the same negated)

The scale is a table lookup (`E8M0_HALF`, 256 entries filled by the NumPy reference, as the fp16 table of
kernels/dequant.py). In the portable kernels the value is one in a 16-entry table on the stack (`_table`):
LLVM does not vectorize that lookup. Measured on a 4096 x 4096 matvec, one thread: the stack table 0.6-1.2
GB/s, the value computed with shifts and selects 0.70, a block dequantized to the stack first 0.85, the
AVX2 pshufb decode 4.9 (Q4_K's float kernel: 2.2-2.6 in the same runs).

The row kernels take the same arguments as kernels/matmul.py's, with the E8M0 table where those take the
fp16 table; `rows_entry` is MXFP4's row kernel in the kernel table (kernels/ktypes.py, the MXFP4 entry at the
end of this file), so the drivers, the q/k/v group kernel and the fused MoE layer take MXFP4 as any type; its
int8 mode rounds x per 32 (`quantize_q8`, `rows_q8`), which the table names as `q8_32`.
Integers are explicit int32 (Numba widens to int64 otherwise: half the lanes).

Dimension legend: T tokens, R rows, C columns, B = C / 32 blocks per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from moert.kernels import simd, simd_f32z
from moert.kernels.blockdot import I32, PRANGE_ONLY, Z0, block_dot2, stack_f32
from moert.kernels.jit import variant
from moert.kernels.mxfp4_avx2 import rows1_avx2, rows_avx2, rows_q8_avx2
from moert.quants.dequant import MXFP4_VALUES, e8m0_half

__all__ = ["E8M0_HALF", "dequant", "dequant_ref", "make_drivers", "quantize_q8", "quantize_q8_ref", "rows", "rows1",
           "rows_q8", "rows_q8_ref", "rows_ref"]

# Every E8M0 byte -> 2^(e-128) as float32 (ggml_e8m0_to_fp32_half), computed by the NumPy reference.
E8M0_HALF = e8m0_half(np, np.arange(256, dtype=np.uint8))
_FM = {"reassoc", "contract"}


_VALUES = np.array(MXFP4_VALUES, dtype=np.float32)
_IVALUES = np.array(MXFP4_VALUES, dtype=np.int32)


@njit(cache=True, inline="always")
def _table():
    """MXFP4_VALUES as a float32 array on the caller's stack (a gather-free lookup LLVM keeps in cache)."""
    k = stack_f32(16)
    for i in range(16):
        k[i] = _VALUES[i]
    return k


# ------------------------------------------------------------------------------------ dequantization

@njit(parallel=PRANGE_ONLY, cache=True, fastmath=False)
def dequant(blocks, y, e8m0):
    """y[i] = the 32 weights of block i; blocks (n, 17) uint8, y (n, 32) float32, e8m0 = E8M0_HALF. Bit for bit
    ggml's dequantize_row_mxfp4: d * value is one exact float32 product."""
    for i in prange(blocks.shape[0]):
        b, w = blocks[i], y[i]
        d = e8m0[b[0]]
        for j in range(16):
            q = I32(b[1 + j])
            w[j] = d * _VALUES[q & 15]
            w[j + 16] = d * _VALUES[q >> 4]


def dequant_ref(blocks: np.ndarray) -> np.ndarray:
    """Twin of dequant: moert/quants/dequant.py's dequant_mxfp4, (n, 17) -> (n, 32)."""
    from moert.quants.dequant import dequant_mxfp4

    return dequant_mxfp4(np.ascontiguousarray(blocks), np)


# ------------------------------------------------------------------------------------ float rows

@njit(cache=True, fastmath=_FM)
def _dot1(w, x, nb, e8m0):
    """w . x for nb blocks: w (nb*17,) uint8 one row's bytes, x (nb*32,) float32. 32 lanes of accumulators on
    the stack (kept in vector registers), one horizontal sum at the end."""
    k = _table()
    acc = stack_f32(32)
    for l in range(32):
        acc[l] = 0.0
    for b in range(nb):
        o, c = b * 17, b * 32
        d = e8m0[w[o]]
        for l in range(16):
            q = I32(w[o + 1 + l])
            acc[l] += d * (k[q & 15] * x[c + l])
            acc[16 + l] += d * (k[q >> 4] * x[c + 16 + l])
    s = np.float32(0.0)
    for l in range(32):
        s += acc[l]
    return s


@njit(cache=True, fastmath=_FM, inline="always")
def _deq8(w, b, n, buf, e8m0):
    """Blocks b .. b+n-1 (n <= 8) of a row into buf[:32 n]."""
    k = _table()
    for j in range(n):
        o = (b + j) * 17
        d = e8m0[w[o]]
        for l in range(16):
            q = I32(w[o + 1 + l])
            buf[32 * j + l] = d * k[q & 15]
            buf[32 * j + 16 + l] = d * k[q >> 4]


@njit(cache=True, fastmath=_FM)
def rows1_table(w, x, out, r0, r1, b0, b1, e8m0):
    """out[0, r] = sum over blocks [b0, b1) of row r of w times x[0] (same columns), r in [r0, r1). w (R, B*17)
    uint8 raw rows, x (1, C) float32, out (1, >= r1)."""
    xv = x[0, 32 * b0:32 * b1]
    for r in range(r0, r1):
        out[0, r] = _dot1(w[r, 17 * b0:17 * b1], xv, b1 - b0, e8m0)


@njit(cache=True, fastmath=_FM)
def rows_table(w, x, out, r0, r1, b0, b1, e8m0):
    """out[t, r] for every token t of x (T, C), as rows1_table: two rows at a time, each 8-block (256-weight) run
    dequantized into a stack buffer and multiplied with every token (blockdot.block_dot2: each load of x feeds
    both rows)."""
    acc0 = np.empty(x.shape[0], dtype=np.float32)
    acc1 = np.empty(x.shape[0], dtype=np.float32)
    u = stack_f32(256)
    v = stack_f32(256)
    for r in range(r0, r1, 2):                          # rows in pairs; an odd last row pairs with itself
        r2 = min(r + 1, r1 - 1)
        acc0[:] = 0.0
        acc1[:] = 0.0
        w0, w1 = w[r], w[r2]
        for b in range(b0, b1, 8):
            n = min(8, b1 - b)
            _deq8(w0, b, n, u, e8m0)
            _deq8(w1, b, n, v, e8m0)
            block_dot2(u, v, 32 * n, x, 32 * b, acc0, acc1)
        out[:, r] = acc0
        out[:, r2] = acc1


def rows_ref(w: np.ndarray, x: np.ndarray, out: np.ndarray, r0: int, r1: int, b0: int, b1: int) -> None:
    """Twin of rows and rows1 (either variant): rows [r0, r1), blocks [b0, b1) dequantized by NumPy, then x @ W.T."""
    W = dequant_ref(w[r0:r1, 17 * b0:17 * b1].reshape(-1, 17)).reshape(r1 - r0, -1)
    out[:, r0:r1] = x[:, 32 * b0:32 * b1] @ W.T


# ------------------------------------------------------------------------------------ int8 activations
# llama.cpp's CPU MXFP4 matmul quantizes x to Q8_0 (int8 per 32, step max|x| / 127) and sums each block's
# 32 products exactly in int32 (ggml_vec_dot_mxfp4_q8_0): per block, d_w * d_x * isum.

@njit(cache=True)
def quantize_q8(x):
    """x (T, C) float32 -> x8 (T, C) int8, xd (T, C/32) float32: per 32, step max|x| / 127 and
    x8 = rint(x / step) (through 1/step, as the twin)."""
    T, C = x.shape
    x8 = np.empty((T, C), dtype=np.int8)
    xd = np.empty((T, C // 32), dtype=np.float32)
    for t in range(T):
        for b in range(C // 32):
            amax = np.float32(0.0)
            for l in range(32):
                amax = max(amax, abs(x[t, 32 * b + l]))
            xd[t, b] = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            for l in range(32):
                x8[t, 32 * b + l] = I32(np.rint(x[t, 32 * b + l] * inv))
    return x8, xd


def quantize_q8_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Twin of quantize_q8."""
    xb = np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(xb).max(axis=-1)                                      # (T, B)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / amax, 0).astype(np.float32)
    x8 = np.rint(xb * inv[..., None]).astype(np.int8).reshape(x.shape)
    return x8, (amax / np.float32(127.0)).astype(np.float32)


@njit(cache=True, fastmath=_FM)
def _dot1_q8(w, x8, xd, nb, e8m0):
    """w . x for nb blocks, x as int8 (nb*32,) with steps xd (nb,): sum_b d_b xd_b isum_b, isum_b exact."""
    s = np.float32(0.0)
    for b in range(nb):
        o, c = b * 17, b * 32
        acc = I32(0)
        for l in range(16):
            q = I32(w[o + 1 + l])
            acc = I32(acc + I32(I32(_IVALUES[q & 15]) * I32(x8[c + l])))
            acc = I32(acc + I32(I32(_IVALUES[q >> 4]) * I32(x8[c + 16 + l])))
        s += (e8m0[w[o]] * xd[b]) * np.float32(acc)
    return s


@njit(cache=True, fastmath=_FM)
def rows_q8_table(w, x8, xd, out, r0, r1, b0, b1, e8m0):
    """out[t, r] for r in [r0, r1), blocks [b0, b1), x given as quantize_q8's (x8 (T, C), xd (T, B))."""
    for t in range(x8.shape[0]):
        xv, dv = x8[t, 32 * b0:32 * b1], xd[t, b0:b1]
        for r in range(r0, r1):
            out[t, r] = _dot1_q8(w[r, 17 * b0:17 * b1], xv, dv, b1 - b0, e8m0)


def rows_q8_ref(w: np.ndarray, x8: np.ndarray, xd: np.ndarray, out: np.ndarray, r0: int, r1: int, b0: int,
                b1: int) -> None:
    """Twin of rows_q8 (either variant): the values x8 * step exactly (float64) times the NumPy-dequantized rows."""
    xf = x8[:, 32 * b0:32 * b1].astype(np.float64) * np.repeat(xd[:, b0:b1].astype(np.float64), 32, axis=1)
    W = dequant_ref(w[r0:r1, 17 * b0:17 * b1].reshape(-1, 17)).reshape(r1 - r0, -1).astype(np.float64)
    out[:, r0:r1] = (xf @ W.T).astype(np.float32)


# ------------------------------------------------------------------------------------ AVX2 or portable

if simd.available():
    rows1, rows, rows_q8 = rows1_avx2, rows_avx2, rows_q8_avx2
    if simd_f32z.available():   # one token with 16 lanes (kernels/simd_f32z.py): 1.45x rows1_avx2 (2880 x 2880)
        rows1 = simd_f32z.rows1_mxfp4
else:
    rows1, rows, rows_q8 = rows1_table, rows_table, rows_q8_table


# ------------------------------------------------------------------------------------ drivers
# matmul.kernels_for's (serial, parallel) pair for MXFP4 (the table entry's `drivers`). jit.variant names
# each copy with a hash of kernels/*.py, so an edit to a kernel they inline recompiles them.


Q8 = False     # bound per copy by make_drivers (a placeholder: the templates below are never compiled as is)


def _serial(w, x, out, r0, r1, b0, b1, e8m0):
    if Q8:
        x8, xd = quantize_q8(x)
        rows_q8(w, x8, xd, out, r0, r1, b0, b1, e8m0)
    elif x.shape[0] == 1:
        rows1(w, x, out, r0, r1, b0, b1, e8m0)
    else:
        rows(w, x, out, r0, r1, b0, b1, e8m0)


def _parallel(w, x, out, nb, e8m0, chunk):
    R = w.shape[0]
    n = (R + chunk - 1) // chunk
    if Q8:
        x8, xd = quantize_q8(x)
        for i in prange(n):
            rows_q8(w, x8, xd, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, e8m0)
    else:
        for i in prange(n):
            if x.shape[0] == 1:
                rows1(w, x, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, e8m0)
            else:
                rows(w, x, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, e8m0)


def make_drivers(aq: int = 0) -> tuple:
    """(serial, parallel) as kernels/matmul.py's drivers: serial(w, x, out, r0, r1, b0, b1, e8m0) and
    parallel(w, x, out, nb, e8m0, chunk), one parallel region over chunks of rows. aq = 2 (act_quant="int8"): x
    rounded to int8 per 32 first (quantize_q8, rows_q8); otherwise float (MXFP4 has no int16 kernels)."""
    q8 = aq == 2
    return (variant(_serial, f"serial_mxfp4_aq{int(q8) * 2}", Q8=q8),
            variant(_parallel, f"parallel_mxfp4_aq{int(q8) * 2}", parallel=PRANGE_ONLY, Q8=q8))


@njit(cache=True, fastmath=_FM, inline="always")
def rows_entry(w, x, xs, out, r0, r1, b0, b1, f16):
    """MXFP4's row kernel in the kernel table's signature (xs: unused, MXFP4 has no per-32 minimum terms)."""
    if x.shape[0] == 1:
        rows1(w, x, out, r0, r1, b0, b1, f16)
    else:
        rows(w, x, out, r0, r1, b0, b1, f16)
