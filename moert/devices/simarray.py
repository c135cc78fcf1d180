"""The arrays of `sim:N` (moert/devices/sim.py): NumPy arrays tagged with their device. Operations keep the tag;
mixing devices raises DeviceMismatchError; a read of their values by the host (int(), .item(), what CuPy syncs on)
is counted on the device (SimDevice.host_reads); while a graph is captured every operation is recorded on the
device's tape (`call`), and SimDevice.replay runs the tape again (`into`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from moert.devices import Device, DeviceMismatchError


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


def _common_device(what: str, *objs: Any) -> Device:
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


def unwrap(obj: Any, depth: int = 0) -> Any:
    if isinstance(obj, SimArray):
        return obj._a
    if depth < 3 and isinstance(obj, tuple):
        return tuple(unwrap(o, depth + 1) for o in obj)
    if depth < 3 and isinstance(obj, list):
        return [unwrap(o, depth + 1) for o in obj]
    if depth < 3 and isinstance(obj, dict):
        return {k: unwrap(v, depth + 1) for k, v in obj.items()}
    return obj


_PLAIN = frozenset({int, float, bool, str, slice, type(None), type(Ellipsis), np.dtype, type})   # nothing to unwrap


def call(dev: Device, f: Callable, args: tuple, kwargs: dict, raw: list | None = None) -> Any:
    """f on the arrays' NumPy data (raw: args already unwrapped), the result on dev; on dev.tape while a graph is
    captured (moert/devices/graph.py), to be run again on the arrays' data of then by SimDevice.replay."""
    if raw is None:
        raw = [a._a if type(a) is SimArray else a if type(a) in _PLAIN else unwrap(a) for a in args]
    out = wrap(f(*raw, **{k: unwrap(v) for k, v in kwargs.items()}) if kwargs else f(*raw), dev)
    if dev.tape is not None:
        dev.tape.append((f, args, kwargs, out))
    return out


def into(out: Any, res: Any) -> None:
    """A replayed operation's result into the array the recorded one made (a view of the same memory is already so)."""
    if isinstance(out, SimArray):
        if not np.may_share_memory(out._a, res):
            np.copyto(out._a, res)
    elif isinstance(out, (tuple, list)):
        for o, r in zip(out, res):
            into(o, r)


def wrap(obj: Any, dev: Device) -> Any:
    if isinstance(obj, np.ndarray):
        return dev._adopt(obj)
    if isinstance(obj, np.generic):  # reductions give 0-d device arrays, as in CuPy
        return dev._adopt(np.asarray(obj))
    if isinstance(obj, tuple):
        return tuple(wrap(o, dev) for o in obj)
    if isinstance(obj, list):
        return [wrap(o, dev) for o in obj]
    return obj


class SimArray(NDArrayOperatorsMixin):
    """A NumPy array living on a simulated GPU: operations keep the tag, mixing devices raises."""

    __slots__ = ("_a", "device", "__weakref__")

    def __init__(self, a: np.ndarray, device: Device):
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
                return call(dev, ufunc, inputs, {}, raw)
        # ufunc.at takes host index arrays like indexing does
        checked = (inputs[0], _no_host(inputs[1]), inputs[2:]) if method == "at" else inputs
        dev = _common_device(f"numpy.{ufunc.__name__}.{method}", checked, kwargs.get("out", ()))
        out = kwargs.get("out")
        result = call(dev, getattr(ufunc, method), inputs, kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return result

    def __array_function__(self, func, types, args, kwargs):
        dev = _common_device(f"numpy.{func.__name__}", args, kwargs)
        name = func.__name__
        if name in _SORTS and dev.recording is not None:
            dev.refuse(f"numpy.{name}", _SORT_WHY)
        if name in _SYNCS or name == "where" and len(args) + len(kwargs) == 1:
            dev.host_read(f"numpy.{name} (CuPy reads its output's size back)")
        out = call(dev, func, args, kwargs)
        if type(out) in (bool, int, float) and name not in ("ndim", "size", "shape"):
            dev.host_read(f"numpy.{name}")                  # CuPy gives a 0-d device array; a Python value is a read
        return out

    # -- indexing
    def __getitem__(self, key):
        on = _no_host(key)
        _common_device("indexing", self, on)
        if any(k._a.dtype == bool for k in (on if type(on) is tuple else (on,))):       # () for host keys
            self.device.host_read("a boolean mask's indexing (CuPy reads the count back)")
        return call(self.device, operator.getitem, (self, key), {})

    def __setitem__(self, key, value):
        _common_device("item assignment", self, _no_host(key), value)
        call(self.device, operator.setitem, (self, key, value), {})

    # -- Python protocols (CuPy allows these on device arrays, with an implicit sync: counted, SimDevice.host_reads)
    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        for row in self._a:
            yield wrap(row, self.device)

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
        if name in _SORTS and self.device.recording is not None:
            self.device.refuse(f".{name}()", _SORT_WHY)
        if not callable(attr):
            return wrap(attr, self.device) if isinstance(attr, np.ndarray) else attr
        dev = self.device

        def method(*args, **kwargs):
            if _plain(args) and _plain(kwargs.values()):   # x.reshape(T, -1), x.sum(axis=-1): nothing to check
                return call(dev, attr, args, kwargs)
            _common_device(f"ndarray.{name}", self, args, kwargs)
            return call(dev, attr, args, kwargs)

        return method


_READS = frozenset({"item", "tolist", "tobytes", "tofile", "itemset"})
# functions whose output size depends on the values: CuPy reads a count back (a sync), e.g. bincount's max
_SYNCS = frozenset({"bincount", "nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"})
# CuPy sorts with thrust, which may synchronize: not counted as a read, but refused while a graph is captured
_SORTS = frozenset({"sort", "argsort", "lexsort", "partition", "argpartition"})
_SORT_WHY = "sorts: CuPy's sort (thrust) may synchronize, which a CUDA graph's capture cannot hold (moe._topk: argmax)"


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
