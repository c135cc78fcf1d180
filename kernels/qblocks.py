"""Per-type block decoders of the float matmul kernels (kernels/matmul.py), one section per GGML type with
its block drawn as bytes (as gguf-py's quants.py and moert/quants/dequant.py, the reference, draw them).

Each type that the kernel table (kernels/ktypes.py) lists brings, here:
    dot1_<t>(w, x, xs, nb, f16) -> float32   one token: w . x for nb blocks of one row (w the row's bytes),
                                             decoding each block's quants straight into FMAs; xs per-32 sums
                                             of x (read by Q4_K/Q5_K only)
    deq_<t>(...)                             batch: a block (or chunk) of a row dequantized into a float32
                                             buffer in L1, which kernels/blockdot.py multiplies with 4 tokens
        "paired" types (256-weight blocks):  deq(w, b, buf, f16)     block b -> buf[:256]
        "chunked" types:                     deq(w, b, k, buf, f16)  blocks [b, b + k) -> buf[:k * block]

How they read: the one-token per-lane accumulators live on the stack (stack_f32), so LLVM keeps them in
vector registers across blocks, with no horizontal sum per sub-block; the block's scales are decoded once
into a small stack array. Inner loops index slices from 0: an offset LLVM cannot prove non-negative keeps
Numba's negative-index wraparound in every load (2x slower, measured). w is a row's uint8 bytes from its
first block; f16 the fp16 (or bf16) -> float32 table. Check the loops with `bench/bench_matmul.py --asm`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moert.kernels.blockdot import FM, I32, stack_f32

__all__ = ["bf16_bits", "deq_bf16", "deq_f16", "deq_q4_k", "deq_q5_k", "deq_q6_k", "deq_q8_0", "dot1_q4_k",
           "dot1_q5_k", "dot1_q6_k", "dot1_q8_0", "f16_bits", "half", "i8", "scales_k4"]


@njit(cache=True, inline="always")
def half(w, i, f16):
    """The little-endian fp16 at w[i], w[i+1] as float32 (through the 64K table: Numba has no float16)."""
    return f16[I32(w[i]) | I32(I32(w[i + 1]) << I32(8))]


@njit(cache=True, inline="always")
def scales_k4(w, o, d, dmin, dsc, dmn):
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


# --------------------------------------------------------------------------------------------- Q4_K
# | d f16 | dmin f16 | scales[12] | qs[128] |  w = d*sc_j * q - dmin*m_j, 8 sub-blocks j of 32
#   sub-blocks 2p, 2p+1 (p < 4): low, high nibbles of qs[32p:32p+32]

@njit(cache=True, fastmath=FM)
def dot1_q4_k(w, x, xs, nb, f16):
    """w . x for nb blocks: w (nb*144,) uint8 one row's bytes, x (nb*256,), xs = its per-32 sums (nb*8,)."""
    acc = stack_f32(64)
    dsc = stack_f32(8)
    dmn = stack_f32(8)
    for l in range(64):
        acc[l] = 0.0
    mins = np.float32(0.0)
    for b in range(nb):
        o = b * 144
        scales_k4(w, o, half(w, o, f16), half(w, o + 2, f16), dsc, dmn)
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


@njit(cache=True, fastmath=FM, inline="always")
def deq_q4_k(w, b, buf, f16):
    o = b * 144
    dsc = stack_f32(8)
    dmn = stack_f32(8)
    scales_k4(w, o, half(w, o, f16), half(w, o + 2, f16), dsc, dmn)
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

@njit(cache=True, fastmath=FM)
def dot1_q5_k(w, x, xs, nb, f16):
    acc = stack_f32(64)
    dsc = stack_f32(8)
    dmn = stack_f32(8)
    for l in range(64):
        acc[l] = 0.0
    mins = np.float32(0.0)
    for b in range(nb):
        o = b * 176
        scales_k4(w, o, half(w, o, f16), half(w, o + 2, f16), dsc, dmn)
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


