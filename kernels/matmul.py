"""Fused dequantize-and-dot: y = x @ W.T straight from a GGUF tensor's bytes, never a dequantized W.

    matvec(x, w)           x (C,)   -> (R,)     one token (decode)
    matmul(x, w)           x (T, C) -> (T, R)   a small batch (prefill, or one expert's tokens)
    matvec_ref, matmul_ref the NumPy reference twins: dequantize with moert/quants/dequant.py, then `@`

w is a QTensor (raw GGUF bytes, type, NumPy shape (R, C)); FAST_TYPES lists the types with kernels:
F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4 (kernels/mxfp4.py). Rows run in parallel (numba.get_num_threads()
threads, one parallel region per call); small matrices run serially, as a parallel region costs more than they do.

How the kernels read (all float32, summed in a different order from the reference; see the tests):
  - one token: each type has a fused row dot that decodes a block's quants straight into FMAs. The
    per-lane accumulators live on the stack (`_stack`), so LLVM keeps them in vector registers across
    blocks and sub-blocks, with no horizontal sum per sub-block; the block's scales are decoded once
    into a small stack array. The Q4_K/Q5_K minimum terms use per-32 sums of x computed once per call.
  - a batch: each type dequantizes one block of a row into a 256-float stack buffer (L1), and the
    shared `_block_dot` multiplies it with 4 tokens at a time (one load of the weight, 4 FMAs).
Integers are explicit int32 everywhere: Numba widens int32 arithmetic to int64, and an int64 lane is
half as many lanes (the issue's "about 2x"). Inner loops index slices from 0: an offset LLVM cannot
prove non-negative keeps Numba's negative-index wraparound in every load (2x slower, measured).
Check the loops with `inspect_asm()` (bench/bench_matmul.py --asm).

Dimension legend: T tokens, R rows (output features), C columns (input features), B blocks per row.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from moert.kernels.dequant import BF16_TO_F32, F16_TO_F32
from moert.kernels.moe import QTensor
from moert.quants.dequant import dequantize as _ref_dequantize
from moert.quants.dequant import lookup

__all__ = ["FAST_TYPES", "TYPE_CODES", "Prepared", "matmul", "matmul_ref", "matvec", "matvec_ref", "weight_bytes"]

# Kernel table: GGML type -> (code used inside Numba, block size). The code picks the row kernel.
TYPE_CODES = {"F32": 0, "F16": 1, "BF16": 2, "Q8_0": 3, "Q4_K": 4, "Q5_K": 5, "Q6_K": 6,
              "MXFP4": 7}  # MXFP4 (issue 15): kernels/mxfp4.py
BLOCK = {"F32": 1, "F16": 1, "BF16": 1, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256,
         "MXFP4": 32}  # MXFP4 (issue 15)
FAST_TYPES: frozenset[str] = frozenset(TYPE_CODES)

_FM = {"reassoc", "contract"}   # let LLVM reorder float sums (vector lanes) and fuse mul+add; no nnan/ninf
_PARALLEL_MIN_BYTES = 1 << 18   # below this many weight bytes per call, run on the calling thread
I32 = np.int32


# ------------------------------------------------------------------------------------- stack scratch

@intrinsic
def _stack(typingctx, n, dtype):
    """A pointer to n elements of `dtype` on the stack of the calling function (n a literal)."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    ty = dtype.dtype

    def codegen(context, builder, sig, args):
        return cgutils.alloca_once(builder, context.get_value_type(ty), size=n.literal_value)
    return types.CPointer(ty)(n, dtype), codegen


@njit(cache=True, inline="always")
def _stack_f32(n):
    """A float32 array of literal length n on the stack: after unrolling, LLVM keeps it in registers."""
    return numba.carray(_stack(n, numba.float32), n)


# ------------------------------------------------------------------------------------------ helpers

@njit(cache=True, inline="always")
def _half(w, i, f16):
    """The little-endian fp16 at w[i], w[i+1] as float32 (through the 64K table: Numba has no float16)."""
    return f16[I32(w[i]) | I32(I32(w[i + 1]) << I32(8))]


@njit(cache=True, inline="always")
def _scales_k4(w, o, d, dmin, dsc, dmn):
    """dsc[j] = d * sc_j, dmn[j] = dmin * m_j for the 8 sub-blocks of the Q4_K/Q5_K block at w[o:].
    The 12 scale bytes at o+4: 6-bit (sc, m) for j < 4 in the low bits of bytes j, j+4; for j >= 4 the
    low 4 bits in byte j+4 (nibbles), the high 2 bits in the top of bytes j-4, j (as ggml's get_scale_min_k4)."""
    for j in range(4):
        a = I32(w[o + 4 + j])
        m = I32(w[o + 8 + j])
        h = I32(w[o + 12 + j])
        dsc[j] = d * np.float32(I32(a & I32(63)))
        dmn[j] = dmin * np.float32(I32(m & I32(63)))
        dsc[4 + j] = d * np.float32(I32(I32(h & I32(15)) | I32(I32(a >> I32(6)) << I32(4))))
        dmn[4 + j] = dmin * np.float32(I32(I32(h >> I32(4)) | I32(I32(m >> I32(6)) << I32(4))))


