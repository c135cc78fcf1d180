"""x86 AVX2 integer dot products for the int8-activation kernels (kernels/matmul_q.py, mode "int8"): the one
place where moert emits target-specific instructions. LLVM does not derive `vpmaddubsw` (u8 x s8 -> pairs
summed into s16) from Numba source, and that instruction is what makes llama.cpp's Q4_K/Q6_K dot products
cheap: 32 weights per instruction, no int-to-float conversion per weight. Each function here is a Numba
`@intrinsic` over a row of 256-weight super-blocks: each block's dot product is exact in int32 (8 lanes),
then converted and multiplied by the block's float scales into 8 float lanes, with one horizontal sum per
row (the structure of ggml's AVX2 `ggml_vec_dot_q4_K_q8_K`).

    q4k_row(w, o, nb, xq, c, ld, xd, cd, ldd, xb, cb, ldb, n)
        sum over the nb Q4_K blocks from w[o] of xd_b (d_b sum_j sc_j isum_j - dmin_b sum_j m_j xs_j), for
        n tokens (a literal 1 to 7): token t's int8 x at xq[c + t ld], its steps at xd[cd + t ldd] (one
        per block), its per-32 sums xs_j NEGATED, as int16, at xb[cb + t ldb] (matmul_q.x_q4_k), so the
        min term is one vpmaddwd and shares the scale term's conversion and multiply-add. The block's
        6-bit scales and mins are decoded here. A float32 for n = 1, an n-tuple otherwise: the block's
        nibbles and scales are decoded once for all n tokens.
    q4kr_row(...)
        the same over kernels/repack.py's Q4_K blocks (148 bytes: the scales and mins one byte each, the
        nibbles in its PAIR order), x in that order too (repack.x_q4_kr): the two sub-blocks of a pair in
        alternate 16-bit lanes, so one vpmaddwd takes both (half the scale shuffles and vpmaddwd of
        q4k_row). The same int32 sums per block; float lanes added in another order.
    q6k_row(w, o, nb, xq, c, ld, xd, cd, ldd, xs, cs, lds, n)
        sum over the nb Q6_K blocks from w[o] of xd_b d_b sum_g scale_g sum_{l<16} (q6 - 32) xq, likewise;
        xs[cs + t lds] holds token t's per-16 sums of xq (int16), which take the -32 out once per block.

w is a uint8 array, xq an int8, xd a float32 and xb (xs) an int16 array, each C-contiguous: every offset is a
flat element offset from the array's first element. The callers check `available()` first:
on a CPU without AVX2 the int8 mode is refused with a clear error instead of failing to compile.
No overflow: a u8 x s8 pair is at most 2 * 63 * 127 = 16002 < 2^15 (Q6_K; its -32 correction is at most
32 * 2 * 128 * 2032 < 2^24; q4kr_row adds two Q4_K pairs in 16 bits: 4 * 15 * 127 = 7620), and the int32
sums are bounded by 256 * 63 * 127 * 127 (Q4_K scales are 6-bit) < 2^31.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["available", "q4k_row", "q4kr_row", "q6k_row", "q6k_row_intrinsic"]

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


def _const(vty, v):
    return ir.Constant(vty, [v] * vty.count)


def _lanes(builder, v, idx):
    """The vector of v's lanes idx (a shuffle with constant indices)."""
    return builder.shuffle_vector(v, ir.Constant(v.type, None), ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def _maddubs(builder, u, s):
    return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16x16, [_V8x32, _V8x32]), [u, s])


def _madd(builder, a, b):
    return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", _V32x8, [_V16x16, _V16x16]), [a, b])


def _check(w, xq):
    return (isinstance(w, types.Array) and w.dtype == types.uint8
            and isinstance(xq, types.Array) and xq.dtype == types.int8)


def _at(builder, base, k):
    return builder.add(base, ir.Constant(base.type, k))


