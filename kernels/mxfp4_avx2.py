"""MXFP4's AVX2 row kernels (kernels/mxfp4.py picks them on a CPU with AVX2, else its portable ones).

    rows1_avx2(w, x, out, r0, r1, b0, b1, e8m0)          one token
    rows_avx2(w, x, out, r0, r1, b0, b1, e8m0)           a batch
    rows_q8_avx2(w, x8, xd, out, r0, r1, b0, b1, e8m0)   x rounded to int8 per 32 (act_quant="int8")

Same arguments and results as kernels/mxfp4.py's `*_table` kernels (tests/test_kernels_mxfp4.py checks both
against the NumPy twins); the intrinsics below emit the LLVM IR, as kernels/simd.py does for Q4_K and Q6_K.
"""

from __future__ import annotations

import functools

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from moert.kernels import simd
from moert.kernels.blockdot import FM as _FM
from moert.kernels.blockdot import I32
from moert.quants.dequant import MXFP4_VALUES

__all__ = ["dot_u8s8", "pair_loop", "result", "rows1_avx2", "rows_avx2", "rows_q8_avx2", "vnni"]

# The portable loops (kernels/mxfp4.py) decode a weight with a table lookup per weight, which LLVM does not
# vectorize. ggml's AVX2 MXFP4 kernel decodes 16 nibbles per instruction with `pshufb` on a 16-byte table of
# the values (as int8), which is what these intrinsics emit (simd.py's way: LLVM IR from Numba, x86 only, used
# when simd.available()). Per 32-weight block: one 16-byte load, the nibbles looked up with pshufb, then
#   row_f32: the values widened to float, times x (8 lanes at a time), the block's sum times its scale;
#   row_q8:  the values + 12 (unsigned) times int8 x (one vpdpbusd with VNNI, else vpmaddubsw + vpmaddwd), from
#            -12 sum x, exact in int32, then times scale * x's step (ggml_vec_dot_mxfp4_q8_0's sum, with
#            float32 steps where ggml keeps fp16; ggml moves the sign onto x instead: two more instructions).
# n tokens (a literal 1 to 4) share each block's decode; two blocks an iteration, two sets of accumulators.

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()
_V16x8, _V32x8 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 32)
_F32x8, _F32x32 = ir.VectorType(_F32, 8), ir.VectorType(_F32, 32)


def _values32(context, builder, aty, wa, ob, tab):
    """The 32 weights' codes looked up in tab (<32 x i8>, the 16 values twice) for the block at w[ob]: <32 x i8>,
    weights 0..31 in order.
    The 16 bytes go to both 128-bit halves (vbroadcasti128), the high half's shifted right by 4 (vpsrlvd), both
    masked to nibbles and looked up in one 256-bit pshufb: 3 instructions on the vector ports where two
    128-bit lookups and a vinserti128 took 6 (ggml's AVX2 kernel does the latter); int8 MXFP4 matvec 17.1 ->
    21.0 GB/s (8192 x 8192, one thread, same run). The float kernel widens 16 at a time: _values16x2."""
    simd.prefetch(context, builder, aty, wa, ob, 1)                   # one line (3-4 blocks) 4 KB ahead
    q = simd._vload(context, builder, aty, wa, simd._at(builder, ob, 1), _V16x8)
    q2 = builder.bitcast(builder.shuffle_vector(q, q, ir.Constant(ir.VectorType(_I32, 32), list(range(16)) * 2)),
                         ir.VectorType(_I32, 8))
    q2 = builder.lshr(q2, ir.Constant(ir.VectorType(_I32, 8), [0] * 4 + [4] * 4))
    nib = builder.and_(builder.bitcast(q2, _V32x8), ir.Constant(_V32x8, [15] * 32))
    shuf = simd._fn(builder, "llvm.x86.avx2.pshuf.b", _V32x8, [_V32x8, _V32x8])
    return builder.call(shuf, [tab, nib])


def _values16x2(context, builder, aty, wa, ob):
    """_values32's values as two <16 x i8> halves (two 128-bit pshufb), for the float kernel: each half widens
    to float straight from its register (the 256-bit lookup then an extract measured 10% slower there)."""
    simd.prefetch(context, builder, aty, wa, ob, 1)
    q = simd._vload(context, builder, aty, wa, simd._at(builder, ob, 1), _V16x8)
    m4 = ir.Constant(_V16x8, [15] * 16)
    lo = builder.and_(q, m4)
    hi = builder.and_(builder.lshr(q, ir.Constant(_V16x8, [4] * 16)), m4)
    tab = ir.Constant(_V16x8, list(MXFP4_VALUES))
    shuf = simd._fn(builder, "llvm.x86.ssse3.pshuf.b.128", _V16x8, [_V16x8, _V16x8])
    return builder.call(shuf, [tab, lo]), builder.call(shuf, [tab, hi])