@njit(cache=True, fastmath=_FM)
def sums32(x):
    """Per-32 sums of x (T, C) -> (T, C // 32): the Q4_K/Q5_K minimum terms are dmin*m_j * sum(x_j)."""
    T, C = x.shape
    s = np.zeros((T, C // 32), dtype=np.float32)
    for t in range(T):
        for j in range(C // 32):
            a = np.float32(0.0)
            for l in range(32):
                a += x[t, 32 * j + l]
            s[t, j] = a
    return s


@njit(cache=True, fastmath=_FM, inline="always")
def _block_dot(buf, n, x, c0, acc):
    """acc[t] += buf[:n] . x[t, c0:c0+n] for every token t; 4 (then 2) tokens per pass share each weight load."""
    T = x.shape[0]
    t = 0
    while t + 4 <= T:
        x0, x1, x2, x3 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n], x[t + 2, c0:c0 + n], x[t + 3, c0:c0 + n]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        for l in range(n):
            v = buf[l]
            s0 += v * x0[l]
            s1 += v * x1[l]
            s2 += v * x2[l]
            s3 += v * x3[l]
        acc[t] += s0
        acc[t + 1] += s1
        acc[t + 2] += s2
        acc[t + 3] += s3
        t += 4
    if t + 2 <= T:                                      # 2 or 3 left: a pair, then maybe one
        x0, x1 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        for l in range(n):
            v = buf[l]
            s0 += v * x0[l]
            s1 += v * x1[l]
        acc[t] += s0
        acc[t + 1] += s1
        t += 2
    if t < T:
        xt = x[t, c0:c0 + n]
        s = np.float32(0.0)
        for l in range(n):
            s += buf[l] * xt[l]
        acc[t] += s


@njit(cache=True, fastmath=_FM, inline="always")
def _block_dot2(u, v, n, x, c0, acc0, acc1):
    """acc0[t] += u[:n] . x[t, c0:c0+n] and acc1[t] += v[:n] . x[t, ...]: two rows' dequantized blocks at once,
    so each load of x feeds two FMAs (the batch kernels were bound by reloading x from L2 for every row:
    1.2-1.4x measured on Q4_K). 4 tokens per pass, then 2, then 1."""
    T = x.shape[0]
    t = 0
    while t + 4 <= T:
        x0, x1, x2, x3 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n], x[t + 2, c0:c0 + n], x[t + 3, c0:c0 + n]
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        b0 = np.float32(0.0)
        b1 = np.float32(0.0)
        b2 = np.float32(0.0)
        b3 = np.float32(0.0)
        for l in range(n):
            p, q = u[l], v[l]
            a0 += p * x0[l]
            a1 += p * x1[l]
            a2 += p * x2[l]
            a3 += p * x3[l]
            b0 += q * x0[l]
            b1 += q * x1[l]
            b2 += q * x2[l]
            b3 += q * x3[l]
        acc0[t] += a0
        acc0[t + 1] += a1
        acc0[t + 2] += a2
        acc0[t + 3] += a3
        acc1[t] += b0
        acc1[t + 1] += b1
        acc1[t + 2] += b2
        acc1[t + 3] += b3
        t += 4
    if t + 2 <= T:
        x0, x1 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n]
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        b0 = np.float32(0.0)
        b1 = np.float32(0.0)
        for l in range(n):
            p, q = u[l], v[l]
            a0 += p * x0[l]
            a1 += p * x1[l]
            b0 += q * x0[l]
            b1 += q * x1[l]
        acc0[t] += a0
        acc0[t + 1] += a1
        acc1[t] += b0
        acc1[t + 1] += b1
        t += 2
    if t < T:
        xt = x[t, c0:c0 + n]
        a0 = np.float32(0.0)
        b0 = np.float32(0.0)
        for l in range(n):
            a0 += u[l] * xt[l]
            b0 += v[l] * xt[l]
        acc0[t] += a0
        acc1[t] += b0


# --------------------------------------------------------------------------------------------- Q4_K
# | d f16 | dmin f16 | scales[12] | qs[128] |  w = d*sc_j * q - dmin*m_j, 8 sub-blocks j of 32
#   sub-blocks 2p, 2p+1 (p < 4): low, high nibbles of qs[32p:32p+32]