# Software prefetch this many bytes ahead of the block being read: the row kernels read one sequential stream,
# but spend ~100 instructions per block, and the hardware prefetcher alone kept them at 60-70% of one thread's
# read bandwidth (16384 x 8192, 1 thread, same run, bench/HISTORY.md, 2026-11-24 run L: int8 Q4_K repacked
# 13.7 -> 16.7 GB/s, Q6_K 14.7 -> 19.8, 2 threads 26.6 -> 33.2 and 26.9 -> 34.9; 4, 8, 16 and 32 KB ahead
# measured alike, 0.5-2 KB with one line per block did nothing). A prefetch never faults, so reading past the
# array's end is harmless.
PF_BYTES = 4096


def prefetch(context, builder, aty, arr, off, nbytes):
    """Prefetch hints (prefetcht0) for the nbytes from flat byte offset off + PF_BYTES of array arr (uint8), one
    per 64-byte line: a block's worth, PF_BYTES ahead of the block being read."""
    a = context.make_array(aty)(context, builder, arr)
    p8 = ir.IntType(8).as_pointer()
    fn = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [p8, _I32, _I32, _I32])
    for k in range(0, nbytes, 64):
        ptr = builder.bitcast(builder.gep(a.data, [_at(builder, off, PF_BYTES + k)]), p8)
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _scales_mins(context, builder, aty, wa, o):
    """The Q4_K block's 8 scales and 8 mins at w[o + 4:] as <16 x i16> (lanes 0-7 sc, 8-15 m): the 12
    packed 6-bit bytes as three u32, unpacked as ggml's AVX2 Q4_K dot does."""
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
    return builder.zext(builder.bitcast(v4, ir.VectorType(_I8, 16)), _V16x16)


def _opaque_masks(builder):
    """The 8 vpshufb masks that broadcast 16-bit lane k (k < 8) of a 128-bit half to all of it, loaded
    (volatile) from the stack once per call: LLVM folds a pshufb with a constant mask back into a lane
    broadcast, which it builds from 2-3 shuffles; from a value it cannot see, it stays one vpshufb."""
    out = []
    for k in range(8):
        slot = cgutils.alloca_once(builder, _V8x32)
        builder.store(ir.Constant(_V8x32, [2 * k + (i % 2) for i in range(32)]), slot)
        load = _VolatileLoad(builder.block, slot)
        builder._insert(load)
        out.append(load)
    return out


class _VolatileLoad(ir.instructions.LoadInstr):
    """`load volatile` (llvmlite's builder has no such flag): a value the optimizer may not replace."""

    def descr(self, buf):
        [ptr] = self.operands
        buf.append(f"load volatile {self.type}, {ptr.type} {ptr.get_reference()}, align 1\n")


