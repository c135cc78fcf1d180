"""Routing traces: which experts each token picked in each layer, with what weight, in order.

    m = moert.load(path, trace=True)            # or m.trace_start() ... m.trace_stop()
    m.generate("def main():", 32)
    t = m.trace                                 # moert.Trace: t.ids (N, L, K), t.weights (N, L, K)
    t.counts(); t.coverage(8); t.hits(plan); t.entropy(); t.coactivation()
    t.save("run.npz"); moert.Trace.load("run.npz")

A trace is what the router decided, so it does not depend on the placement (the same ids whatever the
devices). It is the raw material for placement research: `strategies.hot_experts` reads one, and
`moert trace FILE` summarises one. Dimension legend: N tokens, L layers, K experts per token, E experts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from moert.errors import MoertError


class TraceError(MoertError, ValueError):
    """A trace file that is not one, or a question a trace cannot answer (a plan of another model)."""


@dataclass
class Trace:
    """Per processed token: its position, whether it was part of a prompt (prefill), and per layer the
    selected expert ids and their weights (-1 and 0 in layers without routed experts)."""

    n_expert: int
    positions: np.ndarray                     # (N,) int64
    prefill: np.ndarray                       # (N,) bool
    ids: np.ndarray                           # (N, L, K) int32
    weights: np.ndarray                       # (N, L, K) float32
    logits: np.ndarray | None = None         # (N, L, E) float32 router logits, with trace="full"
    header: dict[str, Any] = field(default_factory=dict)   # model, architecture, config, placement, version
    # (M, 3) int64 rows (token, layer, expert): an expert cache's prefetch="next-router" predicted `expert` for
    # `layer` in the forward chunk starting at trace token `token` (what moert.replay and predict replay)
    prefetch: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    @property
    def n_layer(self) -> int:
        return int(self.ids.shape[1])

    # -- questions
    def counts(self) -> np.ndarray:
        """(L, E) int64: how often each expert of each layer was selected."""
        out = np.zeros((self.n_layer, self.n_expert), dtype=np.int64)
        for il in range(self.n_layer):
            ids = self.ids[:, il].reshape(-1)
            out[il] = np.bincount(ids[ids >= 0], minlength=self.n_expert)
        return out

    def coverage_curve(self) -> np.ndarray:
        """(E + 1,) float: share of all selections covered by the k hottest experts of each layer, k = 0..E."""
        c = -np.sort(-self.counts(), axis=1)                            # (L, E) hottest first
        total = c.sum()
        cum = np.concatenate([[0], np.cumsum(c.sum(axis=0))])
        return cum / total if total else np.zeros(self.n_expert + 1)

    def coverage(self, k: int) -> float:
        """Share of selections that the k hottest experts of each layer cover."""
        return float(self.coverage_curve()[min(max(int(k), 0), self.n_expert)])

    def hits(self, plan: Any) -> dict[str, float]:
        """Share of selections whose expert sits on each device of `plan` (its gate tensor's placement)."""
        c = self.counts()
        out: dict[str, float] = {}
        total = c.sum()
        for il in range(self.n_layer):
            if not c[il].any():
                continue
            name = next((n for n in (f"blk.{il}.ffn_gate_exps.weight", f"blk.{il}.ffn_up_exps.weight",
                                     f"blk.{il}.ffn_gate_up_exps.weight") if n in plan), None)
            if name is None:
                raise TraceError(f"the plan has no expert tensors for layer {il} (blk.{il}.ffn_gate_exps.weight); "
                                 f"is it a plan of the model this trace was recorded on ({self.header.get('model')})?")
            devs = plan.expert_devices(name)
            if len(devs) != self.n_expert:
                raise TraceError(f"{name} has {len(devs)} experts but the trace has {self.n_expert}")
            for e in np.flatnonzero(c[il]):
                out[devs[e]] = out.get(devs[e], 0.0) + float(c[il, e] / total)
        return dict(sorted(out.items()))

    def entropy(self) -> np.ndarray:
        """(L,) bits: entropy of each layer's expert selections (log2 E when every expert is used equally)."""
        c = self.counts().astype(np.float64)
        p = c / np.maximum(c.sum(axis=1, keepdims=True), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.nansum(np.where(p > 0, p * np.log2(p), 0.0), axis=1)

    def coactivation(self) -> np.ndarray:
        """(L, E, E) int64: how often experts i and j were selected by the same token (diagonal: counts)."""
        out = np.zeros((self.n_layer, self.n_expert, self.n_expert), dtype=np.int64)
        K = self.ids.shape[2]
        for il in range(self.n_layer):
            ids = self.ids[:, il]                                       # (N, K)
            ok = (ids >= 0).all(axis=1)
            for a in range(K):
                for b in range(K):
                    np.add.at(out[il], (ids[ok, a], ids[ok, b]), 1)
        return out

    def summary(self, plan: Any = None, ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)) -> dict[str, Any]:
        """Plain data for --json and the printed summary."""
        d = {"tokens": len(self), "prefill_tokens": int(self.prefill.sum()), "layers": self.n_layer,
             "experts": self.n_expert, "experts_per_token": int(self.ids.shape[2]),
             "counts": self.counts().tolist(), "entropy_bits": [round(float(x), 4) for x in self.entropy()],
             "coverage": {str(k): round(self.coverage(k), 4) for k in ks if k <= self.n_expert},
             "header": self.header}
        if plan is not None:
            d["hits"] = self.hits(plan)
        return d

    # -- files
    def save(self, path: str | Path) -> Path:
        """An .npz with the arrays and a JSON header."""
        path = Path(path)
        arrays = dict(positions=self.positions, prefill=self.prefill, ids=self.ids, weights=self.weights,
                      header=np.array(json.dumps({**self.header, "n_expert": self.n_expert})))
        if self.logits is not None:
            arrays["logits"] = self.logits
        if self.prefetch is not None:
            arrays["prefetch"] = self.prefetch
        with open(path, "wb") as f:
            np.savez_compressed(f, **arrays)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """A trace written by `save`."""
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(str(z["header"]))
                t = cls(int(header.pop("n_expert")), z["positions"], z["prefill"].astype(bool), z["ids"],
                        z["weights"], z["logits"] if "logits" in z.files else None, header,
                        z["prefetch"].astype(np.int64) if "prefetch" in z.files else None)
        except (OSError, KeyError, ValueError, json.JSONDecodeError) as e:
            raise TraceError(f"{path}: not a moert trace ({type(e).__name__}: {e}); write one with "
                             f"`moert run ... --trace FILE` or Trace.save") from None
        if t.ids.ndim != 3 or t.ids.shape != t.weights.shape or t.ids.shape[0] != t.positions.shape[0]:
            raise TraceError(f"{path}: inconsistent arrays (ids {t.ids.shape}, weights {t.weights.shape}, "
                             f"positions {t.positions.shape})")
        if t.ids.size and (t.ids.max() >= t.n_expert or t.ids.min() < -1):
            raise TraceError(f"{path}: expert ids outside [-1, {t.n_expert})")
        return t


class Recorder:
    """What a Model fills while tracing: one chunk's layers at a time, then whole tokens."""

    def __init__(self, n_layer: int, n_expert: int, k: int, full: bool, header: dict[str, Any]):
        self.n_layer, self.n_expert, self.k, self.full, self.header = n_layer, n_expert, k, full, header
        self._chunk: dict[int, tuple] = {}
        self._done: list[tuple] = []
        self._guesses: dict[int, tuple] = {}        # layer -> experts a cache's prefetch predicted, this chunk
        self._prefetch: list[np.ndarray] = []       # (m, 3) rows (token, layer, expert) of the chunks done
        self._tokens = 0                            # tokens of the chunks done
        self._prefetching = False                   # a prefetching cache ran: Trace.prefetch is an array

    def guess(self, layer: int, experts) -> None:
        """An expert cache's prefetch predicted `experts` for `layer` in this chunk (none: not a cached layer)."""
        self._guesses[layer], self._prefetching = tuple(experts), True

    def mark(self) -> tuple[int, int, int]:
        """Where the recording stands (a forward that fails goes back here: `rollback`)."""
        return len(self._done), len(self._prefetch), self._tokens

    def rollback(self, mark: tuple[int, int, int]) -> None:
        """Forget the chunks recorded since `mark` and the current one."""
        del self._done[mark[0]:], self._prefetch[mark[1]:]
        self._tokens = mark[2]
        self.drop_chunk()

    def layer(self, il: int, ids: np.ndarray, weights: np.ndarray, logits: np.ndarray | None) -> None:
        self._chunk[il] = (ids, weights, logits)

    def end_chunk(self, pos0: int, n: int, positions=None, prefill=None) -> None:
        """The chunk of n tokens at pos0 is done (a batch of sequences: each row's position and prefill flag)."""
        if not self._chunk:
            return
        ids = np.full((n, self.n_layer, self.k), -1, dtype=np.int32)
        w = np.zeros((n, self.n_layer, self.k), dtype=np.float32)
        lg = np.zeros((n, self.n_layer, self.n_expert), dtype=np.float32) if self.full else None
        for il, (i, x, g) in self._chunk.items():
            ids[:, il], w[:, il] = i, x
            if lg is not None and g is not None:
                lg[:, il] = g
        pos = np.arange(pos0, pos0 + n) if positions is None else np.asarray(positions, np.int64)
        self._done.append((pos, np.full(n, n > 1) if prefill is None else np.asarray(prefill, bool), ids, w, lg))
        rows = [(self._tokens, il, e) for il, es in sorted(self._guesses.items()) for e in es]
        if rows:
            self._prefetch.append(np.array(rows, dtype=np.int64).reshape(-1, 3))
        self._tokens += n
        self._guesses = {}
        self._chunk = {}

    def drop_chunk(self) -> None:
        self._chunk, self._guesses = {}, {}

    def trace(self) -> Trace:
        """Everything recorded so far, as a Trace."""
        if not self._done:
            z = np.zeros((0, self.n_layer, self.k))
            return Trace(self.n_expert, np.zeros(0, np.int64), np.zeros(0, bool), z.astype(np.int32),
                         z.astype(np.float32), np.zeros((0, self.n_layer, self.n_expert), np.float32)
                         if self.full else None, dict(self.header),
                         np.zeros((0, 3), np.int64) if self._prefetching else None)
        cols = list(zip(*self._done))
        pf = np.concatenate(self._prefetch) if self._prefetch else \
            np.zeros((0, 3), np.int64) if self._prefetching else None
        return Trace(self.n_expert, np.concatenate(cols[0]), np.concatenate(cols[1]), np.concatenate(cols[2]),
                     np.concatenate(cols[3]), np.concatenate(cols[4]) if self.full else None, dict(self.header),
                     pf)


class Tracing:
    """moert.Model's tracing: trace_start, trace_stop, trace (a Model records through `record_routing`)."""

    def trace_start(self, full: bool = False) -> None:
        """Record every token's routing from now on (full=True: the router logits too)."""
        from moert import __version__

        c = self.config
        cfg = {k: v for k, v in vars(c).items() if isinstance(v, (int, float, str, bool))}
        header = {"model": Path(str(self.gguf.path)).name, "model_path": str(Path(str(self.gguf.path)).resolve()),
                  "architecture": c.arch, "config": cfg, "n_batch": self.n_batch,
                  "placement": {"overrides": self.plan.overrides_string(), "gpu_layers": self.plan.gpu_layers,
                                "bytes_by_device": self.plan.bytes_by_device()}, "moert_version": __version__}
        self._trace = Recorder(c.n_layer, getattr(c, "n_expert", 0), getattr(c, "n_expert_used", 0), full, header)

    def record_prefetch(self, layer: int, experts) -> None:
        """An expert cache's prefetch predicted `experts` for `layer` in this chunk (kept in the trace)."""
        if self._trace is not None:
            self._trace.guess(layer, experts)

    def trace_stop(self):
        """Stop recording; the Trace recorded (None if none was started)."""
        t, self._trace = self.trace, None
        return t

    @property
    def trace(self):
        """The routing recorded since trace_start / load(trace=True), as a moert.Trace (None: not tracing)."""
        return None if self._trace is None else self._trace.trace()
