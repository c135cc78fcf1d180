"""`sim:N`: a simulated GPU. NumPy underneath, a GPU's rules on top, so every GPU code path runs in tests.

Its arrays are `SimArray`s tagged with their device. An operation that mixes arrays of two devices (or a
sim array with a host ndarray) raises `DeviceMismatchError`; `np.asarray(sim_array)` raises like CuPy's
implicit-conversion error; every array it holds (weights, KV cache, and the temporaries operations create,
until they are garbage-collected) counts against its capacity, and going beyond it raises
`DeviceOutOfMemory`. So a forward pass that forgets a transfer, or needs more memory than the estimate
said, fails in the test suite the way it would on a real card.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from moert.devices import Device, DeviceMismatchError, GiB, check_host, where

DEFAULT_SIM_MEMORY = 24 * GiB


def _devices_in(obj: Any, found: list, depth: int = 0) -> None:
    """Collect the device of every array in obj (nested tuples/lists/dicts); 0-d host arrays are constants."""
    if isinstance(obj, SimArray):
        found.append(obj.device)
    elif isinstance(obj, np.ndarray):
        if obj.ndim > 0:
            found.append(None)  # None = host
    elif depth < 3 and isinstance(obj, (tuple, list)):
        for o in obj:
            _devices_in(o, found, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in obj.values():
            _devices_in(o, found, depth + 1)


def _common_device(what: str, *objs: Any) -> SimDevice:
    found: list = []
    for o in objs:
        _devices_in(o, found)
    devs = {id(d): d for d in found}
    sims = [d for d in devs.values() if d is not None]
    if len(devs) > 1:
        names = sorted({"host (numpy.ndarray)" if d is None else d.name for d in devs.values()})
        if len(names) == 1:
            names = [f"{names[0]} (two different {names[0]} device objects)"]
        raise DeviceMismatchError(
            f"{what} mixes arrays on {' and '.join(names)}; a GPU operation needs all its arrays on one "
            f"device. Move one explicitly: dev.put(host_array), dev.to_host(arr) or "
            f"moert.devices.transfer(arr, src, dst)")
    return sims[0]


def _unwrap(obj: Any, depth: int = 0) -> Any:
    if isinstance(obj, SimArray):
        return obj._a
    if depth < 3 and isinstance(obj, tuple):
        return tuple(_unwrap(o, depth + 1) for o in obj)
    if depth < 3 and isinstance(obj, list):
        return [_unwrap(o, depth + 1) for o in obj]
    if depth < 3 and isinstance(obj, dict):
        return {k: _unwrap(v, depth + 1) for k, v in obj.items()}
    return obj


def _wrap(obj: Any, dev: SimDevice) -> Any:
    if isinstance(obj, np.ndarray):
        return dev._adopt(obj)
    if isinstance(obj, np.generic):  # reductions give 0-d device arrays, as in CuPy
        return dev._adopt(np.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(_wrap(o, dev) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o, dev) for o in obj]
    return obj


class SimArray(NDArrayOperatorsMixin):
    """A NumPy array living on a simulated GPU: operations keep the tag, mixing devices raises."""

    __slots__ = ("_a", "device", "__weakref__")

    def __init__(self, a: np.ndarray, device: SimDevice):
        self._a = a
        self.device = device

    # -- NumPy protocols
    def __array__(self, dtype=None, copy=None):
        raise DeviceMismatchError(
            f"implicit conversion of a {self.device.name} array to a host numpy.ndarray is not allowed "
            f"(CuPy refuses it too); use {self.device.name}.to_host(arr) or moert.devices.transfer")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "__call__" and not kwargs:     # the common case, checked inline: a x b, exp(a), a + 1.0
            dev = self.device
            raw = []
            for x in inputs:
                if type(x) is SimArray:
                    if x.device is not dev:
                        break
                    raw.append(x._a)
                elif isinstance(x, (np.ndarray, SimArray)):
                    break                                # host or mismatched arrays: the checks below say so
                else:
                    raw.append(x)
            else:
                return _wrap(ufunc(*raw), dev)
        # ufunc.at takes host index arrays like indexing does
        checked = (inputs[0], _no_host(inputs[1]), inputs[2:]) if method == "at" else inputs
        dev = _common_device(f"numpy.{ufunc.__name__}.{method}", checked, kwargs.get("out", ()))
        out = kwargs.get("out")
        result = getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _wrap(result, dev)

    def __array_function__(self, func, types, args, kwargs):
        dev = _common_device(f"numpy.{func.__name__}", args, kwargs)
        name = func.__name__
        if name in _SYNCS or name == "where" and len(args) + len(kwargs) == 1:
            dev.host_read(f"numpy.{name} (CuPy reads its output's size back)")
        out = func(*_unwrap(args), **_unwrap(kwargs))
        if type(out) in (bool, int, float) and name not in ("ndim", "size", "shape"):
            dev.host_read(f"numpy.{name}")                  # CuPy gives a 0-d device array; a Python value is a read
        return _wrap(out, dev)

    # -- indexing
    def __getitem__(self, key):
        _common_device("indexing", self, _no_host(key))
        if any(type(k) is SimArray and k._a.dtype == bool for k in (key if isinstance(key, tuple) else (key,))):
            self.device.host_read("a boolean mask's indexing (CuPy reads the count back)")
        return _wrap(self._a[_unwrap(key)], self.device)

    def __setitem__(self, key, value):
        _common_device("item assignment", self, _no_host(key), value)
        self._a[_unwrap(key)] = _unwrap(value)

    # -- Python protocols (CuPy allows these on device arrays, with an implicit sync: counted, SimDevice.host_reads)
    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        for row in self._a:
            yield _wrap(row, self.device)

    def __bool__(self) -> bool:
        self.device.host_read("bool()")
        return bool(self._a)

    def __int__(self) -> int:
        self.device.host_read("int()")
        return int(self._a)

    def __float__(self) -> float:
        self.device.host_read("float()")
        return float(self._a)

    def __index__(self) -> int:
        self.device.host_read("an index (__index__)")
        return self._a.__index__()

    def __complex__(self) -> complex:
        self.device.host_read("complex()")
        return complex(self._a)

    def __repr__(self) -> str:
        return f"SimArray({self.device.name}, {self._a!r})"

    __hash__ = None  # type: ignore[assignment]

    def __array_namespace__(self, api_version=None):
        """The device's array namespace (Array API protocol): `dev.xp`."""
        return self.device.xp

    # -- attributes and methods of ndarray, results tagged with this device
    def get(self, *args, **kwargs):
        raise DeviceMismatchError(
            f"arr.get() bypasses the transfer counters; use {self.device.name}.to_host(arr)")

    def __getattr__(self, name: str):
        if name.startswith("__"):  # no __array_interface__ & co: numpy must not see through us
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if name in _READS:                                  # values to the host: .item(), .tolist(), .tobytes()
            self.device.host_read(f".{name}()")
        if not callable(attr):
            return _wrap(attr, self.device) if isinstance(attr, np.ndarray) else attr
        dev = self.device

        def method(*args, **kwargs):
            if _plain(args) and _plain(kwargs.values()):   # x.reshape(T, -1), x.sum(axis=-1): nothing to check
                return _wrap(attr(*args, **kwargs), dev)
            _common_device(f"ndarray.{name}", self, args, kwargs)
            return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)), dev)

        return method


