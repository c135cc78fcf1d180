"""CPU fast paths for the per-token glue of a layer: RMSNorm, RoPE, one-token attention, softmax top-k.

    rms_norm(x, w, eps)                               (N, D) rows, float64 sum of squares
    rope(x, cos, sin, neox)                           (T, heads, Dh), new array
    attention_decode(q, k, v, k_cache, v_cache, pos0, scale, window, sinks)   one query token, GQA; caches
                                                      float32, or uint16 holding f16 (-ctk/-ctv f16)
    qk_norm_rope_attention(q, k, v, q_norm, k_norm, eps, cos, sin, neox, k_cache, v_cache, pos0, scale,
                           window)            the three above in one for one token (Qwen3, Gemma 3)
    softmax_topk(logits, k, renorm)                   (T, E) -> ids (T, K) int32, weights (T, K) float32

Their reference twins are moert/layers.py's and moert/moe.py's xp functions, which call these when the
arrays are NumPy arrays on the CPU (and the shapes are ones the kernels take). They exist for Python
overhead, not FLOPs: at decode a layer's NumPy glue is ~100 tiny array operations at ~1-3 us each,
while one Numba call costs ~1-3 us (bench/e2e.py --overhead). Same results up to float32 rounding;
tests/test_kernels_layers.py compares them with the twins on random inputs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moert.errors import ShapeError
from moert.kernels.flash_decode import Cache, attention_parallel, split_attention
from moert.kernels.flash_decode import attend1 as _attention1
from moert.kernels.fmath import exp_neg

from . import checks

__all__ = ["attention_decode", "attention_parallel", "exp_neg", "qk_norm_rope_attention", "rms_norm",
           "rope", "softmax_topk"]

_FM = {"reassoc", "contract"}


@njit(cache=True, fastmath=_FM, inline="always")
def _inv_rms(x, eps):
    """1 / sqrt(mean(x^2) + eps) of a row, the sum of squares in float64."""
    s = 0.0
    for j in range(x.shape[0]):
        s += np.float64(x[j]) * np.float64(x[j])
    return np.float32(1.0 / np.sqrt(s / x.shape[0] + eps))


@njit(cache=True, fastmath=_FM)
def _rms_norm(x, w, eps, out):
    N, D = x.shape
    for i in range(N):
        r = _inv_rms(x[i], eps)
        for j in range(D):
            out[i, j] = x[i, j] * r * w[j]


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * w over the last axis; x (..., D) float32, w (D,) float32."""
    checks.expect("rms_norm", "w", w, (x.shape[-1],))
    if x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous and w.dtype == np.float32 \
            and w.flags.c_contiguous:                                   # the per-token case, no copies
        out = np.empty_like(x)
        _rms_norm(x, w, eps, out)
        return out
    D = x.shape[-1]
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, D)
    out = np.empty_like(x2)
    _rms_norm(x2, np.ascontiguousarray(w, dtype=np.float32), float(eps), out)
    return out.reshape(x.shape)


