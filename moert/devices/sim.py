"""`sim:N`: a simulated GPU. NumPy underneath, a GPU's rules on top, so every GPU code path runs in tests.

Its arrays are `SimArray`s tagged with their device (moert/devices/simarray.py). An operation that mixes arrays of
two devices (or a sim array with a host ndarray) raises `DeviceMismatchError`; `np.asarray(sim_array)` raises like
CuPy's implicit-conversion error; every array it holds (weights, KV cache, and the temporaries operations create,
until they are garbage-collected) counts against its capacity, and going beyond it raises
`DeviceOutOfMemory`. So a forward pass that forgets a transfer, or needs more memory than the estimate
said, fails in the test suite the way it would on a real card. Reads of device values by the host are counted
(`host_reads`); a simulated graph capture records operations and replays them (moert/devices/graph.py).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from moert.devices import Device, DeviceMismatchError, GiB, check_host, where
from moert.devices.simarray import SimArray, call, into, unwrap

DEFAULT_SIM_MEMORY = 24 * GiB
__all__ = ["DEFAULT_SIM_MEMORY", "SimArray", "SimDevice", "SimNamespace"]


_CREATORS = {"empty", "zeros", "ones", "full", "arange", "linspace", "eye", "identity", "tri",
             "empty_like", "zeros_like", "ones_like", "full_like", "fromiter"}


class SimNamespace:
    """`dev.xp` of a sim device: numpy, except that array creation makes arrays on that device."""

    def __init__(self, device: SimDevice):
        self._device = device
        self.__name__ = f"moert.devices.sim[{device.name}]"

    def __getattr__(self, name: str):
        attr = getattr(np, name)
        if name in _CREATORS:
            dev = self._device

            def create(*args, **kwargs):
                return call(dev, attr, args, kwargs)

            return create
        return attr

    def asarray(self, obj, dtype=None, **kwargs):
        """Like cupy.asarray: device arrays pass through, host data is uploaded (and counted)."""
        return self._device._as_device(obj, dtype, copy=False)

    def array(self, obj, dtype=None, copy=True, **kwargs):
        """Like cupy.array: a new device array; host data is uploaded (and counted)."""
        return self._device._as_device(obj, dtype, copy=copy)

    def ascontiguousarray(self, obj, dtype=None):
        out = self._device._as_device(obj, dtype, copy=False)
        return call(self._device, np.ascontiguousarray, (out,), {})

    def __repr__(self) -> str:
        return f"<array namespace of {self._device.name}: numpy on a simulated GPU>"


class SimDevice(Device):
    """A simulated GPU: NumPy storage, GPU rules (one device per array, explicit transfers, a capacity)."""

    kind = "sim"
    MEMO_BYTES = 256 << 20      # host memory the memo of dequantized weights may keep, per device

    def __init__(self, index: int, capacity: int = DEFAULT_SIM_MEMORY):
        super().__init__(index, int(capacity))
        self.xp = SimNamespace(self)
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # values the host read back (each a sync on a GPU): to_host, int()/float()/bool()/an index/.item()/.tolist()
        self.host_reads = 0
        self.recording: str | None = None     # while a graph capture is simulated (devices/graph.py): what records
        self.tape: list | None = None         # the operations recorded meanwhile

    def host_read(self, what: str) -> None:
        """Count one read of device values by the host; while `recording`, refuse it as a CUDA graph capture fails."""
        self.refuse(what, "reads a device array back to the host: a sync, which a CUDA graph cannot hold; keep the "
                          "value on the device")
        self.host_reads += 1

    def _no_upload(self, what: str) -> None:
        self.refuse(what, "uploads host data: a graph would replay the value of the capture, not the new one; put it "
                          "into a static device buffer before the step")

    def refuse(self, what: str, why: str) -> None:
        """CaptureError while `recording`: `what` does what a CUDA graph's capture cannot hold (`why`)."""
        if self.recording is not None:
            from moert.devices.graph import CaptureError

            raise CaptureError(f"{what} {why} ({self.recording} on {self.name})")

    def replay(self, tape: list) -> None:
        """Run a recorded tape again: each operation on its arrays' data of now, into the arrays it made then."""
        for f, args, kwargs, out in tape:
            into(out, f(*unwrap(args), **unwrap(kwargs)))

    def memo(self, owner: Any, make: Callable[[], SimArray]) -> SimArray:
        """make(), a float32 SimArray computed from `owner` (a weight), computed once while the memo holds
        under MEMO_BYTES of host memory. A real GPU dequantizes a weight per call, which is fast there and
        the slowest part of a NumPy simulation; the memo keeps the result instead. Each call still returns a
        fresh copy that counts against the capacity until it is collected, as the GPU's output would, so
        memory accounting is the same as without the memo. The entry goes when the owner is collected."""
        hit = self._memo.get(owner)
        if hit is None:
            out = make()
            if sum(a.nbytes for a in self._memo.values()) + out._a.nbytes <= self.MEMO_BYTES:
                hit = np.array(out._a, copy=True)
                hit.flags.writeable = False
                self._memo[owner] = hit
            return out
        return self._adopt(np.array(hit, copy=True), "a dequantized weight")

    def owns(self, arr: Any) -> bool:
        return isinstance(arr, SimArray) and arr.device is self

    run_kernels = False         # True: weights are read through the GPU kernels' NumPy twins (block_kernels)

    def block_kernels(self, *qtypes: str) -> Any:
        """With run_kernels set, the GPU kernels' interface run on their NumPy twins (moert.kernels.gpu on NumPy
        arrays), so the runtime's CUDA path runs here as it would on a GPU; else None (dequantized, memoized)."""
        from moert.kernels import gpu

        if not self.run_kernels or not all(q in gpu.GPU_TYPES for q in qtypes):
            return None
        return _SimKernels(self, gpu)

    def _raw(self, arr: Any) -> Any:
        if isinstance(arr, SimArray):
            if arr.device is not self:
                raise DeviceMismatchError(f"{self.name}.free() got an array of {arr.device.name}")
            return arr._a
        return arr

    def _adopt(self, a: np.ndarray, what: str = "a temporary (an operation's result)") -> SimArray:
        """Tag a NumPy array as living here. New memory (not a view of an array already here) counts against
        the capacity until it is garbage-collected, as a GPU allocator's would: so peak use is measurable."""
        owner = self._buffer(a)
        if id(owner) not in self._allocs:
            self.reserve(owner.nbytes, what)
            self._account(owner, owner.nbytes, what)
        return SimArray(a, self)

    def _put_uncounted(self, host: np.ndarray, what: str) -> SimArray:
        self.reserve(host.nbytes, what)
        a = np.array(host, copy=True, order="C")
        self._account(a, a.nbytes, what)
        return SimArray(a, self)

    def put(self, host: np.ndarray, what: str = "") -> SimArray:
        host = check_host(host, self)
        self._no_upload(f"put ({what})")
        t0 = time.perf_counter()
        out = self._put_uncounted(host, what)
        self._count("h2d", host.nbytes, time.perf_counter() - t0)
        return out

    def empty(self, shape, dtype=np.float32, what: str = "") -> SimArray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.reserve(nbytes, what)
        a = np.empty(shape, dtype)
        self._account(a, a.nbytes, what)
        return SimArray(a, self)

    def _to_host_uncounted(self, arr: Any) -> np.ndarray:
        if not self.owns(arr):
            raise DeviceMismatchError(f"{self.name}.to_host() got an array on {where(arr)}; "
                                      f"call to_host on the device that holds it")
        return np.array(arr._a, copy=True)

    def to_host(self, arr: SimArray) -> np.ndarray:
        t0 = time.perf_counter()
        self.host_read("to_host")
        out = self._to_host_uncounted(arr)
        self._count("d2h", out.nbytes, time.perf_counter() - t0)
        return out

    def _as_device(self, obj: Any, dtype, copy: bool) -> SimArray:
        if isinstance(obj, SimArray):
            if obj.device is not self:
                raise DeviceMismatchError(f"{self.name}.xp.asarray() got an array of {obj.device.name}; "
                                          f"use moert.devices.transfer(arr, src, dst)")
            return call(self, np.array if copy else np.asarray, (obj,), {"dtype": dtype})
        self._no_upload("xp.asarray of host data")
        host = np.array(obj, dtype=dtype)
        if isinstance(obj, np.ndarray) and obj.ndim > 0:  # an implicit upload, as CuPy does: counted
            self._count("h2d", host.nbytes, 0.0)
        return self._adopt(host)


class _SimKernels:
    """kernels/gpu's matmul, moe and attention on a sim device's arrays: unwrapped, run on the twins, adopted back."""

    def __init__(self, device: SimDevice, kernels: Any):
        self.device, self.kernels = device, kernels

    def matmul(self, raw, qtype: str, shape, x, **kw):
        return call(self.device, self.kernels.matmul, (raw, qtype, shape, x), kw)

    def moe(self, *args, **kw):
        if args[0].shape[0] > self.kernels.DECODE_MAX_T:     # a prompt: the CUDA kernel groups its ids on the host
            self.device.host_read("moe's ids of a prompt")
        return call(self.device, self.kernels.moe, args, kw)

    def attention(self, *args, **kw):
        return call(self.device, self.kernels.attention, args, kw)

