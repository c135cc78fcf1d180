"""Python overhead per decoded token per layer, and how much of a layer's time is inside Numba kernels.

    python bench/overhead.py [--threads 1,2] [--steps 300] [--json out.json]

Tiny qwen3moe models (64 wide, 8 experts, 2 used, Q8_0; every tensor on the CPU) with 2 and 10 layers:
the slope of the median decode step between them is what one layer costs (bench/e2e.py --overhead
reports the same slope). Each Numba kernel call the model makes (the fused decode layer of moert/fused.py,
matmul drivers, the MoE layer kernel, kernels/layers.py) is also timed from Python, so the per-layer time
splits into "in kernels" (including
their dispatch) and "the rest": model code, NumPy glue, wrappers, timers. On tiny shapes the kernels'
own fixed costs (per-row calls, a parallel region, small allocations) are a visible part of it.
Medians move with other jobs on a shared machine; the last column uses each model's fastest step, which
other jobs can only slow down.

    python bench/overhead.py --demo [--rounds 6] [--steps 64] [--json out.json]

The shipped demo model (moert/data/demo-qwen3moe.gguf) on ONE thread, moert and llama.cpp (llama-cpp-python)
side by side in one run: engines take turns every round (the order rotating), each round an 8-token prompt
(untimed) then `--steps` one-token forwards at positions 8.., each timed (bench/busy.py's rounds). Also moert
with `fused_decode = False` (every layer through the architecture's Python block: moert/fused.py's twin).
Reported per engine, ms per token: the median step, the best round's median, the fastest step, the spread
(worst round median / best - 1); and moert / llama.cpp, of the medians and of each round's pair. The load
average (`uptime`'s) is read at the start of every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import busy  # noqa: E402
import common  # noqa: E402

import moert  # noqa: E402
from moert.demo import cache_dir  # noqa: E402
from moert.kernels import layers as kl  # noqa: E402
from moert.testing import write_qwen3moe  # noqa: E402

SHAPE = dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2, n_ff_exp=64, n_vocab=256,
             qtype="Q8_0")
LAYER_KERNELS = ("_rms_norm", "_rope", "_attention1", "_norm_rope1", "_softmax_topk")


def model(layers: int) -> Path:
    p = cache_dir() / f"bench-tiny-qwen3moe-L{layers}-v3.gguf"
    if not p.exists():
        write_qwen3moe(p, n_layer=layers, **SHAPE)
    return p


class KernelClock:
    """Adds up the wall time of every Numba kernel call a model makes (wrapping them on the instances)."""

    def __init__(self, m):
        self.seconds = 0.0
        self.undo = []
        for p in m.weights.prepared.values():
            for name in ("serial", "parallel", "kernel"):
                if hasattr(p, name):
                    self._wrap(p, name)
        for name in LAYER_KERNELS:
            self._wrap(kl, name)
        for steps in m._fused.values():                 # fused decode layers (moert/fused.py), made by the warm-up
            for step in steps:
                if step is not None:
                    self._wrap(step, "kernel")

    def _wrap(self, obj, name):
        f = getattr(obj, name)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t
        setattr(obj, name, timed)
        self.undo.append((obj, name, f))

    def close(self):
        for obj, name, f in reversed(self.undo):
            setattr(obj, name, f)


def measure(layers: int, threads: int, steps: int) -> dict:
    """Median decode step and median kernel time in it, at contexts of 8 to 80 tokens."""
    m = moert.load(model(layers), gpu_layers=0, threads=threads, context_size=128, progress=False)
    clock = KernelClock(m)
    try:
        step, kern = [], []
        m.forward(np.arange(1, 9))
        for _ in range(steps):
            if m.position >= 80:
                m.reset()
                m.forward(np.arange(1, 9))
            clock.seconds = 0.0
            t = time.perf_counter()
            m.forward(np.asarray([3]))
            step.append(time.perf_counter() - t)
            kern.append(clock.seconds)
    finally:
        clock.close()
        m.close()
    i = int(np.argmin(step))
    return dict(step=statistics.median(step), kernels=statistics.median(kern), best=step[i], best_kernels=kern[i])


class Unfused:
    """moert -t 1 with every layer through the architecture's Python block (Model.fused_decode = False)."""

    def __init__(self, path: Path):
        self.e = busy.Moert(path, 1, None)
        self.e.m.fused_decode = False
        self.name = "moert -t 1, unfused"

    def __getattr__(self, name):
        return getattr(self.e, name)


