"""Model twins: header-accurate GGUF files of real MoE models whose data region is a sparse hole.

    p = moert.zoo.path("qwen3-30b-a3b")          # ~/.cache/moert/zoo/qwen3-30b-a3b-Q4_K_M.gguf, written once
    moert.plan(p, cpu_moe=True, gpu_backend="sim", gpu_memory=["12GiB"])     # plan / fit / predict on it
    moert inspect zoo:gpt-oss-120b ; moert fit zoo:qwen3-235b-a22b --gpu-mem 24GiB --gpu-backend sim

A twin has the real model's metadata keys, tensor names, shapes, GGML types and offsets (names and keys as
llama.cpp's convert_hf_to_gguf.py writes them, src/llama-arch.cpp; shapes from each model's published
config.json; each tensor's type as llama-quantize chooses it for the mix, moert/cost/quant_mix.py). Its data is
never written: the file is `truncate`d to its full length, so a 400 GB twin takes a few kB of disk. It is
marked `moert.twin = true`; `moert.load` refuses it (TwinError). What a twin lacks: the tokenizer arrays
(a few MB of header in the real file) and the chat template.

Size check: the twin's tensor bytes vs the published file of the same quant, GB (1e9 bytes). The published
figures are the Hugging Face listings named in TWINS (recalled, except Mixtral's, re-read 2026-11-23);
tests/test_zoo.py holds the twins to these within 1.5%, the two exceptions to 8%:

    twin                quant       twin GB   published GB   difference
    qwen3-30b-a3b       Q4_K_M        18.55        18.6          -0.3%
    qwen3-235b-a22b     Q4_K_M       142.15       142.7          -0.4%
    gpt-oss-20b         MXFP4_MOE     12.10        12.1          -0.0%
    gpt-oss-120b        MXFP4_MOE     63.37        63.4          -0.0%
    glm-4.7-flash       Q4_K_M        18.24        18.1          +0.8%
    glm-4.5-air         Q4_K_M        72.15        72.9          -1.0%
    deepseek-v3         Q4_K_M       405.06       404.4          +0.2%
    mixtral-8x7b        Q4_K_M        28.45        26.49         +7.4%   (1)
    olmoe-1b-7b         Q4_K_M         4.21         4.21         +0.0%
    qwen1.5-moe-a2.7b   Q4_K_M         9.49         8.84         +7.4%   (2)

(1) The Mixtral files on the Hub (TheBloke, MaziyarPanahi: 26.44-26.49 GB) were quantized in December 2023;
    today's llama-quantize gives ffn_down Q6_K in the use_more_bits layers (+2.0 GB here). Bartowski's
    Mixtral-8x22B Q4_K_M ("about 4.83 bits per weight") shows the current rule: the twin's 8x7B is 4.87 bpw.
(2) Not explained: 1408-wide expert rows are not whole Q4_K/Q6_K blocks, so ffn_down_exps falls back to
    Q5_0/Q8_0 here (llama-quant.cpp's fallback); the published file may differ in that choice.

This year's models (moert/cost/zoo_recent.py; zoo_arch.py has their hybrid and DSA layers):

    qwen3-next-80b-a3b  Q4_K_M        48.48        48.4          +0.2%   79,674,391,296 parameters, exact
    kimi-k2             Q8_0        1091.59      1090 ("1.09TB") +0.1%
    qwen3.5-35b-a3b     Q8_0          36.89        36.903        -0.04%  (3)
    qwen3.5-122b-a10b   Q8_0         129.86       129.872        -0.01%
    minimax-m2          Q8_0         243.13       243.1 (226.4 GiB) +0.0%
    deepseek-v3.2       Q4_K_M       405.67       404.8 (377 GiB) +0.2%
    glm-5               BF16        1507.97      1510 ("1.51TB") -0.1%   and 751.961 B repeating parameters,
    exactly llama.cpp's log of a GLM-5 GGUF, as the others' published counts match (zoo_recent.PARAMS).

(3) Its Q4_K_M twin (21.16 GB) is 4.4% under unsloth's Qwen3.6 Q4_K_M (20.61 GiB), which follows unsloth's own
    per-tensor recipe for Qwen3.5/3.6 rather than llama-quantize's mix; the Q8_0 (one type) matches.

Every mix, on qwen3-30b-a3b against unsloth's files (exact bytes, imatrix=True as unsloth makes them): Q4_0
-0.03%, Q4_K_S -0.03%, Q4_K_M -0.03%, Q5_K_M -0.03%, Q6_K -0.02%, Q8_0 -0.02%, IQ4_XS -0.10%, BF16 -0.01%
(the rest is the tokenizer header the twin lacks).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from moert.cost import zoo_arch
from moert.cost.quant_mix import MIXES, MixError, mix_types, use_more_bits
from moert.cost.zoo_recent import RECENT
from moert.errors import MoertError
from moert.quants.types import ggml_type

ALIGNMENT = 32
TWIN_KEY = "moert.twin"


class ZooError(MoertError, ValueError):
    """An unknown twin name or quant."""


# ------------------------------------------------------------------------------------------ the models

@dataclass(frozen=True)
class Twin:
    """One zoo entry: where its shapes come from, what it builds, and the published file it mirrors."""

    name: str
    arch: str
    source: str                 # the config.json the shapes come from
    quant: str                  # "Q4_K_M" or "MXFP4_MOE"
    published_gb: float         # the size of the published file of that quant (1e9 bytes)
    published: str              # which file
    hp: dict                    # hyperparameters (see _tensors)


def _t(name: str, *shape: int) -> tuple[str, tuple[int, ...]]:
    return name, tuple(shape)


def _tensors(tw: Twin) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor name and NumPy-order shape (GGUF ne reversed), in llama.cpp's names."""
    h = tw.hp
    D, L, V, X, F = h["D"], h["L"], h["V"], h["X"], h["F"]
    out = [_t("token_embd.weight", V, D)]
    for i in range(L):
        b = f"blk.{i}."
        out.append(_t(b + "attn_norm.weight", D))
        if tw.arch in zoo_arch.HYBRID:         # Gated DeltaNet, or gated full attention every interval-th
            out += zoo_arch.hybrid_attention(tw.arch, h, i)
        elif tw.arch in zoo_arch.MLA:          # MLA: low-rank q and compressed kv (+ the decoupled rope key)
            H, ql, kl, nope, rope, vd = h["H"], h["q_lora"], h["kv_lora"], h["nope"], h["rope"], h["vd"]
            out += [_t(b + "attn_q_a_norm.weight", ql), _t(b + "attn_kv_a_norm.weight", kl),
                    _t(b + "attn_q_a.weight", ql, D), _t(b + "attn_q_b.weight", H * (nope + rope), ql),
                    _t(b + "attn_kv_a_mqa.weight", kl + rope, D), _t(b + "attn_k_b.weight", H, kl, nope),
                    _t(b + "attn_v_b.weight", H, vd, kl),
                    _t(b + "attn_output.weight", D, H * vd)]
            out += [] if h.get("no_kv_b") else [_t(b + "attn_kv_b.weight", H * (nope + vd), kl)]  # kv_b unsplit
            out += zoo_arch.indexer(h, i) if h.get("indexer") else []
        else:
            H, Hkv, Dh = h["H"], h["Hkv"], h["Dh"]
            out += [_t(b + "attn_q.weight", H * Dh, D), _t(b + "attn_k.weight", Hkv * Dh, D),
                    _t(b + "attn_v.weight", Hkv * Dh, D), _t(b + "attn_output.weight", D, H * Dh)]
            if h.get("qkv_bias"):
                out += [_t(b + "attn_q.bias", H * Dh), _t(b + "attn_k.bias", Hkv * Dh), _t(b + "attn_v.bias", Hkv * Dh)]
            if h.get("o_bias"):
                out.append(_t(b + "attn_output.bias", D))
            if h.get("qk_norm") == "head":
                out += [_t(b + "attn_q_norm.weight", Dh), _t(b + "attn_k_norm.weight", Dh)]
            elif h.get("qk_norm") == "full":
                out += [_t(b + "attn_q_norm.weight", H * Dh), _t(b + "attn_k_norm.weight", Hkv * Dh)]
            if h.get("sinks"):
                out.append(_t(b + "attn_sinks.weight", H))
        out.append(_t(b + ("post_attention_norm.weight" if h.get("post_norm") else "ffn_norm.weight"), D))
        if i < h.get("dense", 0):              # leading dense layers
            Fd = h["F_dense"]
            out += [_t(b + "ffn_gate.weight", Fd, D), _t(b + "ffn_up.weight", Fd, D), _t(b + "ffn_down.weight", D, Fd)]
            continue
        out.append(_t(b + "ffn_gate_inp.weight", X, D))
        if h.get("router_bias"):
            out.append(_t(b + "ffn_gate_inp.bias", X))
        if h.get("probs_b"):
            out.append(_t(b + "exp_probs_b.bias", X))
        out += [_t(b + "ffn_gate_exps.weight", X, F, D), _t(b + "ffn_up_exps.weight", X, F, D),
                _t(b + "ffn_down_exps.weight", X, D, F)]
        if h.get("exp_bias"):
            out += [_t(b + "ffn_gate_exps.bias", X, F), _t(b + "ffn_up_exps.bias", X, F),
                    _t(b + "ffn_down_exps.bias", X, D)]
        if h.get("F_sh"):
            Fs = h["F_sh"]
            if h.get("shexp_gate"):
                out.append(_t(b + "ffn_gate_inp_shexp.weight", D))
            out += [_t(b + "ffn_gate_shexp.weight", Fs, D), _t(b + "ffn_up_shexp.weight", Fs, D),
                    _t(b + "ffn_down_shexp.weight", D, Fs)]
        if i >= L - h.get("nextn", 0):         # the multi-token-prediction layer (kept in the file, unused)
            out += [_t(b + "nextn.eh_proj.weight", D, 2 * D), _t(b + "nextn.enorm.weight", D),
                    _t(b + "nextn.hnorm.weight", D), _t(b + "nextn.shared_head_norm.weight", D)]
    out += [_t("output_norm.weight", D), _t("output.weight", V, D)]
    return out


