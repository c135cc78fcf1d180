"""Triton block decoders: one 256-weight chunk of R rows, read from the GGUF block bytes as they are.

deq(wp, roff, c, K, s, l, QT) -> (R, S, L) float32: chunk c of the rows whose first byte is wp + roff (R, 1, 1),
with s = arange(S)[None, :, None] and l = arange(L)[None, None, :]; weight k = 256 c + L s + l of each row.
Weights at or past K (the tail of a row of 32-blocks or plain values) come back as 0. QT is a constexpr
(kernels/gpu/table.py's QT_CODES): each kernel is compiled for one type and carries only its decoder.

Layouts and byte diagrams: moert/quants/dequant.py, whose reference dequantizers these follow operation for
operation in float32 (d * sc first, then times q, minus dmin * m), so the only differences are a GPU's fused
multiply-adds (one rounding, not two). Scales load as (R, S, 1) columns, once per sub-block, and broadcast.
Halves are read as two bytes (every f16 of every block sits at an even offset; blocks need no alignment).
"""

import triton
import triton.language as tl


@triton.jit
def _u8(p, mask):
    """The bytes at p as int32 (0 where masked)."""
    return tl.load(p, mask=mask, other=0).to(tl.int32)


@triton.jit
def _half(p, mask):
    """The little-endian f16 at p (two bytes) as float32."""
    bits = (_u8(p, mask) | (_u8(p + 1, mask) << 8)).to(tl.uint16)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _scale_min_k4(sb, j, mask):
    """Q4_K/Q5_K: the 6-bit scale and min of sub-block j (< 8) from the 12 scale bytes at sb."""
    lo = j < 4
    a = _u8(sb + tl.where(lo, j, j + 4), mask)        # j < 4: sb[j]     j >= 4: sb[j + 4]
    b = _u8(sb + tl.where(lo, j + 4, j - 4), mask)    # j < 4: sb[j + 4] j >= 4: sb[j - 4]
    c = _u8(sb + j, mask)                             #                  j >= 4: sb[j]
    sc = tl.where(lo, a & 63, (a & 0xF) | ((b >> 6) << 4))
    m = tl.where(lo, b & 63, (a >> 4) | ((c >> 6) << 4))
    return sc.to(tl.float32), m.to(tl.float32)


@triton.jit
def _e2m1x2(q):
    """MXFP4 code (4 bits) -> twice its E2M1 value (ggml's doubled table 0 1 2 3 4 6 8 12, sign in bit 3)."""
    m = q & 7
    big = (2 + (m & 1)) << ((m >> 1) - 1)             # m >= 4: 4 6 8 12 (the shift is >= 1 there)
    v = tl.where(m < 4, m, big).to(tl.float32)
    return tl.where(q >= 8, -v, v)


@triton.jit
def _e8m0_half(e):
    """E8M0 byte -> 2^(e - 128), as ggml_e8m0_to_fp32_half (e < 2: a subnormal)."""
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def deq(wp, roff, c, K, s, l, QT: tl.constexpr):
    """(R, S, L) float32 weights of chunk c (see the module docstring)."""
    if QT == 7 or QT == 8:
        # Q4_K 144 / Q5_K 176 bytes: | d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128] |; S = 8 sub-blocks of 32
        base = wp + roff + c * (144 if QT == 7 else 176)                     # (R, 1, 1)
        ok = roff >= 0                                                       # every row is whole
        d, dmin = _half(base, ok), _half(base + 2, ok)
        sc, m = _scale_min_k4(base + 4, s, ok)                               # (R, S, 1)
        qs = base + (16 if QT == 7 else 48) + 32 * (s // 2) + l
        q = (_u8(qs, ok) >> (4 * (s % 2))) & 0xF                             # (R, S, L)
        if QT == 8:
            q = q | (((_u8(base + 16 + l, ok) >> s) & 1) << 4)               # bit s of qh[l]
        w = (d * sc) * q.to(tl.float32) - dmin * m
    elif QT == 9:
        # Q6_K 210 bytes: | ql[128] | qh[64] | scales[16] int8 | d |; S = 16 sub-blocks of 16
        base = wp + roff + c * 210
        ok = roff >= 0
        i = 16 * s + l                                                       # weight in the block
        h, t, j = i >> 7, (i >> 5) & 3, i & 31
        lo = (_u8(base + 64 * h + 32 * (t & 1) + j, ok) >> (4 * (t >> 1))) & 0xF
        hi = (_u8(base + 128 + 32 * h + j, ok) >> (2 * t)) & 3
        sc = _u8(base + 192 + s, ok).to(tl.int8).to(tl.float32)             # (R, S, 1)
        w = (_half(base + 208, ok) * sc) * ((lo | (hi << 4)) - 32).to(tl.float32)
    elif QT >= 3:
        # 32-weight blocks, S = 8 of them per chunk: block b of the row, valid while 32 b < K
        b = c * 8 + s                                                        # (1, S, 1)
        ok = (roff >= 0) & (b * 32 < K)                                      # (R, S, 1)
        if QT == 3:      # Q8_0 34 bytes: | d | qs[32] int8 |
            base = wp + roff + b * 34
            w = _u8(base + 2 + l, ok).to(tl.int8).to(tl.float32) * _half(base, ok)
        elif QT == 4:    # Q4_0 18 bytes: | d | qs[16]: q[j] low nibble of qs[j], q[j + 16] high |
            base = wp + roff + b * 18
            q = (_u8(base + 2 + (l & 15), ok) >> (4 * (l >> 4))) & 0xF
            w = _half(base, ok) * (q.to(tl.float32) - 8)
        elif QT == 5:    # Q5_0 22 bytes: | d | qh u32: bit j = bit 4 of q[j] | qs[16] |
            base = wp + roff + b * 22
            q = (_u8(base + 6 + (l & 15), ok) >> (4 * (l >> 4))) & 0xF
            q = q | (((_u8(base + 2 + (l >> 3), ok) >> (l & 7)) & 1) << 4)
            w = _half(base, ok) * (q.to(tl.float32) - 16)
        else:            # MXFP4 17 bytes: | e E8M0 | qs[16]: nibbles as Q4_0 |
            base = wp + roff + b * 17
            q = (_u8(base + 1 + (l & 15), ok) >> (4 * (l >> 4))) & 0xF
            w = _e8m0_half(_u8(base, ok)) * _e2m1x2(q)
    else:
        # plain rows: the row is K values of 4 (F32) or 2 (F16, BF16) bytes
        k = c * 256 + s * l.shape[2] + l                                     # (1, S, L)
        ok = (roff >= 0) & (k < K)
        if QT == 0:
            w = tl.load((wp + roff + 4 * k).to(tl.pointer_type(tl.float32)), mask=ok, other=0.0)
        elif QT == 1:
            w = tl.load((wp + roff + 2 * k).to(tl.pointer_type(tl.float16)), mask=ok, other=0.0).to(tl.float32)
        else:
            bits = tl.load((wp + roff + 2 * k).to(tl.pointer_type(tl.uint16)), mask=ok, other=0)
            w = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return w
