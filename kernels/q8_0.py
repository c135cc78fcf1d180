"""Q8_0 weights with int8 activations (act_quant="int8"): x rounded to int8 per 32, as llama.cpp's CPU matmul
rounds it for a Q8_0 weight (ggml_vec_dot_q8_0_q8_0), each block's 32 products summed exactly in int32.

    rows_q8(w, x8, xd, out, r0, r1, b0, b1, f16)   out[t, r] = sum over blocks [b0, b1) of row r of
                                                 d_b xd[t, b] isum_b (x8, xd: mxfp4.quantize_q8's, x per 32)
    rows_q8_ref                                  its NumPy twin (the reference dequantizer, float64 dot)
    rows_q8_avx2, rows_q8_table                  the AVX2 variant (what rows_q8 is where the CPU has AVX2) and
                                                 the portable Numba one; tests/test_kernels_q8_0.py checks both

Block layout (moert/quants/dequant.py draws it too):

    | d f16 | qs[32]: int8 weights |      w_l = d * qs[l]
    0       2                      34

Per block (row_q8, LLVM IR as kernels/simd.py emits it): one 32-byte load of the weights, |q| and sign(q)
moved onto x with two vpsignb, vpmaddubsw + vpmaddwd (one vpdpbusd on a CPU with VNNI) -> <8 x i32> (exact:
|q| <= 128, |x| <= 127, a pair <= 32512), one conversion, times d (vcvtph2ps) * xd, two blocks an iteration
into two accumulators (mxfp4_avx2.pair_loop). The float kernels (kernels/qblocks.py dot1_q8_0) convert every
weight to float.
Integers are explicit int32 in the Numba loops (Numba widens to int64 otherwise).

Dimension legend: T tokens, R rows, C columns, B = C / 32 blocks per row.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from moert.kernels import simd
from moert.kernels.blockdot import FM, I32
from moert.kernels.mxfp4_avx2 import dot_u8s8, pair_loop, result
from moert.kernels.qblocks import half, i8

__all__ = ["rows_q8", "rows_q8_avx2", "rows_q8_ref", "rows_q8_table"]

_V32x8 = ir.VectorType(ir.IntType(8), 32)
_F32x8 = ir.VectorType(ir.FloatType(), 8)


@intrinsic
def row_q8(typingctx, w, o, nb, x8, c, ld, xd, cd, ldd, n):
    """sum over the nb Q8_0 blocks from w[o] of d_b xd_b isum_b, isum_b the exact int32 dot of the block's int8
    weights with int8 x, for n (a literal 1 to 4) tokens at x8[c + t ld] with steps at xd[cd + t ldd]: a float32
    for n = 1, else an n-tuple (each block's weights loaded once for all n)."""
    if not (simd._row_check(w, x8, xd) and x8.layout == "C" and xd.layout == "C"
            and isinstance(n, types.IntegerLiteral) and 1 <= n.literal_value <= 4):
        return None                                                     # x is read at flat offsets: C order only
    N = n.literal_value

    def codegen(context, builder, sig, args):
        o_, nb_, c_, ld_, cd_, ldd_ = simd._intp(context, builder, sig, args, 1, 2, 4, 5, 7, 8)
        sign = simd._fn(builder, "llvm.x86.avx2.psign.b", _V32x8, [_V32x8, _V32x8])
        wty, wa = sig.args[0], args[0]
        zero = ir.Constant(ir.VectorType(ir.IntType(32), 8), [0] * 8)

        def body(b):
            ob = builder.add(o_, builder.mul(b, ir.Constant(b.type, 34)))
            simd.prefetch(context, builder, wty, wa, ob, 1)              # a line per block, 4 KB ahead
            q = simd._vload(context, builder, wty, wa, simd._at(builder, ob, 2), _V32x8)
            aq = builder.call(sign, [q, q])                             # |q| as u8 for vpmaddubsw
            d = simd._half_at(context, builder, wty, wa, ob)
            out = []
            for ct, cdt in zip(simd._offsets(builder, c_, ld_, N), simd._offsets(builder, cd_, ldd_, N)):
                xv = simd._vload(context, builder, sig.args[3], args[3],
                                 builder.add(ct, builder.mul(b, ir.Constant(b.type, 32))), _V32x8)
                sx = builder.call(sign, [xv, q])                        # sign(q) moved onto x
                isum = dot_u8s8(builder, aq, sx, zero)                          # <8 x i32>
                f = builder.fmul(d, simd._f32_at(context, builder, sig.args[6], args[6], builder.add(cdt, b)))
                out.append((builder.sitofp(isum, _F32x8), f))
            return out
        return result(context, builder, sig, pair_loop(builder, nb_, N, body))
    ret = types.float32 if N == 1 else types.UniTuple(types.float32, N)
    return ret(w, o, nb, x8, c, ld, xd, cd, ldd, n), codegen


@njit(cache=True, fastmath=FM)
def rows_q8_avx2(w, x8, xd, out, r0, r1, b0, b1, f16):
    """rows_q8_table's result with row_q8 (AVX2), tokens four at a time (f16 unused: d through vcvtph2ps)."""
    T, C = x8.shape
    B = xd.shape[1]
    T4 = T - T % 4
    xf, df = x8.reshape(T * C), xd.reshape(T * B)
    for r in range(r0, r1):
        wr = w[r]
        for t in range(0, T4, 4):
            s0, s1, s2, s3 = row_q8(wr, 34 * b0, b1 - b0, xf, t * C + 32 * b0, C, df, t * B + b0, B, 4)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = s0, s1, s2, s3
        t, n = T4, T - T4
        if n == 3:
            s0, s1, s2 = row_q8(wr, 34 * b0, b1 - b0, xf, t * C + 32 * b0, C, df, t * B + b0, B, 3)
            out[t, r], out[t + 1, r], out[t + 2, r] = s0, s1, s2
        elif n == 2:
            s0, s1 = row_q8(wr, 34 * b0, b1 - b0, xf, t * C + 32 * b0, C, df, t * B + b0, B, 2)
            out[t, r], out[t + 1, r] = s0, s1
        elif n == 1:
            out[t, r] = row_q8(wr, 34 * b0, b1 - b0, xf, t * C + 32 * b0, C, df, t * B + b0, B, 1)


@njit(cache=True, fastmath=FM)
def rows_q8_table(w, x8, xd, out, r0, r1, b0, b1, f16):
    """out[t, r] for r in [r0, r1), blocks [b0, b1): w (R, B*34) uint8 raw rows, x8 (T, C) int8, xd (T, B)
    float32 steps (mxfp4.quantize_q8), f16 the fp16 -> float32 table; out (T, >= r1)."""
    for t in range(x8.shape[0]):
        for r in range(r0, r1):
            s = np.float32(0.0)
            for b in range(b0, b1):
                o, c = 34 * b, 32 * b
                acc = I32(0)
                for l in range(32):
                    acc = I32(acc + I32(I32(i8(w[r, o + 2 + l])) * I32(x8[t, c + l])))
                s += (half(w[r], o, f16) * xd[t, b]) * np.float32(acc)
            out[t, r] = s


def rows_q8_ref(w: np.ndarray, x8: np.ndarray, xd: np.ndarray, out: np.ndarray, r0: int, r1: int, b0: int,
                b1: int) -> None:
    """Twin of rows_q8 (either variant): the values x8 * step exactly (float64) times the NumPy-dequantized rows."""
    from moert.quants.dequant import dequant_q8_0

    xf = x8[:, 32 * b0:32 * b1].astype(np.float64) * np.repeat(xd[:, b0:b1].astype(np.float64), 32, axis=1)
    blocks = np.ascontiguousarray(w[r0:r1, 34 * b0:34 * b1]).reshape(-1, 34)
    W = dequant_q8_0(blocks, np).reshape(r1 - r0, -1).astype(np.float64)
    out[:, r0:r1] = (xf @ W.T).astype(np.float32)


# The AVX2 rows where the CPU has AVX2, else the portable ones (what the kernel table's Q8_0 entry lists).
rows_q8 = rows_q8_avx2 if simd.available() else rows_q8_table
