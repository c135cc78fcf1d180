"""gemma3 against transformers (the float oracle) and llama.cpp, from committed fixtures (tests/fixtures/gemma3/).

The real Gemma-3-270M Q4_K_M file (the `gemma_path` fixture) and a tiny synthetic gemma3 whose sliding
window (8) is shorter than its prompt. tests/reference/make_gemma3_refs.py made the fixtures; neither
transformers nor llama.cpp is needed here.

Greedy agreement is checked teacher-forced: one forward over prompt + the oracle's 24 greedy tokens, whose
argmax at every position must be the oracle's next token. That is exactly "moert's greedy continuation
equals the oracle's" (the model is causal), for one prefill instead of 24 decode steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from moert.loader import load as moert_load
from moert.weights import Weight

# an exact (f32) KV cache, not the default f16: these tests compare with float oracles
load = partial(moert_load, cache_type_k="f32", cache_type_v="f32")

FIXTURES = Path(__file__).parent / "fixtures" / "gemma3"
REAL = np.load(FIXTURES / "gemma3_270m.npz")
PROMPTS = [str(p) for p in REAL["prompts"]]
TEXTS = dict(zip(PROMPTS, (str(t) for t in REAL["texts"])))


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def fx(name: str, key: str) -> np.ndarray:
    return REAL[f"{name}.{key}"]


@pytest.fixture(scope="module")
def gemma(gemma_path, one_numba_thread):
    m = load(gemma_path, gpu_layers=0, progress=False)
    yield m
    m.close()


@pytest.fixture(scope="module")
def forced(gemma):
    """name -> moert's logits (T + 23, V) over the prompt followed by the oracle's greedy tokens."""
    out = {}
    for name in PROMPTS:
        gemma.reset()
        out[name] = gemma.forward(np.concatenate([fx(name, "ids"), fx(name, "hf_gen")[:-1]]))
    gemma.reset()
    return out


# ---------------------------------------------------------------------------------------- real model

def test_config(gemma):
    c = gemma.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab) == \
        (18, 640, 4, 1, 256, 2048, 262144)
    assert (c.sliding_window, c.rope_base, c.rope_base_swa, c.attn_scale) == (512, 1e6, 1e4, 1 / 16)
    assert [il for il in range(18) if not c.is_swa(il)] == [5, 11, 17]
    assert "output.weight" not in gemma.gguf.tensors                 # tied: the embedding is the output


def test_config_needs_its_keys(gemma):
    from moert.config import ConfigError
    from moert.models.gemma3 import Config

    md = dict(gemma.gguf.metadata)
    del md["gemma3.attention.sliding_window"]
    with pytest.raises(ConfigError, match="gemma3.attention.sliding_window"):
        Config.from_gguf(md)


@pytest.mark.parametrize("name", PROMPTS)
def test_tokenization_matches_llama_cpp(gemma, name):
    assert gemma.tokenize(TEXTS[name]) == fx(name, "ids").tolist()


@pytest.mark.parametrize("name", PROMPTS)
def test_greedy_matches_oracle(forced, name):
    ids, want = fx(name, "ids"), fx(name, "hf_gen")
    got = forced[name][len(ids) - 1:].argmax(-1)                        # (24,)
    assert got.tolist() == want.tolist(), f"first difference at token {int(np.argmax(got != want))}"


@pytest.mark.parametrize("name", PROMPTS)
def test_logits_much_closer_to_oracle_than_llama_cpp(forced, name):
    """At the last prompt position, over the oracle's 16384 highest logits (see the reference script)."""
    top, oracle = fx(name, "top_ids"), fx(name, "hf_top")
    ours = rel(forced[name][len(fx(name, "ids")) - 1, top], oracle)
    llama = rel(fx(name, "llama_top"), oracle)
    assert ours < 1e-4 and ours < llama / 100, (ours, llama)


def test_llama_cpp_departs_from_oracle_somewhere():
    """The fixture's premise: llama.cpp (8-bit activations) is measurably off the float oracle."""
    llama = [rel(fx(n, "llama_top"), fx(n, "hf_top")) for n in PROMPTS]
    assert min(llama) > 1e-3
    assert any((fx(n, "llama_gen") != fx(n, "hf_gen")).any() for n in PROMPTS)