def _q4k(context, builder, aty, wa, o, xty, xa, cs, bty, ba, cbs, packed, masks):
    """IR for one Q4_K block at w[o:] against len(cs) int8 token vectors at xq[c] (their negated per-32
    sums, int16, at xb[cb]): one <8 x i32> a token, lanes 0-3 adding up to sum_j sc_j isum_j and lanes 4-7
    to -sum_j m_j xb_j, so one conversion and one multiply-add by [d x] * 4 + [dmin x] * 4 take both terms.
    The weights and scales are decoded once for all tokens. packed: the block is kernels/repack.py's (148
    bytes, the 16 scales and mins one byte each at o + 4, loaded as they are instead of the 6-bit
    unpacking). masks: _opaque_masks(), so each sub-block's scale is broadcast by one vpshufb."""
    if packed:
        sm = builder.zext(_vload(context, builder, aty, wa, _at(builder, o, 4), ir.VectorType(_I8, 16)), _V16x16)
    else:
        sm = _scales_mins(context, builder, aty, wa, o)               # lanes 0-7 sc, 8-15 m
    qs = 20 if packed else 16                                         # where the 128 nibble bytes start
    prefetch(context, builder, aty, wa, o, 148 if packed else 144)
    mins = _lanes(builder, sm, list(range(8, 16)))                    # <8 x i16>
    sc2 = builder.bitcast(_lanes(builder, sm, list(range(8)) * 2), _V8x32)   # the 8 scales in both halves
    madd4 = _fn(builder, "llvm.x86.sse2.pmadd.wd", ir.VectorType(_I32, 4), [ir.VectorType(_I16, 8)] * 2)
    msums = [builder.call(madd4, [mins, _vload(context, builder, bty, ba, cb, ir.VectorType(_I16, 8))])
             for cb in cbs]                                            # -sum m_j xb_j in 4 lanes
    accs = [_const(_V32x8, 0)] * len(cs)
    m4 = _const(_V8x32, 15)
    for p in range(4):                                                   # 64 weights: sub-blocks 2p, 2p+1
        q = _vload(context, builder, aty, wa, _at(builder, o, qs + 32 * p), _V8x32)
        lo, hi = builder.and_(q, m4), builder.and_(builder.lshr(q, _const(_V8x32, 4)), m4)
        if packed:                              # the pair's scales alternating in 16-bit lanes: one vpshufd
            sp = builder.bitcast(_lanes(builder, builder.bitcast(sc2, _V32x8), [p] * 4 + [p + 4] * 4), _V16x16)
        else:                                   # each sub-block's scale in every lane: one vpshufb each
            slo, shi = (builder.bitcast(builder.call(_fn(builder, "llvm.x86.avx2.pshuf.b", _V8x32, [_V8x32, _V8x32]),
                                                     [sc2, masks[j]]), _V16x16) for j in (2 * p, 2 * p + 1))
        for i, c in enumerate(cs):
            xlo = _vload(context, builder, xty, xa, _at(builder, c, 64 * p), _V8x32)
            xhi = _vload(context, builder, xty, xa, _at(builder, c, 64 * p + 32), _V8x32)
            if packed:                          # 16-bit lanes of both sub-blocks, each sum <= 2 * 2 * 15 * 127
                a16 = builder.add(_maddubs(builder, lo, xlo), _maddubs(builder, hi, xhi))
                accs[i] = builder.add(accs[i], _madd(builder, a16, sp))
            else:
                accs[i] = builder.add(accs[i], _madd(builder, _maddubs(builder, lo, xlo), slo))
                accs[i] = builder.add(accs[i], _madd(builder, _maddubs(builder, hi, xhi), shi))
    return [builder.shuffle_vector(builder.add(_lanes(builder, acc, [0, 1, 2, 3]), _lanes(builder, acc, [4, 5, 6, 7])),
                                   ms, ir.Constant(_V32x8, list(range(8)))) for acc, ms in zip(accs, msums)]


def q6k_values(context, builder, aty, wa, o, h):
    """The 6-bit values of half h of the Q6_K block at w[o:] as four <32 x i8>: t-th holds weights
    128h + 32t + l, l < 32 (low nibbles of ql[64h:], ql[64h + 32:], then their high nibbles, each with its
    two bits of qh[32h:]). simd_f32.py's float dot reads them too."""
    def c8(v):
        return _const(_V8x32, v)
    b_and, b_or, shl, shr = builder.and_, builder.or_, builder.shl, builder.lshr
    ql0 = _vload(context, builder, aty, wa, _at(builder, o, 64 * h), _V8x32)
    ql1 = _vload(context, builder, aty, wa, _at(builder, o, 64 * h + 32), _V8x32)
    qh = _vload(context, builder, aty, wa, _at(builder, o, 128 + 32 * h), _V8x32)
    return (b_or(b_and(ql0, c8(15)), shl(b_and(qh, c8(3)), c8(4))),
            b_or(b_and(ql1, c8(15)), shl(b_and(qh, c8(12)), c8(2))),
            b_or(shr(ql0, c8(4)), b_and(qh, c8(48))),
            b_or(shr(ql1, c8(4)), shr(b_and(qh, c8(192)), c8(2))))