@njit(cache=True, fastmath=_FM)
def _dot1_q4_k(w, x, xs, nb, f16):
    """w . x for nb blocks: w (nb*144,) uint8 one row's bytes, x (nb*256,), xs = its per-32 sums (nb*8,)."""
    acc = _stack_f32(64)
    dsc = _stack_f32(8)
    dmn = _stack_f32(8)
    for l in range(64):
        acc[l] = 0.0
    mins = np.float32(0.0)
    for b in range(nb):
        o = b * 144
        _scales_k4(w, o, _half(w, o, f16), _half(w, o + 2, f16), dsc, dmn)
        for j in range(8):
            mins += dmn[j] * xs[8 * b + j]
        for p in range(4):
            d1, d2 = dsc[2 * p], dsc[2 * p + 1]
            c, q0 = 256 * b + 64 * p, o + 16 + 32 * p
            for l in range(32):
                q = I32(w[q0 + l])
                acc[l] += d1 * (np.float32(I32(q & I32(15))) * x[c + l])
                acc[32 + l] += d2 * (np.float32(I32(q >> I32(4))) * x[c + 32 + l])
    s = np.float32(0.0)
    for l in range(64):
        s += acc[l]
    return s - mins


@njit(cache=True, fastmath=_FM, inline="always")
def _deq_q4_k(w, b, buf, f16):
    o = b * 144
    dsc = _stack_f32(8)
    dmn = _stack_f32(8)
    _scales_k4(w, o, _half(w, o, f16), _half(w, o + 2, f16), dsc, dmn)
    for p in range(4):
        d1, m1, d2, m2 = dsc[2 * p], dmn[2 * p], dsc[2 * p + 1], dmn[2 * p + 1]
        q0 = o + 16 + 32 * p
        for l in range(32):
            q = I32(w[q0 + l])
            buf[64 * p + l] = d1 * np.float32(I32(q & I32(15))) - m1
            buf[64 * p + 32 + l] = d2 * np.float32(I32(q >> I32(4))) - m2


# --------------------------------------------------------------------------------------------- Q5_K
# | d f16 | dmin f16 | scales[12] | qh[32] | qs[128] |  as Q4_K; bit j of qh[l] is bit 4 of weight l of
#   sub-block j

@njit(cache=True, fastmath=_FM)
def _dot1_q5_k(w, x, xs, nb, f16):
    acc = _stack_f32(64)
    dsc = _stack_f32(8)
    dmn = _stack_f32(8)
    for l in range(64):
        acc[l] = 0.0
    mins = np.float32(0.0)
    for b in range(nb):
        o = b * 176
        _scales_k4(w, o, _half(w, o, f16), _half(w, o + 2, f16), dsc, dmn)
        for j in range(8):
            mins += dmn[j] * xs[8 * b + j]
        for p in range(4):
            d1, d2 = dsc[2 * p], dsc[2 * p + 1]
            c, q0 = 256 * b + 64 * p, o + 48 + 32 * p
            sh = I32(2 * p)
            for l in range(32):
                q = I32(w[q0 + l])
                h = I32(I32(w[o + 16 + l]) >> sh)
                lo = I32(I32(q & I32(15)) | I32(I32(h & I32(1)) << I32(4)))
                hi = I32(I32(q >> I32(4)) | I32(I32(h & I32(2)) << I32(3)))
                acc[l] += d1 * (np.float32(lo) * x[c + l])
                acc[32 + l] += d2 * (np.float32(hi) * x[c + 32 + l])
    s = np.float32(0.0)
    for l in range(64):
        s += acc[l]
    return s - mins


@njit(cache=True, fastmath=_FM, inline="always")
def _deq_q5_k(w, b, buf, f16):
    o = b * 176
    dsc = _stack_f32(8)
    dmn = _stack_f32(8)
    _scales_k4(w, o, _half(w, o, f16), _half(w, o + 2, f16), dsc, dmn)
    for p in range(4):
        d1, m1, d2, m2 = dsc[2 * p], dmn[2 * p], dsc[2 * p + 1], dmn[2 * p + 1]
        q0 = o + 48 + 32 * p
        sh = I32(2 * p)
        for l in range(32):
            q = I32(w[q0 + l])
            h = I32(I32(w[o + 16 + l]) >> sh)
            buf[64 * p + l] = d1 * np.float32(I32(I32(q & I32(15)) | I32(I32(h & I32(1)) << I32(4)))) - m1
            buf[64 * p + 32 + l] = d2 * np.float32(I32(I32(q >> I32(4)) | I32(I32(h & I32(2)) << I32(3)))) - m2


