"""Make the qwen3moe conformance fixtures: synthetic GGUF models and the logits independent runtimes give.

    python tests/reference/make_qwen3moe_refs.py            # writes tests/fixtures/qwen3moe/

Needs torch + transformers (the float oracle) and, for the llama.cpp references, llama-cpp-python;
the test suite needs none of them: it reads the committed fixtures only.

For each model in MODELS:
  * `moert.testing.write_qwen3moe` writes a small random model (committed as <name>.gguf, so a later
    change to the writer or the quantizers cannot silently change what the logits belong to);
  * every tensor is dequantized to float32 by gguf-py (an implementation independent of moert's),
    mapped to Hugging Face names and loaded into transformers' Qwen3MoeForCausalLM in float32 with
    eager attention; its logits for a fixed 40-token prompt are the oracle (`hf_logits`).
For the llama.cpp models (LLAMA_MODELS), an F32 model is written, quantized by llama.cpp itself to
Q4_K_M (`llama_model_quantize`), and the Q4_K_M file is committed; the oracle runs on its dequantized
weights, and llama.cpp's own logits on the same file are stored as `llama_logits`.

Each <name>.npz holds: tokens (40,) int64, hf_logits (40, V) float32, [llama_logits (40, V) float32],
and the versions that made them.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import rel, versions  # tests/reference/common.py (these files run as scripts)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "qwen3moe"
N_TOKENS = 40

# name -> write_qwen3moe arguments: 2-3 layers, 8-32 experts, top-2..top-8, GQA ratios 1, 2, 4,
# quantized with several GGML types (experts and attention differently), one with a tied output.
MODELS = {
    "l2_e8_k2_gqa2_q8": dict(n_layer=2, n_expert=8, n_expert_used=2, n_head=4, n_head_kv=2, seed=1),
    "l3_e16_k4_gqa4_mixed": dict(n_layer=3, n_expert=16, n_expert_used=4, n_head=8, n_head_kv=2, head_dim=8,
                                 types={r"_exps": "Q4_0", r"attn_(q|k)\.": "F16", r"attn_v": "Q5_0"},
                                 seed=2),
    "l2_e32_k8_gqa1_tied": dict(n_layer=2, n_expert=32, n_expert_used=8, n_head=4, n_head_kv=4, n_ff_exp=16,
                                tied_output=True, types={r"_exps": "Q8_0", r"token_embd": "F16"}, seed=3),
}
# llama.cpp's Q4_K_M needs rows that are multiples of 256 (else it falls back to other types)
LLAMA_MODELS = {
    "l2_e4_k2_gqa2_q4km": dict(n_layer=2, n_expert=4, n_expert_used=2, n_embd=256, n_head=4, n_head_kv=2,
                               head_dim=64, n_ff_exp=256, n_vocab=256, seed=4),
}


def prompt(n_vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(1000 + seed).integers(0, n_vocab, N_TOKENS).astype(np.int64)


# --------------------------------------------------------------------------------------- transformers

def gguf_tensors(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Metadata and every tensor as float32 in NumPy order, dequantized by gguf-py."""
    import gguf

    r = gguf.GGUFReader(str(path))
    md = {}
    for f in r.fields.values():
        if f.types and f.types[0] != gguf.GGUFValueType.ARRAY:
            md[f.name] = f.contents()
    out = {}
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape))                 # GGUF ne -> NumPy order
        out[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    return md, out


def hf_logits(path: Path, tokens: np.ndarray) -> np.ndarray:
    """Logits of transformers' Qwen3MoeForCausalLM (float32, eager attention) on the GGUF's weights."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    md, w = gguf_tensors(path)
    a = md["general.architecture"]
    L, E = md[f"{a}.block_count"], md[f"{a}.expert_count"]
    tied = "output.weight" not in w
    cfg = Qwen3MoeConfig(
        vocab_size=md[f"{a}.vocab_size"], hidden_size=md[f"{a}.embedding_length"],
        intermediate_size=md[f"{a}.feed_forward_length"], num_hidden_layers=L,
        num_attention_heads=md[f"{a}.attention.head_count"],
        num_key_value_heads=md[f"{a}.attention.head_count_kv"], head_dim=md[f"{a}.attention.key_length"],
        max_position_embeddings=md[f"{a}.context_length"], rms_norm_eps=md[f"{a}.attention.layer_norm_rms_epsilon"],
        rope_parameters={"rope_type": "default", "rope_theta": md[f"{a}.rope.freq_base"]},
        moe_intermediate_size=md[f"{a}.expert_feed_forward_length"], num_experts=E,
        num_experts_per_tok=md[f"{a}.expert_used_count"], norm_topk_prob=True,  # llama.cpp always renormalizes
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=tied, attention_bias=False,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()

    sd = {"model.embed_tokens.weight": w["token_embd.weight"], "model.norm.weight": w["output_norm.weight"],
          "lm_head.weight": w["token_embd.weight" if tied else "output.weight"]}
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate"}
    keys = set(model.state_dict())
    for i in range(L):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        for g, n in names.items():
            sd[f"{h}{n}.weight"] = w[f"{b}{g}.weight"]
        gate, up, down = (w[f"{b}ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))  # (E,F,D), (E,D,F)
        if f"{h}mlp.experts.gate_up_proj" in keys:           # transformers >= 5: fused expert tensors
            sd[f"{h}mlp.experts.gate_up_proj"] = np.concatenate([gate, up], axis=1)   # (E, 2F, D)
            sd[f"{h}mlp.experts.down_proj"] = down                                    # (E, D, F)
        else:                                                 # older: one module per expert
            for e in range(E):
                for p, x in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
                    sd[f"{h}mlp.experts.{e}.{p}.weight"] = x[e]
    missing = keys - set(sd) - ({"lm_head.weight"} if tied else set())
    if missing:
        raise SystemExit(f"GGUF -> HF mapping left HF parameters unset: {sorted(missing)[:5]}")
    model.load_state_dict({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in sd.items()}, strict=not tied)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    with torch.no_grad():
        out = model(torch.from_numpy(tokens)[None], use_cache=False).logits[0]
    return out.numpy().astype(np.float32)


# ------------------------------------------------------------------------------------------ llama.cpp

def llama_quantize(src: Path, dst: Path, ftype_name: str = "LLAMA_FTYPE_MOSTLY_Q4_K_M") -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, ftype_name)
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src} -> {dst}) failed with {rc}")


def llama_logits(path: Path, tokens: np.ndarray) -> np.ndarray:
    """llama.cpp's logits for every position (CPU, default settings: F16 KV cache, 8-bit activations)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2,
                          logits_all=True, verbose=False, seed=0)
    llm.reset()
    llm.eval(tokens.tolist())
    out = np.array(llm.scores[:len(tokens)], dtype=np.float32)
    llm.close()
    return out