@njit(cache=True, fastmath=_FM)
def _rope(x, cos, sin, neox, out):
    T, h, Dh = x.shape
    half = Dh // 2
    for t in range(T):
        for j in range(h):
            for i in range(half):
                c, s = cos[t, i], sin[t, i]
                if neox:
                    a, b = x[t, j, i], x[t, j, i + half]
                    out[t, j, i] = a * c - b * s
                    out[t, j, i + half] = b * c + a * s
                else:
                    a, b = x[t, j, 2 * i], x[t, j, 2 * i + 1]
                    out[t, j, 2 * i] = a * c - b * s
                    out[t, j, 2 * i + 1] = b * c + a * s


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """x (T, heads, Dh) rotated by cos, sin (T, Dh/2): NEOX pairs i, i + Dh/2; normal pairs 2i, 2i+1."""
    checks.expect("rope", "x", x, (None, None, None))
    checks.expect("rope", "cos", cos, (x.shape[0], x.shape[2] // 2))
    checks.expect("rope", "sin", sin, cos.shape)
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty_like(x)
    _rope(x, np.ascontiguousarray(cos, dtype=np.float32), np.ascontiguousarray(sin, dtype=np.float32),
          bool(neox), out)
    return out


@njit(cache=True, fastmath=_FM)
def _norm_rope1(x, w, eps, cos, sin, neox, out):
    """out[j] = rope(rmsnorm(x[j]) * w) for each head j of one token: x, out (heads, Dh); cos, sin (Dh/2,)."""
    h, Dh = x.shape
    half = Dh // 2
    for j in range(h):
        r = _inv_rms(x[j], eps)
        for i in range(half):
            if neox:
                i0, i1 = i, i + half
            else:
                i0, i1 = 2 * i, 2 * i + 1
            a, b = x[j, i0] * r * w[i0], x[j, i1] * r * w[i1]
            out[j, i0] = a * cos[i] - b * sin[i]
            out[j, i1] = b * cos[i] + a * sin[i]


@njit(cache=True, fastmath=_FM, inline="always")
def _qk_into_cache(q, k, v, qn, kn, eps, cos, sin, neox, k_cache, v_cache, pos0):
    """Normed, rotated q (H, Dh) returned; normed, rotated k and v written into the caches at pos0."""
    qr = np.empty_like(q)
    _norm_rope1(q, qn, eps, cos, sin, neox, qr)
    _norm_rope1(k, kn, eps, cos, sin, neox, k_cache[pos0])
    for h in range(v.shape[0]):                 # element loops: a slice assignment from an array compiles
        for i in range(v.shape[1]):             # numba's shape-error formatting (seconds on a first run)
            v_cache[pos0, h, i] = v[h, i]
    return qr


@njit(cache=True, fastmath=_FM)
def _qk_attention1(q, k, v, qn, kn, eps, cos, sin, neox, k_cache, v_cache, pos0, s0, scale, out):
    qr = _qk_into_cache(q, k, v, qn, kn, eps, cos, sin, neox, k_cache, v_cache, pos0)
    _attention1(qr, k_cache, v_cache, s0, pos0 + 1, scale, _no_sinks(q.shape[0]), out)


@njit(cache=True, fastmath=_FM)
def _qk_cache1(q, k, v, qn, kn, eps, cos, sin, neox, k_cache, v_cache, pos0):
    """_qk_into_cache as a call of its own: the rotated q (H, Dh) for the split kernel."""
    return _qk_into_cache(q, k, v, qn, kn, eps, cos, sin, neox, k_cache, v_cache, pos0)


def qk_norm_rope_attention(q, k, v, q_norm, k_norm, eps: float, cos, sin, neox: bool, k_cache, v_cache,
                           pos0: int, scale: float, window: int | None) -> np.ndarray:
    """For ONE token: per-head RMSNorm of q and k, RoPE, k and v into the caches at pos0, attention, in one
    Numba call. q (1, H, Dh), k (1, Hk, Dh), v (1, Hk, Dv); norms (Dh,); cos, sin (1, Dh/2). Returns
    (1, H * Dv). Twin: moert.layers.rms_norm, rope and attention in a row (moert/models/blocks.py)."""
    _check_attention1("qk_norm_rope_attention", q, k, v, k_cache, v_cache, pos0)
    Dh = q.shape[2]
    for name, a, want in (("q_norm", q_norm, (Dh,)), ("k_norm", k_norm, (Dh,)), ("cos", cos, (1, Dh // 2)),
                          ("sin", sin, (1, Dh // 2))):
        checks.expect("qk_norm_rope_attention", name, a, want)
    H, Dv = q.shape[1], v.shape[2]
    s0 = 0 if window is None else max(0, pos0 - window + 1)
    out = np.empty((H, Dv), dtype=np.float32)
    args = (q[0], k[0], v[0], q_norm, k_norm, float(eps), cos[0], sin[0], bool(neox), k_cache, v_cache, pos0, s0,
            np.float32(scale), out)
    if attention_parallel(pos0 + 1 - s0, k_cache.shape[1], k_cache.shape[2], Dv):      # the keys on every thread
        return split_attention(_qk_cache1(*args[:12])[None], Cache(k_cache), Cache(v_cache), pos0, scale, window)
    _qk_attention1(*args)
    return out.reshape(1, H * Dv)


def _check_attention1(fn: str, q, k, v, k_cache, v_cache, pos0: int) -> None:
    """One token's q (1, H, Dh), k (1, Hk, Dh), v (1, Hk, Dv) against caches (n_ctx, Hk, Dh|Dv), H % Hk == 0."""
    checks.expect(fn, "q", q, (1, None, None))
    checks.expect(fn, "k_cache", k_cache, (None, None, q.shape[2]))
    n_ctx, Hk = k_cache.shape[:2]
    checks.expect(fn, "k", k, (1, Hk, q.shape[2]))
    checks.expect(fn, "v", v, (1, Hk, None))
    checks.expect(fn, "v_cache", v_cache, (n_ctx, Hk, v.shape[2]))
    if Hk == 0 or q.shape[1] % Hk:
        raise ShapeError(f"{fn}: {q.shape[1]} query heads do not share {Hk} KV heads evenly; nothing was computed")
    checks.position(fn, pos0, n_ctx)


@njit(cache=True)
def _no_sinks(H):
    """(H,) -inf: no sink logit for any head."""
    return np.full(H, -np.inf, dtype=np.float32)


def _attend1(q1, k_cache, v_cache, pos0, scale, window, sinks=None):
    H, Dv = q1.shape[0], v_cache.shape[2]
    if sinks is None:
        sinks = np.full(H, -np.inf, dtype=np.float32)
    else:
        checks.expect("attention_decode", "sinks", sinks, (H,))
        sinks = np.ascontiguousarray(sinks, dtype=np.float32)
    S = pos0 + 1
    s0 = 0 if window is None else max(0, pos0 - window + 1)
    out = np.empty((H, Dv), dtype=np.float32)
    if attention_parallel(S - s0, k_cache.shape[1], k_cache.shape[2], Dv):                   # the keys on every thread
        return split_attention(q1[None], Cache(k_cache), Cache(v_cache), pos0, scale, window, sinks)
    _attention1(q1, k_cache, v_cache, s0, S, np.float32(scale), sinks, out)
    return out.reshape(1, H * Dv)


def attention_decode(q, k, v, k_cache, v_cache, pos0: int, scale: float, window: int | None,
                     sinks: np.ndarray | None = None) -> np.ndarray:
    """moert.layers.attention for ONE query token (T = 1): writes k, v at pos0, returns (1, H * Dv). sinks: None
    or (H,) float32 logits joining each head's softmax denominator (gpt-oss). A cache is float32, or uint16
    holding f16 bits (kvcache.TypedKV's "f16" storage viewed as uint16): k, v rounded to f16 as it rounds them."""
    _check_attention1("attention_decode", q, k, v, k_cache, v_cache, pos0)
    for cache, x in ((k_cache, k[0]), (v_cache, v[0])):
        cache[pos0] = x.astype(np.float16).view(np.uint16) if cache.dtype == np.uint16 else x
    return _attend1(np.ascontiguousarray(q[0], dtype=np.float32), k_cache, v_cache, pos0, scale, window, sinks)


@njit(cache=True)
def _softmax_topk(logits, k, renorm, ids, w):
    T, E = logits.shape
    p = np.empty(E, dtype=np.float32)
    taken = np.zeros(E, dtype=np.bool_)
    for t in range(T):
        m = logits[t, 0]
        for e in range(1, E):
            m = max(m, logits[t, e])
        tot = np.float32(0.0)
        for e in range(E):
            p[e] = np.exp(logits[t, e] - m)
            tot += p[e]
        for e in range(E):
            p[e] = p[e] / tot
            taken[e] = False
        sel = np.float32(0.0)
        for j in range(k):                      # the largest untaken; ties: the lowest index (stable)
            best = -1
            for e in range(E):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
            ids[t, j] = best
            w[t, j] = p[best]
            sel += p[best]
        if renorm:
            for j in range(k):
                w[t, j] = w[t, j] / sel


def softmax_topk(logits: np.ndarray, k: int, renorm: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """moert.moe.softmax_topk on the CPU: ids (T, K) int32 largest first, weights (T, K) float32."""
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    checks.expect("softmax_topk", "logits", logits, (None, None))
    if not 1 <= k <= logits.shape[1]:
        raise ShapeError(f"softmax_topk: k = {k} experts of {logits.shape[1]}; need 1..{logits.shape[1]}")
    T = logits.shape[0]
    ids = np.empty((T, k), dtype=np.int32)
    w = np.empty((T, k), dtype=np.float32)
    _softmax_topk(logits, int(k), bool(renorm), ids, w)
    return ids, w
