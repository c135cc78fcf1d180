"""x86 AVX2 integer dot products for the int8-activation kernels (kernels/matmul_q.py, mode "int8"): the one
place where moert emits target-specific instructions. LLVM does not derive `vpmaddubsw` (u8 x s8 -> pairs
summed into s16) from Numba source, and that instruction is what makes llama.cpp's Q4_K/Q6_K dot products
cheap: 32 weights per instruction, no int-to-float conversion per weight. Each function here is a Numba
`@intrinsic` over one 256-weight super-block that returns its exact int32 sum; the float scales stay in the
Numba caller.

    q4k_isum(w, o, xq, c, xb, cb)   (sum_j sc_j * sum_{l<32} q_{32j+l} * xq[c + 32j + l],
                                     sum_j m_j * xb[cb + j]) for the block at w[o:] (its 6-bit scales sc_j
                                     and mins m_j decoded here); xb: the per-32 sums of xq (int32)
    q6k_isum(w, o, xq, c)           sum_g scale_g * sum_{l<16} (q6 - 32) * xq[c + 16g + l]
                                    o: the block's first byte (ql); its 16 int8 scales are read here
    q4k_isum4, q6k_isum4            the same for 4 tokens at once (rows c + i*ld of a batch): the block's
                                    weights and scales are decoded once and feed four accumulators

w is a uint8 array and xq an int8 array, each contiguous in its last axis: o and c are flat offsets from
the array's first element (o may run past the first row of a 2D w). The callers check `available()` first:
on a CPU without AVX2 the int8 mode is refused with a clear error instead of failing to compile.
No overflow: a u8 x s8 pair is at most 2 * 63 * 128 = 16128 < 2^15 (Q6_K), and the int32 sums are bounded
by 256 * 63 * 127 * 127 (Q4_K scales are 6-bit) < 2^31.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["available", "q4k_isum", "q4k_isum4", "q6k_isum", "q6k_isum4"]

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V8x32, _V16x16, _V32x8 = ir.VectorType(_I8, 32), ir.VectorType(_I16, 16), ir.VectorType(_I32, 8)


@functools.cache
def available() -> bool:
    """True when the host CPU has AVX2 (the int8 kernels' instructions)."""
    from llvmlite import binding
    try:
        return "+avx2" in binding.get_host_cpu_features().flatten().split(",")
    except RuntimeError:                                                 # features unknown: be safe
        return False


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _vload(context, builder, aty, arr, off, vty):
    """A vector of type vty loaded (unaligned) from array arr at flat element offset off."""
    a = context.make_array(aty)(context, builder, arr)
    ptr = builder.gep(a.data, [off])
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=1)


def _splat(builder, v, vty):
    """A vector of type vty with every lane v (an int of vty's element width or wider)."""
    v = builder.trunc(v, vty.element) if v.type.width > vty.element.width else v
    undef = ir.Constant(vty, None)
    one = builder.insert_element(undef, v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _const(vty, v):
    return ir.Constant(vty, [v] * vty.count)


def _lanes(builder, v, idx):
    """The vector of v's lanes idx (a shuffle with constant indices)."""
    return builder.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _maddubs(builder, u, s):
    return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16x16, [_V8x32, _V8x32]), [u, s])


def _madd(builder, a, b):
    return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", _V32x8, [_V16x16, _V16x16]), [a, b])


def _hsum(builder, v):
    return builder.call(_fn(builder, "llvm.vector.reduce.add.v8i32", _I32, [_V32x8]), [v])


def _check(w, xq):
    return (isinstance(w, types.Array) and w.dtype == types.uint8
            and isinstance(xq, types.Array) and xq.dtype == types.int8)


def _at(builder, base, k):
    return builder.add(base, ir.Constant(base.type, k))