def _q6k(context, builder, aty, wa, o, xty, xa, cs, sty, sa, ss):
    """IR for one Q6_K block at w[o:] against len(cs) int8 token vectors at xq[c], whose 16 per-16 sums
    (int16) are at xs[s]: [isum_0, isum_1, ...], <8 x i32> each (lanes add up to the sum). The -32 offset
    of every weight is taken out once per block, as ggml's AVX2 Q6_K dot does: sum_l (q_l - 32) x_l =
    sum_l q_l x_l - 32 sum_l x_l per 16-group, the second term one vpmaddwd of the scales with the sums."""
    # the 16 int8 scales at o + 192, sign-extended; lane pattern for group pair (2t, 2t+1): 8 + 8 lanes
    sc16 = builder.sext(_vload(context, builder, aty, wa, _at(builder, o, 192), ir.VectorType(_I8, 16)),
                        ir.VectorType(_I16, 16))
    prefetch(context, builder, aty, wa, o, 210)
    accs = [builder.sub(_const(_V32x8, 0), builder.shl(_madd(builder, sc16, _vload(context, builder, sty, sa, s_,
                                                                                 _V16x16)), _const(_V32x8, 5)))
            for s_ in ss]                                                # - 32 sum_g sc_g xsum_g

    for h in range(2):
        qs = q6k_values(context, builder, aty, wa, o, h)
        for t in range(4):                                               # weights 128h + 32t + l, l < 32
            g = 8 * h + 2 * t                                            # lanes 0-7: group g, 8-15: g + 1
            sc = _lanes(builder, sc16, [g] * 8 + [g + 1] * 8)
            for i, c in enumerate(cs):
                x = _vload(context, builder, xty, xa, _at(builder, c, 128 * h + 32 * t), _V8x32)
                accs[i] = builder.add(accs[i], _madd(builder, _maddubs(builder, qs[t], x), sc))   # q . x
    return accs


def _intp(context, builder, sig, args, *idx):
    return [context.cast(builder, args[i], sig.args[i], types.intp) for i in idx]


def _offsets(builder, c, ld, n):
    return [builder.add(c, builder.mul(ld, ir.Constant(ld.type, i))) for i in range(n)]


# ------------------------------------------------------------------------------------------ whole rows
# A row of nb blocks in one call: each block's <8 x i32> sums are converted and multiplied by the block's
# float scales into <8 x float> accumulators, one horizontal sum per row and token at the end (ggml's
# layout). One call per block, with an integer horizontal sum and a scalar float tail per block, measured
# about 25% slower (bench/HISTORY.md, 2026-11-23 runs E-H).

_F32x8 = ir.VectorType(ir.FloatType(), 8)


def _half_at(context, builder, aty, wa, off):
    """The little-endian fp16 at w[off] as a float (F16C's vcvtph2ps)."""
    h = builder.bitcast(_vload(context, builder, aty, wa, off, _I16), ir.HalfType())
    return builder.fpext(h, ir.FloatType())


def _dmin8(context, builder, aty, wa, off):
    """A Q4_K block's d and dmin (fp16 at w[off], w[off + 2]) as <8 x float> [d] * 4 + [dmin] * 4: one
    vcvtph2ps of 4 halves (the last two, scale bytes, unused) and one lane permute."""
    h4 = builder.bitcast(_vload(context, builder, aty, wa, off, ir.VectorType(_I16, 4)),
                         ir.VectorType(ir.HalfType(), 4))
    return _lanes(builder, builder.fpext(h4, ir.VectorType(ir.FloatType(), 4)), [0] * 4 + [1] * 4)


def _fsplat(builder, v):
    one = builder.insert_element(ir.Constant(_F32x8, None), v, ir.Constant(_I32, 0))
    return _lanes(builder, one, [0] * 8)