# --------------------------------------------------------------------------------------------- Q6_K
# | ql[128] | qh[64] | scales[16] int8 | d f16 |  w = d*sc * (q - 32), 16 sub-blocks of 16
#   weight 128h + 32t + l: nibble t // 2 of ql[64h + 32 (t % 2) + l], bits 2t of qh[32h + l];
#   sub-block 8h + 2t + l // 16

@njit(cache=True, inline="always")
def _i8(u):
    """A uint8 reinterpreted as int8, as int32."""
    return I32(I32(I32(u) ^ I32(128)) - I32(128))


@njit(cache=True, fastmath=_FM)
def _dot1_q6_k(w, x, xs, nb, f16):
    """w . x for nb Q6_K blocks. Lane l of the accumulator takes weights 128h + 32t + l for all four t,
    each times a per-lane scale (d * the scale of its 16-weight sub-block): one 32-lane loop per half
    block. Two 16-lane loops per sub-block with broadcast scales ran 2.5x slower (measured)."""
    acc = _stack_f32(32)
    sc = _stack_f32(128)                                # (t, l): d * scale of weight 32t + l's sub-block
    for l in range(32):
        acc[l] = 0.0
    for b in range(nb):
        o = b * 210
        d = _half(w, o + 208, f16)
        for h in range(2):
            for t in range(4):
                for g in range(2):
                    v = d * np.float32(_i8(w[o + 192 + 8 * h + 2 * t + g]))
                    for l in range(16):
                        sc[32 * t + 16 * g + l] = v
            c, ql, qh = 256 * b + 128 * h, o + 64 * h, o + 128 + 32 * h
            for l in range(32):
                qa = I32(w[ql + l])
                qb = I32(w[ql + 32 + l])
                hb = I32(w[qh + l])
                v0 = np.float32(I32(I32(I32(qa & I32(15)) | I32(I32(hb & I32(3)) << I32(4))) - I32(32)))
                v1 = np.float32(I32(I32(I32(qb & I32(15)) | I32(I32(hb & I32(12)) << I32(2))) - I32(32)))
                v2 = np.float32(I32(I32(I32(qa >> I32(4)) | I32(hb & I32(48))) - I32(32)))
                v3 = np.float32(I32(I32(I32(qb >> I32(4)) | I32(I32(hb & I32(192)) >> I32(2))) - I32(32)))
                acc[l] += (sc[l] * v0) * x[c + l] + (sc[32 + l] * v1) * x[c + 32 + l] \
                    + (sc[64 + l] * v2) * x[c + 64 + l] + (sc[96 + l] * v3) * x[c + 96 + l]
    s = np.float32(0.0)
    for l in range(32):
        s += acc[l]
    return s


@njit(cache=True, fastmath=_FM, inline="always")
def _deq_q6_k(w, b, buf, f16):
    o = b * 210
    d = _half(w, o + 208, f16)
    sc = _stack_f32(128)                                # per-lane scales, as in _dot1_q6_k
    for h in range(2):
        for t in range(4):
            for g in range(2):
                v = d * np.float32(_i8(w[o + 192 + 8 * h + 2 * t + g]))
                for l in range(16):
                    sc[32 * t + 16 * g + l] = v
        c, ql, qh = 128 * h, o + 64 * h, o + 128 + 32 * h
        for l in range(32):
            qa = I32(w[ql + l])
            qb = I32(w[ql + 32 + l])
            hb = I32(w[qh + l])
            buf[c + l] = sc[l] * np.float32(I32(I32(I32(qa & I32(15)) | I32(I32(hb & I32(3)) << I32(4))) - I32(32)))
            buf[c + 32 + l] = sc[32 + l] * np.float32(
                I32(I32(I32(qb & I32(15)) | I32(I32(hb & I32(12)) << I32(2))) - I32(32)))
            buf[c + 64 + l] = sc[64 + l] * np.float32(I32(I32(I32(qa >> I32(4)) | I32(hb & I32(48))) - I32(32)))
            buf[c + 96 + l] = sc[96 + l] * np.float32(
                I32(I32(I32(qb >> I32(4)) | I32(I32(hb & I32(192)) >> I32(2))) - I32(32)))


# --------------------------------------------------------------------------------------------- Q8_0
# | d f16 | qs[32] int8 |  w = d * q

@njit(cache=True, fastmath=_FM)
def _dot1_q8_0(w, x, xs, nb, f16):
    acc = _stack_f32(32)
    for l in range(32):
        acc[l] = 0.0
    for b in range(nb):
        o = b * 34
        d = _half(w, o, f16)
        for l in range(32):
            acc[l] += d * (np.float32(_i8(w[o + 2 + l])) * x[32 * b + l])
    s = np.float32(0.0)
    for l in range(32):
        s += acc[l]
    return s