def _scale(context, builder, aty, wa, ob, tty, ta):
    """E8M0_HALF[w[ob]]: the block's scale, a float."""
    e = builder.zext(simd._vload(context, builder, aty, wa, ob, _I8), ir.IntType(64))
    return simd._f32_at(context, builder, tty, ta, e)


def _fold8(builder, v):
    """<32 x float> -> <8 x float>: the four quarters added."""
    q = [simd._lanes(builder, v, list(range(8 * i, 8 * i + 8))) for i in range(4)]
    return builder.fadd(builder.fadd(q[0], q[1]), builder.fadd(q[2], q[3]))


@functools.cache
def vnni() -> bool:
    """True when the host CPU has a 256-bit vpdpbusd (AVX-VNNI, or AVX512-VNNI with AVX512VL)."""
    from llvmlite import binding
    try:
        f = binding.get_host_cpu_features().flatten().split(",")
    except RuntimeError:
        return False
    return "+avxvnni" in f or ("+avx512vnni" in f and "+avx512vl" in f)


def dot_u8s8(builder, u, s, start):
    """start (<8 x i32>) plus the sums of four adjacent products u8 u x s8 s (<32 x i8> each). One vpdpbusd
    where the CPU has VNNI, else vpmaddubsw (pairs into i16), vpmaddwd by ones and an add: the same sums here,
    as the callers keep pairs of |u s| below 2^15 (|u| <= 128, |s| <= 127), where vpmaddubsw never saturates."""
    if vnni():
        fn = simd._fn(builder, "llvm.x86.avx512.vpdpbusd.256", ir.VectorType(_I32, 8), [ir.VectorType(_I32, 8)] * 3)
        v8 = ir.VectorType(_I32, 8)
        return builder.call(fn, [start, builder.bitcast(u, v8), builder.bitcast(s, v8)])
    return builder.add(start, simd._madd(builder, simd._maddubs(builder, u, s), ir.Constant(ir.VectorType(_I16, 16),
                                                                                          [1] * 16)))


def pair_loop(builder, nb, n, body):
    """sum over blocks b < nb of body(b) -> n (<8 x float> a, float f) terms, acc += a * f; the n float totals.
    Two blocks an iteration into two sets of accumulators (ggml's accum1 / accum2): one chain of adds would
    wait out the add's latency every block (the blocks' own work is ~15 instructions)."""
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(_F32x8, [0.0] * 8)) for _ in range(n)] for _ in (0, 1)]

    def step(b, k):
        for acc, (a, f) in zip(accs[k], body(b)):
            builder.store(builder.fadd(builder.load(acc), builder.fmul(a, simd._fsplat(builder, f))), acc)
    one, two = ir.Constant(nb.type, 1), ir.Constant(nb.type, 2)
    pairs = builder.sdiv(nb, two)
    with cgutils.for_range(builder, pairs) as loop:
        b = builder.mul(loop.index, two)
        step(b, 0)
        step(builder.add(b, one), 1)
    with builder.if_then(builder.icmp_signed("!=", builder.mul(pairs, two), nb)):
        step(builder.sub(nb, one), 0)                                   # an odd last block
    return [simd._fhsum(builder, builder.fadd(builder.load(a0), builder.load(a1))) for a0, a1 in zip(*accs)]


def result(context, builder, sig, tot):
    """The n totals as the intrinsic returns them: a float for n = 1, else an n-tuple."""
    return tot[0] if len(tot) == 1 else context.make_tuple(builder, sig.return_type, tot)


