"""x86 AVX2 one-token float dots for Q4_K, Q6_K and Q8_0: the default (float) path's decode kernels on a CPU with
AVX2, in LLVM IR as kernels/simd.py's int8 ones. Numba's own loop (kernels/qblocks.py dot1_q4_k,
dot1_q6_k, the fallback on other CPUs) spends ~0.75 instructions per weight: LLVM widens the nibbles
through shuffles and multiplies every weight by its sub-block's scale. Here each weight costs about half:

    Q4_K   8 bytes -> 8 x i32 in one vpmovzxbd (from memory), their low and high nibbles (and, shift) are 16
           weights of sub-blocks 2p and 2p+1, converted (vcvtdq2ps) and multiplied into x with FMAs; each
           sub-block's 8-lane sum takes its scale d*sc_j in one more FMA, the mins d_min*m_j . sum_32(x) one
           FMA per block.
    Q6_K   the 6-bit values and their -32 as bytes (32 lanes at a time, as simd.py's int8 kernel), then
           8 lanes sign-extended, converted and FMA'd with x; one FMA per 16 weights for the scale d*sc_g.
    Q8_0   4 x 8 int8 sign-extended (vpmovsxbd), converted, times d (exact: the weight as dequantized) and FMA'd
           with x into 32 lanes: 2x Numba's loop on the short rows of a small model's ffn_down (4 blocks a row;
           bench/HISTORY.md, 2026-11-24).

The sums are float32, grouped differently from the reference (within the kernels' 1e-5 of sum|w x|, checked
in tests/test_kernels_matmul.py with every other kernel).

    q4k_dot(w, o, nb, x, c, xs, cs)   sum over nb Q4_K blocks from w[o] with x[c:], per-32 sums xs[cs:]
    q6k_dot(w, o, nb, x, c)           sum over nb Q6_K blocks from w[o] with x[c:]
    q8_0_dot(w, o, nb, x, c)          sum over nb Q8_0 blocks from w[o] with x[c:]
    dot1_q4_k, dot1_q6_k, dot1_q8_0   the three in qblocks.dot1's signature: the kernel table's one-token dots

w a uint8 array, x and xs float32 arrays, each contiguous from the given flat offset (a row's bytes and a
token's values, as qblocks' dot1 gets them). Only called when simd.available() (kernels/ktypes.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from moert.kernels.blockdot import Z0
from moert.kernels.simd import (
    _I8,
    _I32,
    _at,
    _const,
    _fhsum,
    _fn,
    _fsplat,
    _half_at,
    _intp,
    _lanes,
    _scales_mins,
    _V8x32,
    _V32x8,
    _vload,
    prefetch,
    q6k_values,
)

__all__ = ["dot1_q4_k", "dot1_q6_k", "dot1_q8_0", "q4k_dot", "q6k_dot", "q8_0_dot"]

_F8 = ir.VectorType(ir.FloatType(), 8)
_F16 = ir.VectorType(ir.FloatType(), 16)


def _fma(builder, a, b, c):
    return builder.call(_fn(builder, "llvm.fma.v8f32", _F8, [_F8, _F8, _F8]), [a, b, c])


def _dot(builder, terms):
    """sum of q * x over the (q, x) pairs of 8 lanes, as one FMA chain."""
    s = None
    for q, x in terms:
        s = builder.fmul(q, x) if s is None else _fma(builder, q, x, s)
    return s


def _q4k(context, builder, aty, wa, o, xty, xa, c, sty, sa, cs, acc, accm):
    """One Q4_K block at w[o:] (x at x[c:], its per-32 sums at xs[cs:]) into the 8-lane accumulators:
    acc += the scaled nibble dots, accm += d_min m_j sum_32(x)_j (subtracted at the end)."""
    sm = _scales_mins(context, builder, aty, wa, o)                    # <16 x i16>: 8 sc, 8 m
    prefetch(context, builder, aty, wa, o, 144)
    sc = builder.sitofp(builder.zext(_lanes(builder, sm, list(range(8))), _V32x8), _F8)
    mn = builder.sitofp(builder.zext(_lanes(builder, sm, list(range(8, 16))), _V32x8), _F8)
    dsc = builder.fmul(sc, _fsplat(builder, _half_at(context, builder, aty, wa, o)))
    dmn = builder.fmul(mn, _fsplat(builder, _half_at(context, builder, aty, wa, _at(builder, o, 2))))
    accm = _fma(builder, dmn, _vload(context, builder, sty, sa, cs, _F8), accm)
    m4 = _const(_V32x8, 15)
    for p in range(4):                                                  # sub-blocks 2p (low), 2p+1 (high)
        lo, hi = [], []
        for k in range(4):                                              # bytes 8k..8k+7 of the 32
            v = builder.zext(_vload(context, builder, aty, wa, _at(builder, o, 16 + 32 * p + 8 * k),
                                    ir.VectorType(_I8, 8)), _V32x8)
            lo.append((builder.sitofp(builder.and_(v, m4), _F8),
                       _vload(context, builder, xty, xa, _at(builder, c, 64 * p + 8 * k), _F8)))
            hi.append((builder.sitofp(builder.lshr(v, _const(_V32x8, 4)), _F8),
                       _vload(context, builder, xty, xa, _at(builder, c, 64 * p + 32 + 8 * k), _F8)))
        acc = _fma(builder, _dot(builder, lo), _lanes(builder, dsc, [2 * p] * 8), acc)
        acc = _fma(builder, _dot(builder, hi), _lanes(builder, dsc, [2 * p + 1] * 8), acc)
    return acc, accm


def _q6k(context, builder, aty, wa, o, xty, xa, c, acc):
    """One Q6_K block at w[o:] (x at x[c:]) into the 8-lane accumulator."""
    sc = builder.sitofp(builder.sext(_vload(context, builder, aty, wa, _at(builder, o, 192), ir.VectorType(_I8, 16)),
                                     ir.VectorType(_I32, 16)), _F16)
    d = _half_at(context, builder, aty, wa, _at(builder, o, 208))
    prefetch(context, builder, aty, wa, o, 210)
    dsc = builder.fmul(sc, _lanes(builder, builder.insert_element(ir.Constant(_F16, None), d, ir.Constant(_I32, 0)),
                                  [0] * 16))                            # 16 lanes d * sc_g

    for h in range(2):
        qs = q6k_values(context, builder, aty, wa, o, h)                # 6-bit q of lanes t = 0..3
        for t in range(4):                                              # weights 128h + 32t + l, l < 32
            q = builder.sub(qs[t], _const(_V8x32, 32))                  # q - 32 as signed bytes
            for g in range(2):                                          # 16-weight group 8h + 2t + g
                terms = [(builder.sitofp(builder.sext(_lanes(builder, q, list(range(8 * k, 8 * k + 8))), _V32x8), _F8),
                          _vload(context, builder, xty, xa, _at(builder, c, 128 * h + 32 * t + 8 * k), _F8))
                         for k in (2 * g, 2 * g + 1)]
                acc = _fma(builder, _dot(builder, terms), _lanes(builder, dsc, [8 * h + 2 * t + g] * 8), acc)
    return acc


def _q80(context, builder, aty, wa, o, xty, xa, c, accs):
    """One Q8_0 block at w[o:] (x at x[c:]) into four 8-lane accumulators, lane l of accs[k] taking weight 8k + l:
    int8 sign-extended (vpmovsxbd), converted, times d (exact: the dequantized weight), FMA'd with x."""
    d = _fsplat(builder, _half_at(context, builder, aty, wa, o))
    out = []
    for k in range(4):
        q = builder.sitofp(builder.sext(_vload(context, builder, aty, wa, _at(builder, o, 2 + 8 * k),
                                               ir.VectorType(_I8, 8)), _V32x8), _F8)
        out.append(_fma(builder, builder.fmul(q, d), _vload(context, builder, xty, xa, _at(builder, c, 8 * k), _F8),
                        accs[k]))                                       # d * q is exact: the weight, as dequantized
    return out


