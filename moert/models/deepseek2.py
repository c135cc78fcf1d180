"""deepseek2: DeepSeek-V2 / V2-Lite / V3, GLM-4.7-Flash (Kimi-K2 too), as llama.cpp's src/models/deepseek2.cpp.

Per layer: RMSNorm -> multi-head latent attention (MLA) -> residual -> RMSNorm ->
  a dense SwiGLU FFN (the first leading_dense_block_count layers), or
  routed experts (softmax (V2) or sigmoid + selection bias exp_probs_b (V3, GLM), group-limited top-k,
  weights from the unbiased scores, optionally renormalized, times expert_weights_scale) + shared experts
-> residual. Output: RMSNorm -> output.weight.

MLA. The query is attn_q (V2-Lite) or attn_q_b(RMSNorm(attn_q_a h)) (q_lora_rank > 0); per head its first
qk_nope dims carry no position, the last n_rot are rotated (llama.cpp's normal, interleaved-pairs RoPE).
attn_kv_a_mqa makes per token a latent c (kv_lora_rank, then RMSNorm) and ONE rotated key k_pe shared by
all heads. Keys and values of each head are k_b c and v_b c; instead of expanding them, attention is run in
latent space (llama.cpp's absorption): score = (k_b^T q_nope) . c + q_pe . k_pe, output v_b (sum p c). So
the cache holds per token only [c, k_pe]: kv_lora_rank + n_rot floats for all heads (GLM-4.7-Flash: 576,
against 20 * (256 + 256) = 10240 for the full keys and values). attn_k_b / attn_v_b are the split halves
of the older attn_kv_b; files of the old converters (no key_length_mla) hold attn_kv_b only, and run the
same way. A multi-token-prediction block (nextn_predict_layers, GLM-4.7-Flash files of current converters)
is declared, loaded when present and never run, as llama.cpp does without speculative decoding.

YaRN (DeepSeek's rope scaling): llama.cpp cancels the (1 + 0.1 ln factor) magnitude that ggml puts on
cos/sin and scales q.k by mscale^2 instead, mscale = 1 + 0.1 * mscale_all_dim * ln factor (the GGUF key
rope.scaling.yarn_log_multiplier holds 0.1 * mscale_all_dim): transformers' DeepseekV2/V3 softmax scale.

Dimension legend: T tokens, D hidden, H heads, R kv_lora_rank, P n_rot (rope dims), Dn qk_nope, Dv value
head dim, E experts, K used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from moert.config import MoEConfig, key
from moert.kvcache import KVSpec
from moert.layers import latent_attention, rms_norm, rope, softmax
from moert.models.blocks import (
    decoder,
    dense_ffn,
    ffn_tensors,
    routed_expert_tensors,
    routed_experts,
    shared_expert,
)
from moert.models.spec import TensorSpec, io_tensors, spec
from moert.moe import grouped_topk, sigmoid_topk

ROPE_NEOX = False   # llama.cpp: LLAMA_ROPE_TYPE_NORM for deepseek2 (adjacent pairs)
GATING = {1: "softmax", 2: "sigmoid"}   # expert_gating_func (llama.cpp's llama_expert_gating_func_type)


def _gating(f: dict) -> int:
    # llama.cpp: absent means softmax (DeepSeek-V2/V2.5 files predate the key), except GLM-4.7-Flash's
    # first files (47 or 48 layers, vocab 154880), which are sigmoid
    return 2 if f["n_layer"] in (47, 48) and f.get("n_vocab", f["_n_tokens"]) == 154880 else 1


@dataclass(frozen=True)
class Config(MoEConfig):
    """llama.cpp's LLM_ARCH_DEEPSEEK2 hparams; absent keys take llama.cpp's defaults, noted per field."""

    ROPE_SCALINGS = ("none", "yarn")

    n_ff: int = key("{arch}.feed_forward_length", 0, minimum=0)                # dense layers; 0: none
    n_layer_dense_lead: int = key("{arch}.leading_dense_block_count", 0, minimum=0)
    # 0: a plain attn_q (V2-Lite). llama.cpp requires the key except for its "lite" layer counts (26, 27)
    q_lora_rank: int = key("{arch}.attention.q_lora_rank", 0, minimum=0)
    kv_lora_rank: int = key("{arch}.attention.kv_lora_rank", minimum=1)
    # per-head q/k and v sizes; absent (0) in files of the old converters, whose key_length/value_length are these
    head_dim_mla: int = key("{arch}.attention.key_length_mla", 0, minimum=0)
    head_dim_v_mla: int = key("{arch}.attention.value_length_mla", 0, minimum=0)
    n_rot: int = key("{arch}.rope.dimension_count", minimum=2)                 # the decoupled RoPE dims
    n_expert_shared: int = key("{arch}.expert_shared_count", minimum=0)
    expert_weights_scale: float = key("{arch}.expert_weights_scale", 0.0, minimum=0.0)   # 0: no scaling
    expert_weights_norm: bool = key("{arch}.expert_weights_norm", False)
    expert_gating_func: int = key("{arch}.expert_gating_func", _gating, minimum=1, maximum=2)
    n_group: int = key("{arch}.expert_group_count", 0, minimum=0)               # 0, 1: no groups
    n_group_used: int = key("{arch}.expert_group_used_count", 0, minimum=0)
    # GLM-4.7-Flash's multi-token-prediction block, appended after the trunk's layers: kept in the file, not run
    n_nextn: int = key("{arch}.nextn_predict_layers", 0, minimum=0)

    @property
    def n_trunk(self) -> int:
        """The layers a token runs through: block_count less the nextn (MTP) layers, as llama.cpp's n_layer()."""
        return self.n_layer - self.n_nextn

    @property
    def n_embd_x2(self) -> int:
        return 2 * self.n_embd

    @property
    def is_mla(self) -> bool:
        """Whether the file holds the split attn_k_b / attn_v_b (key_length_mla and value_length_mla set)."""
        return self.head_dim_mla > 0 and self.head_dim_v_mla > 0

    @property
    def k_head(self) -> int:
        """q/k size per head: qk_nope + n_rot."""
        return self.head_dim_mla if self.is_mla else self.head_dim

    @property
    def v_head(self) -> int:
        """Value size per head."""
        return self.head_dim_v_mla if self.is_mla else self.head_dim_v

    @property
    def qk_nope(self) -> int:
        return self.k_head - self.n_rot

    @property
    def kv_a_rows(self) -> int:
        return self.kv_lora_rank + self.n_rot

    @property
    def kv_b_rows(self) -> int:
        return self.n_head * (self.qk_nope + self.v_head)

    @property
    def n_ff_shexp(self) -> int:
        return self.n_ff_exp * self.n_expert_shared

    def validate(self) -> None:
        super().validate()
        self._check(self.n_rot % 2 == 0, "rope.dimension_count", f"{self.n_rot} is odd; RoPE rotates pairs")
        self._check(self.qk_nope >= 1, "attention.key_length_mla" if self.is_mla else "attention.key_length",
                    f"the per-head key size {self.k_head} leaves no room beside the {self.n_rot} RoPE dims")
        self._check((self.head_dim_mla > 0) == (self.head_dim_v_mla > 0), "attention.value_length_mla",
                    "key_length_mla and value_length_mla come together (llama.cpp's is_mla)")
        if self.is_mla:      # the converter's MQA view: one KV head of [latent, rope key], values the latent
            self._check(self.head_dim == self.kv_a_rows and self.head_dim_v == self.kv_lora_rank,
                        "attention.key_length", f"key_length {self.head_dim} / value_length {self.head_dim_v} "
                        f"should be kv_lora_rank + rope dims {self.kv_a_rows} / kv_lora_rank {self.kv_lora_rank}")
        self._check(self.n_nextn < self.n_layer, "nextn_predict_layers",
                    f"{self.n_nextn} of block_count {self.n_layer} layers leaves no trunk")
        self._check(self.n_layer_dense_lead <= self.n_layer, "leading_dense_block_count",
                    f"{self.n_layer_dense_lead} dense layers but block_count {self.n_layer}")
        self._check(self.n_ff >= 1 or self.n_layer_dense_lead == 0, "feed_forward_length",
                    "missing (or 0) but the model has leading dense layers")
        if self.n_group > 1:
            self._check(self.n_expert % self.n_group == 0, "expert_group_count",
                        f"expert_count {self.n_expert} is not a multiple of {self.n_group} groups")
            self._check(1 <= self.n_group_used <= self.n_group and
                        self.n_expert_used <= self.n_group_used * (self.n_expert // self.n_group),
                        "expert_group_used_count", f"{self.n_group_used} groups of {self.n_expert // self.n_group} "
                        f"experts cannot supply expert_used_count {self.n_expert_used}")

    def kv_spec(self) -> KVSpec:
        """The latent cache: per trunk layer and token one 'head' of kv_lora_rank + n_rot, no separate V."""
        return KVSpec(self.n_trunk, 1, self.kv_a_rows, 0)

    def rope_and_scale(self):
        """(the rope's layers.Yarn or None, the q.k scale), as llama.cpp's deepseek2 graph: with YaRN the rope
        magnitude is attn_factor and q.k is scaled by mscale^2 / sqrt(k_head), mscale = attn_factor * (1 + 0.1
        mscale_all_dim ln factor); without yarn_log_multiplier, both are attn_factor * (1 + 0.1 ln factor)."""
        y = self.yarn()
        if y is None:
            return None, 1.0 / math.sqrt(self.k_head)
        a, log_mul = self.yarn_attn_factor, self.yarn_log_multiplier / 0.1     # the key holds 0.1 * mscale_all_dim
        rope_m = a if log_mul else a * (1.0 + 0.1 * math.log(y.factor))
        mscale = a * (1.0 + 0.1 * log_mul * math.log(y.factor)) if log_mul else rope_m
        return replace(y, mscale=rope_m), mscale * mscale / math.sqrt(self.k_head)


def tensors(c: Config) -> list[TensorSpec]:
    """Every tensor a deepseek2 file holds (llama.cpp's deepseek2 load_arch_tensors), NumPy order."""
    out = io_tensors()
    for i in range(c.n_layer):
        layer = layer_tensors(c, i)
        if i >= c.n_trunk:          # an MTP block: llama.cpp loads it when present, and never needs it
            b = f"blk.{i}.nextn."
            layer = [replace(s, optional=True) for s in layer] + [
                spec(b + "eh_proj.weight", "n_embd", "n_embd_x2", optional=True),
                *(spec(b + n, "n_embd", optional=True) for n in ("enorm.weight", "hnorm.weight",
                                                                 "shared_head_norm.weight")),
                spec(b + "embed_tokens.weight", "n_vocab", "n_embd", optional=True),
                spec(b + "shared_head_head.weight", "n_vocab", "n_embd", optional=True)]
        out += layer
    return out


def layer_tensors(c: Config, i: int) -> list[TensorSpec]:
    """The tensors of layer i (llama.cpp's deepseek2 load_arch_tensors, one layer), NumPy order."""
    b = f"blk.{i}."
    out = [spec(b + "attn_norm.weight", "n_embd")]
    if c.q_lora_rank:
        out += [spec(b + "attn_q_a.weight", "q_lora_rank", "n_embd"), spec(b + "attn_q_a_norm.weight", "q_lora_rank"),
                spec(b + "attn_q_b.weight", ("n_head", "k_head"), "q_lora_rank")]
    else:
        out.append(spec(b + "attn_q.weight", ("n_head", "k_head"), "n_embd"))
    out += [spec(b + "attn_kv_a_mqa.weight", "kv_a_rows", "n_embd"), spec(b + "attn_kv_a_norm.weight", "kv_lora_rank"),
            # split files may keep the unsplit tensor too (some converters did); llama.cpp ignores it then
            spec(b + "attn_kv_b.weight", "kv_b_rows", "kv_lora_rank", optional=c.is_mla)]
    if c.is_mla:
        out += [spec(b + "attn_k_b.weight", "n_head", "kv_lora_rank", "qk_nope"),
                spec(b + "attn_v_b.weight", "n_head", "v_head", "kv_lora_rank")]
    out.append(spec(b + "attn_output.weight", "n_embd", ("n_head", "v_head")))
    if i < c.n_layer_dense_lead:
        return out + [spec(b + "ffn_norm.weight", "n_embd"), *ffn_tensors(b, "n_ff")]
    out += [*routed_expert_tensors(b), spec(b + "exp_probs_b.bias", "n_expert", optional=True)]
    return out + (ffn_tensors(b, "n_ff_shexp", "_shexp") if c.n_expert_shared else [])


def forward(m, tokens: np.ndarray):
    """Logits (T, n_vocab) for `tokens` (T,) continuing at position m.position; on the host."""
    return decoder(m, tokens, block, n_layer=m.config.n_trunk)


def block(m, il: int, x):
    """One decoder layer; x (T, D) arrives on any device and leaves on this layer's attention device."""
    c, b = m.config, f"blk.{il}."
    dev = m.attention_device(il)
    xp = dev.xp
    x = m.to(x, dev, "hidden")                                          # (T, D)
    with m.phase("attention", dev):
        h = rms_norm(x, m.w(b + "attn_norm.weight", dev), c.rms_eps, xp)
        x = x + mla_attention(m, il, h, dev)
    if il < c.n_layer_dense_lead:
        with m.phase("attention", dev):
            h = rms_norm(x, m.w(b + "ffn_norm.weight", dev), c.rms_eps, xp)                   # (T, D)
        fdev = m.device_of(b + "ffn_up.weight")
        with m.phase("ffn", fdev):
            y = dense_ffn(m, b, m.to(h, fdev, "hidden"), fdev)
        return x + m.to(y, dev, "ffn output")
    bias = m.w(b + "exp_probs_b.bias", dev) if m.has(b + "exp_probs_b.bias") else None
    h, y = routed_experts(m, il, x, dev, lambda logits: route(c, logits, bias, xp))
    if c.n_expert_shared:
        y = y + shared_expert(m, b, h, dev, gated=False)
    return x + y


def router_scores(c: Config, logits: np.ndarray) -> tuple[np.ndarray, str]:
    """What `moert explain` shows of one token's router: every expert's gating score (E,), and how it is made."""
    how = (f"{GATING[c.expert_gating_func]}(ffn_gate_inp . ffn_norm(x)); selection adds exp_probs_b"
           + (f", best {c.n_group_used} of {c.n_group} groups" if c.n_group > 1 else "")
           + (", weights renormalized" if c.expert_weights_norm else "")
           + (f", x {c.expert_weights_scale:g}" if c.expert_weights_scale not in (0, 1) else ""))
    if GATING[c.expert_gating_func] == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits)), how
    return softmax(logits), how


