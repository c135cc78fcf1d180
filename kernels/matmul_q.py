"""Opt-in quantized-activation kernels: x is rounded per 256-block to int16 or int8, each sub-block's dot is
an exact int32 sum, and only then are the float scales applied (llama.cpp's Q8_K scheme). Off by default:
`kmatmul.Prepared(w, act_quant="int16" | "int8")`, `moert.load(act_quant=...)`, `--act-quant` turn it on.

    mode       kernels                                       tokens      needs
    "int16"    Numba: int16 x int16 -> int32 pairs, vpmaddwd  one (T=1)   any CPU
    "int8"     kernels/simd.py: u8 x s8 -> s16, vpmaddubsw    any T       AVX2 (refused otherwise)

    quantize_rows(x, qmax)   x (T, C) -> xq (T, C) int16, x8 (T, C) int8 (qmax 127) or (T, 0), xd (T, C/256)
                             float32 steps, xb (T, C/32) int32 sums; quantize_x: the same for one row (C,)
    matvec_q(x, w, mode)     (kernels/matmul.py) x (C,) or (T, C) -> (R,) or (T, R), the kernels, serial;
                             matvec_q_ref its NumPy twin: this quantization in NumPy, then an exact dot (float64)
    rows8_<t>, rows16_<t>    the row kernels the kernel table (kernels/ktypes.py, an entry's `quant`) lists:
                             (w, xq, x8, xd, xb, out, r0, r1, b0, b1, f16), x as the kernel's x_<t> makes it
                             from quantize_rows' (once per matmul: int16 sums, Q6_K's per-16 sums)

Why: the float kernels spend ~0.75 instructions per weight (nibble, int->float, FMA) and reach 15-30% of one
thread's read bandwidth. vpmaddwd takes 16 weights per instruction, vpmaddubsw 32, with no conversion per
weight. Types: Q4_K, Q6_K (a Q4_K_M file's); Q8_0 and MXFP4 round x per 32 in int8 mode instead (their
table entries' q8_32: kernels/q8_0.py, kernels/mxfp4.py); other types keep the float kernels, and so do batches
(T > 1) in int16 mode. Error: x_j moves by at most step/2 of its block (step = max|x| / qmax), so
|y - y_float| <= sum_j |w_j| * step_b(j) / 2 (tests/test_kernels_matmul_q.py asserts it).

Integers are explicit int32 (Numba widens to int64 otherwise, half the lanes). Dimension legend: T tokens,
R rows, C columns, B blocks of 256 per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moert.errors import KernelOptionError
from moert.kernels import simd
from moert.kernels.blockdot import FM, I32, stack_f32
from moert.kernels.qblocks import half, i8, scales_k4

__all__ = ["ACT_QUANT", "QMAX", "quantize_rows", "quantize_x", "quantize_x_ref",
           "quantized", "rows16_q4_k", "rows16_q6_k", "rows8_q4_k", "rows8_q6_k"]

ACT_QUANT = {None: 0, "none": 0, "int16": 1, "int8": 2}   # act_quant option -> the int in the closure keys
QMAX = {1: 32767, 2: 127}                                   # largest |quantized x| per mode
_FM = FM


def mode(act_quant) -> int:
    """The closure-key int of an act_quant option (None/"none" -> 0, "int16" -> 1, "int8" -> 2); a
    KernelOptionError for anything else, and for "int8" on a CPU without AVX2."""
    if act_quant not in ACT_QUANT:
        raise KernelOptionError(f"act_quant={act_quant!r} is not one of None, 'none', 'int16', 'int8'")
    if ACT_QUANT[act_quant] == 2 and not simd.available():
        raise KernelOptionError("act_quant='int8' needs a CPU with AVX2 (its kernels are vpmaddubsw dot "
                                "products, kernels/simd.py); this CPU has none: use act_quant='int16' or None")
    return ACT_QUANT[act_quant]


# ------------------------------------------------------------------------------------- quantize x

@njit(cache=True, inline="always")
def _quantize_into(x, qmax, xq, xd, xb):
    """Per 256-block: step d = max|x| / qmax, xq = rint(x / d) (through 1/d, as the twin), and the per-32
    sums of xq (the Q4_K min term). x (C,) float32, C a multiple of 256."""
    C = x.shape[0]
    for b in range(C // 256):
        amax = np.float32(0.0)
        for l in range(256):
            amax = max(amax, abs(x[256 * b + l]))
        d = amax / np.float32(qmax)
        inv = np.float32(qmax) / amax if amax > 0 else np.float32(0.0)
        xd[b] = d
        for j in range(8):
            s = I32(0)
            for l in range(32):
                q = I32(np.rint(x[256 * b + 32 * j + l] * inv))
                q = I32(min(max(q, I32(-qmax)), I32(qmax)))
                xq[256 * b + 32 * j + l] = q
                s = I32(s + q)
            xb[8 * b + j] = s


@njit(cache=True)
def quantize_rows(x, qmax):
    """Each row of x (T, C) quantized per 256-block (_quantize_into): (xq (T, C) int16, x8, xd (T, C/256)
    float32 steps, xb (T, C/32) int32 sums); x8 is xq as int8 (T, C) when qmax <= 127 (the int8 kernels
    read it), else (T, 0)."""
    T, C = x.shape
    xq = np.empty((T, C), dtype=np.int16)
    x8 = np.empty((T, C if qmax <= 127 else 0), dtype=np.int8)
    xd = np.empty((T, C // 256), dtype=np.float32)
    xb = np.empty((T, C // 32), dtype=np.int32)
    for t in range(T):
        _quantize_into(x[t], qmax, xq[t], xd[t], xb[t])
        if qmax <= 127:
            for i in range(C):
                x8[t, i] = xq[t, i]
    return xq, x8, xd, xb


@njit(cache=True)
def quantize_x(x, qmax):
    """quantize_rows of one row x (C,): (xq (C,) int16, x8 (C,) int8 or (0,), xd (C/256,), xb (C/32,))."""
    xq, x8, xd, xb = quantize_rows(x.reshape(1, -1), qmax)
    return xq[0], x8[0], xd[0], xb[0]


def quantize_x_ref(x: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """NumPy twin of quantize_x (x (C,); a flattened (T, C) works too: blocks never straddle rows)."""
    xb = np.asarray(x, dtype=np.float32).reshape(-1, 256)
    amax = np.abs(xb).max(axis=1)                                      # (B,)
    d = (amax / np.float32(qmax)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(qmax) / amax, 0).astype(np.float32)
    q = np.clip(np.rint(xb * inv[:, None]), -qmax, qmax).astype(np.int16)  # (B, 256)
    x8 = q.reshape(-1).astype(np.int8) if qmax <= 127 else np.empty(0, dtype=np.int8)
    return q.reshape(-1), x8, d, q.reshape(-1, 32).astype(np.int32).sum(axis=1, dtype=np.int32)


# ------------------------------------------------------------------------------------- row dots
# Each sub-block: an int32 sum of q * xq over its lanes (vpmaddwd), then float: d*sc * sum.

@njit(cache=True, fastmath=_FM)
def _dot1q_q4_k(w, xq, xd, xb, nb, f16):
    """w . x for nb Q4_K blocks, x given as (xq, xd, xb): sum_b xd_b (sum_j d*sc_j * isum_j - dmin*m_j * xb_j)."""
    dsc = stack_f32(8)
    dmn = stack_f32(8)
    s = np.float32(0.0)
    for b in range(nb):
        o = b * 144
        scales_k4(w, o, half(w, o, f16), half(w, o + 2, f16), dsc, dmn)
        a = np.float32(0.0)
        for p in range(4):
            c, q0 = 256 * b + 64 * p, o + 16 + 32 * p
            s1 = I32(0)
            s2 = I32(0)
            for l in range(32):
                q = I32(w[q0 + l])
                s1 = I32(s1 + I32(I32(q & I32(15)) * I32(xq[c + l])))    # I32 around each op: no int64
                s2 = I32(s2 + I32(I32(q >> I32(4)) * I32(xq[c + 32 + l])))
            a += dsc[2 * p] * np.float32(s1) - dmn[2 * p] * np.float32(xb[8 * b + 2 * p]) \
                + dsc[2 * p + 1] * np.float32(s2) - dmn[2 * p + 1] * np.float32(xb[8 * b + 2 * p + 1])
        s += xd[b] * a
    return s


@njit(cache=True, fastmath=_FM)
def _dot1q_q6_k(w, xq, xd, xb, nb, f16):
    """w . x for nb Q6_K blocks: per half block h and 16-lane group g, four int32 sums (t = 0..3), each
    for sub-block 8h + 2t + g, of (q - 32) * xq; then d * sc * sum."""
    s = np.float32(0.0)
    for b in range(nb):
        o = b * 210
        a = np.float32(0.0)
        for h in range(2):
            c, ql, qh = 256 * b + 128 * h, o + 64 * h, o + 128 + 32 * h
            for g in range(2):
                s0 = I32(0)
                s1 = I32(0)
                s2 = I32(0)
                s3 = I32(0)
                for k in range(16):
                    l = 16 * g + k
                    qa = I32(w[ql + l])
                    qb = I32(w[ql + 32 + l])
                    hb = I32(w[qh + l])
                    v0 = I32(I32(I32(qa & I32(15)) | I32(I32(hb & I32(3)) << I32(4))) - I32(32))
                    v1 = I32(I32(I32(qb & I32(15)) | I32(I32(hb & I32(12)) << I32(2))) - I32(32))
                    v2 = I32(I32(I32(qa >> I32(4)) | I32(hb & I32(48))) - I32(32))
                    v3 = I32(I32(I32(qb >> I32(4)) | I32(I32(hb & I32(192)) >> I32(2))) - I32(32))
                    s0 = I32(s0 + I32(v0 * I32(xq[c + l])))
                    s1 = I32(s1 + I32(v1 * I32(xq[c + 32 + l])))
                    s2 = I32(s2 + I32(v2 * I32(xq[c + 64 + l])))
                    s3 = I32(s3 + I32(v3 * I32(xq[c + 96 + l])))
                sc = o + 192 + 8 * h + g
                a += np.float32(i8(w[sc])) * np.float32(s0) + np.float32(i8(w[sc + 2])) * np.float32(s1) \
                    + np.float32(i8(w[sc + 4])) * np.float32(s2) + np.float32(i8(w[sc + 6])) * np.float32(s3)
        s += (xd[b] * half(w, o + 208, f16)) * a
    return s


@njit(cache=True, fastmath=_FM)
def _rows1q_q4_k(w, xq, xd, xb, out, r0, r1, b0, b1, f16):
    qv, dv, sv = xq[256 * b0:256 * b1], xd[b0:b1], xb[8 * b0:8 * b1]
    for r in range(r0, r1):
        out[0, r] = _dot1q_q4_k(w[r, 144 * b0:144 * b1], qv, dv, sv, b1 - b0, f16)


@njit(cache=True, fastmath=_FM)
def _rows1q_q6_k(w, xq, xd, xb, out, r0, r1, b0, b1, f16):
    qv, dv = xq[256 * b0:256 * b1], xd[b0:b1]
    for r in range(r0, r1):
        out[0, r] = _dot1q_q6_k(w[r, 210 * b0:210 * b1], qv, dv, xb, b1 - b0, f16)


# rows8_q4_k reads GGUF's blocks through these two names; kernels/ktypes.py binds simd.q4kr_row and 148 in a
# copy of it (rows8_q4_kr) for kernels/repack.py's blocks.
Q4K_ROW, Q4K_BYTES, Q6K_ROW = simd.q4k_row, 144, simd.q6k_row
BIG = 4                 # tokens a call past 7 (AVX2: 8 spill registers); the 512-bit kernel binds 7 (kernels/simd_z.py)


# What each quantized row kernel reads beside xq, x8 and xd, made once per matmul from quantize_rows' output
# by the kernel's x_<t> (kernels/ktypes.py lists the pairs; the drivers call it before their rows).

@njit(cache=True, inline="always")
def x_as_is(xq, x8, xd, xb):
    """x as quantize_rows gives it (the int16 kernels: per-32 sums as int32)."""
    return xq, x8, xd, xb


@njit(cache=True, inline="always")
def neg16(xb):
    """-xb as int16 (T, C/32): the int8 Q4_K kernel's per-32 sums (each at most 32 * 127 in size), negated so
    its min term comes out of one vpmaddwd with the sign it is added with."""
    out = np.empty(xb.shape, dtype=np.int16)
    for t in range(xb.shape[0]):
        for j in range(xb.shape[1]):
            out[t, j] = -xb[t, j]
    return out


@njit(cache=True, inline="always")
def x_q4_k(xq, x8, xd, xb):
    """rows8_q4_k's x: the per-32 sums negated, as int16 (neg16)."""
    return xq, x8, xd, neg16(xb)


