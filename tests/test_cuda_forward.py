"""The forward pass on a real GPU (gpu_backend="cupy"): conformance and placement invariance.

Skipped unless CuPy and a CUDA device are present; on a machine with a GPU, `pytest tests/test_cuda_forward.py`
checks in one command what the sim device checks everywhere else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from moert.devices import cuda as _cuda
from moert.loader import load

pytestmark = pytest.mark.skipif(_cuda.device_count() == 0, reason="needs CuPy and a CUDA device")

FIXTURES = Path(__file__).parent / "fixtures" / "qwen3moe"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.npz"))
PLACEMENTS = {
    "experts cpu, rest cuda:0": dict(cpu_moe=True),
    "all cuda:0": dict(overrides=[("token_embd", "cuda:0")]),
    "experts of half the layers on cuda:0": dict(n_cpu_moe=1),
    "gate/up/down split over cpu/cuda:0": dict(overrides=[("ffn_gate_exps", "cpu")]),
}


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("name", NAMES)
def test_cuda_matches_transformers(name, placement):
    z = np.load(FIXTURES / f"{name}.npz")
    tokens, hf = z["tokens"], z["hf_logits"]
    m = load(FIXTURES / f"{name}.gguf", gpu_backend="cupy", progress=False, **PLACEMENTS[placement])
    assert "cuda:0" in {m.plan.device_of(n) for n in m.weights}
    prefill = m.forward(tokens)
    assert rel(prefill, hf) < 1e-4
    m.reset()
    steps = np.concatenate([m.forward(tokens[:8])] + [m.forward(tokens[i:i + 1]) for i in range(8, len(tokens))])
    assert rel(steps, hf) < 1e-4
    cpu = load(FIXTURES / f"{name}.gguf", gpu_layers=0, progress=False).forward(tokens)
    assert rel(prefill, cpu) < 1e-4
    s = m.stats.total
    assert s.transfer_count > 0 and "cuda:0" in s.time["attention"]


def test_cuda_gemma3_sliding_window_matches_transformers():
    """The dense gemma3 path (sliding-window layers, GeGLU) on the GPU, against the same oracle as on sim."""
    gemma = Path(__file__).parent / "fixtures" / "gemma3"
    z = np.load(gemma / "tiny_swa.npz")
    m = load(gemma / "tiny_swa.gguf", gpu_backend="cupy", progress=False)
    assert rel(m.forward(z["tokens"]), z["hf_logits"]) < 1e-4