# ---------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--only", nargs="*", help="model names to (re)make")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp models")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from moert.testing import write_qwen3moe

    args.out.mkdir(parents=True, exist_ok=True)
    meta = {f"version_{k}": np.array(v) for k, v in versions().items()}
    for name, kw in MODELS.items():
        if args.only and name not in args.only:
            continue
        path = write_qwen3moe(args.out / f"{name}.gguf", **kw)
        tokens = prompt(kw.get("n_vocab", 256), kw["seed"])
        hf = hf_logits(path, tokens)
        np.savez_compressed(args.out / f"{name}.npz", tokens=tokens, hf_logits=hf, **meta)
        print(f"{name}: {path.stat().st_size:,} bytes; hf logits {hf.shape}")
    if args.no_llama:
        return
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("llama-cpp-python is not installed: skipping", ", ".join(LLAMA_MODELS))
        return
    for name, kw in LLAMA_MODELS.items():
        if args.only and name not in args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = write_qwen3moe(Path(tmp) / "f32.gguf", qtype="F32", **kw)
            q = Path(tmp) / "q.gguf"
            llama_quantize(src, q)
            path = args.out / f"{name}.gguf"
            shutil.copyfile(q, path)
            tokens = prompt(kw.get("n_vocab", 256), kw["seed"])
            hf_f32 = hf_logits(src, tokens)            # the unquantized model, for information
        hf = hf_logits(path, tokens)                   # the oracle on the very weights llama.cpp runs
        ll = llama_logits(path, tokens)
        np.savez_compressed(args.out / f"{name}.npz", tokens=tokens, hf_logits=hf, llama_logits=ll,
                            hf_f32_logits=hf_f32, **meta)
        agree = float(np.mean(ll.argmax(-1) == hf.argmax(-1)))
        print(f"{name}: {path.stat().st_size:,} bytes; llama.cpp vs hf rel {rel(ll, hf):.2e}, "
              f"top-1 agreement {agree:.2f}; Q4_K_M vs F32 (hf) rel {rel(hf, hf_f32):.2e}")


if __name__ == "__main__":
    main()
