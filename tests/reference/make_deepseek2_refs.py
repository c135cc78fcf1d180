"""Float oracles for deepseek2, both flavours (make_arch_refs.py's pattern): transformers float32, same weights.

    python tests/reference/make_deepseek2_refs.py           # tests/fixtures/arch/deepseek2{,-lite}.gguf and .npz
    python tests/reference/make_deepseek2_refs.py --llama   # ..._q4km.gguf / .npz (needs llama-cpp-python)

Needs torch + transformers; the test suite reads the committed fixtures only (tests/test_architectures.py).
  deepseek2       GLM-4.7-Flash style (q_lora, split attn_k_b / attn_v_b, sigmoid + exp_probs_b, 4 groups of
                  which 2 are used, norm, scale 1.8, YaRN factor 4 with mscale_all_dim 0.707): Glm4MoeLiteForCausalLM
  deepseek2-lite  DeepSeek-V2-Lite style (plain attn_q, attn_kv_b, softmax, two shared experts):
                  DeepseekV2ForCausalLM
Every tensor is dequantized by gguf-py (not by moert) and mapped to the HF parameters; the split attn_k_b
(H, R, Dn) / attn_v_b (H, Dv, R) are put back together into kv_b_proj (H * (Dn + Dv), R), as the converter
split it. llama.cpp's deepseek2 RoPE (normal mode, adjacent pairs) is HF's interleaved / complex RoPE, so q
and k rows need no permutation. HF's q_a / kv_a RMSNorms use eps 1e-6 whatever rms_norm_eps says, so the
TINY files use 1e-6 throughout.

With `--llama`: an F32 model with rows of 256 where llama.cpp's Q4_K needs them, quantized to Q4_K_M by
llama.cpp itself, the oracle on its gguf-py-dequantized weights, and llama.cpp's own logits on the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from common import rel, versions
from make_qwen3moe_refs import gguf_tensors

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "arch"
N_TOKENS = 24
MODELS = {"deepseek2": 15, "deepseek2-lite": 16}          # TINY name -> seed
# for llama.cpp's Q4_K_M: rows of 256 (the embedding, q_lora, kv_lora); the rest falls back to 32-blocks
WIDE = {"deepseek2": {"embedding_length": 256, "attention.q_lora_rank": 256, "attention.kv_lora_rank": 256,
                      "rope.dimension_count": 16, "attention.key_length": 272, "attention.value_length": 256,
                      "attention.key_length_mla": 48, "attention.value_length_mla": 32, "feed_forward_length": 64,
                      "expert_feed_forward_length": 64},
        "deepseek2-lite": {"embedding_length": 256, "attention.kv_lora_rank": 256, "rope.dimension_count": 16,
                           "attention.key_length": 48, "attention.value_length": 32, "feed_forward_length": 64,
                           "expert_feed_forward_length": 64}}


def hf_model(md: dict, w: dict[str, np.ndarray]):
    """Glm4MoeLiteForCausalLM (sigmoid gating) or DeepseekV2ForCausalLM (softmax) with the GGUF's weights."""
    import torch
    import transformers as tf

    a = md["general.architecture"]
    g = lambda k, d=None: md.get(f"{a}.{k}", d)                         # noqa: E731
    L, H = g("block_count"), g("attention.head_count")
    mla = g("attention.key_length_mla") is not None
    Dk, Dv = (g("attention.key_length_mla"), g("attention.value_length_mla")) if mla else \
        (g("attention.key_length"), g("attention.value_length"))
    P, R = g("rope.dimension_count"), g("attention.kv_lora_rank")
    Dn = Dk - P
    rope = {"rope_type": "default", "rope_theta": g("rope.freq_base")}
    if g("rope.scaling.type") == "yarn":
        m_all = g("rope.scaling.yarn_log_multiplier") / 0.1
        rope = {**rope, "rope_type": "yarn", "factor": g("rope.scaling.factor"), "mscale": m_all,
                "mscale_all_dim": m_all, "original_max_position_embeddings": g("rope.scaling.original_context_length"),
                "beta_fast": 32.0, "beta_slow": 1.0}
    common = dict(vocab_size=g("vocab_size"), hidden_size=g("embedding_length"), num_hidden_layers=L,
                  num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=g("context_length"),
                  rms_norm_eps=g("attention.layer_norm_rms_epsilon"), tie_word_embeddings=False, rope_parameters=rope,
                  intermediate_size=g("feed_forward_length"), moe_intermediate_size=g("expert_feed_forward_length"),
                  n_routed_experts=g("expert_count"), num_experts_per_tok=g("expert_used_count"),
                  n_shared_experts=g("expert_shared_count"), kv_lora_rank=R,
                  q_lora_rank=g("attention.q_lora_rank") or None,
                  qk_rope_head_dim=P, qk_nope_head_dim=Dn, v_head_dim=Dv,
                  routed_scaling_factor=g("expert_weights_scale", 1.0), norm_topk_prob=bool(g("expert_weights_norm")))
    dense = g("leading_dense_block_count", 0)
    if g("expert_gating_func") == 2:
        cfg = tf.Glm4MoeLiteConfig(**common, n_group=g("expert_group_count", 1),
                                   topk_group=g("expert_group_used_count", 1),
                                   mlp_layer_types=["dense"] * dense + ["sparse"] * (L - dense), rope_interleave=True)
        cls = tf.Glm4MoeLiteForCausalLM
    else:
        cfg = tf.DeepseekV2Config(**common, first_k_dense_replace=dense, topk_method="greedy")
        cls = tf.DeepseekV2ForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).to(torch.float32).eval()
    keys = set(model.state_dict())
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"],
          "lm_head.weight": w["output.weight"]}
    for i in range(L):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        at = h + "self_attn."
        sd.update({h + "input_layernorm.weight": w[b + "attn_norm.weight"],
                   h + "post_attention_layernorm.weight": w[b + "ffn_norm.weight"],
                   at + "kv_a_proj_with_mqa.weight": w[b + "attn_kv_a_mqa.weight"],
                   at + "kv_a_layernorm.weight": w[b + "attn_kv_a_norm.weight"],
                   at + "o_proj.weight": w[b + "attn_output.weight"]})
        if b + "attn_q.weight" in w:
            sd[at + "q_proj.weight"] = w[b + "attn_q.weight"]
        else:
            sd.update({at + "q_a_proj.weight": w[b + "attn_q_a.weight"],
                       at + "q_a_layernorm.weight": w[b + "attn_q_a_norm.weight"],
                       at + "q_b_proj.weight": w[b + "attn_q_b.weight"]})
        if b + "attn_k_b.weight" in w:          # (H, R, Dn) and (H, Dv, R) back into kv_b_proj's (H*(Dn+Dv), R)
            kb, vb = w[b + "attn_k_b.weight"], w[b + "attn_v_b.weight"]
            sd[at + "kv_b_proj.weight"] = np.concatenate([kb.transpose(0, 2, 1), vb], axis=1).reshape(-1, R)
        else:
            sd[at + "kv_b_proj.weight"] = w[b + "attn_kv_b.weight"]
        if i < dense:
            for p in ("gate", "up", "down"):
                sd[f"{h}mlp.{p}_proj.weight"] = w[f"{b}ffn_{p}.weight"]
            continue
        sd[h + "mlp.gate.weight"] = w[b + "ffn_gate_inp.weight"]
        if h + "mlp.gate.e_score_correction_bias" in keys:
            sd[h + "mlp.gate.e_score_correction_bias"] = w.get(b + "exp_probs_b.bias", np.zeros(g("expert_count")))
        gate, up, down = (w[f"{b}ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
        sd[h + "mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)
        sd[h + "mlp.experts.down_proj"] = down
        for p in ("gate", "up", "down"):
            sd[f"{h}mlp.shared_experts.{p}_proj.weight"] = w[f"{b}ffn_{p}_shexp.weight"]
    missing = keys - set(sd)
    if missing:
        raise SystemExit(f"GGUF -> HF mapping left HF parameters unset: {sorted(missing)[:6]}")
    model.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in sd.items()}, strict=True)
    return model


def hf_logits(path: Path, tokens: np.ndarray) -> np.ndarray:
    import torch

    md, w = gguf_tensors(path)
    with torch.no_grad():
        return hf_model(md, w)(torch.from_numpy(tokens)[None], use_cache=False).logits[0].numpy().astype(np.float32)


def llama_refs(name: str, seed: int) -> None:
    """<name>_q4km.gguf quantized by llama.cpp, with the oracle's and llama.cpp's logits on it."""
    import shutil
    import tempfile

    from make_qwen3moe_refs import llama_logits, llama_quantize

    from moert.testing import TINY, write_tiny

    hp = {**TINY[name]["hparams"], **WIDE[name]}
    tokens = np.random.default_rng(3000 + seed).integers(0, 256, N_TOKENS).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        src = write_tiny(Path(tmp) / "f32.gguf", name, seed=seed, qtype="F32", hparams=hp)
        q = Path(tmp) / "q.gguf"
        llama_quantize(src, q)
        path = OUT / f"{name}_q4km.gguf"
        shutil.copyfile(q, path)
    hf = hf_logits(path, tokens)
    ll = llama_logits(path, tokens)
    np.savez(OUT / f"{name}_q4km.npz", tokens=tokens, hf_logits=hf, llama_logits=ll, **versions())
    print(f"{name}_q4km: {path.stat().st_size:,} bytes; llama.cpp vs oracle {rel(ll, hf):.2e}, top-1 agreement "
          f"{float(np.mean(ll.argmax(-1) == hf.argmax(-1))):.2f}", file=sys.stderr)


def main() -> int:
    from moert.testing import write_tiny

    OUT.mkdir(parents=True, exist_ok=True)
    for name, seed in MODELS.items():
        if "--llama" in sys.argv:
            llama_refs(name, seed)
            continue
        path = write_tiny(OUT / f"{name}.gguf", name, seed=seed)
        tokens = np.random.default_rng(2000 + seed).integers(0, 256, N_TOKENS).astype(np.int64)
        logits = hf_logits(path, tokens)
        np.savez(OUT / f"{name}.npz", tokens=tokens, hf_logits=logits, **versions())
        print(f"{name}: {path.stat().st_size:,} bytes, logits {logits.shape}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
