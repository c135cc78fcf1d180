"""The runtime's GPU path with the GPU kernels (Device.block_kernels): weights stay quantized on the device and are
read by kernels/gpu's matmul and moe, never dequantized per call. Run here on the sim device with the kernels'
NumPy twins (SimDevice.run_kernels), against the sim's own dequantizing path: the same logits, and the kernels
(not the dequantizer) did the work. On a CUDA GPU the same code launches the Triton kernels (bench/gpu_check.py)."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert import quants
from moert.demo import demo_model_path
from moert.devices.gpus import CudaDevice
from moert.devices.sim import SimDevice
from moert.kernels import gpu as kgpu
from moert.testing import write_tiny

KW = dict(gpu_backend="sim", context_size=64, warmup=False, progress=False, kv=moert.KVConfig("f32", "f32"))
PROMPT = [3, 17, 5, 99, 42, 7]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_path")
    return {"qwen3moe (Q8_0: the fused MoE kernel)": write_tiny(d / "q.gguf", "qwen3moe", seed=2),
            "gpt-oss (MXFP4 experts, biases, swiglu_oai)": write_tiny(d / "g.gguf", "gpt-oss", seed=2),
            "demo (Q4_K gate/up, Q6_K down: per-expert matmuls)": demo_model_path()}


def _run(path, placement, kernels: bool, monkeypatch):
    calls = {"matmul": 0, "moe": 0, "dequantize on sim": 0}
    real = {n: getattr(kgpu, n) for n in ("matmul", "moe")}
    real_dq = quants.dequantize

    def count(name):
        def f(*a, **k):
            calls[name] += 1
            return real[name](*a, **k)
        return f

    def dq(raw, typ, shape, xp=np):
        calls["dequantize on sim"] += xp is not np and typ != "F32"
        return real_dq(raw, typ, shape, xp=xp)

    with monkeypatch.context() as mp:
        mp.setattr(SimDevice, "run_kernels", kernels)
        mp.setattr(kgpu, "matmul", count("matmul"))
        mp.setattr(kgpu, "moe", count("moe"))
        mp.setattr(quants, "dequantize", dq)
        m = moert.load(path, **KW, **placement)
        try:
            calls.update({k: 0 for k in calls})                 # loading is not the forward's
            prefill = m.forward(PROMPT)
            decode = m.forward([11])
        finally:
            m.close()
    return np.concatenate([prefill, decode]), calls


@pytest.mark.parametrize("placement", [dict(gpu_layers="all"), dict(gpu_layers="all", cpu_moe=True)],
                         ids=["all-GPU", "-cmoe"])
@pytest.mark.parametrize("name", ["qwen3moe (Q8_0: the fused MoE kernel)", "gpt-oss (MXFP4 experts, biases, "
                                  "swiglu_oai)", "demo (Q4_K gate/up, Q6_K down: per-expert matmuls)"])
def test_the_gpu_kernels_path_gives_the_dequantizing_paths_logits(models, name, placement, monkeypatch):
    want, plain = _run(models[name], placement, False, monkeypatch)
    got, calls = _run(models[name], placement, True, monkeypatch)
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-5     # float64 twins vs float32 matmuls
    assert plain["matmul"] == plain["moe"] == 0 and plain["dequantize on sim"] > 0
    assert calls["matmul"] > 0 and calls["dequantize on sim"] == 0, calls      # no GPU weight dequantized per call
    fused = not name.startswith("demo") and "cpu_moe" not in placement
    assert (calls["moe"] > 0) == fused, calls           # one type for gate/up/down, all on the GPU: the fused kernel


def test_a_type_without_a_gpu_kernel_is_dequantized_as_before(monkeypatch):
    monkeypatch.setattr(SimDevice, "run_kernels", True)
    dev = SimDevice(0, 1 << 30)
    assert dev.block_kernels("Q4_K", "Q6_K") is not None
    assert dev.block_kernels("Q4_K", "IQ4_XS") is None and dev.block_kernels("Q2_K") is None
    monkeypatch.setattr(SimDevice, "run_kernels", False)
    assert dev.block_kernels("Q4_K") is None
    # no CuPy needed to ask: a CUDA device reads these in place
    assert CudaDevice.block_kernels(object(), "Q4_K", "Q6_K") is kgpu
    assert CudaDevice.block_kernels(object(), "Q4_K", "IQ4_XS") is None