@njit(cache=True, fastmath=FM, inline="always")
def deq_q5_k(w, b, buf, f16):
    o = b * 176
    dsc = stack_f32(8)
    dmn = stack_f32(8)
    scales_k4(w, o, half(w, o, f16), half(w, o + 2, f16), dsc, dmn)
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
def i8(u):
    """A uint8 reinterpreted as int8, as int32."""
    return I32(I32(I32(u) ^ I32(128)) - I32(128))


@njit(cache=True, fastmath=FM)
def dot1_q6_k(w, x, xs, nb, f16):
    """w . x for nb Q6_K blocks. Lane l of the accumulator takes weights 128h + 32t + l for all four t,
    each times a per-lane scale (d * the scale of its 16-weight sub-block): one 32-lane loop per half
    block. Two 16-lane loops per sub-block with broadcast scales ran 2.5x slower (measured)."""
    acc = stack_f32(32)
    sc = stack_f32(128)                                # (t, l): d * scale of weight 32t + l's sub-block
    for l in range(32):
        acc[l] = 0.0
    for b in range(nb):
        o = b * 210
        d = half(w, o + 208, f16)
        for h in range(2):
            for t in range(4):
                for g in range(2):
                    v = d * np.float32(i8(w[o + 192 + 8 * h + 2 * t + g]))
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


@njit(cache=True, fastmath=FM, inline="always")
def deq_q6_k(w, b, buf, f16):
    o = b * 210
    d = half(w, o + 208, f16)
    sc = stack_f32(128)                                # per-lane scales, as in dot1_q6_k
    for h in range(2):
        for t in range(4):
            for g in range(2):
                v = d * np.float32(i8(w[o + 192 + 8 * h + 2 * t + g]))
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

@njit(cache=True, fastmath=FM)
def dot1_q8_0(w, x, xs, nb, f16):
    acc = stack_f32(32)
    for l in range(32):
        acc[l] = 0.0
    for b in range(nb):
        o = b * 34
        d = half(w, o, f16)
        for l in range(32):
            acc[l] += d * (np.float32(i8(w[o + 2 + l])) * x[32 * b + l])
    s = np.float32(0.0)
    for l in range(32):
        s += acc[l]
    return s


@njit(cache=True, fastmath=FM, inline="always")
def _deq1_q8_0(w, b, buf, f16):
    o = b * 34
    d = half(w, o, f16)
    for l in range(32):
        buf[l] = d * np.float32(i8(w[o + 2 + l]))


# ------------------------------------------------------------------------------------ F32, F16, BF16
# F32: the row is float32. BF16: the top half of a float32. F16 -> float32 bit by bit, so it vectorizes
# (a table lookup per weight would be a gather): (h & 0x7fff) << 13 read as float32 and times 2^112 is
# exact for normal and subnormal halves; exponent 31 (inf, nan) is forced to 255; then the sign.

@njit(cache=True, fastmath=FM, inline="always")
def f16_bits(w, c0, n, buf):
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


@njit(cache=True, fastmath=FM, inline="always")
def bf16_bits(w, c0, n, buf):
    h = w.view(np.uint16)
    u = buf.view(np.uint32)
    for l in range(n):
        u[l] = np.uint32(h[c0 + l]) << np.uint32(16)


# ----------------------------------------------------------------------------------- chunked decoders
# Q8_0 (32 weights), F16 and BF16 (one column a "block") go up to 256 weights per chunk.

@njit(cache=True, fastmath=FM, inline="always")
def deq_q8_0(w, b, k, buf, f16):
    """Q8_0 blocks [b, b + k) of the row w -> buf[:32 k]."""
    for j in range(k):
        _deq1_q8_0(w, b + j, buf[32 * j:], f16)


@njit(cache=True, fastmath=FM, inline="always")
def deq_f16(w, b, k, buf, f16):
    """F16 columns [b, b + k) of the row w -> buf[:k]."""
    f16_bits(w[2 * b:2 * (b + k)], 0, k, buf)


@njit(cache=True, fastmath=FM, inline="always")
def deq_bf16(w, b, k, buf, f16):
    """BF16 columns [b, b + k) of the row w -> buf[:k]."""
    bf16_bits(w[2 * b:2 * (b + k)], 0, k, buf)
