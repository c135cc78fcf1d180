"""The GPUs a backend gives: `get_devices("sim" | "cupy" | "auto" | "none", sizes)` -> sim:N (moert/devices/sim.py)
or cuda:N (CudaDevice, CuPy underneath: moert/devices/cuda.py). The host and the device interface: base.py."""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from moert.devices import Device, DeviceMismatchError, check_host, parse_sizes, where
from moert.devices.sim import DEFAULT_SIM_MEMORY, SimDevice
from moert.errors import DeviceOutOfMemory, PlacementError

GPU_BACKENDS = ("auto", "cupy", "sim", "none")


class CudaDevice(Device):
    """GPU N through CuPy; `capacity` caps what moert may allocate there."""

    kind = "cuda"

    def __init__(self, index: int, capacity: int):
        super().__init__(index, int(capacity))
        from moert.devices import cuda as _cuda
        self._cp = _cuda.cupy()
        self.xp = self._cp
        self._ctx: list = []

    def __enter__(self) -> CudaDevice:
        ctx = self._cp.cuda.Device(self.index)
        ctx.__enter__()
        self._ctx.append(ctx)
        return self

    def __exit__(self, *exc) -> None:
        self._ctx.pop().__exit__(*exc)

    def synchronize(self) -> None:
        self._cp.cuda.Device(self.index).synchronize()

    def block_kernels(self, *qtypes: str) -> Any:
        """kernels/gpu (Triton, launched by CuPy) where every type has a GPU entry and Triton is installed: weights
        stay quantized on the GPU and are read by one fused kernel per call. Else None: dequantized per call."""
        return _block_kernels(qtypes)

    def owns(self, arr: Any) -> bool:
        return isinstance(arr, self._cp.ndarray) and arr.device.id == self.index

    def _alloc(self, fn, nbytes: int, what: str):
        self.reserve(nbytes, what)
        try:
            with self._cp.cuda.Device(self.index):
                out = fn()
        except self._cp.cuda.memory.OutOfMemoryError:
            raise DeviceOutOfMemory(self.name, nbytes, self.used, self.capacity, what) from None
        self._account(out, nbytes, what)
        return out

    def _put_uncounted(self, host: np.ndarray, what: str):
        return self._alloc(lambda: self._cp.asarray(host), host.nbytes, what)

    def put(self, host: np.ndarray, what: str = ""):
        host = check_host(host, self)
        t0 = time.perf_counter()
        out = self._put_uncounted(host, what)
        self._count("h2d", host.nbytes, time.perf_counter() - t0)
        return out

    def empty(self, shape, dtype=np.float32, what: str = ""):
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self._alloc(lambda: self._cp.empty(shape, dtype), nbytes, what)

    def _to_host_uncounted(self, arr: Any) -> np.ndarray:
        if not self.owns(arr):
            raise DeviceMismatchError(f"{self.name}.to_host() got an array on {where(arr)}")
        return self._cp.asnumpy(arr)

    def to_host(self, arr) -> np.ndarray:
        t0 = time.perf_counter()
        out = self._to_host_uncounted(arr)
        self._count("d2h", out.nbytes, time.perf_counter() - t0)
        return out

    def _from_peer(self, arr: Any, src: Device, what: str):
        if not isinstance(src, CudaDevice):
            return super()._from_peer(arr, src, what)
        t0 = time.perf_counter()
        out = self._alloc(lambda: self._cp.array(arr, copy=True), arr.nbytes, what)  # peer copy
        self._count("d2d", arr.nbytes, time.perf_counter() - t0)
        return out


# ---------------------------------------------------------------------------------------- functions


@functools.cache
def _block_kernels(qtypes: tuple[str, ...]) -> Any:
    """CudaDevice.block_kernels, decided once per set of types (every GPU matmul asks)."""
    import importlib.util

    from moert.kernels import gpu

    if importlib.util.find_spec("triton") is None:          # pip install 'moert[gpu]' brings it
        return None
    return gpu if all(q in gpu.GPU_TYPES for q in qtypes) else None


def get_devices(gpu_backend: str = "auto", gpu_memory: str | int | list | None = None) -> list[Device]:
    """The GPU devices of a backend ("auto": CuPy if it sees a GPU, else none; "sim"; "cupy"; "none")."""
    backend = (gpu_backend or "auto").lower()
    if backend not in GPU_BACKENDS:
        raise PlacementError(f"unknown gpu_backend {gpu_backend!r}; use one of {', '.join(GPU_BACKENDS)}")
    try:
        sizes = parse_sizes(gpu_memory)
    except PlacementError as e:
        raise PlacementError(f"gpu_memory={gpu_memory!r:.60}: {e}") from None
    if backend == "none":
        return []
    if backend == "sim":
        return [SimDevice(i, c) for i, c in enumerate(sizes or [DEFAULT_SIM_MEMORY])]
    from moert.devices import cuda as _cuda
    n = _cuda.device_count()
    if n == 0:
        if backend == "cupy":
            raise PlacementError(f"gpu_backend='cupy' but {_cuda.why_unavailable()}; {_cuda.INSTALL}, or use "
                                 f"gpu_backend='sim' to simulate")
        return []
    if len(sizes) > n:
        raise PlacementError(f"gpu_memory lists {len(sizes)} GPUs but CuPy sees {n} "
                             f"({', '.join(f'cuda:{i}' for i in range(n))}); give at most {n} sizes")
    return [CudaDevice(i, min(sizes[i], _cuda.free_memory(i)) if i < len(sizes) else _cuda.free_memory(i))
            for i in range(n)]


def resolve(gpu_backend: str = "auto", fallback: str = "none") -> str:
    """The backend "auto" stands for here: "cupy" when CuPy sees a CUDA device, else `fallback` ("none": the CPU
    runs everything, as moert.plan/load do; "sim": a simulated GPU, as `moert demo` does); others as given."""
    backend = (gpu_backend or "auto").lower()
    if backend != "auto":
        return backend
    from moert.devices import cuda as _cuda

    return "cupy" if _cuda.device_count() > 0 else fallback


def describe(gpu_backend: str = "auto", fallback: str = "none") -> str:
    """The line a command starts with: which GPU backend and device it uses, and if none, the real reason.

    "GPU: cuda:0 NVIDIA H200 (CuPy 14.2.0)", "GPU: sim:0 (simulated: no CUDA device: CuPy is not installed ...)",
    "GPU: none (no CUDA device: ...; --gpu-backend sim simulates one)", "GPU: none (--gpu-backend none)"."""
    from moert.devices import cuda as _cuda

    backend = resolve(gpu_backend, fallback)
    if backend == "cupy":
        p = _cuda.probe()
        if not p.count:
            return f"GPU: none (--gpu-backend cupy, but no CUDA device: {p.reason})"
        return "GPU: " + ", ".join(f"cuda:{i} {n}" for i, n in enumerate(p.names)) + f" (CuPy {p.cupy})"
    if backend == "sim":
        if _cuda.device_count():
            return f"GPU: sim:0 (simulated, --gpu-backend sim; {_cuda.why_unavailable()})"
        return f"GPU: sim:0 (simulated: no CUDA device: {_cuda.why_unavailable()})"
    if (gpu_backend or "auto").lower() == "none":
        return "GPU: none (--gpu-backend none)"
    return f"GPU: none (no CUDA device: {_cuda.why_unavailable()}; --gpu-backend sim simulates one)"


__all__ = ["GPU_BACKENDS", "CudaDevice", "describe", "get_devices", "resolve"]
