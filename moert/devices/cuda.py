"""The CuPy-only bits, imported lazily: nothing here runs unless a CUDA device is asked for."""

from __future__ import annotations

from moert.errors import PlacementError

_why = ""


def cupy():
    """The cupy module, or a PlacementError saying how to get it."""
    try:
        import cupy as cp
    except ImportError as e:
        raise PlacementError(f"CuPy is not installed ({e}); pip install 'moert[gpu]', "
                             f"or use gpu_backend='sim' to simulate a GPU") from None
    return cp


def device_count() -> int:
    """How many CUDA devices CuPy sees (0 without CuPy, driver or GPU)."""
    global _why
    try:
        import cupy as cp
    except ImportError:
        _why = "CuPy is not installed"
        return 0
    try:
        n = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver, no device: CuPy raises CUDARuntimeError
        _why = f"CuPy finds no usable CUDA device ({e})"
        return 0
    if n == 0:
        _why = "CuPy finds no CUDA device"
    return n


def why_unavailable() -> str:
    """The reason the last device_count() returned 0."""
    return _why or "no CUDA device"


def free_memory(index: int) -> int:
    """Free bytes on CUDA device `index` right now."""
    cp = cupy()
    with cp.cuda.Device(index):
        free, _total = cp.cuda.runtime.memGetInfo()
    return int(free)


def memory(index: int) -> tuple[int, int]:
    """(free, total) bytes on CUDA device `index` right now."""
    cp = cupy()
    with cp.cuda.Device(index):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


def device_name(index: int) -> str:
    """CUDA device `index`'s product name, e.g. 'NVIDIA H100 80GB HBM3'."""
    name = cupy().cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)
