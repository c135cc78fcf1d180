"""Attention with the keys split across threads (flash-decoding): a decode step (or a few tokens: moert.layers
SPLIT_TOKENS) deep in the context on every thread, over a KV cache read in its own type (f32, f16, bf16, q8_0: no
float32 copy). Prompts take kernels/flash_prompt.py, the same work items by sgemm.

    split_attention(q, k, v, pos0, scale, window, sinks=None, dv=None)          -> (T, H * Dv)
    split_attention_ref(...)                                                     the NumPy twin, same signature
    attend1(q, k_cache, v_cache, s0, S, scale, sinks, out)                       one token, serial, in Numba
    Cache(values, scales=None, bf16=False)                                       a cache as this kernel reads it

One work item is (KV head, key chunk, token block): it reads its chunk BLOCK keys and values at a time (each KV
head's keys once for all G query heads of its group; the register tiles of kernels/flash_simd.py, where Dh and Dv
are whole vectors, read f32 / f16 / bf16 rows as they are and q8_0 rows through a float32 tile; plain loops over
float32 tiles otherwise), prefetches the next BLOCK rows, and keeps per query row a partial softmax: running max
m, sum l and weighted values acc (FlashAttention's recurrence). A second pass merges the chunks' partials per row:
M = max(sink, m_c), out = sum_c acc_c e^(m_c - M) / (e^(sink - M) + sum_c l_c e^(m_c - M)) (Dao et al.'s
flash-decoding; llama.cpp's CPU flash attention splits the same way). Decode has few rows, so the keys are split
into chunks until every thread has work items; many tokens make many token blocks and keep one chunk. Small work
runs as one serial call (no parallel region).

Measured (32 query / 4 KV heads of 128, f16, one token; 2 shared cores of a Zen 5 EPYC, AVX-512): the register
tiles against the plain loops over float32 tiles (2026-11-28, `python bench/depth_ab.py kernel --split-before
64d2480 --rounds 9`): 2 threads 3.45x at 4096 keys (0.98 -> 0.28 ms), 3.0x at 16384 (5.4 -> 1.8 ms), 2.6x at
32768 (11.2 -> 4.4 ms); one thread 3.2-3.3x at 256-4096 keys, 1.9-2.4x at 16384-32768 (from memory). With the
register tiles over float32 tiles, converting the cache was ~1/3 of a tile's time at 4096 keys: reading the rows
as they are took it from 2.6 to 1.9 us (one thread); the prefetch, 5.6 -> 4.9 us at 16384 keys.

Windows (gemma3, gpt-oss: a query at p sees keys p - window < s <= p) and sinks (gpt-oss: a logit per head in
the denominator) as moert.layers.attention takes them. MLA (deepseek2) passes its latent cache as both k and v
with dv = the latent rank: the values are the first dv dims of each key row.

Dimension legend: T query tokens, H query heads, Hk KV heads, G = H / Hk, Dh key dim, Dv value dim, S keys.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from moert.errors import ShapeError
from moert.kernels.blockdot import PRANGE_ONLY
from moert.kernels.flash_simd import LANES, prefetch_row, scores, weighted_values
from moert.kernels.fmath import as_f32, exp_neg, f32_of_bits
from moert.kernels.jit import threads

__all__ = ["NO_SCALES", "Cache", "attend1", "attention_parallel", "check_inputs", "merge_row", "split_attention",
           "split_attention_ref", "split_plan", "tile"]

_FM = {"reassoc", "contract"}
BLOCK = 64                  # keys converted to float32 tiles at a time
ROWS = 64                   # query rows (tokens x G) per work item of a prompt
MIN_CHUNK = 128             # keys: the shortest chunk a work item gets
PARALLEL_MIN_WORK = 1 << 18  # cache elements read (keys x Hk x (Dh + Dv)) below which one thread runs it


class Cache(NamedTuple):
    """One layer's K or V as stored: values (n_ctx, Hk, D) float32, uint16 (f16 bits, or bf16 bits when bf16)
    or int8 (q8_0, with scales (n_ctx, Hk, D / 32) as f16 bits in uint16)."""

    values: np.ndarray
    scales: np.ndarray | None = None
    bf16: bool = False


def tile(cache, scales, bf16, a, n, kh, out):
    """Rows a .. a+n of KV head kh, their first out.shape[1] dims, as float32 into out (n, D)."""


# The loops index 1-D views with range variables only: an index Numba cannot prove >= 0 gets a wraparound
# test per element, which keeps LLVM from vectorizing the loop (4x slower tiles).
@overload(tile, jit_options={"fastmath": _FM})
def _tile_impl(cache, scales, bf16, a, n, kh, out):
    dt = cache.dtype
    if dt == types.float32:
        def f32(cache, scales, bf16, a, n, kh, out):
            for j in range(n):
                src, dst = cache[a + j, kh], out[j]
                for i in range(out.shape[1]):
                    dst[i] = src[i]
        return f32
    if dt == types.uint16:
        def u16(cache, scales, bf16, a, n, kh, out):
            for j in range(n):
                src, dst = cache[a + j, kh], out[j]
                if bf16:
                    for i in range(out.shape[1]):
                        dst[i] = f32_of_bits(np.int32(np.int64(src[i]) << 16))
                else:
                    for i in range(out.shape[1]):
                        dst[i] = as_f32(src[i])
        return u16
    if dt == types.int8:
        def q8(cache, scales, bf16, a, n, kh, out):
            for j in range(n):
                row, sr = cache[a + j, kh], scales[a + j, kh]
                for b in range(out.shape[1] // 32):
                    d = as_f32(sr[b])
                    src, dst = row[b * 32:b * 32 + 32], out[j, b * 32:b * 32 + 32]
                    for u in range(32):
                        dst[u] = np.float32(src[u]) * d
        return q8
    return None


def rows(cache, scales, bf16, a, n, kh, out):
    """What the register tiles read for rows a .. a+n of KV head kh: (the cache, a), read as it is (float32, f16,
    bf16); a q8_0 cache's rows converted into out, (out, 0)."""