def _check(w, x):
    return (isinstance(w, types.Array) and w.dtype == types.uint8 and isinstance(x, types.Array)
            and x.dtype == types.float32)


@intrinsic
def q4k_dot(typingctx, w, o, nb, x, c, xs, cs):
    """sum over nb Q4_K blocks from w[o] of the block . x[c + 256 b:], xs[cs + 8 b:] its per-32 sums."""
    if not (_check(w, x) and _check(w, xs)):
        return None

    def codegen(context, builder, sig, args):
        o_, nb_, c_, cs_ = _intp(context, builder, sig, args, 1, 2, 4, 6)
        acc = cgutils.alloca_once_value(builder, ir.Constant(_F8, [0.0] * 8))
        accm = cgutils.alloca_once_value(builder, ir.Constant(_F8, [0.0] * 8))
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index

            def at(base, k):
                return builder.add(base, builder.mul(b, ir.Constant(b.type, k)))
            a, am = _q4k(context, builder, sig.args[0], args[0], at(o_, 144), sig.args[3], args[3], at(c_, 256),
                         sig.args[5], args[5], at(cs_, 8), builder.load(acc), builder.load(accm))
            builder.store(a, acc)
            builder.store(am, accm)
        return builder.fsub(_fhsum(builder, builder.load(acc)), _fhsum(builder, builder.load(accm)))
    return types.float32(w, o, nb, x, c, xs, cs), codegen