@njit(cache=True, fastmath=_FM, inline="always")   # inlined: simd.py's code is in the callers' cache keys
def rows8_q4_k(w, xq, x8, xd, xb, out, r0, r1, b0, b1, f16):
    """out[t, r] for every token t of int8 x (T, C) (xb: x_q4_k's negated int16 per-32 sums): simd.q4k_row
    sums a row's blocks [b0, b1) exactly in int32 per block, then in float vectors. Up to 7 tokens (an expert's
    share of a prompt) go in one call, one decode of each block feeding them all (5 tokens: 14% faster than
    4 + 1, 6: 8%, 7: 3%; 8 spill registers); more go BIG at a time, then the rest in one call. Tokens past 7 go
    BIG at a time over all the rows, whose bytes (<= 64 rows a task: < 80 KB) stay in L2, where a row at a time
    read every token's x from L2 again (64 tokens: 128 KB). T = 64, 2048 x 2048, one thread, GMAC/s: AVX2 101.6
    -> 102.7, 512-bit (kernels/simd_z.py, BIG = 7) 106.9 -> 142.3."""
    T, C, Cb, B = x8.shape[0], x8.shape[1], xb.shape[1], xd.shape[1]
    RS = w.strides[0]                                                   # bytes a row: w read from its flat offsets
    T4 = T - T % BIG if T > 7 else 0                                    # up to 7 tokens: one call
    for t in range(0, T4, BIG):
        for r in range(r0, r1):
            s4 = Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                         xb, t * Cb + 8 * b0, Cb, BIG)
            for i in range(BIG):
                out[t + i, r] = s4[i]
    for r in range(r0, r1):
        t, n = T4, T - T4                                               # the rest (1-7 tokens) in one call
        if n == 1:
            out[t, r] = Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                xb, t * Cb + 8 * b0, Cb, 1)
        elif n == 2:
            _put(out, t, r, Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xb, t * Cb + 8 * b0, Cb, 2))
        elif n == 3:
            _put(out, t, r, Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xb, t * Cb + 8 * b0, Cb, 3))
        elif n == 4:
            _put(out, t, r, Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xb, t * Cb + 8 * b0, Cb, 4))
        elif n == 5:
            _put(out, t, r, Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xb, t * Cb + 8 * b0, Cb, 5))
        elif n == 6:
            _put(out, t, r, Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xb, t * Cb + 8 * b0, Cb, 6))
        elif n == 7:
            _put(out, t, r, Q4K_ROW(w, r * RS + Q4K_BYTES * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xb, t * Cb + 8 * b0, Cb, 7))