def _metadata(tw: Twin) -> dict:
    """GGUF keys as llama.cpp writes them for the architecture (gguf-py constants.py Keys.LLM / Keys.Attention)."""
    h, a = tw.hp, tw.arch
    md: dict = {"general.architecture": a, "general.name": f"{tw.name} (moert twin)", TWIN_KEY: True,
                "general.alignment": ALIGNMENT, "tokenizer.ggml.model": "none",
                f"{a}.block_count": h["L"], f"{a}.context_length": h["ctx"], f"{a}.embedding_length": h["D"],
                f"{a}.feed_forward_length": h.get("ff", h.get("F_dense", h["F"])), f"{a}.attention.head_count": h["H"],
                f"{a}.attention.layer_norm_rms_epsilon": h.get("eps", 1e-6), f"{a}.rope.freq_base": h["rope_base"],
                f"{a}.expert_count": h["X"], f"{a}.expert_used_count": h["K"],
                f"{a}.expert_feed_forward_length": h["F"], f"{a}.vocab_size": h["V"]}
    if a in zoo_arch.MLA:  # the MLA layout of current converters: one KV head of kv_lora + rope
        md.update({f"{a}.attention.head_count_kv": 1, f"{a}.attention.key_length": h["kv_lora"] + h["rope"],
                   f"{a}.attention.value_length": h["kv_lora"], f"{a}.attention.key_length_mla": h["nope"] + h["rope"],
                   f"{a}.attention.value_length_mla": h["vd"], f"{a}.attention.q_lora_rank": h["q_lora"],
                   f"{a}.attention.kv_lora_rank": h["kv_lora"], f"{a}.rope.dimension_count": h["rope"],
                   f"{a}.leading_dense_block_count": h["dense"], f"{a}.expert_shared_count": 1,
                   f"{a}.expert_weights_scale": h["scale"], f"{a}.expert_weights_norm": True,
                   f"{a}.expert_gating_func": 2})
    else:
        md.update({f"{a}.attention.head_count_kv": h["Hkv"], f"{a}.attention.key_length": h["Dh"],
                   f"{a}.attention.value_length": h["Dh"]})
    if h.get("F_sh"):
        md[f"{a}.expert_shared_feed_forward_length"] = h["F_sh"]
        md.setdefault(f"{a}.expert_shared_count", 1)
    md.update(zoo_arch.metadata(a, h))
    if h.get("dense") and a not in zoo_arch.MLA:
        md[f"{a}.leading_dense_block_count"] = h["dense"]
    if h.get("nextn"):
        md[f"{a}.nextn_predict_layers"] = h["nextn"]
    if h.get("groups"):                     # group-limited routing: n_group, topk_group
        md[f"{a}.expert_group_count"], md[f"{a}.expert_group_used_count"] = h["groups"]
    if h.get("yarn"):          # rope_scaling: factor, original_max_position_embeddings, 0.1 * mscale_all_dim
        factor, orig, log_mul = h["yarn"]
        md.update({f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": factor,
                   f"{a}.rope.scaling.original_context_length": orig})
        if log_mul:                             # gpt-oss's converter writes none
            md[f"{a}.rope.scaling.yarn_log_multiplier"] = log_mul
    if h.get("swa"):
        md[f"{a}.attention.sliding_window"] = h["swa"]
    return md


