"""What `predict` returns: a Prediction, its terms (Part: a stage of a layer on a device, or a transfer, and what
bounds it), a table and plain data."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field

from moert.cost import coverage
from moert.cost.range import VALIDATION, likely
from moert.cost.range import kind as _kind


@dataclass(frozen=True)
class Part:
    """One term of a prediction: a stage of a layer on a device (or a transfer), and what bounds it."""

    phase: str                   # "prefill" (per micro-batch, summed) or "decode" (per token)
    device: str                  # "cpu", "gpu0", ..., "link"
    layer: int | None            # None: input/output and per-forward costs
    stage: str                   # "attention", "ffn", "experts", "output", "transfer", "offload", "overhead"
    bytes: float = 0.0           # bytes read from the device's memory (or moved over the link)
    flops: float = 0.0
    ops: float = 0.0             # launches (GPU), calls (CPU), copies (link)
    seconds: float = 0.0
    bound: str = ""              # "memory", "compute", "kernel", "overhead", "latency", "bandwidth"


@dataclass
class Prediction:
    """Predicted speeds and every term behind them; `table()` prints a summary."""

    decode_tok_s: float
    prefill_tok_s: float
    decode_s: float              # seconds per decoded token (at the mean depth of the tg test)
    prefill_s: float             # seconds for the n_prompt tokens
    parts: list[Part]
    fits: bool
    memory: dict[str, dict]      # per GPU: need, capacity (bytes)
    settings: dict = field(default_factory=dict)
    classes: dict = field(default_factory=dict)     # its coverage class per axis (moert/cost/coverage.py)

    def seconds_by(self, phase: str, key: str = "device") -> dict[str, float]:
        """Seconds of a phase summed by "device", "stage", "bound" or "layer"."""
        out: dict = defaultdict(float)
        for p in self.parts:
            if p.phase == phase:
                out[getattr(p, key)] += p.seconds
        return dict(out)

    def kind(self) -> str:
        """"cpu-only", "hybrid" or "all-GPU": the class of figures whose out-of-sample error sets the ranges."""
        return _kind(p.device for p in self.parts)

    def likely(self, phase: str) -> tuple[float, float]:
        """(low, high) tok/s of a phase ("prefill" or "decode"): the prediction times and divided by the 68%
        out-of-sample spread of its class on published figures (moert/cost/range.py), widened where the machine or
        setting is in a class of few figures (`extrapolating`; coverage.widened)."""
        return likely(self.prefill_tok_s if phase == "prefill" else self.decode_tok_s, phase, self.kind(),
                      len(self.extrapolating_in((phase,))))

    @property
    def extrapolating(self) -> list[str]:
        """Why this prediction is outside what published figures checked: one reason per class with fewer than
        coverage.MIN_FIGURES training figures ("no figure from a 2-socket box", "2 figures at depth >32k")."""
        return self.extrapolating_in(("prefill", "decode") if self.settings.get("n_prompt") else ("decode",))

    def extrapolating_in(self, phases) -> list[str]:
        """The reasons of `extrapolating` for these phases."""
        return coverage.reasons(self.classes, VALIDATION["coverage"], phases) if self.classes else []

    def bound(self, phase: str) -> str:
        """The device and resource taking most of a phase's time, e.g. "cpu memory"."""
        out: dict = defaultdict(float)
        for p in self.parts:
            if p.phase == phase:
                out[f"{p.device} {p.bound}"] += p.seconds
        return max(out, key=out.get) if out else ""

    def table(self) -> str:
        """Speeds, then seconds per phase by device and stage, and the bound."""
        s = self.settings
        (plo, phi), (dlo, dhi) = self.likely("prefill"), self.likely("decode")
        lines = [f"{s.get('hardware')}: pp{s.get('n_prompt')} {self.prefill_tok_s:,.1f} tok/s (likely {plo:,.0f}-"
                 f"{phi:,.0f}), tg{s.get('n_gen')} {self.decode_tok_s:,.2f} tok/s (likely {dlo:,.1f}-{dhi:,.1f}) at "
                 f"depth {s.get('depth')} "
                 f"({'fits' if self.fits else 'DOES NOT FIT'}; policy {s.get('policy')})"]
        for phase in ("prefill", "decode"):
            tot = sum(self.seconds_by(phase).values()) or 1.0
            cells = ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in sorted(
                self.seconds_by(phase, "stage").items(), key=lambda kv: -kv[1]) if v / tot >= 0.005)
            lines.append(f"  {phase:<8} bound by {self.bound(phase):<16} {cells}")
        for d, m in self.memory.items():
            lines.append(f"  {d}: needs {m['need'] / 2**30:.2f} GiB of {m['capacity'] / 2**30:.2f} GiB")
        lines += [f"  extrapolating: {r}" for r in self.extrapolating]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"decode_tok_s": self.decode_tok_s, "prefill_tok_s": self.prefill_tok_s, "decode_s": self.decode_s,
                "prefill_s": self.prefill_s, "fits": self.fits, "memory": self.memory, "settings": self.settings,
                "bound": {ph: self.bound(ph) for ph in ("prefill", "decode")}, "kind": self.kind(),
                "likely": {ph: list(self.likely(ph)) for ph in ("prefill", "decode")},
                "classes": self.classes, "extrapolating": self.extrapolating,
                "parts": [asdict(p) for p in self.parts]}


# ------------------------------------------------------------------------------------------- predict