@njit(cache=True, inline="always")
def _put(out, t, r, s):
    """out[t + i, r] = s[i] for the n-tuple s of a row kernel's n tokens."""
    for i in range(len(s)):
        out[t + i, r] = s[i]


@njit(cache=True, inline="always")
def sums16(x8):
    """Per-16 sums of int8 x (T, C): (T, C/16) int16 (each at most 16 * 127 in size). The Q6_K kernel takes
    its -32 offset out with them once per block."""
    T = x8.shape[0]
    s = np.empty((T, x8.shape[1] // 16), dtype=np.int16)
    for t in range(T):
        for g in range(x8.shape[1] // 16):
            a = I32(0)
            for l in range(16):
                a = I32(a + I32(x8[t, 16 * g + l]))
            s[t, g] = a
    return s


@njit(cache=True, inline="always")
def x_q6_k(xq, x8, xd, xb):
    """rows8_q6_k's x: the per-16 sums (sums16) in place of the per-32 ones."""
    return xq, x8, xd, sums16(x8)


@njit(cache=True, fastmath=_FM, inline="always")
def rows8_q6_k(w, xq, x8, xd, xb, out, r0, r1, b0, b1, f16):
    """As rows8_q4_k for Q6_K (simd.q6k_row; no min term: xb is x_q6_k's per-16 sums of x, which take out the
    weights' -32 offset)."""
    T, C, B = x8.shape[0], x8.shape[1], xd.shape[1]
    xs, S = xb, xb.shape[1]
    RS = w.strides[0]
    T4 = T - T % BIG if T > 7 else 0
    for t in range(0, T4, BIG):
        for r in range(r0, r1):
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, BIG))
    for r in range(r0, r1):
        t, n = T4, T - T4
        if n == 1:
            out[t, r] = Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                xs, t * S + 16 * b0, S, 1)
        elif n == 2:
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, 2))
        elif n == 3:
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, 3))
        elif n == 4:
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, 4))
        elif n == 5:
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, 5))
        elif n == 6:
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, 6))
        elif n == 7:
            _put(out, t, r, Q6K_ROW(w, r * RS + 210 * b0, b1 - b0, x8, t * C + 256 * b0, C, xd, t * B + b0, B,
                                    xs, t * S + 16 * b0, S, 7))


@njit(cache=True, inline="always")
def rows16_q4_k(w, xq, x8, xd, xb, out, r0, r1, b0, b1, f16):
    """The int16 kernel in the table's signature (x given quantized, quantize_rows): one token (T == 1)."""
    _rows1q_q4_k(w, xq[0], xd[0], xb[0], out, r0, r1, b0, b1, f16)


@njit(cache=True, inline="always")
def rows16_q6_k(w, xq, x8, xd, xb, out, r0, r1, b0, b1, f16):
    """As rows16_q4_k for Q6_K."""
    _rows1q_q6_k(w, xq[0], xd[0], xb[0], out, r0, r1, b0, b1, f16)


@njit(cache=True, inline="always")
def quantized(qmax, T):
    """Whether a call of T tokens takes the quantized kernels: int8 always, int16 for one token."""
    return qmax != 0 and (T == 1 or qmax <= 127)
