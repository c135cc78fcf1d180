"""What a forward call measured: time per phase and device, transfers, expert selections (`Model.stats`).

    Stats        counters of one forward call, or of several added up
    ModelStats   `last` (the latest call), `total` (every call since load or reset()), and `prefill` /
                 `decode` (the calls of several tokens / of one); `to_dict()` for --json
    Phase        `with m.phase("attention", dev):` the timer the architecture files use

With a virtual clock (`moert.load(..., hardware=hw)`, moert/cost/vclock.py) the times of sim GPUs and of transfers
to and from them are the cost model's predictions for that hardware, not NumPy's; CPU times stay measured.
`Stats.predicted` names the (phase, device) cells that are predicted, `predicted_seconds` their share of
`seconds`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from moert.devices import Device, TransferStats
from moert.devices.remote import RemoteStats

# "layer": a decode step's whole layer in two CPU kernel calls: attention, router and experts (moert/fused.py)
PHASES = ("embed", "attention", "router", "experts", "ffn", "layer", "transfers", "output")
_PHASE_INDEX = {p: i for i, p in enumerate(PHASES)}


@dataclass
class Stats:
    """Counters of one forward call, or of all of them (`Model.stats.total`)."""

    n_layer: int
    n_expert: int
    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    time: dict[str, dict[str, float]] = field(default_factory=dict)    # phase -> device -> seconds
    transfers: dict[str, TransferStats] = field(default_factory=dict)  # device -> its counted transfers
    expert_counts: np.ndarray = None    # (n_layer, n_expert) int64: how often each expert was selected
    layer_time: np.ndarray = None       # (n_layer, len(PHASES)) seconds per layer and phase
    hardware: str = ""                  # the virtual clock's hardware ("": every time is measured)
    predicted_seconds: float = 0.0      # of `seconds`: the virtual clock's (sim GPUs and their transfers)
    predicted: set = field(default_factory=set)   # (phase, device) cells of `time` that are predicted
    remote: dict[str, RemoteStats] = field(default_factory=dict)   # ray:N -> its calls, bytes, round trips

    def __post_init__(self):
        if self.expert_counts is None:
            self.expert_counts = np.zeros((self.n_layer, self.n_expert), dtype=np.int64)
        if self.layer_time is None:
            self.layer_time = np.zeros((self.n_layer, len(PHASES)), dtype=np.float64)

    def add_time(self, phase: str, device: str, seconds: float, layer: int | None = None) -> None:
        d = self.time.setdefault(phase, {})
        d[device] = d.get(device, 0.0) + seconds
        if layer is not None and phase in _PHASE_INDEX:
            self.layer_time[layer, _PHASE_INDEX[phase]] += seconds

    def add_predicted(self, phase: str, device: str, seconds: float, layer: int | None = None) -> None:
        """Time the virtual clock predicts for (phase, device)."""
        self.add_time(phase, device, seconds, layer)
        self.predicted.add((phase, device))
        self.predicted_seconds += seconds

    def __iadd__(self, other: Stats) -> Stats:
        self.calls += other.calls
        self.tokens += other.tokens
        self.seconds += other.seconds
        self.hardware = other.hardware or self.hardware
        self.predicted_seconds += other.predicted_seconds
        self.predicted |= other.predicted
        for phase, per_dev in other.time.items():
            for dev, s in per_dev.items():
                self.add_time(phase, dev, s)
        for dev, t in other.transfers.items():
            self.transfers[dev] = self.transfers.get(dev, TransferStats()) + t
        for dev, r in other.remote.items():
            self.remote[dev] = self.remote.get(dev, RemoteStats()) + r
        self.expert_counts += other.expert_counts
        self.layer_time += other.layer_time
        return self

    def to_dict(self) -> dict:
        """Plain data for --json: per phase and device (ms), transfers per device and direction, expert
        counts (n_layer x n_expert), and per layer the ms of each phase. With a virtual clock, "clock" says
        which cells of time_ms are predicted for which hardware and how much of ms is predicted."""
        out = {
            "calls": self.calls, "tokens": self.tokens, "ms": self.seconds * 1e3,
            "tokens_per_s": self.tokens / self.seconds if self.seconds else None,
            "time_ms": {p: {d: s * 1e3 for d, s in sorted(per.items())} for p, per in self.time.items()},
            "transfers": {d: asdict(t) for d, t in sorted(self.transfers.items())},
            "expert_counts": self.expert_counts.tolist(),
            "layer_time_ms": {p: (self.layer_time[:, i] * 1e3).round(4).tolist() for i, p in enumerate(PHASES)
                              if self.layer_time[:, i].any()},
        }
        if self.remote:
            out["remote"] = {d: r.as_dict() for d, r in sorted(self.remote.items())}
        if self.hardware:
            out["clock"] = {"hardware": self.hardware, "predicted_ms": self.predicted_seconds * 1e3,
                            "measured_ms": (self.seconds - self.predicted_seconds) * 1e3,
                            "predicted": sorted(f"{p} {d}" for p, d in self.predicted),
                            "note": "time_ms cells listed in 'predicted' are the cost model's for this hardware "
                                    "(sim GPUs and their transfers); every other time is measured here"}
        return out

    @property
    def transfer_bytes(self) -> int:
        return sum(t.bytes for t in self.transfers.values())

    @property
    def transfer_count(self) -> int:
        return sum(t.count for t in self.transfers.values())

    def phase_seconds(self, phase: str) -> float:
        return sum(self.time.get(phase, {}).values())

    def __str__(self) -> str:
        tps = self.tokens / self.seconds if self.seconds else 0.0
        lines = [f"{self.calls} call(s), {self.tokens} tokens, {self.seconds * 1e3:.1f} ms ({tps:.1f} tok/s)"]
        if self.hardware:
            lines[0] += (f": {self.predicted_seconds * 1e3:.1f} ms predicted for {self.hardware}'s GPU and link, "
                         f"{(self.seconds - self.predicted_seconds) * 1e3:.1f} ms measured here")
        lines.append(f"{'phase':<10} {'device':<14} {'ms':>10}" + ("  clock" if self.hardware else ""))
        for phase in PHASES:
            for dev, s in sorted(self.time.get(phase, {}).items()):
                clock = ("  predicted" if (phase, dev) in self.predicted else "  measured") if self.hardware else ""
                lines.append(f"{phase:<10} {dev:<14} {s * 1e3:>10.2f}{clock}")
        lines.append(f"{'device':<8} {'h2d n':>6} {'h2d bytes':>12} {'d2h n':>6} {'d2h bytes':>12} "
                     f"{'d2d n':>6} {'d2d bytes':>12}")
        for dev, t in sorted(self.transfers.items()):
            lines.append(f"{dev:<8} {t.h2d_count:>6} {t.h2d_bytes:>12,} {t.d2h_count:>6} {t.d2h_bytes:>12,} "
                         f"{t.d2d_count:>6} {t.d2d_bytes:>12,}")
            if t.weight_count:                   # an expert cache's copies: weights, not activations
                lines.append(f"{'':<8} and {t.weight_count} weight copies in at run time, {t.weight_bytes:,} bytes")
            if t.offload_count:                  # a big batch's CPU experts copied in (op offload)
                lines.append(f"{'':<8} and {t.offload_count} op-offload copies of CPU weights, "
                             f"{t.offload_bytes:,} bytes")
        if self.remote:
            lines.append(f"{'remote':<8} {'calls':>6} {'sent':>12} {'received':>12} {'round trip ms':>14} "
                         f"{'worker ms':>10} {'overhead/call ms':>17} {'fallback':>8}")
            for dev, r in sorted(self.remote.items()):
                per = r.overhead_s * 1e3 / r.calls if r.calls else 0.0
                lines.append(f"{dev:<8} {r.calls:>6} {r.sent_bytes:>12,} {r.received_bytes:>12,} "
                             f"{r.round_trip_s * 1e3:>14.2f} {r.compute_s * 1e3:>10.2f} {per:>17.3f} "
                             f"{r.fallback_calls:>8}")
        return "\n".join(lines)


class ModelStats:
    """`last`: the latest forward call; `total`: every call since load (or `reset()`); `prefill` and
    `decode`: the calls of several tokens, and of one."""

    def __init__(self, n_layer: int, n_expert: int):
        self._shape = (n_layer, n_expert)
        self.cache = None        # an expert cache's counters (moert/dynamic/runtime.py CacheStats), if any
        self.reset()

    def reset(self) -> None:
        """Zero them all."""
        self.last, self.total = Stats(*self._shape), Stats(*self._shape)
        self.prefill, self.decode = Stats(*self._shape), Stats(*self._shape)
        if self.cache is not None:
            self.cache = type(self.cache).zeros(self._shape[0])

    def snapshot(self) -> dict:
        """A copy of every counter, for `restore` (the warm-up leaves the stats as they were)."""
        import copy

        return copy.deepcopy(vars(self))

    def restore(self, snapshot: dict) -> None:
        vars(self).update(snapshot)

    def add(self, call: Stats) -> None:
        """Count a finished forward call."""
        self.last = call
        self.total += call
        (self.prefill if call.tokens > 1 else self.decode).__iadd__(call)

    def to_dict(self) -> dict:
        out = {"total": self.total.to_dict(), "prefill": self.prefill.to_dict(), "decode": self.decode.to_dict(),
               "last": self.last.to_dict()}
        if self.cache is not None:
            out["cache"] = self.cache.to_dict()
        return out

    def __str__(self) -> str:
        return f"last call:\n{self.last}\n\ncumulative:\n{self.total}"


class Phase:
    """Model.phase's context manager: time inside goes to (phase, device) in the model's current call;
    nested phases pause the outer one (a class: a generator-based one costs microseconds per layer).
    predicted: the virtual clock's seconds for this phase, counted instead of the time measured inside."""

    __slots__ = ("m", "name", "dev", "predicted")

    def __init__(self, m, name: str, dev: Device | str, predicted: float | None = None):
        self.m, self.name, self.dev, self.predicted = m, name, dev, predicted

    def __enter__(self) -> None:
        m, now = self.m, time.perf_counter()
        if m._phases:
            outer = m._phases[-1]
            m._add_time(outer[0], outer[1], now - outer[2], outer[3] is not None)
        m._phases.append([self.name, self.dev if isinstance(self.dev, str) else self.dev.name, now, self.predicted])

    def __exit__(self, *exc) -> None:
        m = self.m
        if not isinstance(self.dev, str):
            self.dev.synchronize()
        now = time.perf_counter()
        p = m._phases.pop()
        m._add_time(p[0], p[1], now - p[2], p[3] is not None)
        if p[3] is not None:
            m._add_predicted(p[0], p[1], p[3])
        if m._phases:
            m._phases[-1][2] = now
