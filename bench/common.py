"""Shared bench helpers: the machine line every table starts with, timing under noise, markdown tables.

Every figure in bench/ is the best (minimum) of several rounds, with the median beside it where a
script keeps both: other processes share the cores, and the minimum is the least disturbed run; the
median says how disturbed the others were.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import cache

from moert.bench import machine_info

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # `import bandwidth` from any cwd


@cache
def bandwidth(threads: int | None = None, mib: int = 512, rounds: int = 5) -> dict:
    """This machine's read bandwidth (GB/s, 1 thread and `threads`), measured once per process."""
    import bandwidth as bw

    return bw.measure(mib, rounds, threads)


# The Qwen3-30B-A3B-shaped benchmark file's shapes (e2e.py writes it with moert's quantizer, llama_quantized.py
# with llama.cpp's), both named by this version.
SHAPES = dict(n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128, n_expert_used=8, n_ff_exp=768,
              n_vocab=4096, context_length=4096, qtype="Q4_K", types={r"attn_v|ffn_down": "Q6_K"}, seed=30)
MODEL_VERSION = 1  # bump when SHAPES or the writer changes


def machine(threads: int | None = None, with_bandwidth: bool = True) -> dict:
    """CPU model, cores, threads used, versions, load average (moert.bench.machine_info), and the measured
    read bandwidth."""
    info = machine_info(threads)
    if with_bandwidth:
        b = bandwidth(info["threads"])
        info.update(bw_1thread_GBps=round(b["single"], 1), bw_GBps=round(b["multi"], 1))
    return info


def machine_line(m: dict) -> str:
    """One line for a table header."""
    s = f"{m['cpu']}, {m['cores']} cores, {m['threads']} threads; numpy {m['numpy']}, numba {m['numba']}"
    if "bw_GBps" in m:
        s += f"; read bandwidth {m['bw_1thread_GBps']} GB/s (1 thread), {m['bw_GBps']} GB/s ({m['threads']} threads)"
    return s + f"; load average {m['load_avg']} at start"


def times(fn: Callable[[], object], rounds: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `rounds` calls of fn after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def best_median(ts: Sequence[float]) -> tuple[float, float]:
    return min(ts), statistics.median(ts)


def spread(ts: Sequence[float]) -> float:
    """(median - best) / best: 0 on a quiet machine."""
    b, m = best_median(ts)
    return (m - b) / b if b else 0.0


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def command() -> str:
    """The command line that ran this script, for the table footer."""
    return "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def device_seconds(xp, fn: Callable[[], object], reps: int = 50) -> float:
    """Median seconds of fn over reps calls after up to 5 warm-ups: CUDA events around each call on a GPU (xp is
    CuPy), the host clock on NumPy (the simulated GPU, --dry runs)."""
    import numpy as np

    for _ in range(min(5, reps)):
        fn()
    times = []
    for _ in range(reps):
        if xp is np:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            continue
        a, b = xp.cuda.Event(), xp.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(xp.cuda.get_elapsed_time(a, b) / 1e3)
    return float(np.median(times))
