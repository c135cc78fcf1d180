"""The Triton kernels' own sources inside a model: tiny models' logits with every GPU matmul and MoE layer run by
kernels/gpu's kernels under Triton's interpreter (the sim device's kernel path, tests/test_gpu_path.py, with the
interpreter where it runs the NumPy twins), against the dequantizing path's logits."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

pytest.importorskip("triton", reason="the GPU kernels are Triton sources: pip install triton (the dev extra has it)")

import moert  # noqa: E402
from moert.devices.sim import SimDevice  # noqa: E402
from moert.kernels import gpu as kgpu  # noqa: E402
from moert.testing import write_tiny  # noqa: E402

KW = dict(gpu_backend="sim", context_size=64, warmup=False, progress=False, kv=moert.KVConfig("f32", "f32"),
          gpu_layers="all")
PROMPT = [3, 17, 5, 99, 42, 7]


def _logits(path, interpret: bool, monkeypatch) -> tuple[np.ndarray, dict]:
    calls = {"matmul": 0, "moe": 0}

    def interpreted(name):
        real = getattr(kgpu, name)

        @functools.wraps(real)
        def f(*a, **k):
            calls[name] += 1
            return real(*a, **k, backend="interpret")
        return f

    with monkeypatch.context() as mp:
        for name, t in kgpu.GPU_TYPES.items():      # fewer, larger programs: the interpreter's cost is per program
            mp.setitem(kgpu.GPU_TYPES, name, dataclasses.replace(t, rows=64))
        mp.setattr(SimDevice, "run_kernels", interpret)
        mp.setattr(kgpu, "matmul", interpreted("matmul"))
        mp.setattr(kgpu, "moe", interpreted("moe"))
        m = moert.load(path, **KW)
        try:
            out = np.concatenate([m.forward(PROMPT), m.forward([11])])     # a 6-token prefill, one decode step
        finally:
            m.close()
    return out, calls


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_interpreted_kernels_give_the_models_logits(arch, tmp_path, monkeypatch):
    """Float32 kernels against float32 dequantized matmuls: only summation order differs, ~1e-7 per matmul,
    compounded over a tiny model's layers well below 1e-5 of the logits' norm (as tests/test_gpu_path.py allows
    the twins). qwen3moe's Q8_0 experts take the fused MoE kernel; gpt-oss's MXFP4 experts with biases and its
    clamped swiglu too."""
    path = write_tiny(tmp_path / f"{arch}.gguf", arch, seed=2)
    want, _ = _logits(path, False, monkeypatch)
    got, calls = _logits(path, True, monkeypatch)
    assert calls["matmul"] > 0 and calls["moe"] > 0, calls
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-5


def test_interpreted_kernels_give_the_demo_models_logits(monkeypatch):
    """The demo model (Q4_K gate/up, Q6_K down: per-expert matmuls through the matvec kernel)."""
    from moert.demo import demo_model_path

    want, _ = _logits(demo_model_path(), False, monkeypatch)
    got, calls = _logits(demo_model_path(), True, monkeypatch)
    assert calls["matmul"] > 0, calls
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-5
