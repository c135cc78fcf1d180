"""olmoe: OLMoE-1B-7B, as llama.cpp's src/models/olmoe.cpp runs it.

Per layer: RMSNorm -> attention with RMSNorm over the whole q and k projections (before the heads are
split), NEOX RoPE -> residual -> RMSNorm -> softmax over all experts -> top-k, NOT renormalized -> k SwiGLU
experts of feed_forward_length -> residual. Output: RMSNorm -> output.weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert.config import MoEConfig, key
from moert.layers import rms_norm
from moert.models.blocks import (
    attention_tensors,
    decoder,
    gqa_attention,
    routed_expert_tensors,
    routed_experts,
    unrenormalized_router_scores,
)
from moert.models.spec import TensorSpec, io_tensors, spec
from moert.moe import softmax_topk

ROPE_NEOX = True   # llama.cpp: LLAMA_ROPE_TYPE_NEOX for olmoe


@dataclass(frozen=True)
class Config(MoEConfig):
    """llama.cpp's LLM_ARCH_OLMOE hparams: the experts' hidden size is feed_forward_length."""

    n_ff_exp: int = key("{arch}.feed_forward_length", minimum=1)


def tensors(c: Config) -> list[TensorSpec]:
    """Every tensor an olmoe file holds (llama.cpp's olmoe load_arch_tensors), NumPy order."""
    out = io_tensors()
    for i in range(c.n_layer):
        b = f"blk.{i}."
        out += [spec(b + "attn_norm.weight", "n_embd"), *attention_tensors(b, qk_norm="full"),
                *routed_expert_tensors(b)]
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
        x = x + gqa_attention(m, il, h, dev, c.rope_base, neox=ROPE_NEOX, qk_norm="full")
    _, y = routed_experts(m, il, x, dev, lambda logits: softmax_topk(logits, c.n_expert_used, xp, renorm=False))
    return x + y


router_scores = unrenormalized_router_scores     # what `moert explain` shows of the router
