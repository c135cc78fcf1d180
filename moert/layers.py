"""Shared transformer layers, written against an array module `xp` (numpy, a sim device, or cupy).

Every function takes its arrays on one device and returns arrays on that device; none of them moves
data. All arithmetic is float32 except RoPE angles (float64, then cast, as positions grow large).

On the CPU (xp is numpy, float32 arrays) rms_norm, rope and one-token attention hand over to Numba
kernels in kernels/layers.py, for Python overhead: these functions are their reference twins
(`fast=False` runs the twin).

Dimension legend: T tokens in this call, S positions in the cache (past + T), D hidden, H query heads,
Hk key/value heads, G = H / Hk heads per KV group, Dh head dim, F feed-forward hidden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from moert.activations import glu_ffn
from moert.graphs.static import attention_at, latent_attention_at
from moert.kvcache import DevicePos, Rows, TypedKV, load, store

FLASH_CHUNK = 256    # keys per step of flash_attention (memory.py's scratch term counts on it)
SPLIT_TOKENS = 8     # up to this many query tokens on the CPU: kernels/flash_decode.py (keys split over the threads)
_fast = None    # moert.kernels.layers, imported on first use (it imports Numba)


def _kernels():
    global _fast
    if _fast is None:
        from moert.kernels import layers

        _fast = layers
    return _fast


def _f16_bits(cache):
    """An f16 TypedKV's storage as a uint16 view (what the CPU decode kernel reads), any other cache as it is."""
    if isinstance(cache, TypedKV) and cache.kind == "f16":
        return cache.parts[0].view(np.uint16)
    return cache


def _cache_arrays(*caches) -> bool:
    """Whether the CPU decode kernel reads these caches: C-contiguous NumPy float32 or uint16 (f16) arrays."""
    return all(type(c) is np.ndarray and c.dtype in (np.float32, np.uint16) and c.flags.c_contiguous for c in caches)


def _split_cache(cache):
    """A cache as kernels/flash_decode.py reads it (its Cache: the stored values, q8_0's scales as f16 bits, bf16
    or not), or None where it is not NumPy memory (a sim or CUDA device's arrays)."""
    from moert.kernels.flash_decode import Cache

    if isinstance(cache, TypedKV):
        parts = cache.parts
        if any(type(a) is not np.ndarray for a in parts):
            return None
        if cache.kind == "q8_0":
            return Cache(parts[0], parts[1].view(np.uint16))
        return Cache(parts[0].view(np.uint16), None, cache.kind == "bf16")
    if type(cache) is np.ndarray and cache.dtype == np.float32 and cache.flags.c_contiguous:
        return Cache(cache)
    return None


def _stored(cache):
    """A cache as kernels/gpu's attention reads it: an f32 array as it is, a TypedKV as (kind, *its arrays)."""
    return (cache.kind, *cache.parts) if isinstance(cache, TypedKV) else cache


def _split(q, k_cache, v_cache, pos0: int, scale: float, window, sinks, dv=None, prompt: bool = False):
    """kernels/flash_decode.split_attention (prompt: kernels/flash_prompt.prompt_attention) over these caches, or
    None where it does not take them."""
    kc, vc = _split_cache(k_cache), _split_cache(v_cache)
    if kc is None or vc is None or (sinks is not None and type(sinks) is not np.ndarray):
        return None
    if prompt:
        from moert.kernels.flash_prompt import prompt_attention

        return prompt_attention(q, kc, vc, pos0, scale, window, sinks, dv)
    from moert.kernels.flash_decode import split_attention

    return split_attention(q, kc, vc, pos0, scale, window, sinks, dv)


def cpu_arrays(xp, *arrays) -> bool:
    """Whether the CPU kernels (kernels/layers.py) take these: xp is numpy and they are C-contiguous
    float32 NumPy arrays."""
    if xp is not np:
        return False
    for a in arrays:
        if type(a) is not np.ndarray or a.dtype != np.float32 or not a.flags.c_contiguous:
            return False
    return True


