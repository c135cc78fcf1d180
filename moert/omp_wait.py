"""Which OpenMP wait policy moert's parallel kernels run under, for a benchmark's header (`wait_policy()`).

Numba runs a `prange` loop as one parallel region of its threading layer (here GNU OpenMP, libgomp). By
default libgomp's threads spin for a while after a region before they sleep (GOMP_SPINCOUNT), and so does
the calling thread at a region's end, waiting for the others. On a quiet machine that saves a wake-up per
region. On a machine that is not idle the spinning threads use up their share of the busy core, the OS takes
the worker off it, and a region then waits for it to get a core back (bench/busy.py; bench/HISTORY.md,
2026-11-24, "A machine that is not idle": the benchmark file's decode on 2 threads at 240 ms a token against 89 on
one thread, with one core kept busy and other jobs running).

OMP_WAIT_POLICY=passive (set in the environment before the process starts) makes the workers sleep at once:
under load no region stalls (the same decode 10-12 ms against 65-73), but on a quiet moment of this box it
cost moert's int8 decode 18-50% (3.3 -> 3.9-5.0 ms a token), and llama.cpp in the same process, whose
ggml barriers are OpenMP barriers, half its speed (bench/RESULTS.md). libgomp reads the policy once, for the
whole process, so moert does not set it: the default stays libgomp's, and small work avoids regions instead
(kernels/matmul.py threads_for).
"""

from __future__ import annotations

import os

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")   # libgomp's wait policy, read once when it loads


def wait_policy() -> str:
    """'libgomp's default (spins, then sleeps)', 'passive (OMP_WAIT_POLICY)', 'spin 10000 (GOMP_SPINCOUNT)', ..."""
    if os.environ.get("GOMP_SPINCOUNT"):
        return f"spin {os.environ['GOMP_SPINCOUNT']} (GOMP_SPINCOUNT)"
    p = os.environ.get("OMP_WAIT_POLICY", "").lower()
    return f"{p} (OMP_WAIT_POLICY)" if p else "libgomp's default (spins, then sleeps)"