# Each entry cites the config.json its shapes come from; published sizes are the Hugging Face file listings.
TWINS: dict[str, Twin] = {t.name: t for t in (
    # huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json: hidden 2048, 48 layers, 32 q / 4 kv heads of
    # 128, 128 experts (8 used) of 768, vocab 151936, max_position_embeddings 40960, rope_theta 1e6
    Twin("qwen3-30b-a3b", "qwen3moe", "huggingface.co/Qwen/Qwen3-30B-A3B config.json", "Q4_K_M", 18.6,
         "Qwen/Qwen3-30B-A3B-GGUF Qwen3-30B-A3B-Q4_K_M.gguf",
         dict(D=2048, L=48, H=32, Hkv=4, Dh=128, X=128, K=8, F=768, V=151936, ctx=40960, rope_base=1e6,
              qk_norm="head", ff=6144)),
    # huggingface.co/Qwen/Qwen3-235B-A22B config.json: hidden 4096, 94 layers, 64 q / 4 kv heads of 128,
    # 128 experts (8 used) of 1536
    Twin("qwen3-235b-a22b", "qwen3moe", "huggingface.co/Qwen/Qwen3-235B-A22B config.json", "Q4_K_M", 142.7,
         "unsloth/Qwen3-235B-A22B-GGUF Q4_K_M (3 parts)",
         dict(D=4096, L=94, H=64, Hkv=4, Dh=128, X=128, K=8, F=1536, V=151936, ctx=40960, rope_base=1e6,
              qk_norm="head", ff=12288)),
    # huggingface.co/openai/gpt-oss-20b config.json: hidden 2880, 24 layers, 64 q / 8 kv heads of 64,
    # 32 experts (4 used) of 2880, vocab 201088, sliding_window 128, rope_theta 150000, attention sinks, biases,
    # rope_scaling yarn (factor 32, original_max_position_embeddings 4096, beta_fast 32, beta_slow 1)
    Twin("gpt-oss-20b", "gpt-oss", "huggingface.co/openai/gpt-oss-20b config.json", "MXFP4_MOE", 12.1,
         "ggml-org/gpt-oss-20b-GGUF gpt-oss-20b-mxfp4.gguf",
         dict(D=2880, L=24, H=64, Hkv=8, Dh=64, X=32, K=4, F=2880, V=201088, ctx=131072, rope_base=150000.0,
              eps=1e-5, qkv_bias=True, o_bias=True, sinks=True, post_norm=True, router_bias=True, exp_bias=True,
              swa=128, yarn=(32.0, 4096, 0.0))),
    # huggingface.co/openai/gpt-oss-120b config.json: as 20b with 36 layers and 128 experts
    Twin("gpt-oss-120b", "gpt-oss", "huggingface.co/openai/gpt-oss-120b config.json", "MXFP4_MOE", 63.4,
         "ggml-org/gpt-oss-120b-GGUF mxfp4 (3 parts)",
         dict(D=2880, L=36, H=64, Hkv=8, Dh=64, X=128, K=4, F=2880, V=201088, ctx=131072, rope_base=150000.0,
              eps=1e-5, qkv_bias=True, o_bias=True, sinks=True, post_norm=True, router_bias=True, exp_bias=True,
              swa=128, yarn=(32.0, 4096, 0.0))),
    # huggingface.co/zai-org/GLM-4.7-Flash config.json (Glm4MoeLiteForCausalLM, converted as deepseek2):
    # hidden 2048, 47 layers, 20 heads, q_lora 768, kv_lora 512, qk_nope 192 + rope 64, v 256, 64 experts
    # (4 used) of 1536 + 1 shared, first_k_dense_replace 1 (dense 10240), vocab 154880, 202752 positions
    Twin("glm-4.7-flash", "deepseek2", "huggingface.co/zai-org/GLM-4.7-Flash config.json", "Q4_K_M", 18.1,
         "unsloth/GLM-4.7-Flash-GGUF GLM-4.7-Flash-Q4_K_M.gguf",
         dict(D=2048, L=47, H=20, q_lora=768, kv_lora=512, nope=192, rope=64, vd=256, X=64, K=4, F=1536,
              F_sh=1536, F_dense=10240, dense=1, V=154880, ctx=202752, rope_base=1e6, eps=1e-5, scale=1.8,
              probs_b=True)),
    # huggingface.co/zai-org/GLM-4.5-Air config.json: hidden 4096, 46 layers + 1 MTP layer, 96 q / 8 kv heads
    # of 128, attention_bias, 128 experts (8 used) of 1408 + 1 shared, first_k_dense_replace 1 (dense 10944),
    # vocab 151552, 131072 positions
    Twin("glm-4.5-air", "glm4moe", "huggingface.co/zai-org/GLM-4.5-Air config.json", "Q4_K_M", 72.9,
         "unsloth/GLM-4.5-Air-GGUF Q4_K_M (2 parts)",
         dict(D=4096, L=47, H=96, Hkv=8, Dh=128, X=128, K=8, F=1408, F_sh=1408, F_dense=10944, dense=1,
              V=151552, ctx=131072, rope_base=1e6, eps=1e-5, qkv_bias=True, post_norm=True, probs_b=True,
              nextn=1)),
    # huggingface.co/deepseek-ai/DeepSeek-V3 config.json: hidden 7168, 61 layers, 128 heads, q_lora 1536,
    # kv_lora 512, qk_nope 128 + rope 64, v 128, 256 experts (8 used) of 2048 + 1 shared, first_k_dense_replace
    # 3 (dense 18432), vocab 129280, 163840 positions (the MTP layer 61 is not converted); n_group 8,
    # topk_group 4; rope_scaling yarn, factor 40, original_max_position_embeddings 4096, mscale_all_dim 1
    Twin("deepseek-v3", "deepseek2", "huggingface.co/deepseek-ai/DeepSeek-V3 config.json", "Q4_K_M", 404.4,
         "unsloth/DeepSeek-V3-0324-GGUF Q4_K_M (9 parts)",
         dict(D=7168, L=61, H=128, q_lora=1536, kv_lora=512, nope=128, rope=64, vd=128, X=256, K=8, F=2048,
              F_sh=2048, F_dense=18432, dense=3, V=129280, ctx=163840, rope_base=10000.0, scale=2.5,
              probs_b=True, groups=(8, 4), yarn=(40.0, 4096, 0.1))),
    # huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, 32 layers, 32 q / 8 kv heads of 128,
    # 8 experts (2 used) of 14336, vocab 32000, rope_theta 1e6
    Twin("mixtral-8x7b", "llama", "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json", "Q4_K_M", 26.49,
         "MaziyarPanahi/Mixtral-8x7B-Instruct-v0.1-GGUF Q4_K_M",
         dict(D=4096, L=32, H=32, Hkv=8, Dh=128, X=8, K=2, F=14336, V=32000, ctx=32768, rope_base=1e6,
              eps=1e-5)),
    # huggingface.co/allenai/OLMoE-1B-7B-0924 config.json: hidden 2048, 16 layers, 16 heads of 128, 64 experts
    # (8 used) of 1024, vocab 50304, q/k RMSNorm over the whole projection
    Twin("olmoe-1b-7b", "olmoe", "huggingface.co/allenai/OLMoE-1B-7B-0924 config.json", "Q4_K_M", 4.21,
         "allenai/OLMoE-1B-7B-0924-Instruct-GGUF Q4_K_M",
         dict(D=2048, L=16, H=16, Hkv=16, Dh=128, X=64, K=8, F=1024, V=50304, ctx=4096, rope_base=10000.0,
              eps=1e-5, qk_norm="full")),
    # huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json: hidden 2048, 24 layers, 16 heads of 128, 60 experts
    # (4 used) of 1408, a shared expert of 5632 with a sigmoid gate, q/k/v biases, vocab 151936
    Twin("qwen1.5-moe-a2.7b", "qwen2moe", "huggingface.co/Qwen/Qwen1.5-MoE-A2.7B config.json", "Q4_K_M", 8.84,
         "Qwen/Qwen1.5-MoE-A2.7B-Chat-GGUF qwen1_5-moe-a2_7b-chat-q4_k_m.gguf",
         dict(D=2048, L=24, H=16, Hkv=16, Dh=128, X=60, K=4, F=1408, F_sh=5632, V=151936, ctx=8192,
              rope_base=1e6, qkv_bias=True, shexp_gate=True, ff=5632)),
)}
TWINS.update({r[0]: Twin(*r) for r in RECENT})          # this year's models (moert/cost/zoo_recent.py)