@overload(rows, jit_options={"fastmath": _FM})
def _rows_impl(cache, scales, bf16, a, n, kh, out):
    if cache.dtype == types.int8:
        def q8(cache, scales, bf16, a, n, kh, out):
            tile(cache, scales, bf16, a, n, kh, out[:n])
            return out, 0
        return q8
    return lambda cache, scales, bf16, a, n, kh, out: (cache, a)


@njit(cache=True, fastmath=_FM, inline="always")
def _item(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, kh, t0, t1, a0, a1, scale, m, l, acc, kt, vt, sc, qs):
    """One work item: tokens t0 .. t1 (their G heads of KV head kh) over keys a0 .. a1 -> the partials m, l (R,)
    and acc (R, Dv), rows (t - t0) * G + g. kt (BLOCK, Dh), vt (BLOCK, Dv), sc (G, BLOCK), qs (G, Dh) scratch."""
    H, Dh = q.shape[1], q.shape[2]
    Hk = kc.shape[1]
    G = H // Hk
    simd = Dh % LANES == 0 and Dv % LANES == 0
    for r in range((t1 - t0) * G):
        m[r] = -np.inf
        l[r] = 0.0
        for i in range(Dv):
            acc[r, i] = 0.0
    lo = a0 if window <= 0 else max(a0, pos0 + t0 - window + 1)        # no token of the block sees keys < lo
    hi = min(a1, pos0 + t1)                                             # nor keys >= hi
    for a in range(lo, hi, BLOCK):
        n = min(BLOCK, hi - a)
        kx, ka = rows(kc, ks, kb, a, n if simd else 0, kh, kt)          # the register tiles' keys: kx[ka + j]
        vx, va = rows(vc, vs, vb, a, n if simd else 0, kh, vt)
        if not simd:
            tile(kc, ks, kb, a, n, kh, kt[:n])                          # (n, Dh): converted once for every row
            tile(vc, vs, vb, a, n, kh, vt[:n])                          # (n, Dv)
        for j in range(a + BLOCK, min(a + 2 * BLOCK, hi)):             # the next tile's rows on their way
            prefetch_row(kc, j, kh)
            prefetch_row(vc, j, kh)
        for t in range(t0, t1):
            p = pos0 + t
            j0 = 0 if window <= 0 else max(0, p - window + 1 - a)       # this token's keys in the tile: j0 .. j1
            j1 = min(n, p + 1 - a)
            if j1 <= j0:
                continue
            for g in range(G):
                for i in range(Dh):
                    qs[g, i] = q[t, kh * G + g, i] * scale
            nj = j1 - j0
            if simd:
                scores(qs, kx, ka + j0, kh, kb, nj, sc)                 # register tiles: kernels/flash_simd.py
            else:
                for j in range(nj):                                     # each key row read for the G heads
                    kr = kt[j0 + j]
                    for g in range(G):
                        qg = qs[g]
                        d = np.float32(0.0)
                        for i in range(Dh):
                            d += qg[i] * kr[i]
                        sc[g, j] = d
            for g in range(G):
                r = (t - t0) * G + g
                sg, ar = sc[g], acc[r]                                  # 1-D views indexed by range variables
                mr = m[r]                                               # scalars: stores to sc cannot touch them
                mb = sg[0]
                for j in range(1, nj):
                    mb = max(mb, sg[j])
                if mb > mr:                                             # a new max: rescale what was summed
                    c = exp_neg(mr - mb) if mr > -np.inf else np.float32(0.0)
                    l[r] *= c
                    for i in range(Dv):
                        ar[i] *= c
                    mr = mb
                    m[r] = mb
                s = np.float32(0.0)
                for j in range(nj):
                    e = exp_neg(sg[j] - mr)
                    sg[j] = e
                    s += e
                l[r] += s
            if simd:
                weighted_values(sc, vx, va + j0, kh, vb, nj, acc, (t - t0) * G, Dv)
                continue
            for j in range(nj):                                         # each value row read for the G heads
                vr = vt[j0 + j]
                for g in range(G):
                    w = sc[g, j]
                    ar = acc[(t - t0) * G + g]
                    for i in range(Dv):
                        ar[i] += w * vr[i]