def route(c: Config, logits, bias, xp=np):
    """llama.cpp's build_moe_ffn for deepseek2: softmax or sigmoid scores, selection bias, group-limited top-k,
    weights from the unbiased scores, normalized (expert_weights_norm), times expert_weights_scale."""
    scale = c.expert_weights_scale or 1.0
    groups = (c.n_group, c.n_group_used) if c.n_group > 1 else (1, 1)
    if GATING[c.expert_gating_func] == "sigmoid":
        return sigmoid_topk(logits, c.n_expert_used, bias, xp, c.expert_weights_norm, scale, *groups)
    return grouped_topk(softmax(logits, xp), c.n_expert_used, bias, xp, c.expert_weights_norm, scale, *groups)


def mla_attention(m, il: int, h, dev):
    """Multi-head latent attention on dev: h (T, D), already normed -> attn_output (T, D). Writes this chunk's
    latent and rotated key into layer il's cache."""
    c, b, xp = m.config, f"blk.{il}.", dev.xp
    T, H, R, Dn = h.shape[0], c.n_head, c.kv_lora_rank, c.qk_nope
    if c.q_lora_rank:
        q = m.linear(h, b + "attn_q_a.weight", dev)                                      # (T, q_lora)
        q = rms_norm(q, m.w(b + "attn_q_a_norm.weight", dev), c.rms_eps, xp)
        q = m.linear(q, b + "attn_q_b.weight", dev)                                      # (T, H*(Dn+P))
    else:
        q = m.linear(h, b + "attn_q.weight", dev)                                        # (T, H*(Dn+P))
    q = q.reshape(T, H, c.k_head)
    kv = m.linear(h, b + "attn_kv_a_mqa.weight", dev)                                    # (T, R + P)
    c_kv = rms_norm(xp.ascontiguousarray(kv[:, :R]), m.w(b + "attn_kv_a_norm.weight", dev), c.rms_eps, xp)  # (T, R)
    yarn, scale = c.rope_and_scale()
    cos, sin = m.rope(dev, c.n_rot, c.rope_base, yarn)                                   # (T, P/2) each
    q_pe = rope(xp.ascontiguousarray(q[:, :, Dn:]), cos, sin, ROPE_NEOX, xp)              # (T, H, P)
    k_pe = rope(xp.ascontiguousarray(kv[:, None, R:]), cos, sin, ROPE_NEOX, xp)[:, 0]    # (T, P)
    q_lat = q[:, :, :Dn].transpose(1, 0, 2) @ absorbed(m, b, dev, "k")                   # (H, T, R)
    q = kv = None                           # the temporaries memory.py's estimate counts are the ones alive
    k_cache, _ = m.kv_cache(il)                                                          # (n_ctx, 1, R + P)
    lat = latent_attention(q_lat, q_pe.transpose(1, 0, 2), c_kv, k_pe, k_cache, m.position, scale, xp,
                           kernels=dev.block_kernels())                                  # (H, T, R)
    o = lat @ absorbed(m, b, dev, "v").transpose(0, 2, 1)                                # (H, T, Dv)
    o = xp.ascontiguousarray(o.transpose(1, 0, 2)).reshape(T, H * c.v_head)              # (T, H*Dv)
    return m.linear(o, b + "attn_output.weight", dev)                                    # (T, D)


def absorbed(m, b: str, dev, which: str):
    """One per-head map of the latent on dev: "k" latent-to-key (H, Dn, R), from attn_k_b (stored transposed,
    (H, R, Dn)); "v" latent-to-value (H, Dv, R), attn_v_b; or the halves of each head's rows of attn_kv_b."""
    c = m.config
    if c.is_mla:
        return m.w(b + "attn_k_b.weight", dev).transpose(0, 2, 1) if which == "k" else m.w(b + "attn_v_b.weight", dev)
    kv_b = m.w(b + "attn_kv_b.weight", dev).reshape(c.n_head, c.qk_nope + c.v_head, c.kv_lora_rank)
    return kv_b[:, :c.qk_nope] if which == "k" else kv_b[:, c.qk_nope:]
