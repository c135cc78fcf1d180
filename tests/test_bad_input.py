"""Files and requests that lie: each gets a typed error naming what was wrong, never a crash, a hang or
garbage; the model stays usable. (The semantic fuzzer, test_semantic_fuzz.py, runs thousands more.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from semantic_fuzz import _rows, read_recipe, write_recipe

import moert
from moert import ArgumentError, ConfigError, GGUFError, ModelClosedError, PlacementError, ShapeError
from moert.errors import DeviceOutOfMemory
from moert.models.spec import TensorMismatchError
from moert.text.chat import ChatTemplateError, render
from moert.text.tokenizer import Tokenizer, TokenizerError

FIX = Path(__file__).parent / "fixtures"
BASE = FIX / "qwen3moe" / "l2_e4_k2_gqa2_q4km.gguf"      # D 256, 4 experts top-2, head dim 64, 2 layers
GEMMA = FIX / "gemma3" / "tiny_swa.gguf"


@pytest.fixture(scope="module")
def recipe():
    return read_recipe(BASE)


def lie(tmp_path, recipe, *, md=None, drop_md=(), tensors=None, name="lie.gguf") -> Path:
    """The base model written with metadata changed ({key: (type, value)}) and tensors replaced."""
    meta = {k: v for k, v in recipe.metadata.items() if k not in drop_md}
    meta.update(md or {})
    return write_recipe(replace(recipe, metadata=meta, tensors=tensors or recipe.tensors), tmp_path / name)


def with_tensor(recipe, name: str, f) -> list:
    return [f(t) if t[0] == name else t for t in recipe.tensors]


def load(path, **kw):
    kw.setdefault("context_size", 32)
    return moert.load(path, warmup=False, progress=False, gpu_layers=0, **kw)


# --------------------------------------------------------------------------- 1. tensors against the config

def test_a_norm_shorter_than_the_head_is_refused_at_load(tmp_path, recipe):
    # the decode kernel used to read past such a norm into whatever tensor the file stored next
    p = lie(tmp_path, recipe, tensors=with_tensor(recipe, "blk.0.attn_q_norm.weight", lambda t: _rows(t, 1)))
    with pytest.raises(TensorMismatchError, match=r"tensor 'blk.0.attn_q_norm.weight' has shape \(1,\); qwen3moe "
                                                  r"expects \(64,\) \(from attention.key_length 64\)"):
        load(p)


@pytest.mark.parametrize("e", [2, 8])
def test_expert_tensors_disagreeing_with_expert_count(tmp_path, recipe, e):
    ts = [(_rows(t, e) if "_exps" in t[0] else t) for t in recipe.tensors]
    p = lie(tmp_path, recipe, tensors=ts)
    with pytest.raises(TensorMismatchError, match=rf"blk.0.ffn_gate_exps.weight' has shape \({e}, 256, 256\); "
                                                  r"qwen3moe expects \(4, 256, 256\) \(from expert_count 4"):
        load(p)


def test_router_rows_disagreeing_with_expert_count(tmp_path, recipe):
    p = lie(tmp_path, recipe, md={"qwen3moe.expert_count": ("UINT32", 8)},
            tensors=[(_rows(t, 8) if "ffn_gate_inp" in t[0] else t) for t in recipe.tensors])
    with pytest.raises(TensorMismatchError, match=r"ffn_(down|gate|up)_exps.weight' has shape \(4, 256, 256\)"):
        load(p)


@pytest.mark.parametrize("key, value, what", [
    ("qwen3moe.expert_count", 8, r"expects \(8, 256\) \(from expert_count 8"),
    ("qwen3moe.embedding_length", 512, r"expects \(256, 512\) \(from vocab_size 256, embedding_length 512\)"),
    ("qwen3moe.vocab_size", 100, r"'token_embd.weight' has shape \(256, 256\); qwen3moe expects \(100, 256\)"),
])
def test_metadata_no_tensor_matches(tmp_path, recipe, key, value, what):
    with pytest.raises(TensorMismatchError, match=what):
        load(lie(tmp_path, recipe, md={key: ("UINT32", value)}))


@pytest.mark.parametrize("rows", [100, 512])
def test_output_rows_disagreeing_with_the_vocabulary(tmp_path, recipe, rows):
    p = lie(tmp_path, recipe, tensors=with_tensor(recipe, "output.weight", lambda t: _rows(t, rows)))
    with pytest.raises(TensorMismatchError, match=rf"'output.weight' has shape \({rows}, 256\); qwen3moe expects "
                                                  r"\(256, 256\)"):
        load(p)


def test_block_count_one_less_than_the_layers_present(tmp_path, recipe):
    with pytest.raises(TensorMismatchError, match=r"block_count is 1 but the file holds tensors for 2 layers "
                                                  r"\(blk.0 to blk.1\)"):
        load(lie(tmp_path, recipe, md={"qwen3moe.block_count": ("UINT32", 1)}))


def test_block_count_huge_is_refused_before_anything_per_layer(tmp_path, recipe):
    t0 = time.perf_counter()
    with pytest.raises(TensorMismatchError, match=r"block_count is 1,000,000 but the file holds tensors for 2 layers"):
        load(lie(tmp_path, recipe, md={"qwen3moe.block_count": ("UINT32", 10**6)}))
    assert time.perf_counter() - t0 < 5


def test_a_layer_beyond_block_count_among_the_layers(tmp_path, recipe):
    gap = [t for t in recipe.tensors if not t[0].startswith("blk.1.")] + \
        [("blk.2." + t[0][6:], *t[1:]) for t in recipe.tensors if t[0].startswith("blk.1.")]
    with pytest.raises(TensorMismatchError, match=r"block_count is 2 but the file holds tensors for 3 layers"):
        load(lie(tmp_path, recipe, tensors=gap))


def test_missing_extra_and_retyped_tensors(tmp_path, recipe):
    drop = [t for t in recipe.tensors if t[0] != "blk.1.ffn_norm.weight"]
    with pytest.raises(TensorMismatchError, match=r"tensor 'blk.1.ffn_norm.weight' is missing"):
        load(lie(tmp_path, recipe, tensors=drop))
    extra = [*recipe.tensors, ("rope_freqs.weight", *recipe.tensors[1][1:])]
    with pytest.raises(TensorMismatchError, match=r"tensor 'rope_freqs.weight' is not part of a qwen3moe model"):
        load(lie(tmp_path, recipe, tensors=extra, name="extra.gguf"))
    q = [t if t[0] != "output_norm.weight" else (t[0], "Q8_0", t[2], np.zeros(8 * 34, np.uint8))
         for t in recipe.tensors]
    with pytest.raises(TensorMismatchError, match=r"'output_norm.weight' is Q8_0; qwen3moe takes it as one of "
                                                  r"BF16, F16, F32"):
        load(lie(tmp_path, recipe, tensors=q, name="q.gguf"))


def test_vocab_size_disagreeing_with_the_token_list():
    md = {"general.architecture": "qwen3moe", "qwen3moe.vocab_size": 300, "tokenizer.ggml.tokens": ["a"] * 256}
    md.update({f"qwen3moe.{k}": v for k, v in dict(block_count=1, context_length=8, embedding_length=8,
                                                     **{"attention.head_count": 2},
                                                     **{"attention.layer_norm_rms_epsilon": 1e-6},
                                                     expert_count=2, expert_used_count=1,
                                                     expert_feed_forward_length=8).items()})
    from moert.models.qwen3moe import Config

    with pytest.raises(ConfigError, match=r"'qwen3moe.vocab_size' is 300 but tokenizer.ggml.tokens holds 256"):
        Config.from_gguf(md)


# ------------------------------------------------------------------------------------ 2. metadata values

@pytest.mark.parametrize("key, vtype, value, what", [
    ("qwen3moe.attention.layer_norm_rms_epsilon", "FLOAT32", float("nan"), r"is nan; it must be a finite number"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", "FLOAT32", float("inf"), r"is inf; it must be a finite number"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", "STRING", "1e-6", r"is '1e-6' \(str\); expected a float"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", "FLOAT32", 0.0, r"is 0.0; it must be > 0"),
    ("qwen3moe.rope.freq_base", "FLOAT32", 0.0, r"'qwen3moe.rope.freq_base' is 0.0; it must be > 0"),
    ("qwen3moe.rope.freq_base", "FLOAT32", float("nan"), r"'qwen3moe.rope.freq_base' is nan"),
    ("qwen3moe.rope.freq_base", "FLOAT32", float("-inf"), r"'qwen3moe.rope.freq_base' is -inf"),
    ("qwen3moe.expert_used_count", "UINT32", 5, r"expert_used_count 5 > expert_count 4"),
    ("qwen3moe.expert_count", "UINT64", 10**9, r"'qwen3moe.expert_count' is 1,000,000,000; no model"),
    ("qwen3moe.context_length", "UINT64", 2**40, r"'qwen3moe.context_length' is 1,099,511,627,776; no model"),
    ("qwen3moe.attention.head_count", "FLOAT32", 4.0, r"is 4.0 \(float\); expected a int"),
    ("qwen3moe.attention.head_count", "INT32", -4, r"'qwen3moe.attention.head_count' is -4; it must be >= 1"),
    ("qwen3moe.block_count", "BOOL", True, r"is True \(bool\); expected a int"),
])
def test_metadata_values_checked(tmp_path, recipe, key, vtype, value, what):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=what):
        load(lie(tmp_path, recipe, md={key: (vtype, value)}))
    assert time.perf_counter() - t0 < 5


def test_key_length_huge_is_refused_before_any_kv_cache(tmp_path, recipe):
    with pytest.raises(TensorMismatchError, match=r"from attention.head_count 4 \* attention.key_length 1048576"):
        load(lie(tmp_path, recipe, md={"qwen3moe.attention.key_length": ("UINT32", 1 << 20)}), context_size=0)


# --------------------------------------------------------------------------------- 3. kernels' own checks

def test_kernels_refuse_inconsistent_inputs():
    from moert.kernels import layers as kl
    from moert.kernels.moe import moe_ffn
    from moert.kernels.moe_fused import moe_ffn_fused
    from moert.kernels.qtensor import QTensor
    from moert.quants import quantize

    rng = np.random.default_rng(0)
    w = [QTensor(quantize(rng.standard_normal(s, dtype=np.float32), "Q8_0"), "Q8_0", s)
         for s in ((2, 32, 64), (2, 32, 64), (2, 64, 32))]
    x = rng.standard_normal((3, 64), dtype=np.float32)
    ids, wts = np.array([[0, 1], [1, 3], [0, 1]], np.int32), np.full((3, 2), 0.5, np.float32)
    for f in (moe_ffn, moe_ffn_fused):
        with pytest.raises(ShapeError, match=r"expert id 3 is outside \[0, 2\)"):
            f(x, ids, wts, *w)
        with pytest.raises(ShapeError, match=r"x has shape \(3, 32\), expected \(\*, 64\)"):
            f(x[:, :32], ids % 2, wts, *w)
        with pytest.raises(ShapeError, match=r"weights has shape \(3, 1\), expected \(3, 2\)"):
            f(x, ids % 2, wts[:, :1], *w)
        with pytest.raises(ShapeError, match=r"expert shapes do not fit"):
            f(x, ids % 2, wts, w[0], w[1], w[1])
    q, k, v = (rng.standard_normal(s, dtype=np.float32) for s in ((1, 4, 16), (1, 2, 16), (1, 2, 16)))
    kc, vc = np.zeros((8, 2, 16), np.float32), np.zeros((8, 2, 16), np.float32)
    cos, sin = np.ones((1, 8), np.float32), np.zeros((1, 8), np.float32)
    norm = np.ones(16, np.float32)
    with pytest.raises(ShapeError, match=r"q_norm has shape \(1,\), expected \(16,\)"):
        kl.qk_norm_rope_attention(q, k, v, norm[:1], norm, 1e-6, cos, sin, True, kc, vc, 0, 0.25, None)
    with pytest.raises(ShapeError, match=r"position 8 is outside the KV cache's 8 rows"):
        kl.qk_norm_rope_attention(q, k, v, norm, norm, 1e-6, cos, sin, True, kc, vc, 8, 0.25, None)
    with pytest.raises(ShapeError, match=r"3 query heads do not share 2 KV heads evenly"):
        kl.attention_decode(q[:, :3], k, v, kc, vc, 0, 0.25, None)
    with pytest.raises(ShapeError, match=r"rms_norm: w has shape \(1,\), expected \(16,\)"):
        kl.rms_norm(q[0], norm[:1], 1e-6)
    with pytest.raises(ShapeError, match=r"k = 5 experts of 4"):
        kl.softmax_topk(np.zeros((2, 4), np.float32), 5)
    with pytest.raises(ShapeError, match=r"cos has shape \(1, 8\), expected \(2, 8\)"):
        kl.rope(np.zeros((2, 4, 16), np.float32), cos, sin, True)


# --------------------------------------------------------------------------------------------- 4. hangs

def test_catastrophic_regex_is_a_placement_error_in_bounded_time():
    t0 = time.perf_counter()
    with pytest.raises(PlacementError, match=r"took over 0.1 s \(the pattern backtracks catastrophically"):
        moert.plan(str(BASE), [(r"(.{1,30}){1,30}\d{3}", "CPU")], gpu_layers=0)
    assert time.perf_counter() - t0 < 10


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match=r"is a FIFO \(named pipe\), not a GGUF file"):
        load(fifo)
    with pytest.raises(GGUFError, match=r"is a directory, not a GGUF file"):
        load(tmp_path)


@pytest.mark.parametrize("template, what", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", r"ran longer than 2.0 s"),
    ("{% set s = 'ab' * 50000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}", r"ran longer than"),
    ("{{ 9 ** 999999999 }}", r"the exponent 999999999 is larger than 1024"),
    ("{{ 'a' * 1000000000 }}", r"repeating a str of 1 1000000000 times"),
    ("{{ 'x'.ljust(10**9) }}", r"ljust\(\) with 1,000,000,000"),
    ("{{ 'x'|center(10**9) }}", r"filter do_center with 1,000,000,000"),
    ("{{ range(10**9)|list }}", r"range of 1,000,000,000 items"),
    ("{% for i in range(100000) %}{{ 'aaaaaaaaaaaaaaaaaaaaa' }}{% endfor %}", r"more than 1,048,576 characters"),
])
def test_hostile_chat_templates_stop(template, what):
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=what):
        render(template, [{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 6
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__   # the hook is removed


def test_a_normal_template_still_renders():
    from moert.testing import CHATML_TEMPLATE

    out = render(CHATML_TEMPLATE + "{{ 'x'|center(5) }}{{ 2 ** 10 }}", [{"role": "user", "content": "hi"}])
    assert out == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n  x  1024"


def test_a_one_mib_token_is_refused():
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "a", "a" * (1 << 20)],
          "tokenizer.ggml.scores": np.zeros(5, np.float32)}
    t0 = time.perf_counter()
    with pytest.raises(TokenizerError, match=r"token 4 of tokenizer.ggml.tokens is 1,048,576 characters long"):
        Tokenizer(md)
    assert time.perf_counter() - t0 < 2


# -------------------------------------------------------------------------------- 5. truncation, --no-mmap

def test_truncated_after_mapping_is_an_error_before_the_forward(tmp_path):
    p = shutil.copy(BASE, tmp_path / "m.gguf")
    m = load(p)
    good = m.forward([1, 2, 3])
    m.reset()
    size = os.path.getsize(p)
    os.truncate(p, size // 2)
    with pytest.raises(GGUFError, match=r"was truncated to [\d,]+ bytes after it was opened.*--no-mmap"):
        m.forward([1, 2, 3])
    assert m.position == 0
    with open(p, "r+b") as f, open(BASE, "rb") as src:     # the file whole again: the model runs as before
        f.write(src.read())
    np.testing.assert_array_equal(m.forward([1, 2, 3]), good)


def test_no_mmap_survives_truncation(tmp_path):
    p = shutil.copy(BASE, tmp_path / "m.gguf")
    a = load(p).forward([1, 2, 3])
    m = load(p, mmap=False)
    os.truncate(p, 100)
    np.testing.assert_array_equal(m.forward([1, 2, 3]), a)


# ----------------------------------------------------------------------------- 6. allocations, 7. arguments

def test_kv_cache_larger_than_the_gpu_is_refused_before_allocating(recipe):
    t0 = time.perf_counter()   # attention weights ~0.3 MiB fit; the f32 KV cache at 512 tokens, 1 MiB, does not
    with pytest.raises(DeviceOutOfMemory, match=r"sim:0: out of memory for the KV cache at context 512"):
        moert.load(BASE, gpu_backend="sim", cpu_moe=True, gpu_memory=["1MiB"], context_size=512, warmup=False,
                   progress=False, cache_type_k="f32", cache_type_v="f32")
    assert time.perf_counter() - t0 < 5


def test_an_allocation_beyond_host_memory_is_refused():
    from moert.devices import CPU, host_available_bytes

    with pytest.raises(DeviceOutOfMemory, match=r"cpu: out of memory for huge \(in host memory: only"):
        CPU.empty((host_available_bytes() // 4 + (1 << 30),), np.float32, what="huge")


@pytest.fixture(scope="module")
def model():
    m = moert.load(BASE, warmup=False, progress=False, gpu_backend="sim", cpu_moe=True, context_size=32)
    yield m
    m.close()


@pytest.mark.parametrize("kwargs, what", [
    (dict(n_batch=-1), r"n_batch must be an integer in \[1, 65,536\], got -1"),
    (dict(n_batch=0), r"n_batch must be an integer in \[1, 65,536\], got 0"),
    (dict(context_size=-1), r"context_size must be an integer in \[0, 16,777,216\], got -1"),
    (dict(context_size=1.5), r"context_size must be an integer"),
    (dict(threads=0), r"threads must be an integer >= 1, got 0"),
])
def test_load_arguments(kwargs, what):
    with pytest.raises(ArgumentError, match=what):
        moert.load(BASE, warmup=False, progress=False, gpu_layers=0, **kwargs)


@pytest.mark.parametrize("kwargs, what", [
    (dict(tensor_split=[float("nan"), 1]), r"tensor_split=\[nan, 1\]: give one finite share >= 0 per GPU"),
    (dict(tensor_split=["a", 1]), r"tensor_split=\['a', 1\]"),
    (dict(gpu_memory=["-1GiB", "1GiB"]), r"invalid size '-1GiB'"),
])
def test_placement_arguments(kwargs, what):
    with pytest.raises(PlacementError, match=what):
        moert.load(BASE, warmup=False, progress=False, gpu_backend="sim", **{"gpu_memory": ["1GiB", "1GiB"], **kwargs})


def test_bad_calls_leave_the_model_as_it_was(model):
    model.reset()
    good = model.forward([1, 2, 3])
    for bad, err in [(lambda: setattr(model, "position", -1), ArgumentError),
                     (lambda: setattr(model, "position", 4), ArgumentError),
                     (lambda: model.forward([1, 999]), moert.InvalidTokenError),
                     (lambda: model.forward(list(range(40))), moert.ContextOverflowError),
                     (lambda: model.generate([1, 2], max_tokens=-5), moert.GenerationError),
                     (lambda: model.generate([1, 2], temperature=float("nan")), moert.MoertError)]:
        with pytest.raises(err):
            bad()
    model.position = 0
    np.testing.assert_array_equal(model.forward([1, 2, 3]), good)


def test_calls_after_close():
    m = moert.load(BASE, warmup=False, progress=False, gpu_layers=0, context_size=16)
    m.close()
    with pytest.raises(ModelClosedError, match=r"was closed .* load it again with moert.load\(\)"):
        m.forward([1])


# -------------------------------------------------------------------------------------------------- CLI

def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moert", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_cli_lies_exit_1_with_one_line(tmp_path, recipe):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    lying = lie(tmp_path, recipe, tensors=with_tensor(recipe, "blk.0.attn_q_norm.weight", lambda t: _rows(t, 1)))
    for args, what in [
        (["run", str(BASE), "-p", "1 2", "-n", "-5"], "-n -5: give a number of tokens >= 0, or -1"),
        (["run", str(BASE), "-f", "/dev/zero", "-n", "1"], "-f /dev/zero: the prompt file is larger than 16 MiB"),
        (["run", str(fifo), "-p", "1 2", "-n", "1"], "is a FIFO (named pipe), not a GGUF file"),
        (["run", str(lying), "-p", "1 2", "-n", "1"], "tensor 'blk.0.attn_q_norm.weight' has shape (1,)"),
        (["inspect", str(BASE), "-ot", r"(.{1,30}){1,30}\d{3}=CPU"], "the pattern backtracks catastrophically"),
    ]:
        r = cli(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and what in lines[0] and "Traceback" not in r.stderr, (args, r.stderr)


def test_inspect_says_whether_the_file_matches_its_declaration(tmp_path, recipe):
    lying = lie(tmp_path, recipe, md={"qwen3moe.expert_count": ("UINT32", 8)})
    good = cli("inspect", str(BASE)).stdout
    assert "check: every key and tensor matches the qwen3moe declaration (27 tensors)" in good
    r = cli("inspect", str(lying), "--no-tensors")
    assert r.returncode == 0
    assert ("check: does not match its declaration: lie.gguf: tensor 'blk.0.ffn_gate_inp.weight' has shape (4, 256); "
            "qwen3moe expects (8, 256)") in r.stdout