def _q4k(context, builder, aty, wa, o, xty, xa, cs, bty, ba, cbs):
    """IR for one Q4_K block at w[o:] against len(cs) int8 token vectors at xq[c] (xb sums at xb[cb]):
    [isum_0, msum_0, isum_1, msum_1, ...]. The weights and scales are decoded once for all tokens."""
    # the 12 scale bytes at o + 4 as three u32 -> (8 scales, 8 mins) as bytes, as ggml's AVX2 Q4_K dot
    u = [_vload(context, builder, aty, wa, _at(builder, o, 4 + 4 * i), _I32) for i in range(3)]

    def k(v):
        return ir.Constant(_I32, v)
    b_and, b_or, shl, shr = builder.and_, builder.or_, builder.shl, builder.lshr
    m1, m2, m3 = k(0x3F3F3F3F), k(0x0F0F0F0F), k(0x03030303)
    u3 = b_or(b_and(shr(u[2], k(4)), m2), shl(b_and(shr(u[1], k(6)), m3), k(4)))
    u2 = b_and(u[1], m1)
    u1 = b_or(b_and(u[2], m2), shl(b_and(shr(u[0], k(6)), m3), k(4)))
    u0 = b_and(u[0], m1)
    v4 = ir.Constant(ir.VectorType(_I32, 4), None)
    for i, ui in enumerate((u0, u1, u2, u3)):
        v4 = builder.insert_element(v4, ui, k(i))
    sm = builder.zext(builder.bitcast(v4, ir.VectorType(_I8, 16)), _V16x16)   # lanes 0-7 sc, 8-15 m
    mins = builder.zext(_lanes(builder, sm, list(range(8, 16))), _V32x8)
    msums = [_hsum(builder, builder.mul(mins, _vload(context, builder, bty, ba, cb, _V32x8))) for cb in cbs]
    accs = [_const(_V32x8, 0)] * len(cs)
    m4 = _const(_V8x32, 15)
    for p in range(4):                                                   # 64 weights: sub-blocks 2p, 2p+1
        q = _vload(context, builder, aty, wa, _at(builder, o, 16 + 32 * p), _V8x32)
        lo, hi = b_and(q, m4), b_and(shr(q, _const(_V8x32, 4)), m4)
        slo, shi = _lanes(builder, sm, [2 * p] * 16), _lanes(builder, sm, [2 * p + 1] * 16)
        for i, c in enumerate(cs):
            xlo = _vload(context, builder, xty, xa, _at(builder, c, 64 * p), _V8x32)
            xhi = _vload(context, builder, xty, xa, _at(builder, c, 64 * p + 32), _V8x32)
            accs[i] = builder.add(accs[i], _madd(builder, _maddubs(builder, lo, xlo), slo))
            accs[i] = builder.add(accs[i], _madd(builder, _maddubs(builder, hi, xhi), shi))
    return [v for acc, ms in zip(accs, msums) for v in (_hsum(builder, acc), ms)]


def _q6k(context, builder, aty, wa, o, xty, xa, cs):
    """IR for one Q6_K block at w[o:] against len(cs) int8 token vectors at xq[c]: [isum_0, isum_1, ...]."""
    # the 16 int8 scales at o + 192, sign-extended; lane pattern for group pair (2t, 2t+1): 8 + 8 lanes
    sc16 = builder.sext(_vload(context, builder, aty, wa, _at(builder, o, 192), ir.VectorType(_I8, 16)),
                        ir.VectorType(_I16, 16))
    accs = [_const(_V32x8, 0)] * len(cs)

    def c8(v):
        return _const(_V8x32, v)
    b_and, b_or, shl, shr = builder.and_, builder.or_, builder.shl, builder.lshr
    for h in range(2):
        ql0 = _vload(context, builder, aty, wa, _at(builder, o, 64 * h), _V8x32)
        ql1 = _vload(context, builder, aty, wa, _at(builder, o, 64 * h + 32), _V8x32)
        qh = _vload(context, builder, aty, wa, _at(builder, o, 128 + 32 * h), _V8x32)
        qs = (b_or(b_and(ql0, c8(15)), shl(b_and(qh, c8(3)), c8(4))),                # 6-bit q of lanes t = 0..3
              b_or(b_and(ql1, c8(15)), shl(b_and(qh, c8(12)), c8(2))),
              b_or(shr(ql0, c8(4)), b_and(qh, c8(48))),
              b_or(shr(ql1, c8(4)), shr(b_and(qh, c8(192)), c8(2))))
        for t in range(4):                                               # weights 128h + 32t + l, l < 32
            g = 8 * h + 2 * t                                            # lanes 0-7: group g, 8-15: g + 1
            sc = _lanes(builder, sc16, [g] * 8 + [g + 1] * 8)
            for i, c in enumerate(cs):
                x = _vload(context, builder, xty, xa, _at(builder, c, 128 * h + 32 * t), _V8x32)
                p = builder.sub(_maddubs(builder, qs[t], x), _maddubs(builder, c8(32), x))  # (q - 32) . x
                accs[i] = builder.add(accs[i], _madd(builder, p, sc))
    return [_hsum(builder, acc) for acc in accs]