@intrinsic
def row_f32(typingctx, w, o, nb, x, c, ld, e8m0, n):
    """sum over the nb blocks from w[o] of scale_b * sum_l value_l x_l for n (a literal 1 to 4) float32 tokens
    at x[c + t ld]: a float32 for n = 1, else an n-tuple."""
    if not (isinstance(w, types.Array) and w.dtype == types.uint8 and isinstance(x, types.Array) and x.layout == "C"
            and x.dtype == types.float32 and isinstance(n, types.IntegerLiteral) and 1 <= n.literal_value <= 4):
        return None                                                     # x is read at flat offsets: C order only
    N = n.literal_value

    def codegen(context, builder, sig, args):
        o_, nb_, c_, ld_ = simd._intp(context, builder, sig, args, 1, 2, 4, 5)

        def body(b):
            ob = builder.add(o_, builder.mul(b, ir.Constant(b.type, 17)))
            vlo, vhi = _values16x2(context, builder, sig.args[0], args[0], ob)
            v = builder.sitofp(builder.shuffle_vector(vlo, vhi, ir.Constant(ir.VectorType(_I32, 32), list(range(32)))),
                               _F32x32)
            d = _scale(context, builder, sig.args[0], args[0], ob, sig.args[6], args[6])
            out = []
            for ct in simd._offsets(builder, c_, ld_, N):
                xv = simd._vload(context, builder, sig.args[3], args[3],
                                 builder.add(ct, builder.mul(b, ir.Constant(b.type, 32))), _F32x32)
                out.append((_fold8(builder, builder.fmul(v, xv)), d))
            return out
        return result(context, builder, sig, pair_loop(builder, nb_, N, body))
    ret = types.float32 if N == 1 else types.UniTuple(types.float32, N)
    return ret(w, o, nb, x, c, ld, e8m0, n), codegen


# The int8 dot takes the weights as unsigned: the table gives u = v + 12 (0 .. 24) and the sum of u x over a block
# is the wanted sum of v x plus 12 sum x, so the kernel starts each block's vpdpbusd (or vpmaddubsw's sum) from
# -12 sum x, computed once per call for every row (`offsets12`), in lane 0. That takes out both vpsignb a block
# (|v|, and sign(v) onto x) which the signed form (ggml's) needs: int8 MXFP4 matvec 22.1-22.6 -> 24.4-24.5 GB/s
# (8192 x 8192, one thread, same runs). No overflow: a pair
# of u x is at most 2 * 24 * 127 = 6096 (vpmaddubsw saturates at 2^15), |12 sum x| <= 12 * 32 * 127.
OFFSET = 12


@intrinsic
def row_q8(typingctx, w, o, nb, x8, c, ld, xd, cd, ldd, xs, cs, lds, e8m0, n):
    """sum over the nb blocks from w[o] of scale_b xd_b isum_b, isum_b the exact int32 dot of the block's values
    with int8 x, for n (a literal 1 to 4) tokens at x8[c + t ld] with steps at xd[cd + t ldd] and -12 times each
    block's sum of x8 at xs[cs + t lds] (int32, offsets12)."""
    if not (simd._row_check(w, x8, xd) and x8.layout == "C" and xd.layout == "C" and isinstance(xs, types.Array)
            and xs.dtype == types.int32 and xs.layout == "C"
            and isinstance(n, types.IntegerLiteral) and 1 <= n.literal_value <= 4):
        return None
    N = n.literal_value

    def codegen(context, builder, sig, args):
        o_, nb_, c_, ld_, cd_, ldd_, cs_, lds_ = simd._intp(context, builder, sig, args, 1, 2, 4, 5, 7, 8, 10, 11)
        v8 = ir.VectorType(_I32, 8)
        utab = ir.Constant(_V32x8, [v + OFFSET for v in MXFP4_VALUES] * 2)

        def body(b):
            ob = builder.add(o_, builder.mul(b, ir.Constant(b.type, 17)))
            u = _values32(context, builder, sig.args[0], args[0], ob, utab)   # v + 12, unsigned
            d = _scale(context, builder, sig.args[0], args[0], ob, sig.args[12], args[12])
            out = []
            for ct, cdt, cst in zip(simd._offsets(builder, c_, ld_, N), simd._offsets(builder, cd_, ldd_, N),
                                    simd._offsets(builder, cs_, lds_, N)):
                xv = simd._vload(context, builder, sig.args[3], args[3],
                                 builder.add(ct, builder.mul(b, ir.Constant(b.type, 32))), _V32x8)
                off = simd._f32_at(context, builder, sig.args[9], args[9], builder.add(cst, b))  # -12 sum x (i32)
                start = builder.insert_element(ir.Constant(v8, [0] * 8), off, ir.Constant(_I32, 0))
                isum = dot_u8s8(builder, u, xv, start)                      # <8 x i32>, lanes sum to v . x
                f = builder.fmul(d, simd._f32_at(context, builder, sig.args[6], args[6], builder.add(cdt, b)))
                out.append((builder.sitofp(isum, _F32x8), f))
            return out
        return result(context, builder, sig, pair_loop(builder, nb_, N, body))
    ret = types.float32 if N == 1 else types.UniTuple(types.float32, N)
    return ret(w, o, nb, x8, c, ld, xd, cd, ldd, xs, cs, lds, e8m0, n), codegen


