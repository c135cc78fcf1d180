"""A prompt's attention on the CPU at sgemm speed: kernels/flash_decode.py's split, with each work item's scores and
weighted values multiplied by BLAS over tiles of keys, for many query rows at once.

    prompt_attention(q, k, v, pos0, scale, window, sinks=None, dv=None)    -> (T, H * Dv); None without SciPy

moert.layers.attention takes it for every prompt chunk on the CPU with flash attention (-fa, on by default with
the f16 cache); without SciPy, kernels/flash.py or the NumPy flash twin. Against those, 32/4 heads of 128, f16
cache, 2 shared cores: pp512 3.2-3.3x at depth 0, 1.6x (the twin) at depth 4096, 90-180 GFLOP/s.

A work item is (KV head, block of TOKENS tokens): its TOKENS x G query rows against float32 tiles of KEYS keys of
its head, read from the cache in its own type (flash_decode's tiles): S = Q K^T by np.dot (sgemm), then per row the
online softmax over the keys it may see (causal, window), then acc += P V by np.dot. The items spread over the
threads, each sgemm on its own thread (one BLAS thread each, as kernels/matmul_tiles.py); the rows' results
are merged as flash_decode merges chunks (with the sinks). Its twin is flash_decode.split_attention_ref, whose
tests it shares (tests/test_kernels_flash_decode.py).

Dimension legend: T query tokens, H query heads, Hk KV heads, G = H / Hk, Dh key dim, Dv value dim.
"""

from __future__ import annotations

import functools
import importlib.util

import numpy as np
from numba import njit, prange

from moert.kernels.blockdot import PRANGE_ONLY
from moert.kernels.flash_decode import NO_SCALES, Cache, check_inputs, merge_row, tile
from moert.kernels.fmath import exp_neg
from moert.kernels.matmul_tiles import one_blas_thread

__all__ = ["prompt_attention"]

_FM = {"reassoc", "contract"}
KEYS = 128          # keys a tile
TOKENS = 32         # query tokens a work item (x G rows): its tiles are converted once for all of them


@njit(cache=True, fastmath=_FM, inline="always")
def _rows(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, kh, t0, t1, scale, m, l, acc, kt, vt):
    """Tokens t0 .. t1 of KV head kh over every key they may see -> m, l (R,), acc (R, Dv), rows (t - t0) * G + g."""
    H, Dh = q.shape[1], q.shape[2]
    G = H // kc.shape[1]
    R = (t1 - t0) * G
    qs = np.empty((R, Dh), dtype=np.float32)
    for r in range(R):
        m[r] = -np.inf
        l[r] = 0.0
        src, dst = q[t0 + r // G, kh * G + r % G], qs[r]
        for i in range(Dh):
            dst[i] = src[i] * scale
        for i in range(Dv):
            acc[r, i] = 0.0
    lo = 0 if window <= 0 else max(0, pos0 + t0 - window + 1)
    hi = pos0 + t1
    for a in range(lo, hi, KEYS):
        n = min(KEYS, hi - a)
        tile(kc, ks, kb, a, n, kh, kt[:n])                             # (n, Dh)
        tile(vc, vs, vb, a, n, kh, vt[:n])                             # (n, Dv)
        s = np.dot(qs, kt[:n].T)                                        # (R, n) sgemm
        for r in range(R):
            p = pos0 + t0 + r // G
            j0 = 0 if window <= 0 else min(n, max(0, p - window + 1 - a))
            j1 = max(j0, min(n, p + 1 - a))
            row = s[r]
            mr = m[r]
            mb = -np.inf
            for j in range(j0, j1):
                mb = max(mb, row[j])
            if mb > mr:                                                 # a new max: rescale what was summed
                c = exp_neg(mr - mb) if mr > -np.inf else np.float32(0.0)
                l[r] *= c
                for i in range(Dv):
                    acc[r, i] *= c
                mr = mb
                m[r] = mb
            tot = np.float32(0.0)
            for j in range(n):
                e = exp_neg(row[j] - mr) if j0 <= j < j1 else np.float32(0.0)
                row[j] = e
                tot += e
            l[r] += tot
        pv = np.dot(s, vt[:n])                                          # (R, Dv) sgemm
        for r in range(R):
            for i in range(Dv):
                acc[r, i] += pv[r, i]


@njit(cache=True, fastmath=_FM, parallel=PRANGE_ONLY)
def _prompt(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, scale, sinks, mp, lp, ap, out):
    T, H, Dh = q.shape
    Hk = kc.shape[1]
    G = H // Hk
    nt = -(-T // TOKENS)
    for i in prange(Hk * nt):
        kh, b = i // nt, i % nt
        t0, t1 = b * TOKENS, min(T, (b + 1) * TOKENS)
        kt = np.empty((KEYS, Dh), dtype=np.float32)
        vt = np.empty((KEYS, Dv), dtype=np.float32)
        _rows(q, kc, ks, kb, vc, vs, vb, Dv, pos0, window, kh, t0, t1, scale, mp[0, kh, t0 * G:t1 * G],
              lp[0, kh, t0 * G:t1 * G], ap[0, kh, t0 * G:t1 * G], kt, vt)
    for x in range(Hk * T * G):
        kh, r = x // (T * G), x % (T * G)
        t, g = r // G, r % G
        merge_row(mp, lp, ap, kh, r, sinks[kh * G + g], out[t, (kh * G + g) * Dv:(kh * G + g + 1) * Dv])


@functools.cache
def available() -> bool:
    """Whether Numba's np.dot has its BLAS (SciPy)."""
    return importlib.util.find_spec("scipy") is not None


def prompt_attention(q: np.ndarray, k: Cache, v: Cache, pos0: int, scale: float, window: int | None,
                     sinks: np.ndarray | None = None, dv: int | None = None) -> np.ndarray | None:
    """flash_decode.split_attention's signature and results, for many query tokens: (T, H * Dv) float32, or None
    where SciPy is missing (the caller takes another path)."""
    if not available():
        return None
    T, H, Dh = q.shape
    dv = v.values.shape[2] if dv is None else int(dv)
    check_inputs(q, k, v, pos0, dv, sinks)
    Hk = k.values.shape[1]
    mp = np.empty((1, Hk, T * (H // Hk)), dtype=np.float32)            # one chunk: every key of a row in one item
    lp = np.empty_like(mp)
    ap = np.empty((*mp.shape, dv), dtype=np.float32)
    out = np.empty((T, H * dv), dtype=np.float32)
    sinks = np.full(H, -np.inf, dtype=np.float32) if sinks is None else np.ascontiguousarray(sinks, np.float32)
    args = []
    for c in (k, v):
        args += [c.values, NO_SCALES if c.scales is None else c.scales, bool(c.bf16)]
    with one_blas_thread():
        _prompt(np.ascontiguousarray(q, dtype=np.float32), *args, dv, pos0, -1 if window is None else int(window),
                np.float32(scale), sinks, mp, lp, ap, out)
    return out
