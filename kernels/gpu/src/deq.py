"""Triton block decoders: 256-weight chunks of weight rows, read from the GGUF block bytes as they are.

deq(wp, roff, c, K, s, l, QT) -> (R * S, L) float32: chunks seen as sub-blocks of L weights, one per tile row: tile
row i is sub-block s[i] of chunk c[i] of the row whose first byte is wp + roff[i] (roff, s and c: (R * S,), or c a
scalar; l = arange(L)); weight k = 256 c + L s + l of that row. Weights at or past K (past the row's last chunk, or
in the tail of a row of 32-blocks or plain values) come back as 0; the masks are block-shaped, since a block &
scalar mask is int32 under Triton's interpreter, which tl.load refuses. QT is a constexpr (kernels/gpu/table.py's
QT_CODES): each kernel is compiled for one type and carries only its decoder.

Why a sub-block per tile row: a thread then holds the weights of one sub-block (Triton lays the L contiguous
bytes along a thread), so a sub-block's scale is one value per thread, loaded once and broadcast along its row,
and its quant bytes load as vectors where the block allows (Q4_K / Q5_K: 144 / 176-byte blocks, 16-aligned;
Q8_0's 34, Q5_0's 22, Q6_K's 210 and MXFP4's 17 bytes allow 2-byte or byte loads only: a load-time repack
to aligned blocks would pay there, and is not done yet).

Layouts and byte diagrams: moert/quants/dequant.py, whose reference dequantizers these follow operation for
operation in float32 (d * sc first, then times q, minus dmin * m), so the only differences are a GPU's fused
multiply-adds (one rounding, not two). Halves are read as two bytes (every f16 of every block sits at an even
offset; blocks need no alignment).
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
    """MXFP4 code (4 bits) -> twice its E2M1 value: ggml's doubled magnitudes 0 1 2 3 4 6 8 12 are the nibbles of
    0xC8643210 (one shift and mask picks one), and bit 3, the sign, goes straight to the float's sign bit."""
    u = q.to(tl.uint32)                                    # the table does not fit an int32
    mag = ((0xC8643210 >> (4 * (u & 7))) & 0xF).to(tl.float32)
    return (mag.to(tl.uint32, bitcast=True) | ((u & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_half(e):
    """E8M0 byte -> 2^(e - 128), as ggml_e8m0_to_fp32_half (e < 2: a subnormal)."""
    bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
    return bits.to(tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def deq(wp, roff, c, K, s, l, QT: tl.constexpr):
    """(R * S, L) float32 weights of chunk c (see the module docstring). roff (R * S,) int64 and s (R * S,) are 1-d:
    what depends on the sub-block alone (scales, block headers) is loaded as one value per tile row and only then
    broadcast over l (L,); a 2-d (R * S, 1) pointer would be laid out like the tile and load once per weight."""
    l2 = l[None, :]                                                          # (1, L)
    if QT == 7 or QT == 8:
        # Q4_K 144 / Q5_K 176 bytes: | d | dmin | scales[12] | (Q5_K: qh[32]) | qs[128] |; S = 8 sub-blocks of 32
        base = wp + roff + c * (144 if QT == 7 else 176)                     # (R * S,)
        ok = roff * 0 + c * 256 < K                                          # chunks past the row: none
        sc, m = _scale_min_k4(base + 4, s, ok)                               # (R * S,)
        dl, ml = _half(base, ok) * sc, _half(base + 2, ok) * m
        qs = (base + (16 if QT == 7 else 48) + 32 * (s // 2))[:, None] + l2
        q = (_u8(qs, ok[:, None]) >> (4 * (s % 2))[:, None]) & 0xF          # (R * S, L)
        if QT == 8:
            q = q | (((_u8(base[:, None] + 16 + l2, ok[:, None]) >> s[:, None]) & 1) << 4)   # bit s of qh[l]
        w = dl[:, None] * q.to(tl.float32) - ml[:, None]
    elif QT == 9:
        # Q6_K 210 bytes: | ql[128] | qh[64] | scales[16] int8 | d |; S = 16 sub-blocks of 16. Weight 16 s + l is
        # weight j = 16 (s % 2) + l of part t = (s // 2) % 4 of half h = s // 8 (the layout in dequant.py)
        base = wp + roff + c * 210
        ok = roff * 0 + c * 256 < K
        h, t, j0 = s // 8, (s // 2) % 4, 16 * (s % 2)
        dl = _half(base + 208, ok) * _u8(base + 192 + s, ok).to(tl.int8).to(tl.float32)   # (R * S,)
        lo = _u8((base + 64 * h + 32 * (t % 2) + j0)[:, None] + l2, ok[:, None]) >> (4 * (t // 2))[:, None]
        hi = _u8((base + 128 + 32 * h + j0)[:, None] + l2, ok[:, None]) >> (2 * t)[:, None]
        w = dl[:, None] * (((lo & 0xF) | ((hi & 3) << 4)) - 32).to(tl.float32)
    elif QT >= 3:
        # 32-weight blocks, S = 8 of them per chunk: block b of the row, valid while 32 b < K
        b = c * 8 + s                                                        # (R * S,)
        ok = (roff >= 0) & (b * 32 < K)
        ok2 = ok[:, None]
        if QT == 3:      # Q8_0 34 bytes: | d | qs[32] int8 |
            base = wp + roff + b * 34
            w = _u8(base[:, None] + 2 + l2, ok2).to(tl.int8).to(tl.float32) * _half(base, ok)[:, None]
        else:            # Q4_0, Q5_0, MXFP4: 16 bytes of nibbles, q[j] low nibble of qs[j], q[j + 16] high
            nib = (l2 & 15)
            shift = 4 * (l2 >> 4)
            if QT == 4:      # Q4_0 18 bytes: | d | qs[16] |
                base = wp + roff + b * 18
                q = (_u8(base[:, None] + 2 + nib, ok2) >> shift) & 0xF
                w = _half(base, ok)[:, None] * (q.to(tl.float32) - 8)
            elif QT == 5:    # Q5_0 22 bytes: | d | qh u32: bit j = bit 4 of q[j] | qs[16] |
                base = wp + roff + b * 22
                qh = _u8(base + 2, ok) | (_u8(base + 3, ok) << 8) | (_u8(base + 4, ok) << 16) | (
                    _u8(base + 5, ok) << 24)
                q = (_u8(base[:, None] + 6 + nib, ok2) >> shift) & 0xF
                q = q | (((qh[:, None] >> l2) & 1) << 4)
                w = _half(base, ok)[:, None] * (q.to(tl.float32) - 16)
            else:            # MXFP4 17 bytes: | e E8M0 | qs[16] |
                base = wp + roff + b * 17
                q = (_u8(base[:, None] + 1 + nib, ok2) >> shift) & 0xF
                w = _e8m0_half(_u8(base, ok))[:, None] * _e2m1x2(q)
    else:
        # plain rows: the row is K values of 4 (F32) or 2 (F16, BF16) bytes
        k = (c * 256 + s * l.shape[0])[:, None] + l2                         # (R * S, L)
        ok = (roff >= 0)[:, None] & (k < K)
        row = wp + roff                                                      # (R * S,) the rows' first bytes
        if QT == 0:          # typed row pointers, then element offsets: the loads stay contiguous vectors
            w = tl.load(row.to(tl.pointer_type(tl.float32))[:, None] + k, mask=ok, other=0.0)
        elif QT == 1:
            w = tl.load(row.to(tl.pointer_type(tl.float16))[:, None] + k, mask=ok, other=0.0).to(tl.float32)
        else:
            bits = tl.load(row.to(tl.pointer_type(tl.uint16))[:, None] + k, mask=ok, other=0)
            w = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return w


@triton.jit
def deq2(wp, roff, c, K, s, l, QT: tl.constexpr):
    """The nibble types for the decode kernels, two weights per byte: (lo, hi), each (R * S, L) float32, where tile
    row i holds byte run s[i] of its row and the byte l of it gives weight 2 L s + l (its low nibble) and
    2 L s + L + l (its high one). Q4_K / Q5_K: S = 4 runs of L = 32 bytes (sub-blocks 2s and 2s + 1); Q4_0, Q5_0,
    MXFP4: S = 8 blocks of L = 16 bytes. One byte loaded and unpacked feeds both weights in the same thread, where
    deq's tile puts the two nibbles of a byte in two threads that each load it."""
    l2 = l[None, :]
    if QT == 7 or QT == 8:
        base = wp + roff + c * (144 if QT == 7 else 176)                     # (R * S,)
        ok = roff * 0 + c * 256 < K
        d, dmin = _half(base, ok), _half(base + 2, ok)
        sc0, m0 = _scale_min_k4(base + 4, 2 * s, ok)
        sc1, m1 = _scale_min_k4(base + 4, 2 * s + 1, ok)
        q = _u8((base + (16 if QT == 7 else 48) + 32 * s)[:, None] + l2, ok[:, None])          # (R * S, L)
        q0, q1 = q & 0xF, q >> 4
        if QT == 8:
            qh = _u8(base[:, None] + 16 + l2, ok[:, None]) >> (2 * s)[:, None]                   # bits 2s, 2s + 1
            q0, q1 = q0 | ((qh & 1) << 4), q1 | ((qh & 2) << 3)
        lo = (d * sc0)[:, None] * q0.to(tl.float32) - (dmin * m0)[:, None]
        hi = (d * sc1)[:, None] * q1.to(tl.float32) - (dmin * m1)[:, None]
    else:
        b = c * 8 + s                                                        # (R * S,) 32-weight blocks
        ok = (roff >= 0) & (b * 32 < K)
        ok2 = ok[:, None]
        if QT == 4:      # Q4_0
            base = wp + roff + b * 18
            q = _u8(base[:, None] + 2 + l2, ok2)
            d = _half(base, ok)[:, None]
            lo, hi = d * ((q & 0xF).to(tl.float32) - 8), d * ((q >> 4).to(tl.float32) - 8)
        elif QT == 5:    # Q5_0: bit j of qh is bit 4 of weight j
            base = wp + roff + b * 22
            qh = _u8(base + 2, ok) | (_u8(base + 3, ok) << 8) | (_u8(base + 4, ok) << 16) | (_u8(base + 5, ok) << 24)
            qh = qh[:, None] >> l2
            q = _u8(base[:, None] + 6 + l2, ok2)
            d = _half(base, ok)[:, None]
            lo = d * (((q & 0xF) | ((qh & 1) << 4)).to(tl.float32) - 16)
            hi = d * (((q >> 4) | (((qh >> 16) & 1) << 4)).to(tl.float32) - 16)
        else:            # MXFP4
            base = wp + roff + b * 17
            q = _u8(base[:, None] + 1 + l2, ok2)
            e = _e8m0_half(_u8(base, ok))[:, None]
            lo, hi = e * _e2m1x2(q & 0xF), e * _e2m1x2(q >> 4)
    return lo, hi


@triton.jit
def deq4(wp, roff, c, K, s, l, QT: tl.constexpr):
    """Q6_K for the decode kernels, four weights per byte position: (w0, w1, w2, w3), each (R * S, L = 16) float32.
    S = 4 tile rows per chunk: row s covers half h = s // 2 of the block, bytes j = 16 (s % 2) + l of its runs,
    and w_t is weight 128 h + 32 t + j: its low bits the nibble t // 2 of ql[64 h + 32 (t % 2) + j], its high bits
    bits 2t, 2t + 1 of qh[32 h + j], its scale scales[8 h + 2 t + s % 2]. Three byte loads feed four weights, where
    deq's tile loads two bytes for each."""
    base = wp + roff + c * 210                                               # (R * S,)
    ok = roff * 0 + c * 256 < K
    h, j0 = s // 2, 16 * (s % 2)
    ok2 = ok[:, None]
    l2 = l[None, :]
    q0 = _u8((base + 64 * h + j0)[:, None] + l2, ok2)                       # parts t = 0 (low nibble), 2 (high)
    q1 = _u8((base + 64 * h + 32 + j0)[:, None] + l2, ok2)                  # parts t = 1, 3
    qh = _u8((base + 128 + 32 * h + j0)[:, None] + l2, ok2)
    d = _half(base + 208, ok)
    sc = base + 192 + 8 * h + s % 2                                         # scale of part t at sc + 2 t
    w0 = (d * _u8(sc, ok).to(tl.int8).to(tl.float32))[:, None] * (((q0 & 0xF) | ((qh & 3) << 4)) - 32).to(tl.float32)
    w1 = (d * _u8(sc + 2, ok).to(tl.int8).to(tl.float32))[:, None] * (
        ((q1 & 0xF) | (((qh >> 2) & 3) << 4)) - 32).to(tl.float32)
    w2 = (d * _u8(sc + 4, ok).to(tl.int8).to(tl.float32))[:, None] * (
        ((q0 >> 4) | (((qh >> 4) & 3) << 4)) - 32).to(tl.float32)
    w3 = (d * _u8(sc + 6, ok).to(tl.int8).to(tl.float32))[:, None] * (
        ((q1 >> 4) | ((qh >> 6) << 4)) - 32).to(tl.float32)
    return w0, w1, w2, w3
