"""`moert.ExpertCache`: what an expert cache is (device, size, policy, prefetch), for replays, runs and predictions.

    cache = moert.ExpertCache("sim:0", slots=16, policy="lru")          # 16 experts per MoE layer
    cache = moert.ExpertCache("sim:0", slots=256, per_layer=False)      # 256 experts shared by all layers
    moert.replay(trace, cache).hit_rate

A cache is a value: it says nothing about a model until it is used with one. The experts it holds are keyed
layer * E + expert; `policies()` makes one policy object per cache (per layer, or one for the pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moert.dynamic.policies import POLICIES, CacheError, Policy
from moert.errors import ArgumentError

PREFETCH = (None, "next-router")


@dataclass(frozen=True)
class ExpertCache:
    """`slots` experts per MoE layer (per_layer=True) or in total (per_layer=False) kept on `device`,
    managed by `policy` (moert/dynamic/policies.py: lru, lfu, lfru, static, belady). `hot`: for "static",
    the trace (or (L, E) selection counts) whose hottest experts it keeps (default: the replayed trace
    itself); `half_life`: lfru's, in trace steps (tokens in decode). `prefetch="next-router"`: layer l + 1's
    router applied to layer l's MoE input picks experts copied in early (moert/dynamic/runtime.py); a replay or
    a prediction takes the guesses a run recorded in its trace (Trace.prefetch). Not with belady."""

    device: Any = "sim:0"
    slots: int = 8
    policy: str = "lru"
    per_layer: bool = True
    prefetch: str | None = None
    hot: Any = field(default=None, compare=False)
    half_life: float = 32.0
    prefetch_k: int | None = None       # experts a prefetch takes per token (None: the model's top-K)

    def __post_init__(self):
        if isinstance(self.slots, bool) or not isinstance(self.slots, (int, np.integer)) or self.slots < 0:
            raise ArgumentError(f"ExpertCache slots={self.slots!r}: give a whole number of experts >= 0 "
                                f"(per MoE layer, or in total with per_layer=False), e.g. slots=16")
        if self.policy not in POLICIES:
            raise ArgumentError(f"ExpertCache policy={self.policy!r}: use one of {', '.join(POLICIES)}")
        if self.prefetch not in PREFETCH:
            raise ArgumentError(f"ExpertCache prefetch={self.prefetch!r}: use None or 'next-router'")
        if self.prefetch and self.policy == "belady":
            raise ArgumentError("ExpertCache policy='belady' with prefetch: Belady already knows every request, a "
                                "prediction adds nothing to the optimum; give prefetch=None (or another policy)")
        if not (isinstance(self.half_life, (int, float)) and self.half_life > 0):
            raise ArgumentError(f"ExpertCache half_life={self.half_life!r}: give a positive number of tokens")

    def keep(self, counts: np.ndarray) -> np.ndarray:
        """(L * E,) bool: the static set for selection counts (L, E): per layer its `slots` most selected
        experts (per_layer), or the `slots` most selected (layer, expert) pairs overall; never an expert that
        was not selected; ties go to the lower index (hot_experts' order: most selections first)."""
        c = np.asarray(counts, dtype=np.int64)
        L, E = c.shape
        keep = np.zeros(L * E, dtype=bool)
        if self.per_layer:
            order = np.argsort(-c, axis=1, kind="stable")[:, :self.slots]          # (L, slots)
            rows = np.repeat(np.arange(L), order.shape[1])
            sel = order.reshape(-1)
            ok = c[rows, sel] > 0
            keep[rows[ok] * E + sel[ok]] = True
        else:
            flat = c.reshape(-1)
            top = np.argsort(-flat, kind="stable")[:self.slots]
            keep[top[flat[top] > 0]] = True
        return keep

    def policies(self, n_layer: int, n_expert: int, counts: np.ndarray | None = None) -> list[Policy]:
        """One policy object per cache: n_layer of them (per_layer) or one."""
        cls = POLICIES[self.policy]
        n = n_layer if self.per_layer else 1
        if self.policy == "static":
            if counts is None:
                raise CacheError("a static cache needs the selection counts its hot set comes from: pass a trace "
                                 "(ExpertCache(..., hot=trace))")
            keys = np.flatnonzero(self.keep(counts))
            part = keys // n_expert if self.per_layer else np.zeros_like(keys)
            return [cls(self.slots, frozenset(int(k) for k in keys[part == p])) for p in range(n)]
        if self.policy == "lfru":
            return [cls(self.slots, self.half_life) for _ in range(n)]
        return [cls(self.slots) for _ in range(n)]

    def predict(self, plan, hardware, trace, n_prompt: int = 512, n_gen: int = 128, depth: int = 0, **options):
        """moert.predict(plan, hardware, ..., cache=self, trace=trace): moert/dynamic/predict.py."""
        from moert.dynamic.predict import predict_with_cache

        return predict_with_cache(plan, hardware, self, trace, n_prompt, n_gen, depth, **options)

    def hot_counts(self, trace) -> np.ndarray | None:
        """The (L, E) counts the static set comes from: `hot` (a Trace or counts), else `trace`'s."""
        src = trace if self.hot is None else self.hot
        if src is None:
            return None
        return np.asarray(src.counts() if hasattr(src, "counts") else src, dtype=np.int64)


def expert_bytes(model: Any, n_layer: int | None = None) -> np.ndarray:
    """(L,) int64: the bytes of one expert (its gate, up and down rows, biases included) in each layer of
    `model` (a GGUF path, open file or Plan's model), 0 in layers without routed experts: what a miss copies."""
    from moert.placement.memory import EXPERT_TENSORS
    from moert.placement.plan import model_info

    info = model_info(model)
    out = np.zeros(n_layer or info.n_layer, dtype=np.int64)
    for name, t in info.tensors.items():
        if name.startswith("blk.") and EXPERT_TENSORS.search(name):
            il = int(name.split(".")[1])
            if il < out.shape[0]:
                out[il] += t[2] // t[1][0]                 # bytes / experts: one expert's share
    return out


__all__ = ["PREFETCH", "CacheError", "ExpertCache", "expert_bytes"]
