"""qwen3moe: Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their family).

Per layer: RMSNorm -> GQA attention with per-head RMSNorm on q and k and NEOX RoPE -> residual ->
RMSNorm -> softmax router -> top-k -> renormalize -> k SwiGLU experts (no shared expert) -> residual.
Output: RMSNorm -> output.weight (or token_embd.weight when the file ties them).

The runtime `m` (moert/model.py) says where each weight lives; this file only says which device
each step runs on (attention and router where the layer's attention is, experts wherever the plan
put them) and what it computes. Tensors are named as in the GGUF file, end to end.

Dimension legend: T tokens, D hidden, H query heads, Hk KV heads, Dh head dim, E experts, K used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert.config import MoEConfig
from moert.fused import QKNormMoE
from moert.layers import rms_norm
from moert.models.blocks import (
    decoder,
    qk_norm_attention,
    qk_norm_attention_tensors,
    routed_expert_tensors,
    routed_experts,
)
from moert.models.spec import TensorSpec, io_tensors, spec
from moert.moe import softmax_topk


@dataclass(frozen=True)
class Config(MoEConfig):
    """Qwen3-MoE needs exactly the MoE fields (llama.cpp's LLM_ARCH_QWEN3MOE hparams)."""

    def validate(self) -> None:
        super().validate()
        self._check(self.head_dim % 2 == 0, "attention.key_length",
                    f"key_length {self.head_dim} is odd; RoPE rotates pairs of dimensions")


ROPE_NEOX = True  # llama.cpp: LLAMA_ROPE_TYPE_NEOX for qwen3moe


def tensors(c: Config) -> list[TensorSpec]:
    """Every tensor a qwen3moe file holds (llama-model.cpp, LLM_ARCH_QWEN3MOE), shapes in NumPy order."""
    out = io_tensors()
    for i in range(c.n_layer):
        b = f"blk.{i}."
        out += [spec(b + "attn_norm.weight", "n_embd"), *qk_norm_attention_tensors(b), *routed_expert_tensors(b)]
    return out


def route(logits, k: int, xp=np):
    """Qwen3-MoE routing: softmax over all experts -> top-k -> renormalize the k weights to sum to 1."""
    return softmax_topk(logits, k, xp, renorm=True)


# the same layer as two CPU kernel calls for a decode step, where every tensor of it is on the CPU (moert/fused.py);
# `block` below is its definition and twin
FUSED = QKNormMoE(neox=ROPE_NEOX, renorm=True)


def forward(m, tokens: np.ndarray):
    """Logits (T, n_vocab) for `tokens` (T,) continuing at position m.position; on the output's device."""
    return decoder(m, tokens, block, fused=FUSED)


def block(m, il: int, x):
    """One decoder layer; x (T, D) arrives on any device and leaves on this layer's attention device."""
    c, b = m.config, f"blk.{il}."
    dev = m.attention_device(il)
    xp = dev.xp
    x = m.to(x, dev, "hidden")                                          # (T, D)

    with m.phase("attention", dev):
        h = rms_norm(x, m.w(b + "attn_norm.weight", dev), c.rms_eps, xp)                     # (T, D)
        x = x + qk_norm_attention(m, il, h, dev, c.rope_base, neox=ROPE_NEOX)              # (T, D)

    # router and routed experts (CPU: Numba kernels on the quantized bytes), wherever the plan put them
    _, y = routed_experts(m, il, x, dev, lambda logits: route(logits, c.n_expert_used, xp))    # (T, D) on dev
    return x + y
