"""Float oracles for the architecture family: transformers in float32 on the same weights, per architecture.

    python tests/reference/make_arch_refs.py [NAME ...]          # tests/fixtures/arch/<name>.gguf and .npz
    python tests/reference/make_arch_refs.py --llama [NAME ...]  # <name>_q4km (gpt-oss: _mxfp4) .gguf and .npz

Needs torch + transformers; the test suite reads the committed fixtures only (tests/test_architectures.py).
For each TINY model of moert.testing (llama with experts = Mixtral's layout, dense llama, qwen2moe, olmoe,
gpt-oss with MXFP4 experts) a small random GGUF is written (Q8_0 matrices, committed), every tensor is
dequantized by gguf-py (not by moert) and mapped to the Hugging Face class of that family (MixtralForCausalLM,
LlamaForCausalLM, Qwen2MoeForCausalLM, OlmoeForCausalLM, GptOssForCausalLM; eager attention, float32); its
logits for a fixed prompt are the oracle. llama.cpp stores llama q/k rows permuted for its RoPE mode: they are
un-permuted here for HF.

With llama-cpp-python importable (`--llama`), each family also gets <name>_q4km.gguf: an F32 model written
here with rows of 256, quantized to Q4_K_M by llama.cpp itself (llama_model_quantize), the oracle run on
its gguf-py-dequantized weights, and llama.cpp's own logits on the file (`llama_logits`). gpt-oss gets
<name>_mxfp4.gguf instead: the F32 model quantized to MXFP4_MOE by llama.cpp (experts MXFP4, other matrices
Q8_0), as ggml-org's gpt-oss GGUFs are.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from common import versions
from make_qwen3moe_refs import gguf_tensors

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "arch"
N_TOKENS = 24
MODELS = {"llama": 11, "llama-dense": 12, "qwen2moe": 13, "olmoe": 14, "gpt-oss": 15}     # TINY name -> seed
# for llama.cpp's Q4_K_M every row must be a multiple of 256 (else it falls back to other types)
WIDE = {"embedding_length": 256, "attention.key_length": 64, "attention.value_length": 64,
        "feed_forward_length": 256, "expert_feed_forward_length": 256, "expert_shared_feed_forward_length": 256}


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf.py's LlamaModel.permute of q/k rows (for llama.cpp's normal RoPE mode)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_model(name: str, md: dict, w: dict[str, np.ndarray]):
    """The transformers model of this family with the GGUF's weights."""
    import torch
    import transformers as tf

    a = md["general.architecture"]
    g = lambda k, d=None: md.get(f"{a}.{k}", d)                         # noqa: E731
    L, H, Hk = g("block_count"), g("attention.head_count"), g("attention.head_count_kv")
    common = dict(vocab_size=g("vocab_size"), hidden_size=g("embedding_length"), num_hidden_layers=L,
                  num_attention_heads=H, num_key_value_heads=Hk, max_position_embeddings=g("context_length"),
                  rms_norm_eps=g("attention.layer_norm_rms_epsilon"), tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": g("rope.freq_base")})
    if name == "llama":
        cfg = tf.MixtralConfig(**common, intermediate_size=g("feed_forward_length"),
                               num_local_experts=g("expert_count"), num_experts_per_tok=g("expert_used_count"))
        cls, moe = tf.MixtralForCausalLM, "mlp"
    elif name == "llama-dense":
        cfg = tf.LlamaConfig(**common, intermediate_size=g("feed_forward_length"))
        cls, moe = tf.LlamaForCausalLM, None
    elif name == "qwen2moe":
        cfg = tf.Qwen2MoeConfig(**common, intermediate_size=g("feed_forward_length"),
                                moe_intermediate_size=g("expert_feed_forward_length"),
                                shared_expert_intermediate_size=g("expert_shared_feed_forward_length"),
                                num_experts=g("expert_count"), num_experts_per_tok=g("expert_used_count"),
                                norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])
        cls, moe = tf.Qwen2MoeForCausalLM, "mlp"
    elif name == "gpt-oss":
        # YaRN as gpt-oss's published config has it (truncate False); the rest from the GGUF keys
        rope = {"rope_type": "yarn", "rope_theta": g("rope.freq_base"), "factor": g("rope.scaling.factor"),
                "beta_fast": g("rope.scaling.yarn_beta_fast", 32.0), "beta_slow": g("rope.scaling.yarn_beta_slow", 1.0),
                "original_max_position_embeddings": g("rope.scaling.original_context_length"), "truncate": False}
        cfg = tf.GptOssConfig(**{**common, "rope_parameters": rope}, head_dim=g("attention.key_length"),
                              intermediate_size=g("expert_feed_forward_length"), num_local_experts=g("expert_count"),
                              num_experts_per_tok=g("expert_used_count"), sliding_window=g("attention.sliding_window"),
                              attention_bias=True)
        cls, moe = tf.GptOssForCausalLM, "gpt-oss"
    else:
        cfg = tf.OlmoeConfig(**common, intermediate_size=g("feed_forward_length"), num_experts=g("expert_count"),
                             num_experts_per_tok=g("expert_used_count"), norm_topk_prob=False)
        cls, moe = tf.OlmoeForCausalLM, "mlp"
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).to(torch.float32).eval()
    keys = set(model.state_dict())
    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"],
          "lm_head.weight": w["output.weight"]}
    for i in range(L):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        q, k = w[f"{b}attn_q.weight"], w[f"{b}attn_k.weight"]
        if a == "llama":
            q, k = unpermute(q, H), unpermute(k, Hk)
        sd.update({f"{h}input_layernorm.weight": w[f"{b}attn_norm.weight"],
                   f"{h}post_attention_layernorm.weight": w.get(f"{b}ffn_norm.weight",
                                                               w.get(f"{b}post_attention_norm.weight")),
                   f"{h}self_attn.q_proj.weight": q, f"{h}self_attn.k_proj.weight": k,
                   f"{h}self_attn.v_proj.weight": w[f"{b}attn_v.weight"],
                   f"{h}self_attn.o_proj.weight": w[f"{b}attn_output.weight"]})
        for p, hp in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")):
            if f"{b}attn_{p}.bias" in w:
                sd[f"{h}self_attn.{hp}_proj.bias"] = w[f"{b}attn_{p}.bias"]
        if moe == "gpt-oss":
            sd[f"{h}self_attn.sinks"] = w[f"{b}attn_sinks.weight"]
            sd[f"{h}mlp.router.weight"] = w[f"{b}ffn_gate_inp.weight"]
            sd[f"{h}mlp.router.bias"] = w[f"{b}ffn_gate_inp.bias"]
            gate, up, down = (w[f"{b}ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))  # (E,F,D), (E,D,F)
            gb, ub = w[f"{b}ffn_gate_exps.bias"], w[f"{b}ffn_up_exps.bias"]                   # (E, F)
            E, F, D = gate.shape
            gu = np.empty((E, D, 2 * F), np.float32)                   # HF: (E, D, 2F), gate and up interleaved
            gu[..., 0::2], gu[..., 1::2] = gate.transpose(0, 2, 1), up.transpose(0, 2, 1)
            gub = np.empty((E, 2 * F), np.float32)
            gub[:, 0::2], gub[:, 1::2] = gb, ub
            sd.update({f"{h}mlp.experts.gate_up_proj": gu, f"{h}mlp.experts.gate_up_proj_bias": gub,
                       f"{h}mlp.experts.down_proj": down.transpose(0, 2, 1),
                       f"{h}mlp.experts.down_proj_bias": w[f"{b}ffn_down_exps.bias"]})
            continue
        if a == "olmoe":
            sd[f"{h}self_attn.q_norm.weight"] = w[f"{b}attn_q_norm.weight"]
            sd[f"{h}self_attn.k_norm.weight"] = w[f"{b}attn_k_norm.weight"]
        if moe is None:
            for p in ("gate", "up", "down"):
                sd[f"{h}mlp.{p}_proj.weight"] = w[f"{b}ffn_{p}.weight"]
            continue
        gate_key = next(k2 for k2 in keys if k2.startswith(h) and k2.endswith(".gate.weight") and "shared" not in k2)
        sd[gate_key] = w[f"{b}ffn_gate_inp.weight"]
        gate, up, down = (w[f"{b}ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))    # (E,F,D), (E,D,F)
        pre = gate_key[: -len("gate.weight")] + "experts."
        if pre + "gate_up_proj" in keys:                      # transformers >= 5: fused expert tensors
            sd[pre + "gate_up_proj"] = np.concatenate([gate, up], axis=1)
            sd[pre + "down_proj"] = down
        else:
            for e in range(gate.shape[0]):
                for p, x in (("w1", gate), ("w3", up), ("w2", down)) if pre + "0.w1.weight" in keys else \
                        (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
                    sd[f"{pre}{e}.{p}.weight"] = x[e]
        if a == "qwen2moe":
            for p in ("gate", "up", "down"):
                sd[f"{h}mlp.shared_expert.{p}_proj.weight"] = w[f"{b}ffn_{p}_shexp.weight"]
            sd[f"{h}mlp.shared_expert_gate.weight"] = w[f"{b}ffn_gate_inp_shexp.weight"].reshape(1, -1)
    missing = keys - set(sd)
    if missing:
        raise SystemExit(f"{name}: GGUF -> HF mapping left HF parameters unset: {sorted(missing)[:6]}")
    model.load_state_dict({k2: torch.from_numpy(np.array(v, dtype=np.float32)) for k2, v in sd.items()}, strict=True)
    return model


def hf_logits(name: str, path: Path, tokens: np.ndarray) -> np.ndarray:
    import torch

    md, w = gguf_tensors(path)
    with torch.no_grad():
        return hf_model(name, md, w)(torch.from_numpy(tokens)[None], use_cache=False).logits[0].numpy()


def llama_refs(name: str, seed: int) -> None:
    """<name>_q4km.gguf (gpt-oss: _mxfp4) quantized by llama.cpp, with the oracle's and llama.cpp's logits on it."""
    import shutil
    import tempfile

    from make_qwen3moe_refs import llama_logits, llama_quantize

    from moert.testing import TINY, write_tiny

    hp = {**TINY[name]["hparams"], **{k: v for k, v in WIDE.items() if k in TINY[name]["hparams"]
                                      or k in ("embedding_length", "attention.key_length")}}
    quant, ftype = "q4km", "LLAMA_FTYPE_MOSTLY_Q4_K_M"
    if name == "gpt-oss":        # MXFP4 blocks are 32 wide: no need to widen; twice TINY's width, as a real one
        hp, quant, ftype = {**TINY[name]["hparams"], "embedding_length": 128}, "mxfp4", "LLAMA_FTYPE_MOSTLY_MXFP4_MOE"
    tokens = np.random.default_rng(3000 + seed).integers(0, 256, N_TOKENS).astype(np.int64)
    with tempfile.TemporaryDirectory() as tmp:
        src = write_tiny(Path(tmp) / "f32.gguf", name, seed=seed, qtype="F32", types={}, hparams=hp)
        q = Path(tmp) / "q.gguf"
        llama_quantize(src, q, ftype)
        path = OUT / f"{name}_{quant}.gguf"
        shutil.copyfile(q, path)
    hf = hf_logits(name, path, tokens).astype(np.float32)
    ll = llama_logits(path, tokens)
    np.savez(OUT / f"{name}_{quant}.npz", tokens=tokens, hf_logits=hf, llama_logits=ll, **versions())
    print(f"{name}_{quant}: {path.stat().st_size:,} bytes; llama.cpp top-1 agreement "
          f"{float(np.mean(ll.argmax(-1) == hf.argmax(-1))):.2f}", file=sys.stderr)


def main() -> int:
    import torch

    from moert.testing import write_tiny

    OUT.mkdir(parents=True, exist_ok=True)
    only = [a for a in sys.argv[1:] if not a.startswith("--")] or list(MODELS)
    models = {name: seed for name, seed in MODELS.items() if name in only}
    if "--llama" in sys.argv:
        for name, seed in models.items():
            llama_refs(name, seed)
        return 0
    for name, seed in models.items():
        path = write_tiny(OUT / f"{name}.gguf", name, seed=seed)
        md, w = gguf_tensors(path)
        tokens = np.random.default_rng(2000 + seed).integers(0, 256, N_TOKENS).astype(np.int64)
        with torch.no_grad():
            logits = hf_model(name, md, w)(torch.from_numpy(tokens)[None], use_cache=False).logits[0].numpy()
        np.savez(OUT / f"{name}.npz", tokens=tokens, hf_logits=logits.astype(np.float32), **versions())
        print(f"{name}: {path.stat().st_size:,} bytes, logits {logits.shape}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