def test_generate_decodes_like_the_oracle(gemma):
    """The API end to end (tokenize, prefill, decode step by step with the KV cache, detokenize)."""
    gemma.reset()
    text = gemma.generate(TEXTS["capital"], max_tokens=8, temperature=0)
    assert text == gemma.detokenize(fx("capital", "hf_gen")[:8].tolist()) == " the capital of the country of France."


def _has_run_command() -> bool:
    from moert.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return "run" in sub.choices


@pytest.mark.skipif(not _has_run_command(), reason="`moert run` is not in moert/cli/main.py yet")
def test_cli_run_france(gemma_path, gemma):
    """`moert run MODEL -p "The capital of France is" -n 24 --temp 0` prints the oracle's continuation."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}   # tiny matmuls: threads only contend on a busy box
    r = subprocess.run([sys.executable, "-m", "moert", "run", str(gemma_path), "-p", TEXTS["capital"],
                        "-n", "24", "--temp", "0", "-t", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    want = TEXTS["capital"] + gemma.detokenize(fx("capital", "hf_gen").tolist())
    assert r.stdout.strip() == want, (r.stdout, want)   # "... France. It is the largest city in France and ..."


def test_placement_invariance_cpu_vs_sim(gemma_path, forced, one_numba_thread):
    """Everything on sim:0 (dequantized there with the NumPy reference) gives the CPU's logits."""
    ids = fx("capital", "ids")
    m = load(gemma_path, gpu_backend="sim", progress=False)
    assert {m.plan.device_of(n) for n in m.weights if n != "token_embd.weight"} == {"sim:0"}   # input layer: cpu
    got = m.forward(ids)
    m.close()
    assert rel(got, forced["capital"][:len(ids)]) < 1e-5


# ---------------------------------------------------------------------------------------- tiny model

TINY = np.load(FIXTURES / "tiny_swa.npz")


@pytest.mark.parametrize("placement", [dict(gpu_layers=0), dict(gpu_backend="sim")])
def test_tiny_sliding_window_matches_transformers(placement, one_numba_thread):
    """A 40-token prompt through window-8 layers and one global layer: prefill, then token by token."""
    tokens, hf = TINY["tokens"], TINY["hf_logits"]
    m = load(FIXTURES / "tiny_swa.gguf", progress=False, **placement)
    assert rel(m.forward(tokens), hf) < 1e-5
    m.reset()
    steps = np.concatenate([m.forward(tokens[:5])] + [m.forward(tokens[i:i + 1]) for i in range(5, len(tokens))])
    assert rel(steps, hf) < 1e-5


def test_tiny_at_least_as_close_as_llama_cpp(one_numba_thread):
    tokens, hf, ll = TINY["tokens"], TINY["hf_logits"], TINY["llama_logits"]
    ours = load(FIXTURES / "tiny_swa.gguf", gpu_layers=0, progress=False).forward(tokens)
    assert rel(ours, hf) < rel(ll, hf) / 100
    llama_right = ll.argmax(-1) == hf.argmax(-1)
    assert llama_right.mean() > 0.5
    assert (ours.argmax(-1) == hf.argmax(-1)).all()


def test_tiny_dense_weights_dequantized_once(monkeypatch, one_numba_thread):
    """Model.linear keeps CPU dense weights as float32 after their first use (within dense_cache_bytes):
    decode does not dequantize them again; a smaller budget, or none, changes nothing but the speed."""
    tokens = TINY["tokens"]
    m = load(FIXTURES / "tiny_swa.gguf", gpu_layers=0, progress=False)
    want = m.forward(tokens[:20])
    calls, real = [], Weight.dequantize
    monkeypatch.setattr(Weight, "dequantize", lambda self: calls.append(self) or real(self))
    want = np.concatenate([want, m.forward(tokens[20:21])])
    assert [w.name for w in calls if w.type != "F32"] == []
    monkeypatch.undo()
    for budget in (0, 40_000):
        m = load(FIXTURES / "tiny_swa.gguf", gpu_layers=0, progress=False)
        m.weights.dense_cache_bytes = budget
        got = m.forward(tokens[:21])
        assert 0 <= sum(a.nbytes for a in m.weights.dense.values()) <= budget
        assert rel(got, want) < 1e-6
