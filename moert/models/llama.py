"""llama: Llama 1-3 and Mistral (dense), and Mixtral 8x7B / 8x22B (experts), as llama.cpp's
src/models/llama.cpp runs them.

Per layer: RMSNorm -> GQA attention (RoPE in llama.cpp's normal mode: pairs (2i, 2i+1); the converter
stored q and k rows permuted for it, so the file's rows are used as they are) -> residual -> RMSNorm ->
  dense:   SwiGLU of feed_forward_length (optional biases)
  experts: top-k of the router logits -> softmax over those k -> k SwiGLU experts of feed_forward_length
-> residual. Output: RMSNorm -> output.weight (token_embd.weight when tied).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert.config import Config as BaseConfig
from moert.config import key
from moert.layers import rms_norm
from moert.models.blocks import (
    attention_tensors,
    decoder,
    dense_ffn,
    ffn_tensors,
    gqa_attention,
    routed_expert_tensors,
    routed_experts,
)
from moert.models.spec import TensorSpec, io_tensors, spec
from moert.moe import topk_softmax

ROPE_NEOX = False   # llama.cpp: LLAMA_ROPE_TYPE_NORM for llama


@dataclass(frozen=True)
class Config(BaseConfig):
    """llama.cpp's LLM_ARCH_LLAMA hparams: expert_count absent or 0 is a dense model."""

    n_ff: int = key("{arch}.feed_forward_length", minimum=1)
    n_expert: int = key("{arch}.expert_count", 0, minimum=0)
    n_expert_used: int = key("{arch}.expert_used_count", 0, minimum=0)

    def validate(self) -> None:
        super().validate()
        self._check(self.head_dim % 2 == 0, "attention.key_length",
                    f"key_length {self.head_dim} is odd; RoPE rotates pairs of dimensions")
        if self.n_expert:
            self._check(1 <= self.n_expert_used <= self.n_expert, "expert_used_count",
                        f"expert_used_count {self.n_expert_used} must be 1..expert_count {self.n_expert}")


def tensors(c: Config) -> list[TensorSpec]:
    """Every tensor a llama file holds (llama.cpp's llama load_arch_tensors), NumPy order. rope_freqs
    (Llama 3.1's RoPE factors) is not taken yet: a file with it fails the check by name."""
    out = io_tensors()
    for i in range(c.n_layer):
        b = f"blk.{i}."
        out += [spec(b + "attn_norm.weight", "n_embd"), *attention_tensors(b)]
        if c.n_expert:
            out += routed_expert_tensors(b, "n_ff")
        else:
            out += [spec(b + "ffn_norm.weight", "n_embd"), *ffn_tensors(b, "n_ff", bias=True)]
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
    if not c.n_expert:
        with m.phase("attention", dev):
            h = rms_norm(x, m.w(b + "ffn_norm.weight", dev), c.rms_eps, xp)                   # (T, D)
        fdev = m.device_of(b + "ffn_up.weight")
        with m.phase("ffn", fdev):
            y = dense_ffn(m, b, m.to(h, fdev, "hidden"), fdev)
        return x + m.to(y, dev, "ffn output")
    _, y = routed_experts(m, il, x, dev, lambda logits: topk_softmax(logits, c.n_expert_used, xp))
    return x + y
