"""The forward pass on a GPU: every architecture with a float oracle (transformers' logits on the same weights),
in each placement, on cuda:0 (CuPy) and on sim:0, one test body (tests/gpu_backends.py: the cupy cases skip
without a CUDA device, so CI runs the logic on the sim). On a machine with a GPU, `pytest tests/test_cuda_forward.py`
checks in one command what the sim checks everywhere else.

The KV cache is f32 here: the logits are compared at 1e-4, and f16 (the default) rounds K and V (3e-4..5e-4 off).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from gpu_backends import BACKENDS, GPU

import moert

FIX = Path(__file__).parent / "fixtures"
ORACLES = {**{f"qwen3moe/{p.stem}": p for p in sorted((FIX / "qwen3moe").glob("*.gguf"))},
           **{f"arch/{n}": FIX / "arch" / f"{n}.gguf" for n in ("llama", "llama-dense", "qwen2moe", "olmoe",
                                                                 "deepseek2", "deepseek2-lite", "gpt-oss")},
           "gemma3/tiny_swa": FIX / "gemma3" / "tiny_swa.gguf"}      # dense, sliding-window layers, GeGLU
PLACEMENTS = {                                                        # llama.cpp's flags for each
    "-ngl all": dict(),
    "-cmoe": dict(cpu_moe=True),
    "--n-cpu-moe 1": dict(n_cpu_moe=1),
    "-ngl all -ot token_embd=GPU0": dict(overrides=[("token_embd", "GPU0")]),
}
STEPS = 12                                    # decode token by token after an 8-token prompt, up to this many tokens
KV = moert.KVConfig("f32", "f32")


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def load(path, **kw):
    return moert.load(path, kv=KV, context_size=64, warmup=False, progress=False, **kw)


@functools.cache
def cpu_logits(name: str) -> np.ndarray:
    z = np.load(ORACLES[name].with_suffix(".npz"))
    return load(ORACLES[name], gpu_layers=0).forward(z["tokens"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("name", list(ORACLES))
def test_gpu_matches_transformers_and_the_cpu(name, placement, backend, one_numba_thread):
    z = np.load(ORACLES[name].with_suffix(".npz"))
    tokens, hf = z["tokens"], z["hf_logits"]
    m = load(ORACLES[name], gpu_backend=backend, **PLACEMENTS[placement])
    assert GPU[backend] in {m.plan.device_of(n) for n in m.weights}
    prefill = m.forward(tokens)
    assert rel(prefill, hf) < 1e-4
    m.reset()
    n = min(STEPS, len(tokens))
    steps = np.concatenate([m.forward(tokens[:8])] + [m.forward(tokens[i:i + 1]) for i in range(8, n)])
    assert rel(steps, hf[:n]) < 1e-4
    assert rel(prefill, cpu_logits(name)) < 1e-4
    s = m.stats.total
    assert s.transfer_count > 0 and GPU[backend] in s.time["attention"]
    m.close()
