"""Sub-blocks several architectures share, written against the runtime `m` (weights by their GGUF names).

Dimension legend: T tokens, D hidden, H query heads, Hk KV heads, Dh head dim, Dv value head dim.
"""

from __future__ import annotations

import numpy as np

from moert.layers import attention, cpu_arrays, rms_norm, rope
from moert.models.spec import TensorSpec, spec


def qk_norm_attention_tensors(b: str) -> list[TensorSpec]:
    """The tensors qk_norm_attention reads for block prefix b ("blk.3.")."""
    return [spec(b + "attn_q.weight", ("n_head", "head_dim"), "n_embd"),
            spec(b + "attn_k.weight", ("n_head_kv", "head_dim"), "n_embd"),
            spec(b + "attn_v.weight", ("n_head_kv", "head_dim_v"), "n_embd"),
            spec(b + "attn_output.weight", "n_embd", ("n_head", "head_dim_v")),
            spec(b + "attn_q_norm.weight", "head_dim"), spec(b + "attn_k_norm.weight", "head_dim")]


def qk_norm_attention(m, il: int, h, dev, rope_base: float, *, neox: bool = True, scale: float | None = None,
                      window: int | None = None):
    """GQA attention with per-head RMSNorm on q and k (Qwen3, Gemma 3) on dev, continuing at m.position:
    h (T, D), already normed -> attn_output(attention) (T, D). Writes this chunk's k, v into layer il's cache."""
    c, b, xp = m.config, f"blk.{il}.", dev.xp
    T = h.shape[0]
    q = m.linear(h, b + "attn_q.weight", dev).reshape(T, c.n_head, c.head_dim)          # (T, H, Dh)
    k = m.linear(h, b + "attn_k.weight", dev).reshape(T, c.n_head_kv, c.head_dim)       # (T, Hk, Dh)
    v = m.linear(h, b + "attn_v.weight", dev).reshape(T, c.n_head_kv, c.head_dim_v)     # (T, Hk, Dv)
    qn, kn = m.w(b + "attn_q_norm.weight", dev), m.w(b + "attn_k_norm.weight", dev)    # (Dh,) each
    cos, sin = m.rope(dev, c.head_dim, rope_base)                                        # (T, Dh/2) each
    k_cache, v_cache = m.kv_cache(il)
    if T == 1 and cpu_arrays(xp, q, k, v, qn, kn, cos, sin, k_cache, v_cache):       # decode on the CPU:
        from moert.kernels.layers import qk_norm_rope_attention  # the lines below, fused

        scale = 1.0 / np.sqrt(c.head_dim) if scale is None else scale
        a = qk_norm_rope_attention(q, k, v, qn, kn, c.rms_eps, cos, sin, neox, k_cache, v_cache, m.position,
                                   scale, window)                                        # (1, H*Dv)
        return m.linear(a, b + "attn_output.weight", dev)
    q = rms_norm(q, qn, c.rms_eps, xp)                                                   # per head, over Dh
    k = rms_norm(k, kn, c.rms_eps, xp)
    q, k = rope(q, cos, sin, neox, xp), rope(k, cos, sin, neox, xp)
    a = attention(q, k, v, k_cache, v_cache, m.position, xp, scale=scale, window=window)  # (T, H*Dv)
    return m.linear(a, b + "attn_output.weight", dev)                                     # (T, D)