@njit(cache=True)
def offsets12(x8, b0, b1):
    """(T, B) int32: -12 times the sum of each 32-block of x8 (T, C) for blocks [b0, b1) (others left unset)."""
    T = x8.shape[0]
    xs = np.empty((T, x8.shape[1] // 32), dtype=np.int32)
    for t in range(T):
        for b in range(b0, b1):
            a = I32(0)
            for l in range(32):
                a = I32(a + I32(x8[t, 32 * b + l]))
            xs[t, b] = I32(I32(-OFFSET) * a)
    return xs


@njit(cache=True, fastmath=_FM)
def rows1_avx2(w, x, out, r0, r1, b0, b1, e8m0):
    """rows1_table's result with row_f32 (AVX2)."""
    for r in range(r0, r1):
        out[0, r] = row_f32(w[r], 17 * b0, b1 - b0, x, 32 * b0, 0, e8m0, 1)


@njit(cache=True, fastmath=_FM)
def rows_avx2(w, x, out, r0, r1, b0, b1, e8m0):
    """rows_table's result with row_f32 (AVX2): tokens four at a time share each block's decode, the last 1-3
    in one call."""
    T, C = x.shape
    T4 = T - T % 4
    xf = x.reshape(T * C)
    for r in range(r0, r1):
        wr = w[r]
        for t in range(0, T4, 4):
            s0, s1, s2, s3 = row_f32(wr, 17 * b0, b1 - b0, xf, t * C + 32 * b0, C, e8m0, 4)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = s0, s1, s2, s3
        t, n = T4, T - T4
        if n == 3:
            s0, s1, s2 = row_f32(wr, 17 * b0, b1 - b0, xf, t * C + 32 * b0, C, e8m0, 3)
            out[t, r], out[t + 1, r], out[t + 2, r] = s0, s1, s2
        elif n == 2:
            s0, s1 = row_f32(wr, 17 * b0, b1 - b0, xf, t * C + 32 * b0, C, e8m0, 2)
            out[t, r], out[t + 1, r] = s0, s1
        elif n == 1:
            out[t, r] = row_f32(wr, 17 * b0, b1 - b0, xf, t * C + 32 * b0, C, e8m0, 1)


@njit(cache=True, fastmath=_FM)
def rows_q8_avx2(w, x8, xd, out, r0, r1, b0, b1, e8m0):
    """rows_q8_table's result with row_q8 (AVX2), tokens four at a time (x's block sums made once per call)."""
    T, C = x8.shape
    B = xd.shape[1]
    T4 = T - T % 4
    xf, df, sf = x8.reshape(T * C), xd.reshape(T * B), offsets12(x8, b0, b1).reshape(T * B)
    for r in range(r0, r1):
        wr = w[r]
        for t in range(0, T4, 4):
            c, cb = t * C + 32 * b0, t * B + b0
            s0, s1, s2, s3 = row_q8(wr, 17 * b0, b1 - b0, xf, c, C, df, cb, B, sf, cb, B, e8m0, 4)
            out[t, r], out[t + 1, r], out[t + 2, r], out[t + 3, r] = s0, s1, s2, s3
        t, n = T4, T - T4
        c, cb = t * C + 32 * b0, t * B + b0
        if n == 3:
            s0, s1, s2 = row_q8(wr, 17 * b0, b1 - b0, xf, c, C, df, cb, B, sf, cb, B, e8m0, 3)
            out[t, r], out[t + 1, r], out[t + 2, r] = s0, s1, s2
        elif n == 2:
            s0, s1 = row_q8(wr, 17 * b0, b1 - b0, xf, c, C, df, cb, B, sf, cb, B, e8m0, 2)
            out[t, r], out[t + 1, r] = s0, s1
        elif n == 1:
            out[t, r] = row_q8(wr, 17 * b0, b1 - b0, xf, c, C, df, cb, B, sf, cb, B, e8m0, 1)


# What the table entry, the drivers below and the fused MoE layer call: the AVX2 rows where the CPU has AVX2, else
# the portable ones (measured on a 4096 x 4096 matvec, one thread: 4.9 GB/s against 0.6-1.2; bench/HISTORY.md,
# 2026-11-23).