@njit(cache=True, fastmath=_FM, inline="always")
def _deq_q8_0(w, b, buf, f16):
    o = b * 34
    d = _half(w, o, f16)
    for l in range(32):
        buf[l] = d * np.float32(_i8(w[o + 2 + l]))


# ------------------------------------------------------------------------------------ F32, F16, BF16
# F32: the row is float32. BF16: the top half of a float32. F16 -> float32 bit by bit, so it vectorizes
# (a table lookup per weight would be a gather): (h & 0x7fff) << 13 read as float32 and times 2^112 is
# exact for normal and subnormal halves; exponent 31 (inf, nan) is forced to 255; then the sign.

@njit(cache=True, fastmath=_FM, inline="always")
def _deq_f16(w, c0, n, buf):
    h = w.view(np.uint16)
    u = buf.view(np.uint32)
    for l in range(n):
        u[l] = np.uint32(np.uint32(h[c0 + l]) & np.uint32(0x7FFF)) << np.uint32(13)
    for l in range(n):
        buf[l] *= np.float32(5.192296858534828e33)  # 2 ** 112
    for l in range(n):
        v = np.uint32(h[c0 + l])
        e = np.uint32(0x7F800000) if np.uint32(v & np.uint32(0x7C00)) == np.uint32(0x7C00) else np.uint32(0)
        u[l] = np.uint32(np.uint32(u[l] | e) | np.uint32(np.uint32(v & np.uint32(0x8000)) << np.uint32(16)))


@njit(cache=True, fastmath=_FM, inline="always")
def _deq_bf16(w, c0, n, buf):
    h = w.view(np.uint16)
    u = buf.view(np.uint32)
    for l in range(n):
        u[l] = np.uint32(h[c0 + l]) << np.uint32(16)


# ------------------------------------------------------------------------------------------ the rows
# One function per (type, one token | batch), each compiled on its own: fused into one function, LLVM
# gave up vectorizing the batch loops (5x slower).

@njit(cache=True, fastmath=_FM)
def _rows1_q4_k(w, x, xs, out, r0, r1, b0, b1, f16):
    xv, sv = x[0, 256 * b0:256 * b1], xs[0, 8 * b0:8 * b1]
    for r in range(r0, r1):
        out[0, r] = _dot1_q4_k(w[r, 144 * b0:144 * b1], xv, sv, b1 - b0, f16)


@njit(cache=True, fastmath=_FM)
def _rows1_q5_k(w, x, xs, out, r0, r1, b0, b1, f16):
    xv, sv = x[0, 256 * b0:256 * b1], xs[0, 8 * b0:8 * b1]
    for r in range(r0, r1):
        out[0, r] = _dot1_q5_k(w[r, 176 * b0:176 * b1], xv, sv, b1 - b0, f16)


@njit(cache=True, fastmath=_FM)
def _rows1_q6_k(w, x, xs, out, r0, r1, b0, b1, f16):
    xv, sv = x[0, 256 * b0:256 * b1], xs[0]
    for r in range(r0, r1):
        out[0, r] = _dot1_q6_k(w[r, 210 * b0:210 * b1], xv, sv, b1 - b0, f16)


@njit(cache=True, fastmath=_FM)
def _rows1_q8_0(w, x, xs, out, r0, r1, b0, b1, f16):
    xv, sv = x[0, 32 * b0:32 * b1], xs[0]
    for r in range(r0, r1):
        out[0, r] = _dot1_q8_0(w[r, 34 * b0:34 * b1], xv, sv, b1 - b0, f16)


@njit(cache=True, fastmath=_FM)
def _rows_q4_k(w, x, out, r0, r1, b0, b1, f16):
    acc0 = np.empty(x.shape[0], dtype=np.float32)
    acc1 = np.empty(x.shape[0], dtype=np.float32)
    u = _stack_f32(256)
    v = _stack_f32(256)
    for r in range(r0, r1, 2):                          # rows in pairs; an odd last row pairs with itself
        r2 = min(r + 1, r1 - 1)
        acc0[:] = 0.0
        acc1[:] = 0.0
        w0, w1 = w[r, 144 * b0:144 * b1], w[r2, 144 * b0:144 * b1]
        for b in range(b1 - b0):
            _deq_q4_k(w0, b, u, f16)
            _deq_q4_k(w1, b, v, f16)
            _block_dot2(u, v, 256, x, 256 * (b0 + b), acc0, acc1)
        out[:, r] = acc0
        out[:, r2] = acc1


