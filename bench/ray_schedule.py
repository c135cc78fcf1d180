"""Where a Ray Compiled Graph's round trip goes when the host and its workers outnumber the cores: timestamps.

    python bench/ray_schedule.py [--calls 600] [--work-us 0,88,150] [--workers 1,2] [--json]

n actors in one compiled graph (as moert/cluster/graph.py calls the workers of a MoE layer), each spinning
`work` us before answering, as a worker's kernels take; the host spins 100 us between calls, as its attention does
between two layers. Each actor stamps when its step starts and ends (time.perf_counter: CLOCK_MONOTONIC, one clock
for every process of the machine) and the CPU it ran on (/proc/thread-self/stat), so each call comes apart into:
the host's `execute` (writing the channels), the wait until the first worker starts, the gap between one worker's
end and the next one's start when both sat on one CPU, and the wait from the last worker's end until the host has
the outputs. Per (workers, work): the share of calls whose workers all ran on one CPU, and the round trip (median
and min, us) in each of the two placements the scheduler chose. The first 100 calls of each graph are not counted.
No moert code runs here: this is Ray and the Linux scheduler on this machine (bench/RESULTS.md, "Experts on Ray
workers").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SKIP = 100          # warm-up calls of each graph, not counted
HOST_US = 100.0     # the host's own work between two calls


def cpu() -> int:
    """The CPU this thread is on now (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def spin(us: float) -> None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < us * 1e-6:
        pass


def measure(ray, workers: int, work_us: float, calls: int) -> dict:
    """One graph of `workers` actors spinning work_us: the per-call parts, split by placement."""
    from ray.dag import InputNode, MultiOutputNode

    @ray.remote(num_cpus=0)
    class Actor:
        def step(self, payload):
            t0 = time.perf_counter()
            spin(work_us)
            return (t0, time.perf_counter(), cpu())

    actors = [Actor.remote() for _ in range(workers)]
    with InputNode() as inp:
        dag = MultiOutputNode([a.step.bind(inp[i]) for i, a in enumerate(actors)])
    dag = dag.experimental_compile()
    msg = b"x" * 1100                       # a decoded token's layer call: D 256 floats, K ids and weights
    rows = []
    try:
        for _ in range(calls + SKIP):
            spin(HOST_US)
            h0 = time.perf_counter()
            ref = dag.execute(*[msg] * workers)
            h1 = time.perf_counter()
            outs = ray.get(ref)
            rows.append((h0, h1, time.perf_counter(), sorted(outs)))
    finally:
        dag.teardown()
        for a in actors:
            ray.kill(a)
    rows = rows[SKIP:]
    one = [r for r in rows if len({o[2] for o in r[3]}) == 1]
    spread_ = [r for r in rows if len({o[2] for o in r[3]}) > 1]

    def us(xs):
        return round(statistics.median(xs) * 1e6, 1) if xs else None

    def trip(rs):
        return {"calls": len(rs), "median_us": us([r[2] - r[0] for r in rs]),
                "min_us": round(min(r[2] - r[0] for r in rs) * 1e6, 1) if rs else None}

    return {"workers": workers, "work_us": work_us, "calls": len(rows),
            "one_cpu_share": round(len(one) / len(rows), 3),
            "execute_us": us([r[1] - r[0] for r in rows]),
            "to_first_start_us": us([r[3][0][0] - r[0] for r in rows]),
            "handoff_us": us([b[0] - a[1] for r in one for a, b in zip(r[3], r[3][1:])]) if workers > 1 else None,
            "last_end_to_host_us": us([r[2] - max(o[1] for o in r[3]) for r in rows]),
            "one_cpu": trip(one), "spread": trip(spread_)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--work-us", default="0,88,150", help="comma-separated: each actor's spin per call, us")
    ap.add_argument("--workers", default="1,2", help="comma-separated actor counts")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    logging.getLogger("ray.dag.compiled_dag_node").setLevel(logging.WARNING)
    res = [measure(ray, n, float(w), args.calls) for n in map(int, args.workers.split(","))
           for w in args.work_us.split(",")]
    ray.shutdown()
    m = common.machine(with_bandwidth=False)
    if args.json:
        print(json.dumps({"machine": m, "results": res}, indent=1))
        return 0
    print(common.machine_line(m) + f"; {os.cpu_count()} cores, host + workers spin-wait (Ray's channels)")

    def f(x):
        return "-" if x is None else f"{x:,.1f}"

    print(common.table(
        ["workers", "work us", "calls on one CPU", "round trip: one CPU, median / min us",
         "spread over CPUs, median / min us", "execute us", "to first start us", "handoff us", "last end to host us"],
        [[r["workers"], f(r["work_us"]), f"{r['one_cpu_share']:.0%}",
          f"{f(r['one_cpu']['median_us'])} / {f(r['one_cpu']['min_us'])}",
          f"{f(r['spread']['median_us'])} / {f(r['spread']['min_us'])}", f(r["execute_us"]),
          f(r["to_first_start_us"]), f(r["handoff_us"]), f(r["last_end_to_host_us"])] for r in res]))
    print(f"command: {common.command()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