def demo(args) -> dict:
    """moert -t 1 (fused and not) and llama.cpp -t 1 on the demo model, rounds alternating (module docstring)."""
    from moert.demo import demo_model_path
    from moert.threads import set_threads

    set_threads(1)
    path = demo_model_path()
    mach = common.machine(1, with_bandwidth=False)
    engines = [busy.Moert(path, 1, None), busy.LlamaCpp(path, 1)] + ([] if args.no_unfused else [Unfused(path)])
    res, loads = busy.alternate(engines, args.rounds, args.steps, warm=8, digits=3)
    llama = res["llama.cpp -t 1"]
    for d in res.values():
        d.update(median_ms=statistics.median(d["steps"]) * 1e3, best_round_ms=min(d["rounds"]) * 1e3,
                 fastest_ms=min(d["steps"]) * 1e3, spread=max(d["rounds"]) / min(d["rounds"]) - 1,
                 vs_llama=[a / b for a, b in zip(d["rounds"], llama["rounds"])])
    for d in res.values():
        d["median_vs_llama"] = d["median_ms"] / llama["median_ms"]
        del d["steps"]
    rows = [[name, f"{d['median_ms']:.3f}", f"{d['best_round_ms']:.3f}", f"{d['fastest_ms']:.3f}", f"{d['spread']:.0%}",
             f"{d['median_vs_llama']:.2f}x", f"{min(d['vs_llama']):.2f}-{max(d['vs_llama']):.2f}x"]
            for name, d in res.items()]
    print(f"\n# {common.machine_line(mach)}; load average per round: {loads}")
    print(f"# {path.name}, one thread; {args.rounds} rounds of {args.steps} decode steps after an 8-token prompt "
          f"(positions 8-{7 + args.steps}); ms per token")
    print(common.table(["engine", "median step", "best round median", "fastest step", "spread",
                        "median / llama.cpp's", "round medians / llama.cpp's"], rows))
    print(f"# command: {common.command()}")
    return dict(machine=mach, loads=loads, engines=res)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--steps", type=int, default=None, help="decode steps (default 300; --demo: per round, 64)")
    ap.add_argument("--demo", action="store_true", help="the demo model, moert vs llama.cpp, one thread")
    ap.add_argument("--rounds", type=int, default=6, help="--demo: rounds per engine")
    ap.add_argument("--no-unfused", action="store_true", help="--demo: leave out moert with fused_decode = False")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    if args.demo:
        args.steps = args.steps or 64
        out = demo(args)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
        return out
    args.steps = args.steps or 300
    rows, out = [], []
    for threads in (int(t) for t in args.threads.split(",")):
        a, b = measure(2, threads, args.steps), measure(10, threads, args.steps)
        per_layer = (b["step"] - a["step"]) / 8
        in_kernels = (b["kernels"] - a["kernels"]) / 8
        best_layer = (b["best"] - a["best"]) / 8
        best_rest = best_layer - (b["best_kernels"] - a["best_kernels"]) / 8
        r = dict(threads=threads, step_ms={2: a["step"] * 1e3, 10: b["step"] * 1e3}, layer_ms=per_layer * 1e3,
                 layer_in_kernels_ms=in_kernels * 1e3, layer_rest_ms=(per_layer - in_kernels) * 1e3,
                 best_layer_ms=best_layer * 1e3, best_layer_rest_ms=best_rest * 1e3)
        out.append(r)
        rows.append([threads, f"{a['step'] * 1e3:.3f}", f"{b['step'] * 1e3:.3f}", f"{per_layer * 1e3:.3f}",
                     f"{in_kernels * 1e3:.3f}", f"{(per_layer - in_kernels) * 1e3:.3f}",
                     f"{best_layer * 1e3:.3f} / {best_rest * 1e3:.3f}"])
    mach = common.machine()
    print(f"# {common.machine_line(mach)}")
    print(f"# tiny Q8_0 qwen3moe (64 wide, 8 experts, 2 used), every tensor on the CPU; median of {args.steps} "
          f"decode steps at 8-80 tokens of context")
    print(common.table(["threads", "ms/token, 2 layers", "ms/token, 10 layers", "ms per layer",
                        "of which in kernels", "of which the rest", "fastest steps: per layer / rest"], rows))
    if args.json:
        args.json.write_text(json.dumps(dict(machine=mach, results=out), indent=1))
    return dict(results=out)


if __name__ == "__main__":
    main()
