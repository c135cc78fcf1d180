"""moert's logits against independent runtimes, from committed fixtures (tests/fixtures/qwen3moe/).

The fixtures were made by tests/reference/make_qwen3moe_refs.py: transformers' Qwen3MoeForCausalLM in
float32 on the GGUF's own weights (dequantized by gguf-py), and llama.cpp (llama-cpp-python) on a
Q4_K_M file that llama.cpp quantized itself. Neither is needed here.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest

from moert.loader import load as moert_load

# an exact (f32) KV cache, not the default f16: these tests compare with float oracles
load = partial(moert_load, cache_type_k="f32", cache_type_v="f32")

FIXTURES = Path(__file__).parent / "fixtures" / "qwen3moe"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.npz"))
LLAMA = [n for n in NAMES if "llama_logits" in np.load(FIXTURES / f"{n}.npz").files]
PLACEMENTS = {"cpu": dict(gpu_layers=0), "experts cpu, rest sim": dict(gpu_backend="sim", cpu_moe=True)}


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def fixture(name: str):
    z = np.load(FIXTURES / f"{name}.npz")
    return FIXTURES / f"{name}.gguf", z["tokens"], z


def test_fixtures_present():
    assert len(NAMES) >= 3, f"conformance fixtures missing in {FIXTURES}; run tests/reference/make_qwen3moe_refs.py"


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("name", NAMES)
def test_matches_transformers(name, placement):
    path, tokens, z = fixture(name)
    hf = z["hf_logits"]
    m = load(path, progress=False, **PLACEMENTS[placement])
    prefill = m.forward(tokens)
    assert rel(prefill, hf) < 1e-4, "40-token prefill"
    # the same tokens one at a time after a prefill of the first 8
    m.reset()
    steps = np.concatenate([m.forward(tokens[:8])] + [m.forward(tokens[i:i + 1]) for i in range(8, len(tokens))])
    assert rel(steps, hf) < 1e-4, "token by token"
    assert np.array_equal(prefill.argmax(-1), hf.argmax(-1))


@pytest.mark.parametrize("name", LLAMA)
def test_at_least_as_close_as_llama_cpp(name):
    path, tokens, z = fixture(name)
    hf, ll = z["hf_logits"], z["llama_logits"]
    ours = load(path, gpu_layers=0, progress=False).forward(tokens)
    assert rel(ours, hf) <= rel(ll, hf), (rel(ours, hf), rel(ll, hf))
    llama_right = ll.argmax(-1) == hf.argmax(-1)
    assert llama_right.mean() > 0.5                                 # the fixture means something
    assert (ours.argmax(-1) == hf.argmax(-1))[llama_right].all()