@intrinsic
def q6k_dot(typingctx, w, o, nb, x, c):
    """sum over nb Q6_K blocks from w[o] of the block . x[c + 256 b:]."""
    if not _check(w, x):
        return None

    def codegen(context, builder, sig, args):
        o_, nb_, c_ = _intp(context, builder, sig, args, 1, 2, 4)
        acc = cgutils.alloca_once_value(builder, ir.Constant(_F8, [0.0] * 8))
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            ob, cb = builder.add(o_, builder.mul(b, ir.Constant(b.type, 210))), \
                builder.add(c_, builder.mul(b, ir.Constant(b.type, 256)))
            builder.store(_q6k(context, builder, sig.args[0], args[0], ob, sig.args[3], args[3], cb, builder.load(acc)),
                          acc)
        return _fhsum(builder, builder.load(acc))
    return types.float32(w, o, nb, x, c), codegen


@intrinsic
def q8_0_dot(typingctx, w, o, nb, x, c):
    """sum over nb Q8_0 blocks from w[o] of the block . x[c + 32 b:]."""
    if not _check(w, x):
        return None

    def codegen(context, builder, sig, args):
        o_, nb_, c_ = _intp(context, builder, sig, args, 1, 2, 4)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(_F8, [0.0] * 8)) for _ in range(4)]
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            ob, cb = builder.add(o_, builder.mul(b, ir.Constant(b.type, 34))), \
                builder.add(c_, builder.mul(b, ir.Constant(b.type, 32)))
            got = _q80(context, builder, sig.args[0], args[0], ob, sig.args[3], args[3], cb,
                       [builder.load(a) for a in accs])
            for a, v in zip(accs, got):
                builder.store(v, a)
        v = [builder.load(a) for a in accs]
        return _fhsum(builder, builder.fadd(builder.fadd(v[0], v[1]), builder.fadd(v[2], v[3])))
    return types.float32(w, o, nb, x, c), codegen


# The kernel table's one-token dots (kernels/ktypes.py, on a CPU with AVX2), in qblocks.dot1's signature:
# w one row's bytes of nb blocks, x its values, xs x's per-32 sums (Q4_K), f16 unused (F16C converts).

@njit(cache=True, inline="always")
def dot1_q4_k(w, x, xs, nb, f16):
    return q4k_dot(w, Z0, nb, x, Z0, xs, Z0)


@njit(cache=True, inline="always")
def dot1_q6_k(w, x, xs, nb, f16):
    return q6k_dot(w, Z0, nb, x, Z0)


@njit(cache=True, inline="always")
def dot1_q8_0(w, x, xs, nb, f16):
    return q8_0_dot(w, Z0, nb, x, Z0)
