"""Register-blocked tiles for kernels/flash_decode.py's inner loops, as explicit LLVM vectors of LANES floats (16
where the CPU has AVX-512F, else 8): LLVM vectorized the plain loops one (key, head) pair at a time (a horizontal
sum per score; the accumulator row loaded and stored around every FMA of P.V). The keys and values are read from
a float32 tile or straight from the cache's rows (float32, or f16 / bf16 bits widened in registers: no tile).

    qk_tile(HB, KB, W=LANES) -> an intrinsic (qs, g0, kt, r0, kh, bf16, sc, c0):
        sc[g0 + h, c0 + k] = qs[g0 + h] . kt[r0 + k]            h < HB heads, k < KB keys: HB x KB accumulators
        over Dh in W-float steps (each key row loaded once for the HB heads, each q row once for the KB keys),
        their lane sums in one shuffle tree (pairs of vectors halved into one until one lane an accumulator).
    pv_tile(HB, DB, W=LANES) -> an intrinsic (sc, g0, c0, vt, r0, kh, bf16, n, acc, a0, d0):
        acc[a0 + h, d0:d0 + DB * W] += sum_{j<n} sc[g0 + h, c0 + j] * vt[r0 + j, d0:d0 + DB * W]
        HB x DB vector accumulators held in registers over the n keys, added to acc once.

    scores(qs, kt, j0, kh, bf16, nj, sc)                        a tile's G heads by those tiles
    weighted_values(sc, vt, j0, kh, bf16, nj, acc, a0, Dv)
    prefetch_row(cache, r, kh)                  prefetch hints for one cache row (the next tile's, during this one)

kt, vt: a float32 tile (n, D), or a cache (n_ctx, Hk, D) float32 / uint16 whose KV head kh is read (bf16: its
uint16 are bf16 bits, else f16). The arrays have unit stride in their last axis; Dh and
the dims d0 .. take whole vectors (flash_decode checks D % LANES == 0 and keeps its plain loops otherwise).
Twins: NumPy's products (tests/test_kernels_flash_simd.py, both widths), split_attention_ref through the kernel
(tests/test_kernels_flash_decode.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from moert.kernels.simd_f32z import available as _avx512f

__all__ = ["DB_PV", "HB_PV", "HB_QK", "KB_QK", "LANES", "lane_sums", "prefetch_row", "pv_tile", "qk_tile", "scores",
           "weighted_values"]

LANES = 16 if _avx512f() else 8
HB_QK = 4 if LANES == 16 else 2     # heads a score tile: 4 x 4 (16 zmm) or 2 x 4 (8 ymm) accumulators
KB_QK = 4                           # keys a score tile
HB_PV = 4 if LANES == 16 else 2     # heads a P.V tile
DB_PV = 4                           # vectors of dims a P.V tile
_F = ir.FloatType()
_I32 = ir.IntType(32)


def _vec(n):
    return ir.VectorType(_F, n)


def _ptr(context, builder, aty, arr, inds):
    """The float* of arr[inds] (intp indices)."""
    a = context.make_array(aty)(context, builder, arr)
    return cgutils.get_item_pointer2(context, builder, a.data, cgutils.unpack_tuple(builder, a.shape),
                                     cgutils.unpack_tuple(builder, a.strides), aty.layout, inds)


def _load(builder, ptr, off, vty):
    return builder.load(builder.bitcast(builder.gep(ptr, [off]), vty.as_pointer()), align=4)


def _store(builder, v, ptr, off):
    builder.store(v, builder.bitcast(builder.gep(ptr, [off]), v.type.as_pointer()), align=4)


def _fma(builder, a, b, c):
    t = a.type
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t, t]), f"llvm.fma.v{t.count}f32")
    return builder.call(fn, [a, b, c])


def _splat(builder, x, n):
    v = builder.insert_element(ir.Constant(_vec(n), None), x, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, ir.Constant(_vec(n), None), ir.Constant(ir.VectorType(_I32, n), [0] * n))


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(idx)), idx))


def lane_sums(builder, accs):
    """len(accs) (a power of two <= their lanes) vectors -> one vector of their lane sums, in order: pairs of
    vectors (s lanes an accumulator) into one (s / 2 lanes each: the low halves plus the high halves), then one
    vector halved in itself."""
    vs, w = list(accs), accs[0].type.count
    s = w                                                               # lanes an accumulator holds in each vector
    while len(vs) > 1:
        h, segs = s // 2, w // s
        lo = [m * s + k + off for off in (0, w) for m in range(segs) for k in range(h)]
        vs = [builder.fadd(_shuffle(builder, x, y, lo), _shuffle(builder, x, y, [i + h for i in lo]))
              for x, y in zip(vs[0::2], vs[1::2])]
        s = h
    v = vs[0]
    while s > 1:
        h, segs = s // 2, v.type.count // s
        lo = [m * s + k for m in range(segs) for k in range(h)]
        v = builder.fadd(_shuffle(builder, v, v, lo), _shuffle(builder, v, v, [i + h for i in lo]))
        s = h
    return v


def _row(context, builder, aty, arr, r, kh, col):
    """The pointer to arr[r, col] (a tile) or arr[r, kh, col] (a cache)."""
    return _ptr(context, builder, aty, arr, [r, col] if aty.ndim == 2 else [r, kh, col])


def _loadf(builder, ptr, off, W, aty, bf16):
    """W floats from ptr + off: float32 as they are, uint16 as f16 (or, bf16 true, bf16) bits widened."""
    if aty.dtype == types.float32:
        return _load(builder, ptr, off, _vec(W))
    x = _load(builder, ptr, off, ir.VectorType(ir.IntType(16), W))
    if not bf16:
        return builder.fpext(builder.bitcast(x, ir.VectorType(ir.HalfType(), W)), _vec(W))
    x = builder.shl(builder.zext(x, ir.VectorType(_I32, W)), ir.Constant(ir.VectorType(_I32, W), [16] * W))
    return builder.bitcast(x, _vec(W))


def _rows_ok(a):
    """A tile (float32, 2-D) or a cache the tiles read as it is (float32 or f16 / bf16 bits, 3-D)."""
    return isinstance(a, types.Array) and ((a.ndim == 2 and a.dtype == types.float32)
                                           or (a.ndim == 3 and a.dtype in (types.float32, types.uint16)))


def _both(builder, flag, emit):
    """emit(bf16) under a branch on the runtime flag: the loop once for f16 bits and once for bf16 bits."""
    with builder.if_else(builder.trunc(flag, ir.IntType(1)) if flag.type != ir.IntType(1) else flag) as (b, f):
        with b:
            emit(True)
        with f:
            emit(False)


def _intps(context, builder, sig, args, idx):
    return [context.cast(builder, args[i], sig.args[i], types.intp) for i in idx]


def qk_tile(HB: int, KB: int, W: int = LANES):
    """The score tile intrinsic of HB heads x KB keys in W-float vectors (HB * KB a power of two <= W)."""
    @intrinsic
    def qk(typingctx, qs, g0, kt, r0, kh, bf16, sc, c0):
        if not _rows_ok(kt):
            return None

        def codegen(context, builder, sig, args):
            V, ip, kty = _vec(W), context.get_value_type(types.intp), sig.args[2]
            g0_, r0_, kh_, c0_ = _intps(context, builder, sig, args, (1, 3, 4, 7))
            zero = ir.Constant(ip, 0)
            dh = cgutils.unpack_tuple(builder, context.make_array(sig.args[0])(context, builder, args[0]).shape)[1]
            qp = [_ptr(context, builder, sig.args[0], args[0], [builder.add(g0_, ir.Constant(ip, h)), zero])
                  for h in range(HB)]
            kp = [_row(context, builder, kty, args[2], builder.add(r0_, ir.Constant(ip, k)), kh_, zero)
                  for k in range(KB)]
            accs = [cgutils.alloca_once_value(builder, ir.Constant(V, [0.0] * W)) for _ in range(HB * KB)]

            def emit(bf):
                with cgutils.for_range(builder, builder.udiv(dh, ir.Constant(ip, W))) as loop:
                    off = builder.mul(loop.index, ir.Constant(ip, W))
                    ks = [_loadf(builder, p, off, W, kty, bf) for p in kp]
                    for h in range(HB):
                        qv = _load(builder, qp[h], off, V)
                        for k in range(KB):
                            a = accs[h * KB + k]
                            builder.store(_fma(builder, qv, ks[k], builder.load(a)), a)
            if kty.dtype == types.uint16:
                _both(builder, args[5], emit)
            else:
                emit(False)
            tot = lane_sums(builder, [builder.load(a) for a in accs])  # (HB * KB,): head-major
            for h in range(HB):
                out = _ptr(context, builder, sig.args[6], args[6], [builder.add(g0_, ir.Constant(ip, h)), c0_])
                if KB == 1:
                    builder.store(builder.extract_element(tot, ir.Constant(_I32, h)), out)
                else:
                    _store(builder, _shuffle(builder, tot, tot, list(range(h * KB, h * KB + KB))), out, zero)
            return context.get_dummy_value()
        return types.void(qs, g0, kt, r0, kh, bf16, sc, c0), codegen
    return qk


def pv_tile(HB: int, DB: int, W: int = LANES):
    """The P.V tile intrinsic of HB heads x DB vectors of W dims."""
    @intrinsic
    def pv(typingctx, sc, g0, c0, vt, r0, kh, bf16, n, acc, a0, d0):
        if not _rows_ok(vt):
            return None

        def codegen(context, builder, sig, args):
            V, ip, vty = _vec(W), context.get_value_type(types.intp), sig.args[3]
            g0_, c0_, r0_, kh_, n_, a0_, d0_ = _intps(context, builder, sig, args, (1, 2, 4, 5, 7, 9, 10))
            sp = [_ptr(context, builder, sig.args[0], args[0], [builder.add(g0_, ir.Constant(ip, h)), c0_])
                  for h in range(HB)]
            accs = [cgutils.alloca_once_value(builder, ir.Constant(V, [0.0] * W)) for _ in range(HB * DB)]

            def emit(bf):
                with cgutils.for_range(builder, n_) as loop:
                    vp = _row(context, builder, vty, args[3], builder.add(r0_, loop.index), kh_, d0_)
                    vs = [_loadf(builder, vp, ir.Constant(ip, u * W), W, vty, bf) for u in range(DB)]
                    for h in range(HB):
                        w = _splat(builder, builder.load(builder.gep(sp[h], [loop.index])), W)
                        for u in range(DB):
                            a = accs[h * DB + u]
                            builder.store(_fma(builder, w, vs[u], builder.load(a)), a)
            if vty.dtype == types.uint16:
                _both(builder, args[6], emit)
            else:
                emit(False)
            for h in range(HB):
                ap = _ptr(context, builder, sig.args[8], args[8], [builder.add(a0_, ir.Constant(ip, h)), d0_])
                for u in range(DB):
                    o = ir.Constant(ip, u * W)
                    _store(builder, builder.fadd(_load(builder, ap, o, V), builder.load(accs[h * DB + u])), ap, o)
            return context.get_dummy_value()
        return types.void(sc, g0, c0, vt, r0, kh, bf16, n, acc, a0, d0), codegen
    return pv


@intrinsic
def prefetch_row(typingctx, cache, r, kh):
    """Prefetch hints (prefetcht0) for the lines of cache[r, kh, :] (a 3-D array; r may be past its end: a
    prefetch never faults)."""
    if not (isinstance(cache, types.Array) and cache.ndim == 3):
        return None

    def codegen(context, builder, sig, args):
        ip = context.get_value_type(types.intp)
        r_, kh_ = _intps(context, builder, sig, args, (1, 2))
        p8 = ir.IntType(8).as_pointer()
        row = builder.bitcast(_ptr(context, builder, sig.args[0], args[0], [r_, kh_, ir.Constant(ip, 0)]), p8)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [p8, _I32, _I32, _I32]),
                                            "llvm.prefetch.p0i8")
        d = cgutils.unpack_tuple(builder, context.make_array(sig.args[0])(context, builder, args[0]).shape)[2]
        nb = builder.mul(d, ir.Constant(ip, sig.args[0].dtype.bitwidth // 8))
        with cgutils.for_range_slice(builder, ir.Constant(ip, 0), nb, ir.Constant(ip, 64)) as (off, _):
            builder.call(fn, [builder.gep(row, [off]), *(ir.Constant(_I32, c) for c in (0, 3, 1))])
        return context.get_dummy_value()
    return types.void(cache, r, kh), codegen


_QK = (qk_tile(HB_QK, KB_QK), qk_tile(1, KB_QK), qk_tile(HB_QK, 1), qk_tile(1, 1))
_PV = (pv_tile(HB_PV, DB_PV), pv_tile(1, DB_PV), pv_tile(HB_PV, 1), pv_tile(1, 1))
_qk_hk, _qk_1k, _qk_h1, _qk_11 = _QK
_pv_hd, _pv_1d, _pv_h1, _pv_11 = _PV


@njit(cache=True, inline="always")
def scores(qs, kt, j0, kh, bf16, nj, sc):
    """sc[g, j] = qs[g] . kt[j0 + j] (a tile's row, or a cache's kt[j0 + j, kh] read as it is: f32, f16, bf16
    when bf16) for the G = qs.shape[0] heads and j < nj: tiles of HB_QK heads x KB_QK keys, the
    rest in smaller ones."""
    G = qs.shape[0]
    j = 0
    while j + KB_QK <= nj:
        g = 0
        while g + HB_QK <= G:
            _qk_hk(qs, g, kt, j0 + j, kh, bf16, sc, j)
            g += HB_QK
        while g < G:
            _qk_1k(qs, g, kt, j0 + j, kh, bf16, sc, j)
            g += 1
        j += KB_QK
    while j < nj:
        g = 0
        while g + HB_QK <= G:
            _qk_h1(qs, g, kt, j0 + j, kh, bf16, sc, j)
            g += HB_QK
        while g < G:
            _qk_11(qs, g, kt, j0 + j, kh, bf16, sc, j)
            g += 1
        j += 1


@njit(cache=True, inline="always")
def weighted_values(sc, vt, j0, kh, bf16, nj, acc, a0, Dv):
    """acc[a0 + g, :Dv] += sum_{j < nj} sc[g, j] vt[j0 + j, :Dv] (or vt[j0 + j, kh, :Dv], as scores) for the
    G = sc.shape[0] heads: tiles of HB_PV heads x DB_PV vectors of dims, the rest in smaller ones."""
    G = sc.shape[0]
    g = 0
    while g < G:
        one = g + HB_PV > G
        d = 0
        while d + DB_PV * LANES <= Dv:
            if one:
                _pv_1d(sc, g, 0, vt, j0, kh, bf16, nj, acc, a0 + g, d)
            else:
                _pv_hd(sc, g, 0, vt, j0, kh, bf16, nj, acc, a0 + g, d)
            d += DB_PV * LANES
        while d < Dv:
            if one:
                _pv_11(sc, g, 0, vt, j0, kh, bf16, nj, acc, a0 + g, d)
            else:
                _pv_h1(sc, g, 0, vt, j0, kh, bf16, nj, acc, a0 + g, d)
            d += LANES
        g += 1 if one else HB_PV