@njit(cache=True, fastmath=_FM)
def _rows_q5_k(w, x, out, r0, r1, b0, b1, f16):
    acc0 = np.empty(x.shape[0], dtype=np.float32)
    acc1 = np.empty(x.shape[0], dtype=np.float32)
    u = _stack_f32(256)
    v = _stack_f32(256)
    for r in range(r0, r1, 2):                          # rows in pairs; an odd last row pairs with itself
        r2 = min(r + 1, r1 - 1)
        acc0[:] = 0.0
        acc1[:] = 0.0
        w0, w1 = w[r, 176 * b0:176 * b1], w[r2, 176 * b0:176 * b1]
        for b in range(b1 - b0):
            _deq_q5_k(w0, b, u, f16)
            _deq_q5_k(w1, b, v, f16)
            _block_dot2(u, v, 256, x, 256 * (b0 + b), acc0, acc1)
        out[:, r] = acc0
        out[:, r2] = acc1


@njit(cache=True, fastmath=_FM)
def _rows_q6_k(w, x, out, r0, r1, b0, b1, f16):
    acc0 = np.empty(x.shape[0], dtype=np.float32)
    acc1 = np.empty(x.shape[0], dtype=np.float32)
    u = _stack_f32(256)
    v = _stack_f32(256)
    for r in range(r0, r1, 2):                          # rows in pairs; an odd last row pairs with itself
        r2 = min(r + 1, r1 - 1)
        acc0[:] = 0.0
        acc1[:] = 0.0
        w0, w1 = w[r, 210 * b0:210 * b1], w[r2, 210 * b0:210 * b1]
        for b in range(b1 - b0):
            _deq_q6_k(w0, b, u, f16)
            _deq_q6_k(w1, b, v, f16)
            _block_dot2(u, v, 256, x, 256 * (b0 + b), acc0, acc1)
        out[:, r] = acc0
        out[:, r2] = acc1


@njit(cache=True, fastmath=_FM)
def _rows_q8_0(w, x, out, r0, r1, b0, b1, f16):
    acc = np.empty(x.shape[0], dtype=np.float32)
    buf = _stack_f32(256)
    for r in range(r0, r1):
        acc[:] = 0.0
        wr = w[r, 34 * b0:34 * b1]
        for b in range(0, b1 - b0, 8):                 # 8 blocks (256 weights) per pass
            n = min(8, b1 - b0 - b)
            for k in range(n):
                _deq_q8_0(wr, b + k, buf[32 * k:], f16)
            _block_dot(buf, 32 * n, x, 32 * (b0 + b), acc)
        out[:, r] = acc


@njit(cache=True, fastmath=_FM)
def _rows_f16(w, x, out, r0, r1, c0, c1, f16):
    acc = np.empty(x.shape[0], dtype=np.float32)
    buf = _stack_f32(256)
    for r in range(r0, r1):
        acc[:] = 0.0
        for c in range(c0, c1, 256):
            n = min(256, c1 - c)
            _deq_f16(w[r, 2 * c:2 * (c + n)], 0, n, buf)
            _block_dot(buf, n, x, c, acc)
        out[:, r] = acc


@njit(cache=True, fastmath=_FM)
def _rows_bf16(w, x, out, r0, r1, c0, c1, f16):
    acc = np.empty(x.shape[0], dtype=np.float32)
    buf = _stack_f32(256)
    for r in range(r0, r1):
        acc[:] = 0.0
        for c in range(c0, c1, 256):
            n = min(256, c1 - c)
            _deq_bf16(w[r, 2 * c:2 * (c + n)], 0, n, buf)
            _block_dot(buf, n, x, c, acc)
        out[:, r] = acc


@njit(cache=True, fastmath=_FM)
def _rows_f32(w, x, out, r0, r1, c0, c1, f16):
    acc = np.empty(x.shape[0], dtype=np.float32)
    for r in range(r0, r1):
        acc[:] = 0.0
        _block_dot(w[r].view(np.float32)[c0:c1], c1 - c0, x, c0, acc)
        out[:, r] = acc