@njit(cache=True, fastmath=_FM, inline="always")
def _run(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, scale, chunk, tb, i, mp, lp, ap, scratch):
    """Work item i of the (KV head, token block, chunk) grid into its partials' slot; scratch: _scratch's."""
    T, H, Dh = q.shape
    Hk = kc.shape[1]
    nc, nt = mp.shape[0], -(-T // tb)
    kh, rest = i // (nt * nc), i % (nt * nc)
    b, c = rest // nc, rest % nc
    t0, t1 = b * tb, min(T, (b + 1) * tb)
    s0 = 0 if window <= 0 else max(0, pos0 - window + 1)
    a0 = s0 + c * chunk
    a1 = min(pos0 + T, a0 + chunk)
    G = H // Hk
    R0, R1 = t0 * G, t1 * G
    kt, vt, sc, qs = scratch
    _item(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, kh, t0, t1, a0, a1, scale, mp[c, kh, R0:R1], lp[c, kh, R0:R1],
          ap[c, kh, R0:R1], kt, vt, sc, qs)


@njit(cache=True, inline="always")
def _scratch(G, Dh, Dv):
    """A work item's float32 tiles: keys (BLOCK, Dh), values (BLOCK, Dv), scores (G, BLOCK), scaled q (G, Dh)."""
    return (np.empty((BLOCK, Dh), dtype=np.float32), np.empty((BLOCK, Dv), dtype=np.float32),
            np.empty((G, BLOCK), dtype=np.float32), np.empty((G, Dh), dtype=np.float32))


@njit(cache=True, fastmath=_FM, inline="always")
def merge_row(mp, lp, ap, kh, r, sink, out_row):
    """Row r of KV head kh: the chunks' partials merged with the sink logit into out_row (Dv,)."""
    M = sink
    for c in range(mp.shape[0]):
        M = max(M, mp[c, kh, r])
    tot = np.float32(np.exp(sink - M))                                  # 0 without a sink
    for i in range(out_row.shape[0]):
        out_row[i] = 0.0
    for c in range(mp.shape[0]):
        if mp[c, kh, r] == -np.inf:                                     # a chunk this row saw nothing of
            continue
        f = np.float32(np.exp(mp[c, kh, r] - M))
        tot += lp[c, kh, r] * f
        for i in range(out_row.shape[0]):
            out_row[i] += ap[c, kh, r, i] * f
    inv = np.float32(1.0) / tot
    for i in range(out_row.shape[0]):
        out_row[i] *= inv


@njit(cache=True, fastmath=_FM)
def _split1(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, scale, sinks, chunk, tb, mp, lp, ap, out):
    T, H, Dh = q.shape
    Hk = kc.shape[1]
    G = H // Hk
    scratch = _scratch(G, Dh, Dv)                                       # one set, reused by every item
    for i in range(Hk * -(-T // tb) * mp.shape[0]):
        _run(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, scale, chunk, tb, i, mp, lp, ap, scratch)
    for x in range(Hk * T * G):
        kh, r = x // (T * G), x % (T * G)
        t, g = r // G, r % G
        merge_row(mp, lp, ap, kh, r, sinks[kh * G + g], out[t, (kh * G + g) * Dv:(kh * G + g + 1) * Dv])


@njit(cache=True, fastmath=_FM, parallel=PRANGE_ONLY)
def _split_n(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, scale, sinks, chunk, tb, mp, lp, ap, out):
    """_split1 with the work items spread over the threads; the merge (T * H rows) after the region, on the calling
    thread: a second region would wait a second time for a worker the OS took off its core."""
    T, H, Dh = q.shape
    Hk = kc.shape[1]
    G = H // Hk
    for i in prange(Hk * -(-T // tb) * mp.shape[0]):
        _run(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, scale, chunk, tb, i, mp, lp, ap, _scratch(G, Dh, Dv))
    for x in range(Hk * T * G):
        kh, r = x // (T * G), x % (T * G)
        t, g = r // G, r % G
        merge_row(mp, lp, ap, kh, r, sinks[kh * G + g], out[t, (kh * G + g) * Dv:(kh * G + g + 1) * Dv])


@njit(cache=True, fastmath=_FM)
def attend1(q, k_cache, v_cache, s0, S, scale, sinks, out):
    """One token (q (H, Dh) at position S - 1) over keys s0 .. S of float32 or f16 (uint16) caches into out (H, Dv),
    on the calling thread: the split kernel with one chunk a KV head. What the fused decode layer runs
    (kernels/decode.py) and small work takes; its tiles keep the time linear in S (a (G, S) row of scores is not)."""
    H, Dh = q.shape
    Hk, Dv = k_cache.shape[1], v_cache.shape[2]
    none = np.zeros((1, 1, 1), dtype=np.uint16)
    mp = np.empty((1, Hk, H // Hk), dtype=np.float32)
    lp = np.empty_like(mp)
    ap = np.empty((1, Hk, H // Hk, Dv), dtype=np.float32)
    _split1(q.reshape(1, H, Dh), k_cache, none, False, v_cache, none, False, Dv, S - 1, S - s0 if s0 > 0 else -1,
            scale, sinks, max(1, S - s0), 1, mp, lp, ap, out.reshape(1, H * Dv))


def attention_parallel(keys: int, n_head_kv: int, head_dim: int, head_dim_v: int) -> bool:
    """Whether one token's attention over `keys` cache rows runs as a parallel region (else one thread)."""
    return keys * n_head_kv * (head_dim + head_dim_v) >= PARALLEL_MIN_WORK


def split_plan(T: int, H: int, Hk: int, keys: int, Dh: int, Dv: int, n_threads: int) -> tuple[int, int, int]:
    """(threads, tokens per block, keys per chunk) for T query tokens over `keys` visible cache rows: one thread
    where attention_parallel says so (small work: no parallel region); else chunks of >= MIN_CHUNK keys until
    there are >= 2 work items a thread."""
    G = H // Hk
    tb = max(1, ROWS // G)
    keys = max(keys, 1)
    if n_threads < 2 or not attention_parallel(keys, Hk, Dh, Dv):
        return 1, T, keys                                               # one item per KV head: no merge to speak of
    items = Hk * -(-T // tb)
    n_chunks = min(max(1, -(-2 * n_threads // items)), max(1, keys // MIN_CHUNK))
    return n_threads, tb, -(-keys // n_chunks)


def check_inputs(q, k: Cache, v: Cache, pos0: int, dv: int, sinks) -> None:
    """ShapeError unless q (T, H, Dh), the caches, dv, the position and sinks fit together (the kernels index
    without bounds checks)."""
    T, H, Dh = q.shape
    kc, vc = k.values, v.values
    ok = (kc.ndim == 3 and vc.ndim == 3 and kc.shape[:2] == vc.shape[:2] and kc.shape[2] == Dh
          and 0 < dv <= vc.shape[2] and kc.shape[1] and H % kc.shape[1] == 0 and 0 <= pos0 <= kc.shape[0] - T)
    if not ok:
        raise ShapeError(f"split_attention: q {q.shape}, k {kc.shape}, v {vc.shape} (dv {dv}) at position {pos0} "
                         f"do not fit together; nothing was computed")
    for name, c in (("k", k), ("v", v)):
        if c.values.dtype not in (np.float32, np.uint16, np.int8) or not c.values.flags.c_contiguous:
            raise ShapeError(f"split_attention: the {name} cache is {c.values.dtype}; give C-contiguous float32, "
                             f"uint16 (f16/bf16 bits) or int8 (q8_0 values) with its scales")
        if c.values.dtype == np.int8 and (c.scales is None or c.scales.shape != (*c.values.shape[:2],
                                                                                  c.values.shape[2] // 32)):
            raise ShapeError(f"split_attention: the q8_0 {name} cache needs scales (n_ctx, Hk, D / 32)")
    if sinks is not None and np.shape(sinks) != (H,):
        raise ShapeError(f"split_attention: sinks {np.shape(sinks)}, expected ({H},)")


NO_SCALES = np.zeros((1, 1, 1), dtype=np.uint16)   # the scales argument of a cache without any


def split_attention(q: np.ndarray, k: Cache, v: Cache, pos0: int, scale: float, window: int | None,
                    sinks: np.ndarray | None = None, dv: int | None = None) -> np.ndarray:
    """Causal GQA attention of q (T, H, Dh) at positions pos0 .. pos0+T-1 over the caches k, v (Cache: rows
    (n_ctx, Hk, D) that already hold this chunk's keys and values), the keys split across the threads.
    window, sinks (H,) as moert.layers.attention; dv: the value dims (the first dv of v's rows; default all).
    (T, H * Dv) float32."""
    T, H, Dh = q.shape
    dv = v.values.shape[2] if dv is None else int(dv)
    check_inputs(q, k, v, pos0, dv, sinks)
    Hk = k.values.shape[1]
    w = -1 if window is None else int(window)
    s0 = 0 if w <= 0 else max(0, pos0 - w + 1)
    n, tb, chunk = split_plan(T, H, Hk, pos0 + T - s0, Dh, dv, threads())
    n_chunks = -(-(pos0 + T - s0) // chunk)
    mp = np.empty((n_chunks, Hk, T * (H // Hk)), dtype=np.float32)     # the partials: max, sum, weighted values
    lp = np.empty_like(mp)
    ap = np.empty((*mp.shape, dv), dtype=np.float32)
    out = np.empty((T, H * dv), dtype=np.float32)
    sinks = np.full(H, -np.inf, dtype=np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    q = np.ascontiguousarray(q, dtype=np.float32)
    args = []
    for c in (k, v):
        args += [c.values, NO_SCALES if c.scales is None else c.scales, bool(c.bf16)]
    (_split_n if n > 1 else _split1)(q, *args, dv, pos0, w, np.float32(scale), sinks, chunk, tb, mp, lp, ap, out)
    return out


def _as_f32(c: Cache) -> np.ndarray:
    """A Cache's rows as float32 (n_ctx, Hk, D): the twin's plain read."""
    if c.values.dtype == np.float32:
        return c.values
    if c.values.dtype == np.int8:
        d = c.scales.view(np.float16).astype(np.float32)                # (n_ctx, Hk, D/32)
        x = c.values.reshape(*c.values.shape[:2], -1, 32).astype(np.float32) * d[..., None]
        return x.reshape(c.values.shape)
    if c.bf16:
        return (c.values.astype(np.uint32) << 16).view(np.float32)
    return c.values.view(np.float16).astype(np.float32)


def split_attention_ref(q: np.ndarray, k: Cache, v: Cache, pos0: int, scale: float, window: int | None,
                        sinks: np.ndarray | None = None, dv: int | None = None) -> np.ndarray:
    """split_attention's twin: the whole softmax per query row in NumPy (float64), the caches read as float32."""
    T, H, Dh = q.shape
    K, V = _as_f32(k).astype(np.float64), _as_f32(v).astype(np.float64)
    dv = V.shape[2] if dv is None else dv
    G = H // K.shape[1]
    out = np.empty((T, H, dv), dtype=np.float32)
    for t in range(T):
        p = pos0 + t
        s0 = 0 if window is None else max(0, p - window + 1)
        for h in range(H):
            s = K[s0:p + 1, h // G] @ q[t, h].astype(np.float64) * scale               # (S',)
            top = s.max() if sinks is None else max(s.max(), float(sinks[h]))
            e = np.exp(s - top)
            den = e.sum() + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
            out[t, h] = (e @ V[s0:p + 1, h // G, :dv]) / den
    return out.reshape(T, H * dv)
