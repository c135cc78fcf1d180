"""Synthetic GGUF models for tests, demos and benchmarks, written with gguf-py's GGUFWriter.

Names and metadata keys are llama.cpp's, so placement rules, `moert inspect` and llama.cpp itself
all see an ordinary model. Everything is deterministic from `seed`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

# llama.cpp keeps these in F32 whatever the file type (norms; the MoE router, see llama-quant.cpp)
_ALWAYS_F32 = re.compile(r"_norm\.weight$|ffn_gate_inp\.weight$")

# When a row length is not a multiple of the block size, llama.cpp's quantizer falls back to a
# 32-block type (llama-quant.cpp, "fallback quantization"); then to F16.
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_0", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}


def tensor_type(name: str, shape: tuple[int, ...], qtype: str, types: Mapping[str, str] | None) -> str:
    """The GGML type a tensor is written in: first matching `types` regex, else `qtype`; norms/router F32."""
    from moert.quants import ggml_type

    if _ALWAYS_F32.search(name) or len(shape) == 1:
        return "F32"
    chosen = next((t for pat, t in (types or {}).items() if re.search(pat, name)), qtype)
    while shape[-1] % ggml_type(chosen).block_size:
        chosen = _FALLBACK.get(chosen, "F16")
    return chosen


def encode(x: np.ndarray, type_name: str) -> np.ndarray:
    """Float32 array -> what GGUFWriter stores: F32/F16 arrays, or uint8 bytes shaped (..., row_bytes)."""
    if type_name == "F32":
        return np.ascontiguousarray(x, dtype=np.float32)
    if type_name == "F16":
        return np.ascontiguousarray(x, dtype=np.float16)
    try:
        from moert.quants import quantize
    except ImportError:  # TEMPORARY until moert.quants.quantize lands
        import gguf.quants

        x = np.ascontiguousarray(x, dtype=np.float32)
        return gguf.quants.quantize(x, gguf.GGMLQuantizationType[type_name])
    return quantize(np.ascontiguousarray(x, dtype=np.float32), type_name)


def write_gguf(
    path: str | Path,
    arch: str,
    metadata: Mapping[str, object],
    tensors: Iterable[tuple[str, np.ndarray, str]],
) -> Path:
    """Write a GGUF file: `tensors` yields (name, float32 array in NumPy order, GGML type name)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    for key, value in metadata.items():
        if key == "general.architecture":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))
    for name, array, type_name in tensors:
        data = encode(array, type_name)
        if type_name in ("F32", "F16"):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(path)  # atomic: a half-written model never sits at `path`
    return path


def write_qwen3moe(
    path: str | Path,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_expert: int = 8,
    n_expert_used: int = 2,
    n_ff_exp: int = 32,
    n_vocab: int = 256,
    context_length: int = 512,
    rope_base: float = 1e6,
    rms_eps: float = 1e-6,
    qtype: str = "Q8_0",
    types: Mapping[str, str] | None = None,
    tied_output: bool = False,
    seed: int = 0,
) -> Path:
    """A small random qwen3moe model (Qwen3-30B-A3B's layout) with llama.cpp's names and keys."""
    rng = np.random.default_rng(seed)
    a = "qwen3moe"
    metadata = {
        "general.name": f"synthetic-{a}-L{n_layer}-E{n_expert}-K{n_expert_used}",
        f"{a}.block_count": n_layer,
        f"{a}.context_length": context_length,
        f"{a}.embedding_length": n_embd,
        f"{a}.feed_forward_length": n_ff_exp * n_expert_used,
        f"{a}.expert_feed_forward_length": n_ff_exp,
        f"{a}.expert_count": n_expert,
        f"{a}.expert_used_count": n_expert_used,
        f"{a}.attention.head_count": n_head,
        f"{a}.attention.head_count_kv": n_head_kv,
        f"{a}.attention.key_length": head_dim,
        f"{a}.attention.value_length": head_dim,
        f"{a}.attention.layer_norm_rms_epsilon": float(rms_eps),
        f"{a}.rope.freq_base": float(rope_base),
        f"{a}.vocab_size": n_vocab,
        "tokenizer.ggml.model": "none",
    }

    def mat(*shape: int, scale: float | None = None) -> np.ndarray:
        scale = shape[-1] ** -0.5 if scale is None else scale
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def gen():
        yield "token_embd.weight", mat(n_vocab, n_embd, scale=1.0)
        for i in range(n_layer):
            b = f"blk.{i}."
            yield b + "attn_norm.weight", norm(n_embd)
            yield b + "attn_q.weight", mat(n_head * head_dim, n_embd)
            yield b + "attn_k.weight", mat(n_head_kv * head_dim, n_embd)
            yield b + "attn_v.weight", mat(n_head_kv * head_dim, n_embd)
            yield b + "attn_output.weight", mat(n_embd, n_head * head_dim)
            yield b + "attn_q_norm.weight", norm(head_dim)
            yield b + "attn_k_norm.weight", norm(head_dim)
            yield b + "ffn_norm.weight", norm(n_embd)
            yield b + "ffn_gate_inp.weight", mat(n_expert, n_embd, scale=1.0)
            yield b + "ffn_gate_exps.weight", mat(n_expert, n_ff_exp, n_embd)
            yield b + "ffn_up_exps.weight", mat(n_expert, n_ff_exp, n_embd)
            yield b + "ffn_down_exps.weight", mat(n_expert, n_embd, n_ff_exp)
        yield "output_norm.weight", norm(n_embd)
        if not tied_output:
            yield "output.weight", mat(n_vocab, n_embd)

    tensors = ((name, x, tensor_type(name, x.shape, qtype, types)) for name, x in gen())
    return write_gguf(path, a, metadata, tensors)
