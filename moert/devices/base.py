"""Devices that hold arrays: the host (`cpu`), CuPy GPUs (`cuda:N`) and simulated GPUs (`sim:N`).

One small interface, three kinds. Every move between devices goes through it and is counted:

    dev.put(host, what)      host -> device       (capacity-checked, counted h2d)
    dev.to_host(arr)         device -> host       (counted d2h)
    transfer(arr, src, dst)  any -> any           (the only way across devices)
    dev.empty / dev.zeros    accounted allocation on the device (KV cache, ...)
    dev.free(arr)            give an allocation back
    dev.xp                   the array namespace for compute on that device (numpy / cupy / sim)
    dev.block_kernels(type)  kernels that read a GGML type's blocks in place there (kernels/gpu), or None
"""

from __future__ import annotations

import math
import re
import time
import weakref
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from moert.errors import DeviceOutOfMemory, MoertError, PlacementError

GiB = 1 << 30
MiB = 1 << 20


class DeviceMismatchError(MoertError, TypeError):
    """An operation mixed arrays that live on different devices (a missing explicit transfer)."""


HOST_CHECK_BYTES = 64 * MiB    # allocations at least this big are checked against the host's free memory


def host_available_bytes() -> int:
    """Memory the host can still give (Linux MemAvailable; elsewhere free physical pages)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 1 << 62      # unknown: do not refuse


# ----------------------------------------------------------------------------------------------- sizes

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(size: str | int | float) -> int:
    """Bytes from 6GiB / 512MiB / 6G (binary) / 6GB (decimal) / a plain byte count."""
    if isinstance(size, bool) or isinstance(size, (float, np.floating)) and not math.isfinite(size):   # nan, inf
        raise PlacementError(f"invalid size {size!r}: give a finite number of bytes or a string like '6GiB'")
    if isinstance(size, (int, np.integer, float, np.floating)):
        n = int(size)
    else:
        m = _SIZE_RE.match(str(size))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise PlacementError(f"invalid size {size!r}: write it like '24GiB', '512MiB', '6G' "
                                 f"or a byte count")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n < 0:
        raise PlacementError(f"invalid size {size!r}: sizes cannot be negative")
    return n


def parse_sizes(sizes: str | int | list | tuple | None) -> list[int]:
    """A list of byte counts from '24GiB,8GiB', a single size, or a list of sizes; [] for None."""
    if sizes is None:
        return []
    if isinstance(sizes, str):
        return [parse_size(s) for s in sizes.split(",") if s.strip()]
    if isinstance(sizes, (list, tuple)):
        return [parse_size(s) for s in sizes]
    return [parse_size(sizes)]


def format_size(n: int | None) -> str:
    """A human size: 1.50 GiB, 12.0 MiB, 512 B."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


# ------------------------------------------------------------------------------------- transfer stats

@dataclass
class TransferStats:
    """Counted transfers of one device: host->device, device->host, and device->device into it."""

    h2d_count: int = 0
    h2d_bytes: int = 0
    d2h_count: int = 0
    d2h_bytes: int = 0
    d2d_count: int = 0   # peer copies whose destination is this device
    d2d_bytes: int = 0
    seconds: float = 0.0  # wall time spent inside transfer calls
    weight_count: int = 0  # weights copied in at run time (an expert cache's admissions): not activations,
    weight_bytes: int = 0  # so apart from h2d and out of `count` / `bytes`
    offload_count: int = 0  # CPU weights' blocks copied in for one big batch's matmul (op offload), apart
    offload_bytes: int = 0  # from h2d too: moert/experts.py OFFLOAD_MIN_BATCH

    def reset(self) -> None:
        """Zero every counter."""
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())

    def reset_to(self, snapshot: TransferStats) -> None:
        """Set every counter back to a snapshot's (`copy()`)."""
        for f in fields(self):
            setattr(self, f.name, getattr(snapshot, f.name))

    def copy(self) -> TransferStats:
        """A snapshot (subtract two snapshots for the transfers of one call). Its fields are numbers: a shallow
        copy (dataclasses.asdict's deep one took 20 us, 5% of the demo model's decode step, each forward)."""
        return TransferStats(**vars(self))

    def __sub__(self, other: TransferStats) -> TransferStats:
        return TransferStats(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other: TransferStats) -> TransferStats:
        return TransferStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict:
        """Plain dict of the counters."""
        return asdict(self)

    @property
    def count(self) -> int:
        return self.h2d_count + self.d2h_count + self.d2d_count

    @property
    def bytes(self) -> int:
        return self.h2d_bytes + self.d2h_bytes + self.d2d_bytes


