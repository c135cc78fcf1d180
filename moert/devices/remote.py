"""`ray:N`: a remote expert device, the N-th worker of a cluster (rules spell it RAY<N>, as CUDA<N>).

A remote device holds routed experts only, and no array of the host ever lives on it: per MoE layer and
forward call the host sends it one message (the normed hidden state, and its (token, expert, weight)
pairs) and gets one back (its experts' weighted sum). So it has no put / to_host; its interface is

    dev.submit(key, x, ids, weights) -> handle     start layer `key` on the worker (returns at once)
    dev.collect(handle, timeout) -> (T, D)         wait for it (a RemoteDeviceError past the timeout)

This module has what planning needs: the device's name, its counters (`RemoteStats`) and `RemoteDevice`,
a placeholder that plans (`moert inspect`, `moert.predict`) use without a cluster. moert/cluster/actors.py
implements it on Ray actors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from moert.devices import Device, DeviceMismatchError
from moert.errors import MoertError


class RemoteDeviceError(MoertError, RuntimeError):
    """A remote expert device (a Ray worker) died, hung, or cannot be reached or set up."""

    def __init__(self, message: str, device: str = "", layer: int | None = None):
        self.device, self.layer = device, layer
        super().__init__(message)


@dataclass
class RemoteStats:
    """Counters of one remote device: its calls, the bytes each way, and where the time went."""

    calls: int = 0               # expert-layer calls (one per MoE layer and forward call)
    sent_bytes: int = 0          # host -> worker: hidden states, expert ids, weights
    received_bytes: int = 0      # worker -> host: partial outputs
    round_trip_s: float = 0.0    # from sending a call to having its result, as the host saw it
    compute_s: float = 0.0       # the worker's expert kernels, as the worker measured them
    fallback_calls: int = 0      # calls the host CPU ran instead, the worker being lost (ray_fallback="cpu")

    def copy(self) -> RemoteStats:
        return RemoteStats(**asdict(self))

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())

    def __sub__(self, other: RemoteStats) -> RemoteStats:
        return RemoteStats(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def __add__(self, other: RemoteStats) -> RemoteStats:
        return RemoteStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def overhead_s(self) -> float:
        """Round trip minus compute: the network, serialisation and scheduling cost."""
        return self.round_trip_s - self.compute_s

    def as_dict(self) -> dict:
        """Plain data for --json (times in ms, and the overhead per call)."""
        out: dict[str, Any] = {k: v for k, v in asdict(self).items() if not k.endswith("_s")}
        out.update(round_trip_ms=self.round_trip_s * 1e3, compute_ms=self.compute_s * 1e3,
                   overhead_ms=self.overhead_s * 1e3,
                   overhead_ms_per_call=self.overhead_s * 1e3 / self.calls if self.calls else 0.0)
        return out


class RemoteDevice(Device):
    """ray:N in a plan: a worker that holds routed experts. This base class only names it (a plan made without a
    cluster); moert.cluster.RayDevice runs experts on it."""

    kind = "ray"

    def __init__(self, index: int):
        super().__init__(index, None)
        self.xp = np
        self.remote = RemoteStats()
        self.fallback: str | None = None   # "cpu": a lost worker's experts run on the host (from the mapped file)
        self.lost: RemoteDeviceError | None = None   # why the worker was given up (dead or hung); None: it is fine

    def __repr__(self) -> str:
        return f"<RemoteDevice {self.name} (planned; no cluster)>"

    def owns(self, arr: Any) -> bool:
        return False

    def put(self, host: np.ndarray, what: str = "") -> Any:
        raise DeviceMismatchError(f"{self.name} is a remote expert device: arrays do not live there, they go with "
                                  f"each expert call (moert/experts.py)")

    empty = to_host = put

    def reset_stats(self) -> None:
        super().reset_stats()
        self.remote.reset()

    def attach(self, tensors: dict, model_path: str, options: dict) -> None:
        """Give the worker its experts (name -> (type, shape, expert ids, host view)) before the first token."""
        raise RemoteDeviceError(f"{self.name} is in the plan (a RAY{self.index} rule) but no cluster is connected: "
                                f"pass ray='local:{self.index + 1}' (or a cluster address) to moert.load, or "
                                f"--ray local:{self.index + 1} on the command line", self.name)

    def lose(self, err: RemoteDeviceError) -> None:
        """Give the worker up (no more calls to it): with fallback "cpu" the host runs its experts from now, with a
        warning; without, every later call raises `err` again at once."""
        if self.lost is None and self.fallback == "cpu":
            import warnings

            warnings.warn(f"{err} -- its experts now run on this host's CPU from the mapped file "
                          f"(ray_fallback='cpu'; counted as fallback_calls)", RuntimeWarning, stacklevel=3)
        self.lost = self.lost or err

    def prepare(self, names: tuple, act: str, biases: tuple | None) -> int:
        """Tell the worker about a layer (its gate/up/down names, activation, biases); the key for `submit`."""
        raise RemoteDeviceError(f"{self.name}: no cluster is connected", self.name)

    def submit(self, key: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> Any:
        raise RemoteDeviceError(f"{self.name}: no cluster is connected", self.name)

    def collect(self, handle: Any, layer: int) -> np.ndarray:
        raise RemoteDeviceError(f"{self.name}: no cluster is connected", self.name)

    @staticmethod
    def start(handles: list) -> None:
        """Every worker's call of a layer submitted (a cluster with a compiled graph runs them now)."""

    @staticmethod
    def collect_many(pairs: list, layer: int) -> list[np.ndarray]:
        """collect() of several (device, handle) pairs (a cluster waits for them together)."""
        return [d.collect(h, layer) for d, h in pairs]

    def close(self) -> None:
        """Let the worker go (a no-op without a cluster)."""


def remote_devices(plan: Any) -> list[RemoteDevice]:
    """The remote devices of a plan (none for a plan without RAY rules)."""
    return list(getattr(plan, "remote", ()))


__all__ = ["RemoteDevice", "RemoteDeviceError", "RemoteStats", "remote_devices"]
