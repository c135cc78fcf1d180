"""x86 AVX-512 one-token float dots for Q4_K and Q6_K: kernels/simd_f32.py's AVX2 dots with 16 float lanes (zmm)
instead of 8, on a CPU with AVX-512F (the kernel table picks them, kernels/ktypes.py). The float path's decode
is compute-bound (AVX2: ~13 GB/s a thread, a third of the read bandwidth on the AMD EPYC box; bench/HISTORY.md,
2026-11-25):
each weight is widened, converted and FMA'd, and a 512-bit instruction does twice an AVX2 one's weights.

    Q4_K   16 bytes -> 16 x i32 in one vpmovzxbd (from memory), their low and high nibbles 32 weights of sub-blocks
           2p and 2p+1, converted and FMA'd with x; each sub-block's 16-lane sum takes its scale d*sc_j in one FMA,
           the mins d_min*m_j . sum_32(x) one 8-lane FMA per block (as simd_f32).
    Q6_K   the 6-bit values minus 32 as bytes (simd.q6k_values, 32 lanes), each 16-weight group sign-extended,
           converted, multiplied by x and FMA'd with its scale d*sc_g.
    MXFP4  a block's 16 bytes -> 16 x i32 (vpmovzxbd), their low and high nibbles (weights 0-15, 16-31) looked
           up as floats in the 16 values in one vpermps each (no int -> float conversion), times x, the block's
           16-lane sum FMA'd with its E8M0 scale; blocks four at a time into the four accumulators.

The sums are float32, grouped differently from the reference and from simd_f32's (within the kernels' 1e-5 of
sum|w x|: tests/test_kernels_simd_f32z.py against the NumPy twin, and tests/test_kernels_matmul.py through the
table).

    q4k_dot16(w, o, nb, x, c, xs, cs), q6k_dot16(w, o, nb, x, c)   simd_f32's q4k_dot, q6k_dot, 16 lanes
    dot1_q4_k, dot1_q6_k                                           the same in qblocks.dot1's signature
    mxfp4_dot16(w, o, nb, x, c, e8m0), rows1_mxfp4   kernels/mxfp4_avx2.py's row_f32 (one token), rows1_avx2
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from moert.kernels.blockdot import FM, Z0
from moert.kernels.simd import (
    _I8,
    _I32,
    _at,
    _const,
    _fhsum,
    _fn,
    _half_at,
    _intp,
    _lanes,
    _scales_mins,
    _vload,
    prefetch,
    q6k_values,
)
from moert.kernels.simd_f32 import _F8, _F16, _check, _fma
from moert.quants.dequant import MXFP4_VALUES

__all__ = ["available", "dot1_q4_k", "dot1_q6_k", "mxfp4_dot16", "q4k_dot16", "q6k_dot16", "rows1_mxfp4"]

_V32x16 = ir.VectorType(_I32, 16)


@functools.cache
def available() -> bool:
    """True when the host CPU has AVX-512F (16-lane float FMAs, vpmovzxbd / vpmovsxbd to zmm)."""
    from llvmlite import binding
    try:
        return "+avx512f" in binding.get_host_cpu_features().flatten().split(",")
    except RuntimeError:                                                 # features unknown: be safe
        return False


def _fma16(builder, a, b, c):
    return builder.call(_fn(builder, "llvm.fma.v16f32", _F16, [_F16, _F16, _F16]), [a, b, c])


def _zeros(builder):
    """ACCS 16-lane float accumulators on the stack, zeroed."""
    return [cgutils.alloca_once_value(builder, ir.Constant(_F16, [0.0] * 16)) for _ in range(ACCS)]


def _total(builder, accs):
    """The sum of the accumulators' lanes: added lane by lane, the halves into 8 lanes, then simd's 8-lane sum."""
    v = builder.load(accs[0])
    for a in accs[1:]:
        v = builder.fadd(v, builder.load(a))
    return _fhsum(builder, builder.fadd(_lanes(builder, v, list(range(8))), _lanes(builder, v, list(range(8, 16)))))


# Accumulators per kernel: an FMA waits ~4 cycles for the one before it on the same accumulator, and one chain
# through a block's 8 (Q4_K) or 16 (Q6_K) scaled FMAs held both kernels at its latency (AMD EPYC box, Zen 5,
# 8192 x 4096 (in L3), one thread: Q4_K 18.3 GB/s, Q6_K 14.3 with one; 19.5 and 19.5 with four, 18.8 and 19.4
# with two, 18.8 and 18.5 with eight; AVX2 12.8 and 12.8).
ACCS = 4


def _q4k(context, builder, aty, wa, o, xty, xa, c, sty, sa, cs, accs, accm):
    """One Q4_K block at w[o:] (x at x[c:], its per-32 sums at xs[cs:]) into the accumulators: accs (ACCS of 16
    lanes) += the scaled nibble dots, accm (8 lanes) += d_min m_j sum_32(x)_j (subtracted at the end)."""
    sm = _scales_mins(context, builder, aty, wa, o)                    # <16 x i16>: 8 sc, 8 m
    prefetch(context, builder, aty, wa, o, 144)
    sc = builder.sitofp(builder.zext(_lanes(builder, sm, list(range(8))), ir.VectorType(_I32, 8)), _F8)
    mn = builder.sitofp(builder.zext(_lanes(builder, sm, list(range(8, 16))), ir.VectorType(_I32, 8)), _F8)
    d = _half_at(context, builder, aty, wa, o)
    dsc = builder.fmul(sc, _lanes(builder, builder.insert_element(ir.Constant(_F8, None), d, ir.Constant(_I32, 0)),
                                  [0] * 8))
    dm = _half_at(context, builder, aty, wa, _at(builder, o, 2))
    dmn = builder.fmul(mn, _lanes(builder, builder.insert_element(ir.Constant(_F8, None), dm, ir.Constant(_I32, 0)),
                                  [0] * 8))
    accm = _fma(builder, dmn, _vload(context, builder, sty, sa, cs, _F8), accm)
    m4 = _const(_V32x16, 15)
    for p in range(4):                                                  # sub-blocks 2p (low), 2p+1 (high)
        lo = hi = None
        for k in range(2):                                              # bytes 16k..16k+15 of the 32
            v = builder.zext(_vload(context, builder, aty, wa, _at(builder, o, 16 + 32 * p + 16 * k),
                                    ir.VectorType(_I8, 16)), _V32x16)
            ql = builder.sitofp(builder.and_(v, m4), _F16)
            qh = builder.sitofp(builder.lshr(v, _const(_V32x16, 4)), _F16)
            xl = _vload(context, builder, xty, xa, _at(builder, c, 64 * p + 16 * k), _F16)
            xh = _vload(context, builder, xty, xa, _at(builder, c, 64 * p + 32 + 16 * k), _F16)
            lo = builder.fmul(ql, xl) if lo is None else _fma16(builder, ql, xl, lo)
            hi = builder.fmul(qh, xh) if hi is None else _fma16(builder, qh, xh, hi)
        i, j = (2 * p) % ACCS, (2 * p + 1) % ACCS
        accs[i] = _fma16(builder, lo, _lanes(builder, dsc, [2 * p] * 16), accs[i])
        accs[j] = _fma16(builder, hi, _lanes(builder, dsc, [2 * p + 1] * 16), accs[j])
    return accs, accm


def _q6k(context, builder, aty, wa, o, xty, xa, c, accs):
    """One Q6_K block at w[o:] (x at x[c:]) into the ACCS 16-lane accumulators."""
    sc = builder.sitofp(builder.sext(_vload(context, builder, aty, wa, _at(builder, o, 192), ir.VectorType(_I8, 16)),
                                     _V32x16), _F16)
    d = _half_at(context, builder, aty, wa, _at(builder, o, 208))
    prefetch(context, builder, aty, wa, o, 210)
    dsc = builder.fmul(sc, _lanes(builder, builder.insert_element(ir.Constant(_F16, None), d, ir.Constant(_I32, 0)),
                                  [0] * 16))                            # 16 lanes d * sc_g
    for h in range(2):
        qs = q6k_values(context, builder, aty, wa, o, h)                # 6-bit q of lanes t = 0..3
        for t in range(4):                                              # weights 128h + 32t + l, l < 32
            q = builder.sub(qs[t], _const(ir.VectorType(_I8, 32), 32))  # q - 32 as signed bytes
            for g in range(2):                                          # 16-weight group 8h + 2t + g
                qf = builder.sitofp(builder.sext(_lanes(builder, q, list(range(16 * g, 16 * g + 16))), _V32x16), _F16)
                xv = _vload(context, builder, xty, xa, _at(builder, c, 128 * h + 32 * t + 16 * g), _F16)
                i = (2 * t + g) % ACCS
                accs[i] = _fma16(builder, builder.fmul(qf, xv), _lanes(builder, dsc, [8 * h + 2 * t + g] * 16), accs[i])
    return accs


@intrinsic
def q4k_dot16(typingctx, w, o, nb, x, c, xs, cs):
    """sum over nb Q4_K blocks from w[o] of the block . x[c + 256 b:], xs[cs + 8 b:] its per-32 sums."""
    if not (_check(w, x) and _check(w, xs)):
        return None

    def codegen(context, builder, sig, args):
        o_, nb_, c_, cs_ = _intp(context, builder, sig, args, 1, 2, 4, 6)
        accs = _zeros(builder)
        accm = cgutils.alloca_once_value(builder, ir.Constant(_F8, [0.0] * 8))
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index

            def at(base, k):
                return builder.add(base, builder.mul(b, ir.Constant(b.type, k)))
            a, am = _q4k(context, builder, sig.args[0], args[0], at(o_, 144), sig.args[3], args[3], at(c_, 256),
                         sig.args[5], args[5], at(cs_, 8), [builder.load(v) for v in accs], builder.load(accm))
            for v, slot in zip(a, accs):
                builder.store(v, slot)
            builder.store(am, accm)
        return builder.fsub(_total(builder, accs), _fhsum(builder, builder.load(accm)))
    return types.float32(w, o, nb, x, c, xs, cs), codegen


@intrinsic
def q6k_dot16(typingctx, w, o, nb, x, c):
    """sum over nb Q6_K blocks from w[o] of the block . x[c + 256 b:]."""
    if not _check(w, x):
        return None

    def codegen(context, builder, sig, args):
        o_, nb_, c_ = _intp(context, builder, sig, args, 1, 2, 4)
        accs = _zeros(builder)
        with cgutils.for_range(builder, nb_) as loop:
            b = loop.index
            ob, cb = builder.add(o_, builder.mul(b, ir.Constant(b.type, 210))), \
                builder.add(c_, builder.mul(b, ir.Constant(b.type, 256)))
            got = _q6k(context, builder, sig.args[0], args[0], ob, sig.args[3], args[3], cb,
                       [builder.load(v) for v in accs])
            for v, slot in zip(got, accs):
                builder.store(v, slot)
        return _total(builder, accs)
    return types.float32(w, o, nb, x, c), codegen


# The kernel table's one-token dots (kernels/ktypes.py, on a CPU with AVX-512F), in qblocks.dot1's signature:
# w one row's bytes of nb blocks, x its values, xs x's per-32 sums (Q4_K), f16 unused (F16C converts).

@njit(cache=True, inline="always")
def dot1_q4_k(w, x, xs, nb, f16):
    return q4k_dot16(w, Z0, nb, x, Z0, xs, Z0)


@njit(cache=True, inline="always")
def dot1_q6_k(w, x, xs, nb, f16):
    return q6k_dot16(w, Z0, nb, x, Z0)


def _mxfp4(context, builder, aty, wa, o, xty, xa, c, tty, ta, acc):
    """One MXFP4 block at w[o:] (x at x[c:]) into the 16-lane accumulator acc: += e8m0[e] * (v_lo x_lo + v_hi x_hi)."""
    prefetch(context, builder, aty, wa, o, 1)                           # one line (3-4 blocks) ahead
    q = builder.zext(_vload(context, builder, aty, wa, _at(builder, o, 1), ir.VectorType(_I8, 16)), _V32x16)
    perm = _fn(builder, "llvm.x86.avx512.permvar.sf.512", _F16, [_F16, _V32x16])
    tab = ir.Constant(_F16, [float(v) for v in MXFP4_VALUES])
    lo = builder.call(perm, [tab, builder.and_(q, _const(_V32x16, 15))])          # weights 0..15
    hi = builder.call(perm, [tab, builder.lshr(q, _const(_V32x16, 4))])           # weights 16..31
    s = builder.fmul(lo, _vload(context, builder, xty, xa, c, _F16))
    s = _fma16(builder, hi, _vload(context, builder, xty, xa, _at(builder, c, 16), _F16), s)
    e = builder.zext(_vload(context, builder, aty, wa, o, _I8), ir.IntType(64))
    d = builder.load(builder.gep(context.make_array(tty)(context, builder, ta).data, [e]))
    dv = _lanes(builder, builder.insert_element(ir.Constant(_F16, None), d, ir.Constant(_I32, 0)), [0] * 16)
    return _fma16(builder, s, dv, acc)


@intrinsic
def mxfp4_dot16(typingctx, w, o, nb, x, c, e8m0):
    """sum over nb MXFP4 blocks from w[o] of the block . x[c + 32 b:], e8m0 the scale table (mxfp4.E8M0_HALF)."""
    if not (_check(w, x) and x.layout == "C" and isinstance(e8m0, types.Array) and e8m0.dtype == types.float32):
        return None                                                     # x is read at flat offsets: C order only

    def codegen(context, builder, sig, args):
        o_, nb_, c_ = _intp(context, builder, sig, args, 1, 2, 4)
        accs = _zeros(builder)

        def block(b, k):
            ob, cb = builder.add(o_, builder.mul(b, ir.Constant(b.type, 17))), \
                builder.add(c_, builder.mul(b, ir.Constant(b.type, 32)))
            builder.store(_mxfp4(context, builder, sig.args[0], args[0], ob, sig.args[3], args[3], cb,
                                 sig.args[5], args[5], builder.load(accs[k])), accs[k])
        four = ir.Constant(nb_.type, ACCS)
        quads = builder.sdiv(nb_, four)
        with cgutils.for_range(builder, quads) as loop:                 # block 4i + k into accumulator k
            for k in range(ACCS):
                block(builder.add(builder.mul(loop.index, four), ir.Constant(nb_.type, k)), k)
        with cgutils.for_range(builder, builder.sub(nb_, builder.mul(quads, four))) as loop:   # the last 0-3
            block(builder.add(builder.mul(quads, four), loop.index), 0)
        return _total(builder, accs)
    return types.float32(w, o, nb, x, c, e8m0), codegen


@njit(cache=True, fastmath=FM)
def rows1_mxfp4(w, x, out, r0, r1, b0, b1, e8m0):
    """kernels/mxfp4.py's rows1 (out[0, r] = row r's blocks [b0, b1) . x[0]) with 16 lanes: what it picks on a
    CPU with AVX-512F."""
    xv = x[0]
    for r in range(r0, r1):
        out[0, r] = mxfp4_dot16(w[r], 17 * b0, b1 - b0, xv, 32 * b0, e8m0)
