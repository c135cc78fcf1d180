"""Memory read bandwidth of this machine: one thread and all threads, so kernel figures read as a fraction.

    python bench/bandwidth.py [--mib 512] [--rounds 5] [--threads N] [--json]

Reads a buffer much larger than the last-level cache with a vectorized float32 sum (8 independent
accumulators, so the adds never limit it) and reports the best of `rounds` in GB/s (1e9 bytes/s).
The multi-thread figure splits the buffer into one contiguous piece per thread. Other processes on the
machine share the memory bus, so the figure is what *this* run could get, not the hardware's peak.
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np
from numba import njit, prange

_FAST = {"reassoc", "contract"}


@njit(cache=True, fastmath=_FAST)
def _sum(a, lo, hi):
    """Sum of a[lo:hi] (float32) through 8 accumulators of 8 lanes: reads, never limited by adds."""
    acc = np.zeros(64, dtype=np.float32)
    n = lo + (hi - lo) // 64 * 64
    for i in range(lo, n, 64):
        for j in range(64):
            acc[j] += a[i + j]
    s = np.float32(0.0)
    for j in range(64):
        s += acc[j]
    for i in range(n, hi):
        s += a[i]
    return s


@njit(cache=True)
def read_1(a):
    """One thread reads all of a."""
    return _sum(a, 0, a.shape[0])


@njit(cache=True, parallel=True)
def read_n(a, parts):
    """`parts` threads each read one contiguous part of a."""
    out = np.zeros(parts, dtype=np.float32)
    step = (a.shape[0] + parts - 1) // parts
    for p in prange(parts):
        out[p] = _sum(a, min(p * step, a.shape[0]), min((p + 1) * step, a.shape[0]))
    return out.sum()


def measure(mib: int = 512, rounds: int = 5, threads: int | None = None) -> dict:
    """Best-of-`rounds` read bandwidth in GB/s: {'single': ..., 'multi': ..., 'threads': n, 'bytes': ...}."""
    threads = threads or numba.get_num_threads()
    a = np.ones(mib * (1 << 20) // 4, dtype=np.float32)  # written once, so every page is really there
    read_1(a[:1024])
    old = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        read_n(a[:1024], threads)
        single = min(_time(read_1, a) for _ in range(rounds))
        multi = min(_time(read_n, a, threads) for _ in range(rounds))
    finally:
        numba.set_num_threads(old)
    return dict(single=a.nbytes / single / 1e9, multi=a.nbytes / multi / 1e9, threads=threads, bytes=a.nbytes)


def _time(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="buffer size in MiB (well above the LLC)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="threads for the multi-thread read")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = measure(args.mib, args.rounds, args.threads)
    if args.json:
        print(json.dumps(r))
    else:
        print(f"read bandwidth, {args.mib} MiB buffer, best of {args.rounds}: "
              f"1 thread {r['single']:.1f} GB/s, {r['threads']} threads {r['multi']:.1f} GB/s")


if __name__ == "__main__":
    main()