@njit(cache=True, inline="always")
def rows(code, w, x, xs, out, r0, r1, b0, b1, f16):
    """out[t, r] = sum over blocks [b0, b1) of row r of w times x[t] (same columns), for r in [r0, r1).

    w (R, row_bytes) uint8 raw rows of a type with code `code`; x (T, C) float32 (only the columns of
    blocks b0..b1 are read); xs = sums32(x) (read for Q4_K/Q5_K with T == 1); out (T, >= r1) float32.
    Serial: the parallel drivers (and the MoE kernel) call it on their share of rows.

    Inlined where it is called: a caller that knows `code` at compile time (a closure over it, as
    `kernels_for` and moe_fused's layer kernels are) keeps one branch, so it compiles one type's row
    kernels, not all eleven (cold start: Numba re-optimizes every kernel a function links).
    """
    if code == 4:
        if x.shape[0] == 1:
            _rows1_q4_k(w, x, xs, out, r0, r1, b0, b1, f16)
        else:
            _rows_q4_k(w, x, out, r0, r1, b0, b1, f16)
    elif code == 6:
        if x.shape[0] == 1:
            _rows1_q6_k(w, x, xs, out, r0, r1, b0, b1, f16)
        else:
            _rows_q6_k(w, x, out, r0, r1, b0, b1, f16)
    elif code == 5:
        if x.shape[0] == 1:
            _rows1_q5_k(w, x, xs, out, r0, r1, b0, b1, f16)
        else:
            _rows_q5_k(w, x, out, r0, r1, b0, b1, f16)
    elif code == 3:
        if x.shape[0] == 1:
            _rows1_q8_0(w, x, xs, out, r0, r1, b0, b1, f16)
        else:
            _rows_q8_0(w, x, out, r0, r1, b0, b1, f16)
    elif code == 7:                                     # MXFP4 (issue 15): f16 is mxfp4.E8M0_HALF
        if x.shape[0] == 1:
            mxfp4.rows1(w, x, out, r0, r1, b0, b1, f16)
        else:
            mxfp4.rows(w, x, out, r0, r1, b0, b1, f16)
    elif code == 0:
        _rows_f32(w, x, out, r0, r1, b0, b1, f16)
    elif code == 1:
        _rows_f16(w, x, out, r0, r1, b0, b1, f16)
    else:
        _rows_bf16(w, x, out, r0, r1, b0, b1, f16)


@njit(cache=True)
def no_sums(x):
    """The (T, 1) placeholder passed as `xs` for types whose kernels do not read it."""
    return np.zeros((x.shape[0], 1), dtype=np.float32)


# --------------------------------------------------------------------------------------- the drivers
# One pair of drivers per type, made on first use: a closure over the type code, so each compiles only
# its own type's row kernels (Numba caches closures over plain ints: the key includes their values).

_DRIVERS: dict[tuple[int, int], tuple] = {}


def kernels_for(code: int, aq: int = 0) -> tuple:
    """(serial, parallel) drivers of one type code:
    serial(w, x, out, r0, r1, b0, b1, f16): `rows` on the calling thread (xs computed inside);
    parallel(w, x, out, nb, f16, chunk): all rows, `chunk` rows per task, one parallel region.
    aq != 0: the opt-in quantized-activation kernels (kernels/matmul_q.py) for the types that
    have them; aq = 0 (default) compiles exactly the float drivers."""
    if aq:
        from moert.kernels import matmul_q
        aq = aq if code in matmul_q.QUANT_CODES or (code, aq) == (7, 2) else 0    # (7, 2): MXFP4 int8, issue 15
    if (code, aq) not in _DRIVERS:
        _DRIVERS[code, aq] = mxfp4.make_drivers(aq) if code == 7 else \
            matmul_q.make_drivers(code, aq) if aq else _make_drivers(code)      # MXFP4 (issue 15)
    return _DRIVERS[code, aq]


def variant(fn, name: str, **options):
    """njit(cache=True, **options) of a closure made per type, under a name of its own: every variant of one
    code object would otherwise get one mangled symbol, numbered in the order a process compiles them, and
    variants compiled first in different processes collide when a third loads both from the disk cache."""
    fn.__name__ = fn.__qualname__ = name
    return njit(cache=True, **options)(fn)


def _make_drivers(code: int) -> tuple:
    def serial(w, x, out, r0, r1, b0, b1, f16):
        rows(code, w, x, sums32(x) if code == 4 or code == 5 else no_sums(x), out, r0, r1, b0, b1, f16)

    def parallel(w, x, out, nb, f16, chunk):
        xs = sums32(x) if code == 4 or code == 5 else no_sums(x)
        R = w.shape[0]
        n = (R + chunk - 1) // chunk
        for i in prange(n):
            rows(code, w, x, xs, out, i * chunk, min(R, (i + 1) * chunk), 0, nb, f16)

    return variant(serial, f"serial_t{code}"), variant(parallel, f"parallel_t{code}", parallel=True)


def raw_rows(w: QTensor) -> np.ndarray:
    """The tensor's bytes as a read-only (R, row_bytes) uint8 view (one compiled variant for every caller).
    A file's (R, row_bytes) bytes, as moert's weight store holds them, come back as they are."""
    raw = w.raw
    if raw.ndim == 2 and raw.dtype == np.uint8 and not raw.flags.writeable and raw.flags.c_contiguous:
        return raw                                                      # the per-token fast path
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    a = np.ascontiguousarray(raw).reshape(math.prod(w.shape[:-1]), -1)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def table(type_name: str) -> np.ndarray:
    """The fp16 (or bf16, or MXFP4's E8M0) -> float32 table the kernels of this type read."""
    if type_name == "MXFP4":                                            # MXFP4 (issue 15)
        return mxfp4.E8M0_HALF
    return BF16_TO_F32 if type_name == "BF16" else F16_TO_F32