def _fhsum(builder, v):
    lo = _lanes(builder, v, [0, 1, 2, 3])
    hi = _lanes(builder, v, [4, 5, 6, 7])
    s4 = builder.fadd(lo, hi)
    s2 = builder.fadd(_lanes(builder, s4, [0, 1]), _lanes(builder, s4, [2, 3]))
    return builder.fadd(builder.extract_element(s2, ir.Constant(_I32, 0)),
                        builder.extract_element(s2, ir.Constant(_I32, 1)))


def _row_loop(context, builder, nb, n, body):
    """sum over blocks b < nb of body(b) -> n lists of (<8 x i32> sum, float factor) terms, accumulated in
    <8 x float>; returns the n float totals."""
    accs = [cgutils.alloca_once_value(builder, ir.Constant(_F32x8, [0.0] * 8)) for _ in range(n)]
    with cgutils.for_range(builder, nb) as loop:
        for acc, terms in zip(accs, body(loop.index)):
            a = builder.load(acc)
            for ivec, f in terms:               # one token: FMAs (3-5% faster); several: a multiply and an
                v = builder.sitofp(ivec, _F32x8)                               # add (FMA's longer latency on
                fs = f if isinstance(f.type, ir.VectorType) else _fsplat(builder, f)   # the chain cost T = 16
                a = builder.call(_fn(builder, "llvm.fma.v8f32", _F32x8, [_F32x8] * 3), [v, fs, a]) if n == 1 \
                    else builder.fadd(a, builder.fmul(v, fs))                  # 10-15%)
            builder.store(a, acc)
    return [_fhsum(builder, builder.load(acc)) for acc in accs]


def _f32_at(context, builder, aty, arr, off):
    a = context.make_array(aty)(context, builder, arr)
    return builder.load(builder.gep(a.data, [off]))


def _row_check(w, xq, xd):
    return _check(w, xq) and isinstance(xd, types.Array) and xd.dtype == types.float32


def _tokens(w, xq, xd, sums, n) -> int | None:
    """The literal token count n (1 to 7) of a Q4_K/Q6_K row kernel's call whose arrays have the types it
    reads (uint8 w, int8 x, float32 steps, int16 sums), else None (no such kernel)."""
    if (_row_check(w, xq, xd) and isinstance(sums, types.Array) and sums.dtype == types.int16
            and isinstance(n, types.IntegerLiteral) and 1 <= n.literal_value <= 7):
        return n.literal_value
    return None


def q4k_row_intrinsic(values, size: int, name: str):
    """A Q4_K row intrinsic (q4k_row's arguments and result) over blocks of `size` bytes whose int32 sums come from
    values(builder), called once a codegen so that it can hoist what the blocks share (_q4k_values here; the 512-bit
    _q4k in kernels/simd_z.py): the loop over blocks, the scales and the tokens are this one."""
    def row(typingctx, w, o, nb, xq, c, ld, xd, cd, ldd, xb, cb, ldb, n):
        N = _tokens(w, xq, xd, xb, n)
        if N is None:
            return None

        def codegen(context, builder, sig, args):
            o_, nb_, c_, ld_, cd_, ldd_, cb_, ldb_ = _intp(context, builder, sig, args, 1, 2, 4, 5, 7, 8, 10, 11)
            block = values(builder)

            def body(b):
                ob = builder.add(o_, builder.mul(b, ir.Constant(b.type, size)))
                cs = [builder.add(c, builder.mul(b, ir.Constant(b.type, 256))) for c in _offsets(builder, c_, ld_, N)]
                cbs = [builder.add(c, builder.mul(b, ir.Constant(b.type, 8))) for c in _offsets(builder, cb_, ldb_, N)]
                vals = block(context, builder, sig.args[0], args[0], ob, sig.args[3], args[3], cs, sig.args[9],
                             args[9], cbs)
                dm = _dmin8(context, builder, sig.args[0], args[0], ob)         # [d] * 4 + [dmin] * 4
                return [[(vals[i], builder.fmul(dm, _fsplat(builder, _f32_at(context, builder, sig.args[6], args[6],
                                                                             builder.add(cd, b)))))]
                        for i, cd in enumerate(_offsets(builder, cd_, ldd_, N))]
            tot = _row_loop(context, builder, nb_, N, body)
            return tot[0] if N == 1 else context.make_tuple(builder, sig.return_type, tot)
        ret = types.float32 if N == 1 else types.UniTuple(types.float32, N)
        return ret(w, o, nb, xq, c, ld, xd, cd, ldd, xb, cb, ldb, n), codegen
    row.__name__ = row.__qualname__ = name
    return intrinsic(row)


