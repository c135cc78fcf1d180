"""Decode on a machine that is not idle: one core kept busy by another process, moert vs llama.cpp.

    python bench/busy.py [--models demo,bench] [--layers 3] [--steps 64] [--rounds 4] [--json out.json]
    python bench/busy.py --load 0                   # the same table on an idle machine (no load process)
    python bench/busy.py --model any.gguf ...       # another GGUF instead of the built benchmark file

A desktop with a browser open, or any shared box, has a core busy with something else. This script makes
that happen on purpose: it starts `--load` processes that spin (`while True: pass`), each pinned to one core
(the last cores, `--pin`; `--pin none` leaves them to the scheduler), measures decode under them, and stops
them by their PIDs at the end (also on Ctrl-C or an error).

Engines, each loaded once, run in turn every round (the order rotating): moert at its default thread count
(`moert.load(path)` with no threads: every core Numba saw), moert -t 1 (and -t N with `--threads N`), and
llama.cpp with every core and -t 1 when llama-cpp-python is installed. Each round of an engine: an
8-token prompt (untimed), then `--steps` single-token forwards, each timed. Reported per engine, ms per
token: the median step over all rounds; the median step of each round (the best round, and the spread:
worst round median / best - 1); the 90th percentile step over all rounds; and "stalled": the share of
steps taking more than 3x the engine's fastest step (a parallel region waiting for a worker thread the OS
took off its core). Ratios to moert -t 1: of the medians over all steps, and of round medians pairwise
within a round (the engines of one round ran under the same load: the range shows how much a burst of
other work moved one round). The load average is read at the start of every round. Models: `demo` (the
shipped demo model, moert/data) and `bench`
(bench/e2e.py's Qwen3-30B-A3B-shaped file, `--layers` layers, built on first use).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from moert.omp_wait import wait_policy  # noqa: E402

SPIN = "while True: pass"


# ------------------------------------------------------------------------------------------ the load

def start_load(n: int, pin: str) -> list[subprocess.Popen]:
    """n spinning processes; pin 'last': process i pinned to core cores-1-i, 'none': not pinned."""
    procs, cores = [], sorted(os.sched_getaffinity(0))
    try:
        for i in range(n):
            p = subprocess.Popen([sys.executable, "-c", SPIN])
            procs.append(p)
            if pin == "last":
                os.sched_setaffinity(p.pid, {cores[-1 - i % len(cores)]})
    except BaseException:
        stop_load(procs)
        raise
    time.sleep(0.5)                                       # let them reach the run queue
    return procs


def stop_load(procs: list[subprocess.Popen]) -> None:
    """Stop the load processes this script started, by PID."""
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


# ---------------------------------------------------------------------------------------------- engines

class Moert:
    def __init__(self, path: Path, threads: int | None, act_quant: str | None):
        import moert

        self.name = "moert default" if threads is None else f"moert -t {threads}"
        self.m = moert.load(path, gpu_layers=0, threads=threads, context_size=256, progress=False,
                            act_quant=act_quant)
        self.threads = threads

    def prompt(self, tokens):
        import numba

        from moert.threads import set_threads

        set_threads(self.threads or numba.config.NUMBA_NUM_THREADS)   # Numba's setting is the process's: this engine's
        self.m.reset()
        self.m.forward(np.asarray(tokens), last_only=True)

    def step(self, token):
        self.m.forward(np.asarray([token]))

    def close(self):
        self.m.close()


class LlamaCpp:
    def __init__(self, path: Path, threads: int):
        import llama_cpp

        self.name = f"llama.cpp -t {threads}"
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=256, n_threads=threads, n_threads_batch=threads,
                                   n_gpu_layers=0, verbose=False)

    def prompt(self, tokens):
        self.llm.reset()
        self.llm.eval(list(map(int, tokens)))

    def step(self, token):
        self.llm.eval([int(token)])

    def close(self):
        self.llm.close() if hasattr(self.llm, "close") else None


def engines_for(path: Path, threads: int | None, act_quant: str | None, llama: bool) -> list:
    out = [Moert(path, None, act_quant)] + [Moert(path, t, act_quant) for t in (threads, 1) if t]
    if llama:
        try:
            out += [LlamaCpp(path, os.cpu_count()), LlamaCpp(path, 1)]
        except ImportError:
            pass
    return out


def run_round(e, steps: int) -> list[float]:
    """Seconds of each of `steps` decode steps after an 8-token prompt."""
    e.prompt(list(range(10, 18)))
    out = []
    for i in range(steps):
        t0 = time.perf_counter()
        e.step(20 + i % 50)
        out.append(time.perf_counter() - t0)
    return out


def alternate(engines: list, rounds: int, steps: int, warm: int = 4, pause: float = 0.0,
              digits: int = 2) -> tuple[dict, list[float]]:
    """Each engine warmed (`warm` steps), then `rounds` rounds of `steps` decode steps, the engines taking turns
    going first (a `pause` before each); closes them. ({name: {rounds: per-round medians, steps: every step's
    seconds}}, the load average at each round's start)."""
    res = {e.name: dict(rounds=[], steps=[]) for e in engines}
    loads: list[float] = []
    try:
        for e in engines:                                 # compile and touch everything before timing
            run_round(e, warm)
        for r in range(rounds):
            loads.append(round(os.getloadavg()[0], 2))
            k = r % len(engines)
            for e in engines[k:] + engines[:k]:
                time.sleep(pause)
                s = run_round(e, steps)
                res[e.name]["rounds"].append(statistics.median(s))
                res[e.name]["steps"] += s
            print(f"  round {r + 1}: load {loads[-1]}; " + ", ".join(
                f"{n} {d['rounds'][-1] * 1e3:.{digits}f}" for n, d in res.items()) + " ms/token", flush=True)
    finally:
        for e in engines:
            e.close()
    return res, loads


# ------------------------------------------------------------------------------------------------- main

def measure(path: Path, args) -> dict:
    engines = engines_for(path, args.threads, args.act_quant, not args.no_llama)
    res, loads = alternate(engines, args.rounds, args.steps, warm=4, pause=0.1)
    for d in res.values():
        fast = min(d["steps"])
        d.update(median_ms=statistics.median(d["steps"]) * 1e3, best_ms=min(d["rounds"]) * 1e3,
                 spread=max(d["rounds"]) / min(d["rounds"]) - 1,
                 p90_ms=float(np.percentile(d["steps"], 90)) * 1e3,
                 stalled=float(np.mean(np.asarray(d["steps"]) > 3 * fast)))
        del d["steps"]
    one = res["moert -t 1"]
    for d in res.values():
        d["vs_moert_t1"] = [a / b for a, b in zip(d["rounds"], one["rounds"])]   # paired within rounds
        d["median_vs_moert_t1"] = d["median_ms"] / one["median_ms"]
    return dict(model=str(path), loads=loads, engines=res)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="demo,bench", help="comma-separated: demo, bench")
    ap.add_argument("--model", type=Path, help="a GGUF to measure instead of --models")
    ap.add_argument("--layers", type=int, default=3, help="layers of the built benchmark file")
    ap.add_argument("--threads", "-t", type=int, help="also moert -t N (default: moert's default and -t 1 only)")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--load", type=int, default=1, help="spinning processes to start (0: none)")
    ap.add_argument("--pin", choices=["last", "none"], default="last", help="pin each to one core (the last)")
    ap.add_argument("--act-quant", default=None, help="moert's act_quant (none, int8, ...)")
    ap.add_argument("--no-llama", action="store_true", help="moert only")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    args.act_quant = None if args.act_quant in (None, "none") else args.act_quant

    from moert.demo import demo_model_path
    paths = [args.model] if args.model else []
    for name in ([] if args.model else args.models.split(",")):
        if name == "demo":
            paths.append(demo_model_path())
        elif name == "bench":
            import e2e
            paths.append(e2e.model_path(args.layers))
        else:
            ap.error(f"--models: {name!r} is not demo or bench")
    mach = common.machine(with_bandwidth=False)
    procs = start_load(args.load, args.pin)
    out = []
    try:
        print(f"# load: {args.load} spinning process(es), PIDs {[p.pid for p in procs]}, pinned: {args.pin}")
        for p in paths:
            print(f"{p.name}:", flush=True)
            out.append(measure(p, args))
    finally:
        stop_load(procs)
    print(f"\n# {common.machine_line(mach)}")
    print(f"# OpenMP wait policy: {wait_policy()}")
    print(f"# {args.load} spinning process(es) pinned {args.pin}; {args.rounds} rounds of {args.steps} decode steps "
          f"after an 8-token prompt; act_quant {args.act_quant}; ms per token")
    rows = []
    for r in out:
        for name, d in r["engines"].items():
            v = d["vs_moert_t1"]
            rows.append([Path(r["model"]).name, name, f"{d['median_ms']:.3f}", f"{d['best_ms']:.3f}",
                         f"{d['spread']:.0%}", f"{d['p90_ms']:.3f}", f"{d['stalled']:.0%}",
                         f"{d['median_vs_moert_t1']:.2f}x", f"{min(v):.2f}-{max(v):.2f}x"])
        rows.append([Path(r["model"]).name, f"load average per round: {r['loads']}", "", "", "", "", "", "", ""])
    print(common.table(["model", "engine", "median step", "best round median", "spread", "p90 step", "stalled",
                        "median / moert -t 1's", "round medians / -t 1's"], rows))
    print(f"# command: {common.command()}")
    result = dict(machine=mach, args={k: str(v) for k, v in vars(args).items()}, results=out)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
