"""qwen2moe: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B, as llama.cpp's src/models/qwen2moe.cpp runs them.

Per layer: RMSNorm -> GQA attention (q/k/v biases, NEOX RoPE) -> residual -> RMSNorm ->
  routed experts: softmax over all experts -> top-k, NOT renormalized -> k SwiGLU experts
  + shared expert: SwiGLU of size expert_shared_feed_forward_length, times sigmoid(ffn_gate_inp_shexp . x)
-> residual. Output: RMSNorm -> output.weight.

Dimension legend: T tokens, D hidden, E experts, K used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert.config import MoEConfig, key
from moert.layers import rms_norm
from moert.models.blocks import (
    attention_tensors,
    decoder,
    ffn_tensors,
    gqa_attention,
    routed_expert_tensors,
    routed_experts,
    shared_expert,
    unrenormalized_router_scores,
)
from moert.models.spec import TensorSpec, io_tensors, spec
from moert.moe import softmax_topk

ROPE_NEOX = True   # llama.cpp: LLAMA_ROPE_TYPE_NEOX for qwen2moe


@dataclass(frozen=True)
class Config(MoEConfig):
    """llama.cpp's LLM_ARCH_QWEN2MOE hparams: experts of expert_feed_forward_length (default n_ff / K), a
    shared expert of expert_shared_feed_forward_length (default feed_forward_length)."""

    n_ff: int = key("{arch}.feed_forward_length", minimum=1)
    n_ff_exp: int = key("{arch}.expert_feed_forward_length", lambda f: f["n_ff"] // f["n_expert_used"], minimum=1)
    n_ff_shexp: int = key("{arch}.expert_shared_feed_forward_length", lambda f: f["n_ff"], minimum=1)


def tensors(c: Config) -> list[TensorSpec]:
    """Every tensor a qwen2moe file holds (llama.cpp's qwen2moe load_arch_tensors), NumPy order."""
    out = io_tensors()
    for i in range(c.n_layer):
        b = f"blk.{i}."
        out += [spec(b + "attn_norm.weight", "n_embd"), *attention_tensors(b), *routed_expert_tensors(b),
                spec(b + "ffn_gate_inp_shexp.weight", "n_embd"), *ffn_tensors(b, "n_ff_shexp", "_shexp")]
    return out


def forward(m, tokens: np.ndarray):
    """Logits (T, n_vocab) for `tokens` (T,) continuing at position m.position; on the host."""
    return decoder(m, tokens, block)


def block(m, il: int, x):
    """One decoder layer; x (T, D) arrives on any device and leaves on this layer's attention device."""
    c, b = m.config, f"blk.{il}."
    dev = m.attention_device(il)
    xp = dev.xp
    x = m.to(x, dev, "hidden")                                          # (T, D)
    with m.phase("attention", dev):
        h = rms_norm(x, m.w(b + "attn_norm.weight", dev), c.rms_eps, xp)
        x = x + gqa_attention(m, il, h, dev, c.rope_base, neox=ROPE_NEOX)
    h, y = routed_experts(m, il, x, dev, lambda logits: softmax_topk(logits, c.n_expert_used, xp, renorm=False))
    return x + y + shared_expert(m, b, h, dev, gated=True)


router_scores = unrenormalized_router_scores     # what `moert explain` shows of the router