def _intp(context, builder, sig, args, *idx):
    return [context.cast(builder, args[i], sig.args[i], types.intp) for i in idx]


def _offsets(builder, c, ld, n):
    return [builder.add(c, builder.mul(ld, ir.Constant(ld.type, i))) for i in range(n)]


@intrinsic
def q4k_isum(typingctx, w, o, xq, c, xb, cb):
    """See the module docstring: (sum_j sc_j isum_j, sum_j m_j xb[cb + j]) of the block at w[o:], both exact."""
    if not (_check(w, xq) and isinstance(xb, types.Array) and xb.dtype == types.int32):
        return None

    def codegen(context, builder, sig, args):
        o_, c_, cb_ = _intp(context, builder, sig, args, 1, 3, 5)
        vals = _q4k(context, builder, sig.args[0], args[0], o_, sig.args[2], args[2], [c_], sig.args[4], args[4], [cb_])
        return context.make_tuple(builder, sig.return_type, vals)
    return types.UniTuple(types.int32, 2)(w, o, xq, c, xb, cb), codegen


@intrinsic
def q4k_isum4(typingctx, w, o, xq, c, ld, xb, cb, ldb):
    """q4k_isum for 4 tokens at xq[c + i ld], xb[cb + i ldb] (i < 4): (isum_0, msum_0, ..., isum_3, msum_3)."""
    if not (_check(w, xq) and isinstance(xb, types.Array) and xb.dtype == types.int32):
        return None

    def codegen(context, builder, sig, args):
        o_, c_, ld_, cb_, ldb_ = _intp(context, builder, sig, args, 1, 3, 4, 6, 7)
        vals = _q4k(context, builder, sig.args[0], args[0], o_, sig.args[2], args[2], _offsets(builder, c_, ld_, 4),
                    sig.args[5], args[5], _offsets(builder, cb_, ldb_, 4))
        return context.make_tuple(builder, sig.return_type, vals)
    return types.UniTuple(types.int32, 8)(w, o, xq, c, ld, xb, cb, ldb), codegen


@intrinsic
def q6k_isum(typingctx, w, o, xq, c):
    """See the module docstring."""
    if not _check(w, xq):
        return None

    def codegen(context, builder, sig, args):
        o_, c_ = _intp(context, builder, sig, args, 1, 3)
        return _q6k(context, builder, sig.args[0], args[0], o_, sig.args[2], args[2], [c_])[0]
    return types.int32(w, o, xq, c), codegen


@intrinsic
def q6k_isum4(typingctx, w, o, xq, c, ld):
    """q6k_isum for 4 tokens at xq[c + i ld] (i < 4): (isum_0, ..., isum_3)."""
    if not _check(w, xq):
        return None

    def codegen(context, builder, sig, args):
        o_, c_, ld_ = _intp(context, builder, sig, args, 1, 3, 4)
        vals = _q6k(context, builder, sig.args[0], args[0], o_, sig.args[2], args[2], _offsets(builder, c_, ld_, 4))
        return context.make_tuple(builder, sig.return_type, vals)
    return types.UniTuple(types.int32, 4)(w, o, xq, c, ld), codegen
