"""Replay an expert cache over a recorded routing trace, without the model: `moert.replay(trace, cache)`.

    r = moert.replay(trace, moert.ExpertCache("sim:0", slots=16, policy="lru"))
    r.hits, r.misses            # (L,) int64 per MoE layer, as m.stats.cache counts them at run time
    r.hit_rate, r.bytes_per_token, r.evictions
    moert.dynamic.sweep(trace, [8, 16, 32], ["lru", "belady"])    # the access sequence built once

The requests are the runtime's, in its order (moert/dynamic/requests.py: per forward chunk and layer, the
chunk's distinct experts in ascending id). A hit runs the expert on the cache device; a miss runs it where
the plan put it and, if the policy admits it, copies its weights to the cache (the bytes a replay counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert.dynamic.cache import CacheError, ExpertCache
from moert.dynamic.requests import Accesses, accesses, as_rows, cacheable, decide, merge, prefetches


@dataclass
class Replay:
    """What a cache did over a trace, per MoE layer (L,) int64: hits, misses, admissions (misses whose weights
    were copied to the cache), evictions, cold (first requests of an expert: misses for any cache)."""

    cache: ExpertCache
    hits: np.ndarray
    misses: np.ndarray
    admissions: np.ndarray
    evictions: np.ndarray
    cold: np.ndarray
    tokens: int
    expert_bytes: np.ndarray | None = None      # (L,) bytes of one expert of each layer (gate + up + down)
    prefetch_admissions: np.ndarray | None = None   # (L,) experts a prefetch brought in (with prefetch)
    prefetch_copies: np.ndarray | None = None       # (L,) of them copied (not evicted by their own prefetch)

    @property
    def hit_rate(self) -> float:
        n = int(self.hits.sum() + self.misses.sum())
        return float(self.hits.sum()) / n if n else 0.0

    @property
    def bytes(self) -> int | None:
        """Weight bytes copied to the cache ((admissions + prefetch copies) x expert bytes); None without
        expert_bytes."""
        if self.expert_bytes is None:
            return None
        copies = self.admissions + (0 if self.prefetch_copies is None else self.prefetch_copies)
        return int((copies * self.expert_bytes).sum())

    @property
    def bytes_per_token(self) -> float | None:
        b = self.bytes
        return None if b is None else b / max(self.tokens, 1)

    def to_dict(self) -> dict:
        c = self.cache
        return {"policy": c.policy, "slots": int(c.slots), "per_layer": c.per_layer, "tokens": self.tokens,
                "hit_rate": round(self.hit_rate, 6), "hits": self.hits.tolist(), "misses": self.misses.tolist(),
                "admissions": self.admissions.tolist(), "evictions": self.evictions.tolist(),
                "cold": self.cold.tolist(), "bytes": self.bytes, "bytes_per_token": self.bytes_per_token,
                "prefetch": c.prefetch, **({} if self.prefetch_admissions is None else {
                    "prefetch_admissions": self.prefetch_admissions.tolist(),
                    "prefetch_copies": self.prefetch_copies.tolist()})}


def replay(trace, cache: ExpertCache, *, fast: bool = True, n_batch: int | None = None,
           expert_bytes=None, acc: Accesses | None = None, prefetch: list | None = None, plan=None) -> Replay:
    """Run `cache`'s policy over `trace` (a moert.Trace); fast=False steps the plain-Python policies of
    policies.py instead of the Numba kernel (same result). expert_bytes: (L,) or one number, the bytes of
    one expert per layer, for `bytes`; acc: accesses(trace) when sweeping many caches over one trace.
    plan: the run's placement when it keeps some experts on a GPU (--n-cpu-moe N): only the experts it put on
    the CPU are requests (moert.dynamic.requests.cacheable), as at run time.
    A cache with prefetch="next-router" inserts the predictions the trace recorded (Trace.prefetch, from a run
    with such a cache attached from the trace's start) before each chunk's requests of their layer; prefetch:
    [(chunk, layer, experts), ...] instead (a run's `m.expert_cache.prefetch_log`), or (M, 3) rows (chunk,
    layer, expert)."""
    if not isinstance(cache, ExpertCache):
        raise CacheError(f"replay takes a moert.ExpertCache, not {type(cache).__name__}: "
                         f"replay(trace, moert.ExpertCache('sim:0', slots=16, policy='lru'))")
    mask = None if plan is None else cacheable(plan, trace.n_layer, int(trace.n_expert))
    acc = acc if acc is not None else accesses(trace, n_batch, cacheable=mask)
    L, E = acc.n_layer, acc.n_expert
    counts = cache.hot_counts(trace) if cache.policy == "static" else None
    if counts is not None and counts.shape != (L, E):
        raise CacheError(f"the static cache's hot set comes from counts of shape {counts.shape}, the trace is "
                         f"{L} layers x {E} experts: give hot= a trace of the same model")
    merged = None
    if prefetch is not None:
        rows = as_rows(prefetch)
    elif cache.prefetch:                  # the trace's guesses and their merge with the requests: once per acc
        rows = acc._memo("_prefetch_rows", lambda: prefetches(trace, cache, n_batch, mask))
        merged = acc._memo("_merged", lambda: merge(acc, rows)) if fast else None
    else:
        rows = None
    _, _, per, _, copied = decide(acc, cache, counts, rows, fast, merged)
    total = acc.requests_per_layer()
    eb = None if expert_bytes is None else np.broadcast_to(np.asarray(expert_bytes, dtype=np.int64), (L,)).copy()
    pre = (None, None) if rows is None else (per[3], np.bincount(rows[copied, 1], minlength=L).astype(np.int64))
    return Replay(cache, per[0], total - per[0], per[1], per[2], acc.cold(), acc.n_tokens, eb, *pre)


def sweep(trace, slots, policies, per_layer: bool = True, expert_bytes=None, n_batch: int | None = None,
          **options) -> list[Replay]:
    """replay for every (policy, slots) pair, the access sequence built once; options go to ExpertCache."""
    acc = accesses(trace, n_batch)
    return [replay(trace, ExpertCache("sim:0", int(s), p, per_layer, **options), acc=acc,
                   expert_bytes=expert_bytes) for p in policies for s in slots]


__all__ = ["Replay", "replay", "sweep"]
