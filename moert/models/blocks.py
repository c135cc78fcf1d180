"""Sub-blocks several architectures share, written against the runtime `m` (weights by their GGUF names).

Dimension legend: T tokens, D hidden, H query heads, Hk KV heads, Dh head dim, Dv value head dim.
"""

from __future__ import annotations

from moert.layers import attention, rms_norm, rope


def qk_norm_attention(m, il: int, h, dev, rope_base: float, *, neox: bool = True, scale: float | None = None,
                      window: int | None = None):
    """GQA attention with per-head RMSNorm on q and k (Qwen3, Gemma 3) on dev, continuing at m.position:
    h (T, D), already normed -> attn_output(attention) (T, D). Writes this chunk's k, v into layer il's cache."""
    c, b, xp = m.config, f"blk.{il}.", dev.xp
    T = h.shape[0]
    q = m.linear(h, b + "attn_q.weight", dev).reshape(T, c.n_head, c.head_dim)          # (T, H, Dh)
    k = m.linear(h, b + "attn_k.weight", dev).reshape(T, c.n_head_kv, c.head_dim)       # (T, Hk, Dh)
    v = m.linear(h, b + "attn_v.weight", dev).reshape(T, c.n_head_kv, c.head_dim_v)     # (T, Hk, Dv)
    q = rms_norm(q, m.w(b + "attn_q_norm.weight", dev), c.rms_eps, xp)                  # per head, over Dh
    k = rms_norm(k, m.w(b + "attn_k_norm.weight", dev), c.rms_eps, xp)
    cos, sin = m.rope(dev, c.head_dim, rope_base)                                        # (T, Dh/2) each
    q, k = rope(q, cos, sin, neox, xp), rope(k, cos, sin, neox, xp)
    k_cache, v_cache = m.kv_cache(il)
    a = attention(q, k, v, k_cache, v_cache, m.position, xp, scale=scale, window=window)  # (T, H*Dv)
    return m.linear(a, b + "attn_output.weight", dev)                                     # (T, D)
