"""A step at a position held in device memory (kvcache.DevicePos), as a CUDA graph replays it: no shape, slice or
kernel argument depends on the position, so one capture serves every token (moert/graphs/decode.py).

    rope_angles_at(pos, T, head_dim, base, xp, yarn, freqs)       cos, sin (T, Dh/2) of positions pos .. pos + T - 1
    attention_at(q, k_cache, v_cache, pos, xp, scale, window, sinks)     layers.attention over every cache row, the
                                                                   rows past each token (or before its window) masked
    latent_attention_at(q_lat, q_pe, cache, pos, scale, xp)       layers.latent_attention the same way (MLA)

The caches already hold this step's rows (kvcache.store writes at a DevicePos). Attending over all n_ctx rows is
gpt-fast's choice for a graph: the work of a step is that of a full context, masked; layers.attention at an int
position reads the rows up to it only. These are the twins of layers.attention / latent_attention at a device
position, tested against them (tests/test_gpu_graph.py).

Dimension legend: T tokens, N cache rows (n_ctx), H heads, Hk KV heads, G = H / Hk, Dh, Dv head dims, R latent.
"""

from __future__ import annotations

import numpy as np

from moert.kvcache import DevicePos, load


def rope_angles_at(pos: DevicePos, T: int, head_dim: int, base: float, xp, yarn=None, freqs: dict | None = None):
    """layers.rope_angles for positions pos .. pos + T - 1 read on the device. freqs: a dict keeping each (head dim,
    base, yarn)'s frequencies on the device, uploaded on its first call (before a capture, which may not upload)."""
    key = (head_dim, base, yarn)
    inv = None if freqs is None else freqs.get(key)
    if inv is None:
        half = head_dim // 2
        inv = (1.0 / (base ** (xp.arange(0, half, dtype=xp.float64) * 2.0 / head_dim)) if yarn is None
               else xp.asarray(yarn.inv_freq(head_dim, base)))                           # (Dh/2,) float64
        if freqs is not None:
            freqs[key] = inv
    p = pos.p.astype(xp.float64) + xp.arange(T, dtype=xp.float64)                        # (T,)
    ang = p[:, None] * inv[None, :]                                                      # (T, Dh/2)
    m = 1.0 if yarn is None else yarn.mscale
    return (xp.cos(ang) * m).astype(xp.float32), (xp.sin(ang) * m).astype(xp.float32)


def _masked(pos: DevicePos, T: int, n: int, window: int | None, xp):
    """(T, N) True where token t (at pos + t) must not see cache row s: s > pos + t, or s <= pos + t - window."""
    p = pos.p.astype(xp.int64) + xp.arange(T, dtype=xp.int64)                           # (T,)
    s = xp.arange(n, dtype=xp.int64)[None, :]                                            # (1, N)
    masked = s > p[:, None]
    return masked if window is None else masked | (s <= p[:, None] - window)


def _softmax(s, sinks, xp):
    """Softmax over the last axis; sinks (broadcast to s[..., :1]) join the denominator only (gpt-oss)."""
    top = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = xp.maximum(top, sinks)
    e = xp.exp(s - top)
    den = e.sum(axis=-1, keepdims=True)
    return e / (den if sinks is None else den + xp.exp(sinks - top))


def attention_at(q, k_cache, v_cache, pos: DevicePos, xp, scale: float | None = None, window: int | None = None,
                 sinks=None):
    """layers.attention's result for q (T, H, Dh) at the device position pos: (T, H * Dv), every cache row read,
    those a token must not see masked."""
    T, H, Dh = q.shape
    n = k_cache.shape[0]
    K, V = load(k_cache, 0, n), load(v_cache, 0, n)                                      # (N, Hk, Dh), (N, Hk, Dv)
    Hk, Dv = K.shape[1], V.shape[2]
    G = H // Hk
    scale = 1.0 / np.sqrt(Dh) if scale is None else scale
    qg = q.reshape(T, Hk, G, Dh).transpose(1, 2, 0, 3).reshape(Hk, G * T, Dh)
    s = (qg @ K.transpose(1, 2, 0)).reshape(Hk, G, T, n) * np.float32(scale)             # (Hk, G, T, N)
    s = xp.where(_masked(pos, T, n, window, xp), np.float32(-np.inf), s)
    p = _softmax(s, None if sinks is None else sinks.reshape(Hk, G, 1, 1), xp)
    out = p.reshape(Hk, G * T, n) @ V.transpose(1, 0, 2)                                 # (Hk, G*T, Dv)
    return out.reshape(Hk, G, T, Dv).transpose(2, 0, 1, 3).reshape(T, H * Dv).astype(np.float32)


def latent_attention_at(q_lat, q_pe, cache, pos: DevicePos, scale: float, xp):
    """layers.latent_attention's result at the device position pos: (H, T, R), every row of the latent cache
    (N, 1, R + P) read, those a token must not see masked."""
    R = q_lat.shape[-1]
    n = cache.shape[0]
    kv = load(cache, 0, n)[:, 0]                                                         # (N, R + P)
    s = (xp.concatenate([q_lat, q_pe], axis=-1) @ kv.T) * np.float32(scale)              # (H, T, N)
    s = xp.where(_masked(pos, q_lat.shape[1], n, None, xp), np.float32(-np.inf), s)
    return (_softmax(s, None, xp) @ kv[:, :R]).astype(np.float32)                        # (H, T, R)