def names() -> list[str]:
    """The zoo's model names."""
    return list(TWINS)


def layout(name: str | Twin, quant: str | None = None, imatrix: bool = False) -> list[tuple[str, str, tuple[int, ...]]]:
    """(tensor name, GGML type, NumPy shape) of a twin (a name or a Twin) in file order, each tensor's type as
    llama-quantize chooses it for `quant` (moert/cost/quant_mix.py; imatrix: as made with an importance matrix)."""
    tw = name if isinstance(name, Twin) else _twin(name)
    try:
        h = tw.hp
        n_gqa = h["H"] / (1 if tw.arch in zoo_arch.MLA else h["Hkv"])       # MLA: one KV head
        return mix_types(_tensors(tw), quant or tw.quant, h["X"], n_gqa, h["L"], imatrix)
    except MixError as e:
        raise ZooError(str(e)) from None


def nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor of `type_name` and NumPy shape."""
    t = ggml_type(type_name)
    n = 1
    for s in shape:
        n *= s
    return n // t.block_size * t.type_size


def data_bytes(name: str, quant: str | None = None) -> int:
    """Total tensor bytes of a twin (what the data region holds, padding aside)."""
    return sum(nbytes(t, s) for _, t, s in layout(name, quant))


def twin(name: str, layers: int | None = None) -> Twin:
    """The zoo entry `name`; layers=N: the same model cut to its first N layers (block_count N)."""
    key = name.lower().removeprefix("zoo:")
    if key not in TWINS:
        raise ZooError(f"no zoo model {name!r}; the zoo has: {', '.join(TWINS)}")
    tw, L = TWINS[key], TWINS[key].hp["L"]
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= L):
        raise ZooError(f"layers={layers!r}: {tw.name} has {L} layers; give 1..{L}")
    return tw if layers is None else replace(tw, hp={**tw.hp, "L": layers})


_twin = twin


def cache_dir() -> Path:
    """The zoo's folder: $MOERT_CACHE/zoo, else ~/.cache/moert/zoo."""
    from moert.demo import cache_dir as moert_cache

    return moert_cache() / "zoo"