def rms_norm(x, w, eps: float, xp=np, fast: bool = True):
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * w."""
    if fast and cpu_arrays(xp, x, w) and w.shape == x.shape[-1:]:
        return _kernels().rms_norm(x, w, eps)
    ms = xp.mean(x * x, axis=-1, keepdims=True)                          # (..., 1)
    return x * (1.0 / xp.sqrt(ms + np.float32(eps))) * w


@dataclass(frozen=True)
class Yarn:
    """YaRN RoPE scaling (arXiv:2309.00071), as ggml's rope_yarn and transformers' _compute_yarn_parameters.

    Dimension pair i rotates at base^(-2i/Dh) (extrapolation) for the high-frequency pairs, at that
    divided by `factor` (interpolation) for the low-frequency ones, and a linear ramp in between: the
    ramp runs over the pairs whose wavelength makes beta_fast .. beta_slow turns within `orig_ctx`.
    cos and sin are multiplied by `mscale` (ggml: attn_factor * (1 + 0.1 ln factor); HF: attention_factor).
    truncate floors/ceils the ramp's ends to whole pairs: ggml always does (ggml_rope_yarn_corr_dims), HF
    does unless the config says `truncate: false` (gpt-oss does)."""

    factor: float            # rope.scaling.factor: context extension, 1 / ggml's freq_scale
    orig_ctx: int            # rope.scaling.original_context_length: the context trained before extension
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    truncate: bool = True

    def ramp_range(self, head_dim: int, base: float) -> tuple[float, float]:
        """The pair indices (low, high) between which interpolation ramps in (ggml's corr_dims)."""
        def dim(turns: float) -> float:
            return head_dim * math.log(self.orig_ctx / (turns * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = dim(self.beta_fast), dim(self.beta_slow)
        if self.truncate:
            lo, hi = math.floor(lo), math.ceil(hi)
        return max(lo, 0.0), min(hi, head_dim - 1.0)

    def inv_freq(self, head_dim: int, base: float) -> np.ndarray:
        """Per-pair angular frequencies (Dh/2,) float64."""
        half = head_dim // 2
        extra = 1.0 / (base ** (np.arange(half, dtype=np.float64) * 2.0 / head_dim))   # (Dh/2,)
        lo, hi = self.ramp_range(head_dim, base)
        keep = 1.0 - np.clip((np.arange(half) - lo) / max(hi - lo, 0.001), 0.0, 1.0)   # 1: extrapolate
        return extra / self.factor * (1.0 - keep) + extra * keep


def rope_angles(pos0: int, n: int, head_dim: int, base: float, xp=np, yarn: Yarn | None = None, positions=None):
    """cos, sin of RoPE for positions pos0 .. pos0+n-1 (or the given `positions` (n,), a batch of sequences'):
    each (n, head_dim // 2) float32. With `yarn`, the YaRN frequencies, and cos and sin scaled by yarn.mscale."""
    half = head_dim // 2
    if yarn is None:
        inv_freq = 1.0 / (base ** (xp.arange(0, half, dtype=xp.float64) * 2.0 / head_dim))   # (Dh/2,)
    else:
        inv_freq = xp.asarray(yarn.inv_freq(head_dim, base))
    pos = xp.arange(pos0, pos0 + n, dtype=xp.float64) if positions is None else xp.asarray(positions, xp.float64)
    ang = pos[:, None] * inv_freq[None, :]                                                # (T, Dh/2)
    if yarn is None or yarn.mscale == 1.0:
        return xp.cos(ang).astype(xp.float32), xp.sin(ang).astype(xp.float32)
    return (xp.cos(ang) * yarn.mscale).astype(xp.float32), (xp.sin(ang) * yarn.mscale).astype(xp.float32)


def rope(x, cos, sin, neox: bool, xp=np, fast: bool = True):
    """Rotate x (T, heads, Dh) by position. NEOX pairs dim i with i + Dh/2 (Qwen, GPT-NeoX); the
    normal style pairs adjacent dims 2i, 2i+1 (LLaMA as llama.cpp stores it)."""
    if fast and cpu_arrays(xp, x, cos, sin) and x.ndim == 3:
        return _kernels().rope(x, cos, sin, neox)
    c, s = cos[:, None, :], sin[:, None, :]                              # (T, 1, Dh/2)
    if neox:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]                            # (T, h, Dh/2) each
        return xp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return xp.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(x.shape)


def attention(q, k, v, k_cache, v_cache, pos0: int, xp=np, *, scale: float | None = None,
              window: int | None = None, sinks=None, fast: bool = True, flash: bool = False,
              chunk: int = FLASH_CHUNK, kernels=None):
    """Causal GQA attention continuing at position pos0: writes k, v into the caches, attends over
    positions [0, pos0 + T). q (T, H, Dh), k (T, Hk, Dh), v (T, Hk, Dv); caches (n_ctx, Hk, D*), float32
    arrays or kvcache.TypedKV (-ctk/-ctv f16, bf16, q8_0: rounded when written, float32 when read).
    scale: of the scores (default 1/sqrt(Dh)). window: sliding-window attention, the query at position
    p sees keys at p - window < s <= p (llama.cpp's LLAMA_SWA_TYPE_STANDARD, HF's sliding_window).
    sinks: (H,) float32 logits, one per head, that join each softmax's denominator and add no value
    (gpt-oss's attention sinks: llama.cpp's soft_max_ext sinks, HF's GptOssAttention).
    flash: never hold the (T, S) scores: on the CPU kernels/flash.py (a row at a time) with f32 caches, or
    typed ones up to `chunk` positions (read as float32: an int8 pp64 of a Qwen3-30B-A3B-shaped layer with
    an f16 cache, 1.6 -> 0.8 ms), elsewhere `flash_attention` below (its twin: (T, chunk) scores at a time).
    One token on the CPU (fast):
    kernels/layers.attention_decode, over f32 caches or an f16 TypedKV's storage (a uint16 view); up to
    SPLIT_TOKENS tokens over any cache type: kernels/flash_decode.py (the keys split over the threads, the
    cache read in its own type); more, with flash: kernels/flash_prompt.py (the same by sgemm; with SciPy).
    kernels: the device's GPU kernels (Device.block_kernels()): every chunk runs as kernels/gpu's attention
    over the cache as stored (heads of up to 576 dims). Returns (T, H * Dv). Caches that are kvcache.Rows (a batch
    of sequences, moert/batch.py): attention per sequence over its own cache, its rows of q, k, v; pos0 is not
    used."""
    if isinstance(k_cache, Rows):
        return xp.concatenate([attention(q[a:b], k[a:b], v[a:b], kc, vc, p, xp, scale=scale, window=window,
                                         sinks=sinks, fast=fast, flash=flash, chunk=chunk, kernels=kernels)
                               for a, b, p, kc, vc in k_cache.each(v_cache)])                  # (T, H*Dv)
    T, H, Dh = q.shape
    Hk, Dv = k.shape[1], v.shape[2]
    G = H // Hk
    scale = 1.0 / np.sqrt(Dh) if scale is None else scale
    typed = isinstance(k_cache, TypedKV) or isinstance(v_cache, TypedKV)
    kb, vb = _f16_bits(k_cache), _f16_bits(v_cache)                   # f16 caches as uint16 views, else as given
    if fast and T == 1 and cpu_arrays(xp, q, k, v) and _cache_arrays(kb, vb):
        # decode; a prompt's batched matmuls below are BLAS-fast
        return _kernels().attention_decode(q, k, v, kb, vb, pos0, scale, window, sinks)
    store(k_cache, pos0, k)
    store(v_cache, pos0, v)
    at = isinstance(pos0, DevicePos)                 # a position in device memory (a CUDA graph's: graphs/static.py)
    if kernels is not None and max(Dh, Dv) <= 576:   # a GPU: split + merge up to 8 tokens, f16 tiles for prompts
        return kernels.attention(q, _stored(k_cache), _stored(v_cache), pos0.p if at else pos0, scale=scale,
                                 window=window, sinks=sinks)                                   # (T, H*Dv)
    if at:
        return attention_at(q, k_cache, v_cache, pos0, xp, scale, window, sinks)               # (T, H*Dv)
    S = pos0 + T
    if fast and (T <= SPLIT_TOKENS or flash) and cpu_arrays(xp, q):   # a few tokens, or a prompt: every thread
        out = _split(q, k_cache, v_cache, pos0, scale, window, sinks, prompt=T > SPLIT_TOKENS)
        if out is not None:
            return out                                                  # (T, H*Dv)
    s0 = 0 if window is None else max(0, pos0 - window + 1)            # no query here sees keys before s0
    # head h uses KV head h // G (HF's repeat_kv, llama.cpp's broadcast)
    if flash and fast and cpu_arrays(xp, q) and (not typed or S <= chunk):      # a prompt on the CPU: Numba
        from moert.kernels.flash import flash_attention as flash_cpu

        if typed:           # f16/bf16/q8_0 caches read as float32, as the twin reads them; at most `chunk`
            k_cache, v_cache = load(k_cache, 0, S), load(v_cache, 0, S)   # rows, as the twin's step loads
        if cpu_arrays(xp, k_cache, v_cache):
            return flash_cpu(q, k_cache, v_cache, pos0, scale, window, sinks)   # (T, H*Dv)
    qg = q.reshape(T, Hk, G, Dh).transpose(1, 2, 0, 3).reshape(Hk, G * T, Dh)
    if flash:
        out = flash_attention(qg, k_cache, v_cache, pos0, T, s0, scale, window, chunk, xp, sinks)   # (Hk, G*T, Dv)
        return out.reshape(Hk, G, T, Dv).transpose(2, 0, 1, 3).reshape(T, H * Dv)
    K = load(k_cache, s0, S).transpose(1, 2, 0)                          # (Hk, Dh, S')  S' = S - s0
    V = load(v_cache, s0, S).transpose(1, 0, 2)                          # (Hk, S', Dv)
    # the (Hk, G, T, S') scores are the biggest temporary of a layer: scale, mask and softmax them in place,
    # so one copy is alive at a time (memory.py's estimate counts on it; a sim GPU checks it)
    scores = (qg @ K).reshape(Hk, G, T, S - s0)                         # (Hk, G, T, S')
    scores *= np.float32(scale)
    scores += xp.where(attention_mask(pos0, T, s0, window, xp), np.float32(-np.inf), np.float32(0))  # (T, S')
    p = softmax_(scores, xp) if sinks is None else softmax_sinks_(scores, sinks.reshape(Hk, G, 1, 1), xp)
    out = p.reshape(Hk, G * T, S - s0) @ V                               # (Hk, G*T, Dv)
    return out.reshape(Hk, G, T, Dv).transpose(2, 0, 1, 3).reshape(T, H * Dv)


def flash_attention(qg, k_cache, v_cache, pos0: int, T: int, s0: int, scale: float, window: int | None,
                    chunk: int, xp=np, sinks=None):
    """Attention over cache positions [s0, pos0 + T) a chunk of keys at a time with an online softmax
    (FlashAttention's recurrence, as llama.cpp's -fa): per row a running max m, sum l and output acc;
    each chunk rescales them by exp(m_old - m_new). qg (Hk, G*T, Dh), rows ordered (g, t). The caches are
    read (dequantized, for a TypedKV) one chunk at a time. sinks (H,): a key of score sinks[h] and value 0
    seen first (m starts at the sink, l at 1). Returns (Hk, G*T, Dv)."""
    Hk, R, _ = qg.shape
    S = pos0 + T
    m = xp.full((Hk, R, 1), -np.inf, dtype=np.float32)                  # running max per row
    l = xp.zeros((Hk, R, 1), dtype=np.float32)                          # running sum of exp
    if sinks is not None:                                               # row g*T + t of KV head kh: head kh*G + g
        m = xp.repeat(sinks.reshape(Hk, R // T, 1), T, axis=1).astype(xp.float32)
        l = xp.ones((Hk, R, 1), dtype=np.float32)
    acc = None                                                           # (Hk, R, Dv) running output
    for a in range(s0, S, chunk):
        b = min(a + chunk, S)
        K, V = load(k_cache, a, b), load(v_cache, a, b)                  # (c, Hk, Dh), (c, Hk, Dv)
        s = (qg @ K.transpose(1, 2, 0)) * np.float32(scale)              # (Hk, R, c)
        mask = attention_mask(pos0, T, a, window, xp)[:, : b - a]        # (T, c): key a + j for query t
        s += xp.where(xp.tile(mask, (R // T, 1)), np.float32(-np.inf), np.float32(0))
        m_new = xp.maximum(m, s.max(axis=-1, keepdims=True))
        base = xp.where(xp.isfinite(m_new), m_new, np.float32(0))      # a row with nothing seen yet stays 0
        alpha = xp.exp(m - base)                                         # rescales what was summed before
        p = xp.exp(s - base)                                             # (Hk, R, c)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        pv = p @ V.transpose(1, 0, 2)                                    # (Hk, R, Dv)
        acc = pv if acc is None else acc * alpha + pv
        m = m_new
    return acc / l


def latent_attention(q_lat, q_pe, c_kv, k_pe, cache, pos0: int, scale: float, xp=np, fast: bool = True,
                     kernels=None):
    """Multi-head latent attention (DeepSeek-V2's MLA) over a compressed cache, continuing at position pos0:
    every head attends with one shared key, [latent, rotated key], whose first R dims are also the value
    (llama.cpp's MQA view of MLA, its K-only cache). Writes this chunk's c_kv (T, R) and k_pe (T, P) into
    cache (n_ctx, 1, R + P), an f32 array or a kvcache.TypedKV (-ctk). q_lat (H, T, R): the queries already
    multiplied into latent space (attn_k_b absorbed); q_pe (H, T, P) their rotated part. Returns the
    attention-weighted latents (H, T, R). A kvcache.Rows cache (a batch of sequences): per sequence. Up to
    SPLIT_TOKENS tokens on the CPU (fast): kernels/flash_decode.py, the cache read in its own type. kernels: a
    GPU's (Device.block_kernels()): kernels/gpu's attention, the cache as both keys and values (up to 576 dims)."""
    if isinstance(cache, Rows):
        return xp.concatenate([latent_attention(q_lat[:, a:b], q_pe[:, a:b], c_kv[a:b], k_pe[a:b], c, p, scale, xp,
                                                fast, kernels)
                               for a, b, p, c, _ in cache.each(cache)], axis=1)                # (H, T, R)
    T, R = c_kv.shape
    store(cache, pos0, xp.concatenate([c_kv, k_pe], axis=-1)[:, None, :])
    if kernels is not None and R + k_pe.shape[1] <= 576:                # a GPU: values the first R dims of keys
        q = xp.ascontiguousarray(xp.concatenate([q_lat, q_pe], axis=-1).transpose(1, 0, 2))         # (T, H, R + P)
        c = _stored(cache)
        out = kernels.attention(q, c, c, pos0.p if isinstance(pos0, DevicePos) else pos0, scale=scale, dv=R)
        return out.reshape(T, -1, R).transpose(1, 0, 2)                                             # (H, T, R)
    if isinstance(pos0, DevicePos):                  # a position in device memory (moert/graphs/static.py)
        return latent_attention_at(q_lat, q_pe, cache, pos0, scale, xp)                      # (H, T, R)
    S = pos0 + T
    if fast and T <= SPLIT_TOKENS and xp is np and q_lat.dtype == q_pe.dtype == np.float32:   # values: first R dims
        q = np.ascontiguousarray(np.concatenate([q_lat, q_pe], axis=-1).transpose(1, 0, 2))          # (T, H, R + P)
        out = _split(q, cache, cache, pos0, scale, None, None, R)
        if out is not None:
            return out.reshape(T, -1, R).transpose(1, 0, 2)                                         # (H, T, R)
    kv = load(cache, 0, S)[:, 0]                                         # (S, R + P)
    scores = xp.concatenate([q_lat, q_pe], axis=-1) @ kv.T              # (H, T, S)
    scores *= np.float32(scale)
    scores += xp.where(attention_mask(pos0, T, xp=xp), np.float32(-np.inf), np.float32(0))   # (T, S)
    p = softmax_(scores, xp)
    return p @ kv[:, :R]                                                 # (H, T, R)


def attention_mask(pos0: int, T: int, s0: int = 0, window: int | None = None, xp=np):
    """True where query t (at position pos0 + t) must not see key position s0 + j: (T, S - s0) bool.
    Causal, and with a window also everything `window` or more positions back."""
    p = xp.arange(pos0, pos0 + T)[:, None]                               # (T, 1) query positions
    s = xp.arange(s0, pos0 + T)[None, :]                                 # (1, S') key positions
    masked = s > p
    return masked if window is None else masked | (s <= p - window)        # no (T, S') int64 of p - s


def softmax_(x, xp=np):
    """Softmax over the last axis, max-subtracted, in place (x is overwritten and returned)."""
    x -= x.max(axis=-1, keepdims=True)
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def softmax_sinks_(x, sinks, xp=np):
    """softmax_ with one more logit per row, `sinks` (broadcast to x[..., :1]), in the denominator only: the
    probabilities of x's entries, summing to less than 1. In place."""
    m = xp.maximum(x.max(axis=-1, keepdims=True), sinks)
    x -= m
    xp.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True) + xp.exp(sinks - m)
    return x


def softmax(x, xp=np):
    """Softmax over the last axis, max-subtracted."""
    e = xp.exp(x - xp.max(x, axis=-1, keepdims=True))
    return e / xp.sum(e, axis=-1, keepdims=True)


def swiglu(x, w_gate, w_up, w_down, xp=np):
    """SwiGLU FFN: down(silu(gate x) * up x). x (T, D); w_gate, w_up (F, D); w_down (D, F)."""
    return glu_ffn(x, w_gate, w_up, w_down, "swiglu", None, xp)
