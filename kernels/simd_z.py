"""x86 AVX-512 int8 Q4_K rows: kernels/simd.py's q4k_row with 512-bit vectors, on a CPU with AVX-512BW (the kernel
table picks it for act_quant="int8", kernels/ktypes.py). A prompt's int8 matmuls are compute-bound (an expert sees
~4 of 64 tokens: each block is decoded once and multiplied with each token's x), and a 512-bit vpmaddubsw / vpmaddwd
does twice an AVX2 one's weights: per block and token 4 + 4 instead of 8 + 8.

    One block: its 128 nibble bytes as two 64-byte vectors, pairs (0, 1) and (2, 3); the low nibbles of the first
    are sub-blocks 0 and 2, the high ones 1 and 3 (then 4, 6 and 5, 7). x is put in that order once per matmul
    (x_q4_kz: each 256-block's sub-blocks 0 2 1 3 4 6 5 7), so each of the four vectors meets x in one load;
    vpmaddubsw then vpmaddwd with the two sub-blocks' scales (16 lanes each) sums 64 weights into 16 int32 lanes.

The int32 sums per block are the same integers as q4k_row's (the same products, summed exactly); the float lanes
add in another order (within 1e-6 of sum |w x|: tests/test_kernels_matmul_q.py through the table, and
tests/test_kernels_simd_z.py against q4k_row and the twin).

    q4kz_row(w, o, nb, xq, c, ld, xd, cd, ldd, xb, cb, ldb, n)   q4k_row's signature, x in x_q4_kz's order
    rows8_q4_kz, x_q4_kz                                         the kernel table's (rows, x) pair for it
    q6kz_row, rows8_q6_kz                                        the same for Q6_K (x in GGUF's order: x_q6_k)
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit

from moert.kernels import matmul_q
from moert.kernels.blockdot import FM
from moert.kernels.jit import variant
from moert.kernels.simd import (
    _I8,
    _I16,
    _I32,
    _at,
    _fn,
    _lanes,
    _scales_mins,
    _V32x8,
    _vload,
    prefetch,
    q4k_row_intrinsic,
    q6k_row_intrinsic,
    q6k_values,
)

__all__ = ["ORDER", "available", "q4kz_row", "q6kz_row", "rows8_q4_kz", "rows8_q6_kz", "x_q4_kz", "z_x8", "z_x8_ref"]

_V64x8, _V32x16, _V16x32 = ir.VectorType(_I8, 64), ir.VectorType(_I16, 32), ir.VectorType(_I32, 16)
ORDER = (0, 2, 1, 3, 4, 6, 5, 7)        # x's sub-block at position k of each 256-block, in x_q4_kz's order


@functools.cache
def available() -> bool:
    """True when the host CPU has AVX-512BW (512-bit vpmaddubsw, vpmaddwd)."""
    from llvmlite import binding
    try:
        return {"+avx512f", "+avx512bw"} <= set(binding.get_host_cpu_features().flatten().split(","))
    except RuntimeError:                                                 # features unknown: be safe
        return False


def _q4k(context, builder, aty, wa, o, xty, xa, cs, bty, ba, cbs):
    """IR for one Q4_K block at w[o:] against len(cs) int8 token vectors at xq[c] (x_q4_kz's order; their negated
    per-32 sums, int16, in GGUF's order at xb[cb]): one <8 x i32> a token, as simd._q4k's (lanes 0-3 adding up
    to sum_j sc_j isum_j, lanes 4-7 to -sum_j m_j xb_j)."""
    sm = _scales_mins(context, builder, aty, wa, o)                    # lanes 0-7 sc, 8-15 m
    prefetch(context, builder, aty, wa, o, 144)
    mins = _lanes(builder, sm, list(range(8, 16)))                     # <8 x i16>
    madd4 = _fn(builder, "llvm.x86.sse2.pmadd.wd", ir.VectorType(_I32, 4), [ir.VectorType(_I16, 8)] * 2)
    msums = [builder.call(madd4, [mins, _vload(context, builder, bty, ba, cb, ir.VectorType(_I16, 8))])
             for cb in cbs]                                            # -sum m_j xb_j in 4 lanes
    maddubs = _fn(builder, "llvm.x86.avx512.pmaddubs.w.512", _V32x16, [_V64x8, _V64x8])
    madd = _fn(builder, "llvm.x86.avx512.pmaddw.d.512", _V16x32, [_V32x16, _V32x16])
    m4 = ir.Constant(_V64x8, [15] * 64)
    accs = [ir.Constant(_V16x32, [0] * 16)] * len(cs)
    for h in range(2):                                                  # pairs (2h, 2h + 1): 128 weights
        q = _vload(context, builder, aty, wa, _at(builder, o, 16 + 64 * h), _V64x8)
        halves = (builder.and_(q, m4), builder.and_(builder.lshr(q, ir.Constant(_V64x8, [4] * 64)), m4))
        for k, nib in enumerate(halves):                                # low: sub-blocks 4h, 4h + 2; high: + 1
            j = 4 * h + k
            sc = _lanes(builder, sm, [j] * 16 + [j + 2] * 16)           # <32 x i16>: each sub-block's scale
            for i, c in enumerate(cs):
                x = _vload(context, builder, xty, xa, _at(builder, c, 128 * h + 64 * k), _V64x8)
                accs[i] = builder.add(accs[i], builder.call(madd, [builder.call(maddubs, [nib, x]), sc]))
    out = []
    for acc, ms in zip(accs, msums):
        s8 = builder.add(_lanes(builder, acc, list(range(8))), _lanes(builder, acc, list(range(8, 16))))
        s4 = builder.add(_lanes(builder, s8, [0, 1, 2, 3]), _lanes(builder, s8, [4, 5, 6, 7]))
        out.append(builder.shuffle_vector(s4, ms, ir.Constant(_V32x8, list(range(8)))))
    return out


q4kz_row = q4k_row_intrinsic(lambda builder: _q4k, 144, "q4kz_row")
q4kz_row.__doc__ = """simd.q4k_row with 512-bit vectors: x (xq) in x_q4_kz's order, everything else as q4k_row."""


def _q6k(context, builder, aty, wa, o, xty, xa, cs, sty, sa, ss):
    """IR for one Q6_K block at w[o:] against len(cs) int8 token vectors at xq[c] (GGUF's order: two 32-weight
    runs are 64 contiguous x), per-16 sums at xs[s]: one <8 x i32> a token whose lanes add up to the block's
    sum, as simd._q6k's (the -32 offset out once per block; 64 weights, four 16-groups, per vpmaddubsw)."""
    sc16 = builder.sext(_vload(context, builder, aty, wa, _at(builder, o, 192), ir.VectorType(_I8, 16)),
                        ir.VectorType(_I16, 16))
    prefetch(context, builder, aty, wa, o, 210)
    madd8 = _fn(builder, "llvm.x86.avx2.pmadd.wd", _V32x8, [ir.VectorType(_I16, 16)] * 2)
    offs = [builder.sub(ir.Constant(_V32x8, [0] * 8), builder.shl(builder.call(madd8, [sc16, _vload(
        context, builder, sty, sa, s_, ir.VectorType(_I16, 16))]), ir.Constant(_V32x8, [5] * 8))) for s_ in ss]
    maddubs = _fn(builder, "llvm.x86.avx512.pmaddubs.w.512", _V32x16, [_V64x8, _V64x8])
    madd = _fn(builder, "llvm.x86.avx512.pmaddw.d.512", _V16x32, [_V32x16, _V32x16])
    accs = [ir.Constant(_V16x32, [0] * 16)] * len(cs)
    for h in range(2):
        qs = q6k_values(context, builder, aty, wa, o, h)                # four <32 x i8>: weights 128h + 32t + l
        for p in range(2):                                              # t = 2p, 2p + 1: groups 8h + 4p .. + 3
            q = builder.shuffle_vector(qs[2 * p], qs[2 * p + 1], ir.Constant(ir.VectorType(_I32, 64), list(range(64))))
            g = 8 * h + 4 * p
            sc = _lanes(builder, sc16, [g] * 8 + [g + 1] * 8 + [g + 2] * 8 + [g + 3] * 8)
            for i, c in enumerate(cs):
                x = _vload(context, builder, xty, xa, _at(builder, c, 128 * h + 64 * p), _V64x8)
                accs[i] = builder.add(accs[i], builder.call(madd, [builder.call(maddubs, [q, x]), sc]))
    lo, hi = list(range(8)), list(range(8, 16))
    return [builder.add(off, builder.add(_lanes(builder, acc, lo), _lanes(builder, acc, hi)))
            for acc, off in zip(accs, offs)]


q6kz_row = q6k_row_intrinsic(_q6k, "q6kz_row")
q6kz_row.__doc__ = """simd.q6k_row with 512-bit vectors (same arguments, same x)."""


@njit(cache=True, inline="always")
def z_x8(x8):
    """int8 x (T, C) -> each 256-block's 32-column sub-blocks in ORDER (0 2 1 3 4 6 5 7)."""
    T, C = x8.shape
    out = np.empty((T, C), dtype=np.int8)
    for t in range(T):
        for b in range(C // 256):
            for k in range(8):
                src = 256 * b + 32 * (k + (k % 4 == 1) - (k % 4 == 2))   # ORDER[k]: 1 <-> 2, 5 <-> 6
                dst = 256 * b + 32 * k
                for i in range(32):
                    out[t, dst + i] = x8[t, src + i]
    return out


def z_x8_ref(x8: np.ndarray) -> np.ndarray:
    """NumPy twin of z_x8."""
    T, C = x8.shape
    return np.ascontiguousarray(x8.reshape(T, C // 256, 8, 32)[:, :, list(ORDER)].reshape(T, C))


@njit(cache=True, inline="always")
def x_q4_kz(xq, x8, xd, xb):
    """rows8_q4_kz's x: matmul_q.x_q4_k's, with x8 in ORDER (made once per matmul, as the drivers make every
    kernel's x)."""
    return xq, z_x8(x8), xd, matmul_q.neg16(xb)


rows8_q4_kz = variant(matmul_q.rows8_q4_k.py_func, "rows8_q4_kz", inline=True, fastmath=FM, Q4K_ROW=q4kz_row,
                      Q4K_BYTES=144, BIG=7)         # past 7 tokens, 7 a call (4 for AVX2; 32 vector registers here)
rows8_q6_kz = variant(matmul_q.rows8_q6_k.py_func, "rows8_q6_kz", inline=True, fastmath=FM, Q6K_ROW=q6kz_row, BIG=7)