def n_blocks(type_name: str, cols: int) -> int:
    """How many blocks a row of `cols` weights holds (columns for F32/F16/BF16)."""
    return cols // BLOCK[type_name]


def weight_bytes(w: QTensor) -> int:
    """Bytes of the weight a matmul streams."""
    return int(w.raw.nbytes)


def _check_weight(w: QTensor) -> int:
    """The weight's type code, after checking it is a 2-D tensor of whole blocks of a type with kernels."""
    code = TYPE_CODES.get(w.type)
    if code is None:
        lookup(w.type, FAST_TYPES, "moert.kernels.matmul")             # raises UnsupportedTypeError
    if len(w.shape) != 2:
        raise ValueError(f"matmul needs a 2-D weight (R, C), got shape {w.shape}; pass one expert "
                         f"(QTensor of raw[e]) of a stacked tensor")
    if w.shape[1] % BLOCK[w.type]:
        raise ValueError(f"{w.type} rows of {w.shape[1]} columns are not whole blocks of {BLOCK[w.type]}")
    return code


def threads() -> int:
    """numba.get_num_threads(), without its per-call thread-pool check once the pool is up (~3 us a call)."""
    global _num_threads
    if _num_threads is None:
        numba.get_num_threads()                                         # starts the pool
        try:
            from numba.np.ufunc.parallel import _get_num_threads as _num_threads
        except ImportError:                                             # a Numba without it: the public one
            _num_threads = numba.get_num_threads
    return _num_threads()


_num_threads = None


class Prepared:
    """A weight made ready for repeated matmuls (a model keeps one per CPU weight): its raw rows, type code,
    table and drivers looked up once, so a call costs one Numba dispatch plus a few checks."""

    __slots__ = ("shape", "type", "raw", "code", "nb", "f16", "serial", "parallel")

    def __init__(self, w: QTensor, act_quant: str | None = None):
        """act_quant: None (float, default), "int16" (one-token calls round x per 256-block) or "int8" (every
        call does); see matmul_q.py."""
        aq = 0
        if act_quant is not None:
            from moert.kernels import matmul_q
            aq = matmul_q.mode(act_quant)
        self.code = _check_weight(w)
        self.shape, self.type, self.raw = tuple(w.shape), w.type, raw_rows(w)
        self.nb = w.shape[1] // BLOCK[w.type]
        self.f16 = table(w.type)                                        # MXFP4 (issue 15): was fp16/bf16 only
        self.serial, self.parallel = kernels_for(self.code, aq)

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x (T, C) @ W.T -> (T, R) float32."""
        R, C = self.shape
        if x.ndim != 2 or x.shape[1] != C:
            raise ValueError(f"x {x.shape} does not match the weight {self.shape}: need (T, {C})")
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        T = x.shape[0]
        if out is None:
            out = np.empty((T, R), dtype=np.float32)
        if T == 0 or R == 0:
            return out
        n = threads()
        if n == 1 or self.raw.nbytes * max(1, T // 4) < _PARALLEL_MIN_BYTES:
            self.serial(self.raw, x, out, 0, R, 0, self.nb, self.f16)
        else:
            chunk = max(1, min(64, -(-R // (4 * n))))  # >= 4 chunks a thread, so no thread idles long
            self.parallel(self.raw, x, out, self.nb, self.f16, chunk)
        return out


def matmul(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """x (T, C) @ W.T -> (T, R) float32, W read from its quantized bytes (parallel over rows)."""
    return Prepared(w)(np.asarray(x), out)


def matvec(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """x (C,) @ W.T -> (R,) float32, W read from its quantized bytes (parallel over rows)."""
    y = matmul(np.asarray(x).reshape(1, -1), w, None if out is None else out.reshape(1, -1))
    return y.reshape(-1) if out is None else out


def matmul_ref(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """Reference twin of matmul: the NumPy reference dequantizer, then x @ W.T."""
    y = np.asarray(x, dtype=np.float32) @ _ref_dequantize(w.raw, w.type, w.shape).T
    if out is not None:
        out[...] = y
        return out
    return y


def matvec_ref(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """Reference twin of matvec."""
    y = matmul_ref(np.asarray(x).reshape(1, -1), w).reshape(-1)
    if out is not None:
        out[...] = y
        return out
    return y


# MXFP4 (issue 15): its row kernels live in kernels/mxfp4.py, which imports the helpers above; imported last so
# that either module may be imported first
from moert.kernels import mxfp4  # noqa: E402