def _q4k_values(packed: bool):
    """q4k_row_intrinsic's values for _q4k: GGUF's blocks with their opaque masks made once a codegen, or
    kernels/repack.py's (packed, no masks)."""
    def values(builder):
        masks = None if packed else _opaque_masks(builder)
        return lambda *block: _q4k(*block, packed, masks)
    return values


q4k_row = q4k_row_intrinsic(_q4k_values(False), 144, "q4k_row")
q4k_row.__doc__ = """sum over nb Q4_K blocks from w[o] of d_b xd_b isum_b - dmin_b xd_b msum_b, for n (a literal 1
to 7) tokens t at xq[c + t ld], xd[cd + t ldd], xb[cb + t ldb] (negated int16 per-32 sums): a float32 for
n = 1, else an n-tuple."""
q4kr_row = q4k_row_intrinsic(_q4k_values(True), 148, "q4kr_row")
q4kr_row.__doc__ = """q4k_row over kernels/repack.py's Q4_K blocks (148 bytes, scales and mins unpacked, nibbles in
PAIR order) and x in PAIR order: the same int32 sums per block, a pair of sub-blocks per vpmaddwd."""


def q6k_row_intrinsic(values, name: str):
    """A Q6_K row intrinsic (q6k_row's arguments and result) whose block sums come from `values` (_q6k here, its
    512-bit twin in kernels/simd_z.py): the loop over blocks, the scales and the tokens are this one."""
    def row(typingctx, w, o, nb, xq, c, ld, xd, cd, ldd, xs, cs, lds, n):
        N = _tokens(w, xq, xd, xs, n)
        if N is None:
            return None

        def codegen(context, builder, sig, args):
            o_, nb_, c_, ld_, cd_, ldd_, cs_, lds_ = _intp(context, builder, sig, args, 1, 2, 4, 5, 7, 8, 10, 11)

            def body(b):
                ob = builder.add(o_, builder.mul(b, ir.Constant(b.type, 210)))
                cx = [builder.add(c, builder.mul(b, ir.Constant(b.type, 256))) for c in _offsets(builder, c_, ld_, N)]
                ss = [builder.add(s_, builder.mul(b, ir.Constant(b.type, 16)))
                      for s_ in _offsets(builder, cs_, lds_, N)]
                vals = values(context, builder, sig.args[0], args[0], ob, sig.args[3], args[3], cx, sig.args[9],
                              args[9], ss)
                d = _half_at(context, builder, sig.args[0], args[0], _at(builder, ob, 208))
                return [[(vals[i], builder.fmul(d, _f32_at(context, builder, sig.args[6], args[6],
                                                           builder.add(cd, b))))]
                        for i, cd in enumerate(_offsets(builder, cd_, ldd_, N))]
            tot = _row_loop(context, builder, nb_, N, body)
            return tot[0] if N == 1 else context.make_tuple(builder, sig.return_type, tot)
        ret = types.float32 if N == 1 else types.UniTuple(types.float32, N)
        return ret(w, o, nb, xq, c, ld, xd, cd, ldd, xs, cs, lds, n), codegen
    row.__name__ = row.__qualname__ = name
    return intrinsic(row)


q6k_row = q6k_row_intrinsic(_q6k, "q6k_row")
q6k_row.__doc__ = """sum over nb Q6_K blocks from w[o] of d_b xd_b isum_b, for n (a literal 1 to 7) tokens as q4k_row;
token t's per-16 sums of its int8 x (int16, 16 a block) at xs[cs + t lds]."""
