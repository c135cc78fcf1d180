"""Replay speed: (token, layer) routing decisions per second per policy, the Numba path and its Python twin.

    python bench/replay_speed.py [--tokens 10000] [--layers 48] [--experts 128] [--k 8] [--prefetch]

A synthetic trace (Zipf-like skew per layer, decode tokens only) of the goal's size: 10,000 tokens x 48 layers,
top-8 of 128; 20 cache sizes (4 to 80 per layer) per policy, the request sequence built once. The twin
(fast=False, policies.py stepped in Python) runs 1,000 tokens of it at one size, for the ratio. --prefetch: the
caches prefetch (prefetch="next-router") with synthetic guesses in the trace (Trace.prefetch): for each token
and layer after the first, its K experts, each swapped for a random one with probability 1/2; a decision is
then one (token, layer) routing and its guesses.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moert.dynamic import ExpertCache, accesses, replay  # noqa: E402
from moert.trace import Trace  # noqa: E402


def synthetic(N: int, L: int, E: int, K: int, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    w = 1 / np.arange(1, E + 1) ** 0.8
    ids = np.empty((N, L, K), np.int32)
    for il in range(L):
        p = w[rng.permutation(E)]
        g = rng.gumbel(size=(N, E)) + np.log(p / p.sum())            # K distinct experts by their weights
        ids[:, il] = np.argsort(-g, axis=1)[:, :K]
    return Trace(E, np.arange(N), np.zeros(N, bool), ids, np.ones(ids.shape, np.float32), None, {})


def guesses(t: Trace, seed: int = 1) -> np.ndarray:
    """(M, 3) rows (token, layer, expert): each token's experts of layers 1.., half of them swapped at random."""
    rng = np.random.default_rng(seed)
    N, L, K = t.ids.shape
    g = t.ids[:, 1:].copy()                                          # (N, L - 1, K)
    bad = rng.random(g.shape) < 0.5
    g[bad] = rng.integers(0, t.n_expert, int(bad.sum()))
    tok, lay = np.meshgrid(np.arange(N), np.arange(1, L), indexing="ij")
    return np.stack([np.repeat(tok.reshape(-1), K), np.repeat(lay.reshape(-1), K), g.reshape(-1)], axis=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=10000)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--prefetch", action="store_true", help="prefetching caches, synthetic guesses")
    a = ap.parse_args()
    t = synthetic(a.tokens, a.layers, a.experts, a.k)
    pf = dict(prefetch="next-router") if a.prefetch else {}
    t.prefetch = guesses(t) if a.prefetch else None
    t0 = time.perf_counter()
    acc = accesses(t)
    build = time.perf_counter() - t0
    replay(t, ExpertCache("sim:0", 8, "lru", **pf), acc=acc)          # compile (Numba's cache keeps it)
    sizes = list(range(4, 84, 4))
    small = Trace(t.n_expert, t.positions[:1000], t.prefill[:1000], t.ids[:1000], t.weights[:1000], None, {},
                  None if t.prefetch is None else t.prefetch[t.prefetch[:, 0] < 1000])
    small_acc = accesses(small)
    print(f"{platform.node()}: {a.tokens} tokens x {a.layers} layers, top-{a.k} of {a.experts}: {len(acc):,} "
          f"requests, built in {build:.2f} s; 20 sizes (4..80 per layer) per policy"
          + (f"; prefetching: {len(t.prefetch):,} guesses" if a.prefetch else "") + "\n")
    print("| policy | 20 sizes (s) | M decisions/s | Python twin, 1,000 tokens at 32 slots (s) | fast / twin |")
    print("|---|---:|---:|---:|---:|")
    for p in ("lru", "lfu", "lfru", "static") + (() if a.prefetch else ("belady",)):
        t0 = time.perf_counter()
        for s in sizes:
            replay(t, ExpertCache("sim:0", s, p, **pf), acc=acc)
        dt = time.perf_counter() - t0
        t0 = time.perf_counter()
        replay(small, ExpertCache("sim:0", 32, p, **pf), acc=small_acc, fast=False)
        slow = time.perf_counter() - t0
        t0 = time.perf_counter()
        replay(small, ExpertCache("sim:0", 32, p, **pf), acc=small_acc)
        fast = time.perf_counter() - t0
        print(f"| {p} | {dt:.2f} | {len(sizes) * a.tokens * a.layers / dt / 1e6:.1f} | {slow:.2f} | "
              f"{slow / fast:.0f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
