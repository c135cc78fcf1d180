"""Sub-blocks several architectures share, written against the runtime `m` (moert/models/runtime.py; weights by
their GGUF names), each beside the declaration of the tensors it reads.

Dimension legend: T tokens, D hidden, H query heads, Hk KV heads, Dh head dim, Dv value head dim.
"""

from __future__ import annotations

import numpy as np

from moert.activations import glu
from moert.layers import attention, cpu_arrays, rms_norm, rope, softmax
from moert.models.spec import TensorSpec, spec


def decoder(m, tokens, block, embed_scale: float | None = None, n_layer: int | None = None, fused=None):
    """The forward every decoder here shares: embedding (times embed_scale), block(m, il, x) for each of the
    first n_layer layers (default all), final norm and output projection. Logits (T, V) on the host,
    continuing at m.position. fused: the moert/fused.py kind of layer `block` is, whose one-token steps on
    the CPU then run as two kernel calls a layer where they can (m.fused_layer; `block` is its twin)."""
    x = m.embed("token_embd.weight", tokens)                            # (T, D)
    if embed_scale is not None:
        x = x * np.float32(embed_scale)
    one = fused is not None and len(tokens) == 1
    for il in range(m.config.n_layer if n_layer is None else n_layer):
        y = m.fused_layer(il, x, fused) if one else None
        x = block(m, il, x) if y is None else y
    return m.output("output_norm.weight", "output.weight", x)           # (T, V)


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
    q, k, v = m.linears(h, (b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"), dev)
    q = q.reshape(T, c.n_head, c.head_dim)                                               # (T, H, Dh)
    k = k.reshape(T, c.n_head_kv, c.head_dim)                                            # (T, Hk, Dh)
    v = v.reshape(T, c.n_head_kv, c.head_dim_v)                                          # (T, Hk, Dv)
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
    a = attention(q, k, v, k_cache, v_cache, m.position, xp, scale=scale, window=window,
                  flash=m.flash_attn, kernels=dev.block_kernels())                       # (T, H*Dv)
    return m.linear(a, b + "attn_output.weight", dev)                                     # (T, D)


# -------------------------------------------------------------------- attention without per-head norms

def attention_tensors(b: str, qk_norm: str | None = None) -> list[TensorSpec]:
    """What gqa_attention reads: q/k/v/output, optional q/k/v/output biases, full-width q/k norms (OLMoE)."""
    out = [spec(b + "attn_q.weight", ("n_head", "head_dim"), "n_embd"),
           spec(b + "attn_k.weight", ("n_head_kv", "head_dim"), "n_embd"),
           spec(b + "attn_v.weight", ("n_head_kv", "head_dim_v"), "n_embd"),
           spec(b + "attn_output.weight", "n_embd", ("n_head", "head_dim_v")),
           spec(b + "attn_q.bias", ("n_head", "head_dim"), optional=True),
           spec(b + "attn_k.bias", ("n_head_kv", "head_dim"), optional=True),
           spec(b + "attn_v.bias", ("n_head_kv", "head_dim_v"), optional=True),
           spec(b + "attn_output.bias", "n_embd", optional=True)]
    if qk_norm == "full":
        out += [spec(b + "attn_q_norm.weight", ("n_head", "head_dim")),
                spec(b + "attn_k_norm.weight", ("n_head_kv", "head_dim"))]
    return out


def _biased(m, x, name: str, dev):
    """x + the bias `name` when the file has it (Qwen2's q/k/v), else x."""
    return x + m.w(name, dev) if m.has(name) else x


def gqa_attention(m, il: int, h, dev, rope_base: float, *, neox: bool, qk_norm: str | None = None,
                  scale: float | None = None, window: int | None = None, sinks=None, yarn=None):
    """GQA attention with optional q/k/v/output biases (Qwen2-MoE, gpt-oss) and optional RMSNorm over the whole q
    and k projections (qk_norm="full": OLMoE), on dev: h (T, D), already normed -> (T, D). sinks: (H,) logits on
    dev joining each softmax (gpt-oss); yarn: a layers.Yarn RoPE scaling, or None."""
    c, b, xp = m.config, f"blk.{il}.", dev.xp
    T = h.shape[0]
    q, k, v = m.linears(h, (b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight"), dev)
    q = _biased(m, q, b + "attn_q.bias", dev)                                           # (T, H*Dh)
    k = _biased(m, k, b + "attn_k.bias", dev)                                           # (T, Hk*Dh)
    v = _biased(m, v, b + "attn_v.bias", dev)                                           # (T, Hk*Dv)
    if qk_norm == "full":
        q = rms_norm(q, m.w(b + "attn_q_norm.weight", dev), c.rms_eps, xp)
        k = rms_norm(k, m.w(b + "attn_k_norm.weight", dev), c.rms_eps, xp)
    q = q.reshape(T, c.n_head, c.head_dim)
    k = k.reshape(T, c.n_head_kv, c.head_dim)
    v = v.reshape(T, c.n_head_kv, c.head_dim_v)
    cos, sin = m.rope(dev, c.head_dim, rope_base, yarn)                                  # (T, Dh/2) each
    q, k = rope(q, cos, sin, neox, xp), rope(k, cos, sin, neox, xp)
    k_cache, v_cache = m.kv_cache(il)
    a = attention(q, k, v, k_cache, v_cache, m.position, xp, scale=scale, window=window, sinks=sinks,
                  flash=m.flash_attn, kernels=dev.block_kernels())                       # (T, H*Dv)
    return _biased(m, m.linear(a, b + "attn_output.weight", dev), b + "attn_output.bias", dev)


# ---------------------------------------------------------------------------------------- routed experts

def routed_expert_tensors(b: str, n_ff: str = "n_ff_exp") -> list[TensorSpec]:
    """What routed_experts reads: ffn_norm (D), the router ffn_gate_inp (E, D), gate/up (E, n_ff, D) and
    down (E, D, n_ff) stacked over the experts."""
    return [spec(b + "ffn_norm.weight", "n_embd"), spec(b + "ffn_gate_inp.weight", "n_expert", "n_embd"),
            spec(b + "ffn_gate_exps.weight", "n_expert", n_ff, "n_embd"),
            spec(b + "ffn_up_exps.weight", "n_expert", n_ff, "n_embd"),
            spec(b + "ffn_down_exps.weight", "n_expert", "n_embd", n_ff)]


def routed_experts(m, il: int, x, dev, route):
    """The routed-experts half of a MoE block on dev: h = RMSNorm(x) (ffn_norm), the router's logits (T, E),
    `route(logits) -> ids, weights` (the architecture's semantics, moert/moe.py), then the experts wherever
    the plan put them (m.experts). Returns h (T, D), for a shared expert, and the experts' output (T, D)."""
    c, b = m.config, f"blk.{il}."
    with m.phase("router", dev):
        h = rms_norm(x, m.w(b + "ffn_norm.weight", dev), c.rms_eps, dev.xp)                  # (T, D)
        logits = h @ m.w(b + "ffn_gate_inp.weight", dev).T              # (T, E)
        ids, weights = route(logits)                                    # (T, K), (T, K)
    names = (b + "ffn_gate_exps.weight", b + "ffn_up_exps.weight", b + "ffn_down_exps.weight")
    return h, m.experts(il, h, ids, weights, names, logits=logits)     # (T, D) on dev


def unrenormalized_router_scores(c, logits: np.ndarray) -> tuple[np.ndarray, str]:
    """`router_scores` (what `moert explain` shows of one token's router) of an architecture whose chosen
    experts keep their softmax probabilities, not renormalized over the top k (qwen2moe, olmoe): the softmax
    over all experts (E,) and how the weights come from it."""
    return softmax(logits), "softmax(ffn_gate_inp . ffn_norm(x)); the chosen keep their probabilities, not renormalized"


# ----------------------------------------------------------------------------- FFNs: dense, shared expert

def ffn_tensors(b: str, n_ff: str, suffix: str = "", bias: bool = False) -> list[TensorSpec]:
    """gate/up (n_ff, D) and down (D, n_ff) of a dense FFN (suffix "_shexp": a shared expert), optional biases."""
    out = [spec(f"{b}ffn_gate{suffix}.weight", n_ff, "n_embd"), spec(f"{b}ffn_up{suffix}.weight", n_ff, "n_embd"),
           spec(f"{b}ffn_down{suffix}.weight", "n_embd", n_ff)]
    if bias:
        out += [spec(f"{b}ffn_gate{suffix}.bias", n_ff, optional=True),
                spec(f"{b}ffn_up{suffix}.bias", n_ff, optional=True),
                spec(f"{b}ffn_down{suffix}.bias", "n_embd", optional=True)]
    return out


def dense_ffn(m, b: str, h, dev, act: str = "swiglu", suffix: str = ""):
    """down(act(gate h, up h)) with the blk's ffn_{gate,up,down}{suffix} weights (biases when present), on dev."""
    g = _biased(m, m.linear(h, f"{b}ffn_gate{suffix}.weight", dev), f"{b}ffn_gate{suffix}.bias", dev)  # (T, F)
    u = _biased(m, m.linear(h, f"{b}ffn_up{suffix}.weight", dev), f"{b}ffn_up{suffix}.bias", dev)      # (T, F)
    y = m.linear(glu(g, u, act, dev.xp), f"{b}ffn_down{suffix}.weight", dev)                            # (T, D)
    return _biased(m, y, f"{b}ffn_down{suffix}.bias", dev)


def shared_expert(m, b: str, h, dev, gated: bool):
    """The shared expert (ffn_*_shexp), where its weights are, returned on dev; gated: times
    sigmoid(ffn_gate_inp_shexp . h) per token (Qwen2-MoE)."""
    sdev = m.device_of(b + "ffn_up_shexp.weight")
    hs = m.to(h, sdev, "hidden")
    with m.phase("ffn", sdev):
        y = dense_ffn(m, b, hs, sdev, suffix="_shexp")                                    # (T, D)
        if gated:
            z = hs @ m.w(b + "ffn_gate_inp_shexp.weight", sdev).reshape(-1, 1)            # (T, 1)
            y = y * (np.float32(0.5) * (np.float32(1.0) + sdev.xp.tanh(np.float32(0.5) * z)))   # sigmoid
    return m.to(y, dev, "shared expert output")