def path(name: str, quant: str | None = None, folder: str | os.PathLike | None = None) -> Path:
    """The twin's GGUF path, written on first use (header only; the data region is a sparse hole). The name
    carries a hash of the twin's keys and tensors, so a moert that describes a twin differently never reads
    an older one from the cache."""
    import hashlib

    tw, q = _twin(name), (quant or _twin(name).quant).upper()
    tag = hashlib.sha256(repr((sorted(_metadata(tw).items()), layout(name, q))).encode()).hexdigest()[:8]
    p = Path(folder or cache_dir()) / f"{tw.name}-{q}-{tag}.gguf"
    if not p.exists():
        write_twin(p, tw, q)
    return p


def resolve(model: str) -> str:
    """A model argument as given, or the twin's path for "zoo:NAME" (the CLI's commands call this)."""
    if isinstance(model, str) and model.startswith("zoo:"):
        base, _, q = model[4:].partition("@")
        return str(path(base, q or None))
    return model


# ----------------------------------------------------------------------------------------- the writer

def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def _kv(key: str, v) -> bytes:
    if isinstance(v, bool):
        return _str(key) + struct.pack("<IB", 7, v)
    if isinstance(v, int):
        return _str(key) + struct.pack("<II", 4, v)                 # UINT32, as llama.cpp writes counts
    if isinstance(v, float):
        return _str(key) + struct.pack("<If", 6, v)
    return _str(key) + struct.pack("<I", 8) + _str(str(v))