# ------------------------------------------------------------------------------------------- devices

class Device:
    """Where arrays live. Subclasses: CpuDevice, SimDevice, CudaDevice."""

    kind: str = "?"

    def __init__(self, index: int, capacity: int | None):
        self.index = index
        self.capacity = capacity       # bytes moert may allocate here; None = unbounded (cpu)
        self.used = 0                  # bytes of live accounted allocations (put / empty / zeros)
        self.peak = 0                  # high-water mark of `used`
        self.stats = TransferStats()
        self._allocs: dict[int, list] = {}  # id(buffer) -> [nbytes, what, weakref to it]

    # -- identity
    @property
    def name(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"

    @property
    def free_bytes(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.used

    def __repr__(self) -> str:
        if self.capacity is None:
            return f"<Device {self.name}>"
        cap = f", {format_size(self.used)} of {format_size(self.capacity)} used"
        return f"<Device {self.name}{cap}>"

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def synchronize(self) -> None:
        """Wait for queued work (a no-op except on CUDA)."""

    def block_kernels(self, *qtypes: str) -> Any:   # kernels/gpu's matmul and moe where a GPU has them
        return None

    def reset_stats(self) -> None:
        """Zero the transfer counters (allocation accounting is untouched)."""
        self.stats.reset()

    def allocations(self) -> list[tuple[str, int]]:
        """The live accounted allocations as (what, bytes), largest first."""
        return sorted(((a[1], a[0]) for a in self._allocs.values()), key=lambda t: -t[1])

    # -- accounting
    def reserve(self, nbytes: int, what: str = "") -> None:
        """DeviceOutOfMemory unless nbytes more fit here now (and, for arrays in host memory: the cpu and
        sim devices, in what the host has available): asked before a large allocation is made."""
        if self.capacity is not None and self.used + nbytes > self.capacity:
            raise DeviceOutOfMemory(self.name, nbytes, self.used, self.capacity, what)
        if self.kind != "cuda" and nbytes >= HOST_CHECK_BYTES:
            avail = host_available_bytes()
            if nbytes > avail:
                raise DeviceOutOfMemory(self.name, nbytes, 0, avail, f"{what} (in host memory: only "
                                        f"{format_size(avail)} available)")

    def _account(self, buf: Any, nbytes: int, what: str) -> None:
        key = id(buf)
        try:  # released when the buffer is garbage-collected, like CuPy's pool, or by free()
            ref = weakref.ref(buf, lambda r, key=key: self._collected(key, r))   # (finalize: 10x the cost)
        except TypeError:
            ref = None
        self._allocs[key] = [nbytes, what, ref]
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def _collected(self, key: int, ref: Any) -> None:
        """A buffer died: release its record, unless free() did already and the id now names another."""
        rec = self._allocs.get(key)
        if rec is not None and rec[2] is ref:
            self._release(key)

    def _release(self, key: int) -> None:
        rec = self._allocs.pop(key, None)
        if rec is not None:
            self.used -= rec[0]

    def _buffer(self, arr: Any) -> Any:
        """The array that owns arr's memory (the key allocations are recorded under)."""
        a = arr
        while hasattr(getattr(a, "base", None), "shape"):  # views point at their owner (numpy and cupy)
            a = a.base
        return a

    def free(self, arr: Any) -> None:
        """Give back the accounted allocation that arr (or the array it views) belongs to."""
        self._release(id(self._buffer(self._raw(arr))))

    def free_all(self) -> None:
        """Give back every accounted allocation on this device."""
        for key in list(self._allocs):
            self._release(key)

    # -- interface, per kind
    def _raw(self, arr: Any) -> Any:
        return arr

    def owns(self, arr: Any) -> bool:
        """True when arr lives on this device."""
        raise NotImplementedError

    def put(self, host: np.ndarray, what: str = "") -> Any:
        """Copy a host array onto this device (counted); the cpu returns it unchanged."""
        raise NotImplementedError

    def empty(self, shape, dtype=np.float32, what: str = "") -> Any:
        """An accounted, uninitialized allocation on this device."""
        raise NotImplementedError

    def zeros(self, shape, dtype=np.float32, what: str = "") -> Any:
        """An accounted, zero-filled allocation on this device."""
        out = self.empty(shape, dtype, what)
        out[...] = 0
        return out

    def to_host(self, arr: Any) -> np.ndarray:
        """Copy an array of this device to a host ndarray (counted); the cpu returns it unchanged."""
        raise NotImplementedError

    def _from_peer(self, arr: Any, src: Device, what: str) -> Any:
        # generic device -> device copy through the host; counted once, as d2d into this device
        t0 = time.perf_counter()
        host = src._to_host_uncounted(arr)
        out = self._put_uncounted(host, what)
        self.stats.d2d_count += 1
        self.stats.d2d_bytes += host.nbytes
        self.stats.seconds += time.perf_counter() - t0
        return out

    def put_weights(self, host: np.ndarray, what: str = "", kind: str = "weight") -> Any:
        """Copy weight bytes from the host at run time (kind "weight": an expert cache admitting an expert; "offload":
        a big batch's CPU experts): counted in {kind}_count / {kind}_bytes, apart from the activations' h2d."""
        t0 = time.perf_counter()
        out = self._put_uncounted(host, what)
        setattr(self.stats, f"{kind}_count", getattr(self.stats, f"{kind}_count") + 1)
        setattr(self.stats, f"{kind}_bytes", getattr(self.stats, f"{kind}_bytes") + int(host.nbytes))
        self.stats.seconds += time.perf_counter() - t0
        return out

    def _count(self, direction: str, nbytes: int, seconds: float) -> None:
        setattr(self.stats, f"{direction}_count", getattr(self.stats, f"{direction}_count") + 1)
        setattr(self.stats, f"{direction}_bytes", getattr(self.stats, f"{direction}_bytes") + int(nbytes))
        self.stats.seconds += seconds


def where(x: Any) -> str:
    """Where an array lives, for error messages."""
    if isinstance(x, np.ndarray):
        return "host (numpy.ndarray)"
    dev = getattr(x, "device", None)
    return getattr(dev, "name", None) or type(x).__name__


def check_host(arr: Any, dev: Device) -> np.ndarray:
    on_gpu = not isinstance(arr, np.ndarray) and hasattr(arr, "__cuda_array_interface__")
    on_ours = isinstance(getattr(arr, "device", None), Device)  # a SimArray (moert/devices/sim.py)
    if on_ours or on_gpu:
        src = where(arr) if on_ours else "a GPU"
        raise DeviceMismatchError(
            f"{dev.name}.put() got an array that lives on {src}; use moert.devices.transfer(arr, src, dst)")
    return np.asarray(arr)


class CpuDevice(Device):
    """The host: NumPy arrays; weights stay zero-copy views of the memory-mapped file."""

    kind = "cpu"

    def __init__(self):
        super().__init__(-1, None)
        self.xp = np

    def owns(self, arr: Any) -> bool:
        return isinstance(arr, (np.ndarray, np.generic))

    def put(self, host: np.ndarray, what: str = "") -> np.ndarray:
        return check_host(host, self)

    def empty(self, shape, dtype=np.float32, what: str = "") -> np.ndarray:
        self.reserve(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, what)
        out = np.empty(shape, dtype)
        self._account(out, out.nbytes, what)
        return out

    def to_host(self, arr: Any) -> np.ndarray:
        if not self.owns(arr):
            raise DeviceMismatchError(f"cpu.to_host() got an array of another device ({where(arr)}); "
                                      f"call to_host on the device that holds it")
        return arr

    _put_uncounted = put
    _to_host_uncounted = to_host


CPU = CpuDevice()


def transfer(arr: Any, src: Device, dst: Device, what: str = "") -> Any:
    """Move arr from src to dst (the only way across devices); counted on the GPU side."""
    if src is dst:
        return arr
    if not src.owns(arr):
        raise DeviceMismatchError(
            f"transfer from {src.name}: the array lives on {where(arr)}, not on {src.name}")
    if src.kind == "cpu":
        return dst.put(arr, what)
    if dst.kind == "cpu":
        return src.to_host(arr)
    return dst._from_peer(arr, src, what)


def device_of(arr: Any, devices: list[Device]) -> Device:
    """The device among `devices` (and the cpu) that holds arr."""
    for d in devices:
        if d.owns(arr):
            return d
    if CPU.owns(arr):
        return CPU
    raise DeviceMismatchError(f"array on {where(arr)} belongs to none of {[d.name for d in devices]}")


def xp_of(arr: Any):
    """The array namespace that computes on arr's device: numpy, cupy, or a sim device's namespace."""
    dev = getattr(arr, "device", None)
    if isinstance(dev, Device):  # a SimArray (moert/devices/sim.py)
        return dev.xp
    mod = type(arr).__module__.split(".")[0]
    if mod == "cupy":
        from moert.devices import cuda as _cuda
        return _cuda.cupy()
    return np


__all__ = [
    "CPU", "CpuDevice", "Device", "DeviceMismatchError", "TransferStats", "check_host", "device_of", "format_size",
    "parse_size", "parse_sizes", "transfer", "where", "xp_of",
]
