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
    from moert.quants import quantize

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
    vocab: Mapping[str, object] | None = None,
) -> Path:
    """A small random qwen3moe model (Qwen3-30B-A3B's layout) with llama.cpp's names and keys.

    `vocab`: tokenizer.ggml.* keys (e.g. `gpt2_vocab_metadata()`); n_vocab then follows its token list.
    """
    rng = np.random.default_rng(seed)
    a = "qwen3moe"
    if vocab is not None:
        n_vocab = len(vocab["tokenizer.ggml.tokens"])
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
        **(vocab or {}),
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


# A small built-in corpus for `gpt2_vocab_metadata`: prose, code, numbers and several scripts, so the
# trained merges cover multi-byte characters too. Changing it changes every synthetic vocabulary.
VOCAB_CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs into the forest.
A mixture of experts sends each token to a few experts, and the router decides which ones.
The capital of France is Paris. The capital of Germany is Berlin. The capital of Japan is Tokyo.
Once upon a time, there was a small model that wanted to read every file it was given.
It read the header, then the tensors, then it placed them on the devices it could find.
"Hello, world!" she said. 'It's fine,' he replied, "we'll see what they've done."
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 65536 3.14159 2.71828 -17 +23 1,234,567.
Dates: 2024-01-15, 1999-12-31, 12:30:45. Prices: $19.99, EUR 5.00, 100% of 7/8.
def forward(self, x):
    h = self.norm(x)
    for layer in self.layers:
        h = layer(h) + h
    return self.output(h)

if __name__ == "__main__":
\tprint("tabs\tand\tnewlines")
\treturn {"key": [1, 2, 3], "value": None}

Café, naïve, façade, résumé, déjà vu, crème brûlée, São Paulo, Zürich, Ærø, Øresund, Łódź, Škoda.
Über die Brücke gehen die Mädchen; das Wetter ist schön. El niño comió piña en la mañana.
Tiếng Việt có nhiều dấu: ă â ê ô ơ ư đ. Ελληνικά γράμματα: α β γ δ ε. Русский язык: привет, мир.
中文：你好，世界。我们今天学习分词器。日本語：こんにちは、世界。カタカナとひらがな。
한국어: 안녕하세요, 세계. العربية: مرحبا بالعالم. עברית: שלום עולם. हिन्दी: नमस्ते दुनिया।
Emoji: 😀 😂 🎉 👍 🚀 ❤️ 🇫🇷 👨‍👩‍👧 — and dashes – or … ellipses.
    indented    text   with     runs of     spaces
and blank lines