def header(tw: Twin, quant: str, **keys) -> tuple[bytes, list[tuple[str, str, tuple[int, ...], int]]]:
    """The GGUF header of a twin (metadata, tensor infos with aligned offsets, padded to the alignment), with
    `keys` added to or replacing its metadata, and its tensors as (name, type, shape, offset in the data)."""
    md = _metadata(tw)
    md["general.file_type"] = MIXES[quant][1]                  # llama.h LLAMA_FTYPE_MOSTLY_*
    md.update(keys)
    tensors = layout(tw, quant)
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(md)))
    for k, v in md.items():
        head += _kv(k, v)
    offset, placed = 0, []
    for n, t, shape in tensors:
        ne = tuple(reversed(shape))
        head += _str(n) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        head += struct.pack("<IQ", ggml_type(t).id, offset)
        placed.append((n, t, shape, offset))
        offset += -(-nbytes(t, shape) // ALIGNMENT) * ALIGNMENT
    head += b"\0" * (-len(head) % ALIGNMENT)
    return bytes(head), placed


def write_twin(p: str | os.PathLike, tw: Twin, quant: str) -> Path:
    """Write the header (metadata, tensor infos with aligned offsets), then extend the file to full length."""
    p = Path(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    head, placed = header(tw, quant)
    n, t, shape, offset = placed[-1]
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(head)
        f.truncate(len(head) + offset + -(-nbytes(t, shape) // ALIGNMENT) * ALIGNMENT)   # a hole: no data blocks
    tmp.replace(p)
    return p


__all__ = ["TWINS", "TWIN_KEY", "Twin", "ZooError", "cache_dir", "data_bytes", "header", "layout", "names", "path",
           "resolve", "twin", "use_more_bits", "write_twin"]
