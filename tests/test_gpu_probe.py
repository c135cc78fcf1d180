"""What CuPy sees, said truthfully (moert/devices/cuda.py probe), and the GPU line run/chat/bench/serve/demo start
with (moert/devices/gpus.py describe): checked with a fake `cupy` module for each way a machine can be, so it is
tested here without a GPU. "auto" means CuPy when it sees a device, else the CPU (plan/load) or the sim (demo)."""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from moert.cli.common import gpu_line
from moert.devices import cuda as _cuda
from moert.devices.gpus import describe, resolve


@pytest.fixture(autouse=True)
def fresh_probe():
    _cuda.probe(refresh=True)
    yield
    _cuda.probe(refresh=True)               # the real machine's answer again for the tests after these


def fake_cupy(monkeypatch, count=None, error=None, names=("NVIDIA H200",)):
    def get_count():
        if error is not None:
            raise error
        return count

    rt = types.SimpleNamespace(getDeviceCount=get_count, getDeviceProperties=lambda i: {"name": names[i].encode()})
    mod = types.ModuleType("cupy")
    mod.__version__ = "14.2.0"
    mod.cuda = types.SimpleNamespace(runtime=rt)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return _cuda.probe(refresh=True)


class _Refuse:
    """A meta-path finder that makes `import cupy` fail the way a broken install does."""

    def __init__(self, error):
        self.error = error

    def find_spec(self, name, path=None, target=None):
        if name == "cupy":
            raise self.error
        return None


def broken_import(monkeypatch, error):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Refuse(error), *sys.meta_path])
    return _cuda.probe(refresh=True)


def test_a_device_is_named_and_auto_picks_cupy(monkeypatch):
    p = fake_cupy(monkeypatch, count=1)
    assert p.count == 1 and p.names == ("NVIDIA H200",) and p.reason == ""
    assert _cuda.why_unavailable() == "CuPy 14.2.0 sees 1 CUDA device: cuda:0 NVIDIA H200"    # never "no CUDA"
    assert resolve("auto") == resolve("auto", fallback="sim") == "cupy"
    assert describe() == "GPU: cuda:0 NVIDIA H200 (CuPy 14.2.0)"
    assert describe("sim").startswith("GPU: sim:0 (simulated, --gpu-backend sim; CuPy 14.2.0 sees 1")
    ns = argparse.Namespace(gpu_backend="auto", gpu_layers="0", override_tensor=[])
    assert gpu_line(ns) == "GPU: cuda:0 NVIDIA H200 (CuPy 14.2.0); -ngl 0: the CPU runs every layer"


@pytest.mark.parametrize("error, says", [
    (ModuleNotFoundError("No module named 'cupy'", name="cupy"), "CuPy is not installed"),
    (ImportError("libcudart.so.12: cannot open shared object file"), "CuPy does not import: libcudart.so.12: cannot"),
])
def test_an_import_failure_says_its_text(monkeypatch, error, says):
    p = broken_import(monkeypatch, error)
    assert p.count == 0 and p.reason.startswith(says) and _cuda.why_unavailable() == p.reason
    assert resolve("auto") == "none" and resolve("auto", fallback="sim") == "sim"
    assert describe() == f"GPU: none (no CUDA device: {p.reason}; --gpu-backend sim simulates one)"
    assert describe("auto", fallback="sim") == f"GPU: sim:0 (simulated: no CUDA device: {p.reason})"


@pytest.mark.parametrize("count, error, says", [
    (None, RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient"), "no NVIDIA driver"),
    (None, RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"), "CUDA reports no usable device"),
    (0, None, "CuPy 14.2.0 sees zero CUDA devices (CUDA_VISIBLE_DEVICES="),
])
def test_cupy_without_a_device_says_why(monkeypatch, count, error, says):
    p = fake_cupy(monkeypatch, count=count, error=error)
    assert p.count == 0 and says in p.reason and p.cupy == "14.2.0"
    if error is not None:
        assert str(error) in p.reason                       # CUDA's own words
    assert _cuda.device_count() == 0 and _cuda.why_unavailable() == p.reason


def test_none_and_a_stated_backend(monkeypatch):
    fake_cupy(monkeypatch, count=0)
    assert describe("none") == "GPU: none (--gpu-backend none)"
    assert describe("cupy").startswith("GPU: none (--gpu-backend cupy, but no CUDA device: CuPy 14.2.0 sees zero")
    assert gpu_line(argparse.Namespace(gpu_backend="auto", hardware="rtx3090+ryzen-7950x")).startswith("GPU: sim:0")