and trailing spaces\x20\x20\x20
"""

# Qwen's ChatML, without its default system prompt.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def gpt2_vocab_metadata(n_vocab: int = 1024, pre: str = "qwen2", corpus: str = VOCAB_CORPUS) -> dict[str, object]:
    """A small Qwen-style byte-level BPE vocabulary, trained with HF tokenizers, as tokenizer.ggml.* keys.

    Deterministic: the same arguments give the same tokens and merges. Layout as llama.cpp's converter
    writes Qwen: the BPE tokens, then the specials (<|endoftext|> = BOS/pad, <|im_start|>, <|im_end|> = EOS,
    control; <think>, </think>, user-defined), then [PAD{i}] (unused) up to exactly `n_vocab` tokens.
    """
    import json

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

    from moert.text.tokenizer import _PRE_REGEXES, PRE_TOKENIZERS

    specials = [("<|endoftext|>", 3), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4), ("</think>", 4)]
    n_bpe = n_vocab - len(specials)
    if n_bpe < 256:
        raise ValueError(f"n_vocab = {n_vocab} leaves no room for the 256 byte tokens and {len(specials)} specials; "
                         f"use n_vocab >= {256 + len(specials)}")
    tok = Tokenizer(models.BPE())
    regexes = _PRE_REGEXES[PRE_TOKENIZERS[pre][0]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=n_bpe, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [1] * len(tokens) + [t for _, t in specials]
    tokens += [s for s, _ in specials]
    pad = n_vocab - len(tokens)
    tokens += [f"[PAD{len(tokens) + i}]" for i in range(pad)]
    types += [5] * pad
    ids = {t: i for i, t in enumerate(tokens)}
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,  # plain ints: write_gguf stores them as an INT32 array
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.eos_token_id": ids["<|im_end|>"],
        "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"],
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


# ------------------------------------------------------------------- any architecture, from its declaration

def write_arch(path: str | Path, arch: str, hparams: Mapping[str, object], *, optional: Iterable[str] = (),
               tied_output: bool = False, qtype: str = "Q8_0", types: Mapping[str, str] | None = None,
               n_vocab: int = 256, seed: int = 0) -> Path:
    """A small random model of any registered architecture: `hparams` are its GGUF keys without the
    "{arch}." prefix; the tensors are the ones the architecture declares (moert/models/spec.py), optional
    ones only where a regex of `optional` matches their name (output.weight unless tied_output)."""
    from moert import models
    from moert.models.spec import expected_shape

    rng = np.random.default_rng(seed)
    metadata = {"general.name": f"synthetic-{arch}", "general.architecture": arch, "tokenizer.ggml.model": "none",
                f"{arch}.vocab_size": n_vocab, **{f"{arch}.{k}": v for k, v in hparams.items()}}
    module = models.get(arch)
    config = module.Config.from_gguf(metadata)
    want = [re.compile(p) for p in optional] + ([] if tied_output else [re.compile(r"^output\.weight$")])

    def value(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name.endswith("_norm.weight"):
            return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if len(shape) == 1 or name.endswith(".bias") or name == "token_embd.weight" or "gate_inp" in name:
            return rng.standard_normal(shape, dtype=np.float32) * (1.0 if len(shape) > 1 else 0.1)
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[-1] ** -0.5)

    specs = [s for s in module.tensors(config) if not s.optional or any(p.search(s.name) for p in want)]
    tensors = []
    for s in specs:
        shape = expected_shape(config, s)
        x = value(s.name, shape)
        typ = "F32" if s.types is not None and "F32" in s.types else tensor_type(s.name, shape, qtype, types)
        tensors.append((s.name, x, "F32" if x.ndim == 1 or s.name.endswith(".bias") else typ))
    return write_gguf(path, arch, {k: v for k, v in metadata.items() if k != "general.architecture"}, tensors)


_COMMON = {"block_count": 2, "context_length": 256, "embedding_length": 64, "attention.head_count": 4,
           "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 10000.0}

_DS2 = {**_COMMON, "attention.kv_lora_rank": 32, "rope.dimension_count": 8, "leading_dense_block_count": 1,
        "feed_forward_length": 96, "expert_feed_forward_length": 32, "expert_count": 8, "expert_used_count": 2}

# A tiny model of each registered architecture, for the shared runner (tests/test_architectures.py):
# hyperparameters as the real family has them, shrunk. Every architecture brings one line here.
TINY: dict[str, dict] = {
    "qwen3moe": dict(hparams={**_COMMON, "attention.key_length": 16, "attention.value_length": 16,
                              "feed_forward_length": 64, "expert_feed_forward_length": 32, "expert_count": 8,
                              "expert_used_count": 2}),
    "gemma3": dict(hparams={**_COMMON, "block_count": 3, "attention.head_count_kv": 1, "attention.key_length": 32,
                            "attention.value_length": 32, "feed_forward_length": 96, "attention.sliding_window": 4},
                   tied_output=True),
    "llama": dict(hparams={**_COMMON, "feed_forward_length": 64, "expert_count": 4, "expert_used_count": 2}),
    "llama-dense": dict(arch="llama", hparams={**_COMMON, "feed_forward_length": 96}),
    "qwen2moe": dict(hparams={**_COMMON, "feed_forward_length": 64, "expert_feed_forward_length": 32,
                              "expert_shared_feed_forward_length": 96, "expert_count": 8, "expert_used_count": 2},
                     optional=[r"attn_[qkv]\.bias$"]),
    "olmoe": dict(hparams={**_COMMON, "attention.head_count_kv": 4, "feed_forward_length": 32, "expert_count": 8,
                           "expert_used_count": 2}),
    # GLM-4.7-Flash / DeepSeek-V3 style: q_lora, split attn_k_b / attn_v_b (the MQA view: one KV head of
    # kv_lora + rope), a dense first layer, sigmoid + exp_probs_b, groups, norm, scale, YaRN
    "deepseek2": dict(hparams={**_DS2, "attention.head_count_kv": 1, "attention.q_lora_rank": 32,
                               "attention.key_length": 40, "attention.value_length": 32,
                               "attention.key_length_mla": 24, "attention.value_length_mla": 16,
                               "expert_shared_count": 1, "expert_weights_scale": 1.8, "expert_weights_norm": True,
                               "expert_gating_func": 2, "expert_group_count": 4, "expert_group_used_count": 2,
                               "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                               "rope.scaling.original_context_length": 64,
                               "rope.scaling.yarn_log_multiplier": 0.0707},
                      optional=[r"exp_probs_b"]),
    # DeepSeek-V2-Lite style: plain attn_q, the older attn_kv_b, softmax, two shared experts, no norm or scale
    "deepseek2-lite": dict(arch="deepseek2", hparams={**_DS2, "attention.head_count_kv": 4, "attention.q_lora_rank": 0,
                                                      "attention.key_length": 24, "attention.value_length": 16,
                                                      "expert_shared_count": 2, "expert_gating_func": 1}),
    "gpt-oss": dict(hparams={**_COMMON, "block_count": 3, "attention.key_length": 16, "attention.value_length": 16,
                             "expert_feed_forward_length": 64, "expert_count": 4, "expert_used_count": 2,
                             "attention.sliding_window": 4, "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                             "rope.scaling.original_context_length": 32},
                    types={r"_exps\.weight$": "MXFP4"}, optional=[r"attn_[qkv]\.bias$"]),
}


def write_tiny(path: str | Path, name: str, seed: int = 0, **kw) -> Path:
    """The TINY model `name` (an architecture, or a variant such as "llama-dense")."""
    spec = dict(TINY[name])
    arch = spec.pop("arch", name)
    return write_arch(path, arch, **{**spec, **kw}, seed=seed)


def full_context_peak(path: str | Path, n_ctx: int, kv: str = "f16", **placement) -> tuple[int, int]:
    """(memory estimate, measured sim peak) of sim:0 while generation's forward passes fill the whole context: a
    prompt of n_ctx - 3 tokens in chunks of 512, then three decode steps, each asking for the last logits only.
    kv: the cache type of K and V (f16, the default of both; f32 exact), -fa auto as moert.load's default;
    placement: moert.plan's keywords (cpu_moe=True, ...). tests/test_memory.py and bench/estimate_tightness.py."""
    import warnings

    import moert
    from moert.errors import PlacementWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlacementWarning)
        p = moert.plan(str(path), gpu_backend="sim", gpu_memory="64GiB", **placement)
        est = moert.estimate(p, n_ctx, kv_dtype=kv).devices["sim:0"].total
        m = moert.load(path, gpu_backend="sim", gpu_memory="64GiB", context_size=n_ctx, progress=False,
                       warmup=False, cache_type_k=kv, cache_type_v=kv, **placement)
    try:
        tokens = np.random.default_rng(0).integers(0, m.n_vocab, n_ctx)
        m.forward(tokens[: n_ctx - 3], last_only=True)
        for t in tokens[n_ctx - 3:]:
            m.forward([t], last_only=True)
        assert m.position == n_ctx
        return est, m.plan.devices[0].peak
    finally:
        m.close()