_READS = frozenset({"item", "tolist", "tobytes", "tofile", "itemset"})
# functions whose output size depends on the values: CuPy reads a count back (a sync), e.g. bincount's max
_SYNCS = frozenset({"bincount", "nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"})


def _plain(values: Any) -> bool:
    """No arrays among these values, nor in tuples or lists among them."""
    for v in values:
        if isinstance(v, (np.ndarray, SimArray)):
            return False
        if isinstance(v, (tuple, list)) and not _plain(v):
            return False
    return True


def _no_host(key: Any) -> Any:
    # index arrays from the host are allowed (CuPy uploads them); only other devices clash
    if isinstance(key, tuple):
        return tuple(k for k in key if isinstance(k, SimArray))
    return key if isinstance(key, SimArray) else ()


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
                return _wrap(attr(*_unwrap(args), **_unwrap(kwargs)), dev)

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
        return _wrap(np.ascontiguousarray(out._a), self._device)

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

    def host_read(self, what: str) -> None:
        """Count one read of device values by the host; while `recording`, refuse it as a CUDA graph capture
        fails (a sync inside a capture is cudaErrorStreamCaptureUnsupported)."""
        if self.recording is not None:
            from moert.devices.graph import CaptureError

            raise CaptureError(f"{what} reads a {self.name} array back to the host while {self.recording} is "
                               f"recorded; a CUDA graph cannot hold a sync. Keep the value on the device, or run "
                               f"this step eagerly")
        self.host_reads += 1

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
            a = obj._a.astype(dtype) if dtype is not None else obj._a
            return self._adopt(np.array(a, copy=True) if copy and a is obj._a else a)
        host = np.array(obj, dtype=dtype)
        if isinstance(obj, np.ndarray) and obj.ndim > 0:  # an implicit upload, as CuPy does: counted
            self._count("h2d", host.nbytes, 0.0)
        return self._adopt(host)


class _SimKernels:
    """kernels/gpu's matmul, moe and attention on a sim device's arrays: unwrapped, run on the twins, adopted back."""

    def __init__(self, device: SimDevice, kernels: Any):
        self.device, self.kernels = device, kernels

    def matmul(self, raw, qtype: str, shape, x, **kw):
        return self.device._adopt(self.kernels.matmul(_unwrap(raw), qtype, shape, _unwrap(x), **kw))

    def moe(self, *args, **kw):
        if args[0].shape[0] > self.kernels.DECODE_MAX_T:     # a prompt: the CUDA kernel groups its ids on the host
            self.device.host_read("moe's ids of a prompt")
        args = [_unwrap(a) for a in args]
        kw = {k: _unwrap(v) for k, v in kw.items()}
        return self.device._adopt(self.kernels.moe(*args, **kw))

    def attention(self, *args, **kw):
        return self.device._adopt(self.kernels.attention(*_unwrap(args), **{k: _unwrap(v) for k, v in kw.items()}))

