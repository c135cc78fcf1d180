"""What a Ray worker costs per MoE layer of a decoded token: a local 2-worker cluster beside the single process,
with moert's two ways of calling the workers side by side.

    python bench/bench_cluster.py [--tokens 48] [--rounds 7] [--layers 8] [--workers 2] [--json]

One model file (qwen3moe-shaped, Q8_0, written by moert.testing), loaded four times in this run:
  single      every tensor on the CPU (one process);
  unfused     the same with Model.fused_decode off (a decode step's layer as the architecture's Python block, as a
              layer with remote experts runs): what the fused layer saves, and one expert's kernel time (its
              "experts" phase / K), both parts of the prediction;
  plain       each MoE layer's experts split in halves over RAY0 and RAY1 (a local cluster, worker processes on
              this machine), one Ray actor call per worker and layer (MOERT_RAY_CALLS=plain);
  compiled    the same through one Ray Compiled Graph (moert/cluster/graph.py, the default).
and Ray's own floor for each way: n actors that echo a message of a layer call's size, called together (plain:
`.remote` + one `ray.get`; compiled: a compiled graph's `execute` + `ray.get`), and for the compiled graph two more
that take the round trip apart: the host busy between calls as long as its own part of a layer takes (is a
woken worker slower?), and actors that spin as long as a worker's kernels took (what does work in the workers
add?). Each round runs them all, one after the other (the machine is shared: min and median of the rounds). A
compiled graph's idle workers poll their channels, so each graph is torn down outside its own measurement
(`release`), so as not to load the others.
It ends in one table: ms per token, the added ms per MoE layer ((ray - single) / layers of the same round), the
workers' counters, the floors, and moert.cost.cluster.local_added's prediction for each way, term by term: Ray's
published figure for two workers (out of sample), and moert's own work measured apart from the added cost (the
workers' split kernels against the host's, the fused layer's saving, the host's glue per layer call), with its
error against the measured added cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def decode(m, tokens: int) -> tuple[float, tuple | None, float]:
    """Seconds per token of `tokens` one-token forwards, from a fresh context (the prompt, untimed, first; a
    released graph compiles there), the workers' mean (round trip, kernel) seconds per call meanwhile, and the
    seconds per token of the "experts" phase on the CPU."""
    m.reset()
    m.forward([1, 2, 3])
    before = [d.remote.copy() for d in m.plan.remote]
    phases = m.stats.total.time.get("experts", {}).get("cpu", 0.0)
    t0 = time.perf_counter()
    for i in range(tokens):
        m.forward([(7 * i + 5) % 200])
    seconds = (time.perf_counter() - t0) / tokens
    experts = (m.stats.total.time.get("experts", {}).get("cpu", 0.0) - phases) / tokens
    if not before:
        return seconds, None, experts
    r = [d.remote - b for d, b in zip(m.plan.remote, before)]
    n = sum(x.calls for x in r)
    return seconds, (sum(x.round_trip_s for x in r) / n, sum(x.compute_s for x in r) / n), experts


def glue_seconds(D: int, E: int, K: int, n: int, reps: int = 2000) -> float:
    """The host's own work for one decoded token's layer call of n workers (moert/experts.py, cluster/worker.py):
    the owner masks, one keyed message per worker, each reply unpacked and summed. Best of 5 x reps."""
    import numpy as np

    from moert.cluster.worker import keyed, pack, reply, unreply

    x, w = np.ones((1, D), np.float32), np.full((1, K), 0.25, np.float32)
    ids, owner = np.arange(K, dtype=np.int32)[None] * (E // K), np.arange(E) * n // E
    back = reply(np.ones((1, D), np.float32), 0.0)

    def call():
        o = owner[ids]
        y = 0
        for j in range(n):
            keyed(1, pack(x, np.where(o == j, ids, -1).astype(np.int32), w))
            y = y + np.array(unreply(back, 1, D)[0])
        return y

    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def floors(ray, msg: bytes, reps: int, n: int, gap: float, work: float) -> dict[str, float]:
    """Seconds per round trip to n echo actors: plain calls; a compiled graph's execute + ray.get back to back
    ("compiled"); the same with the host busy `gap` s before each call, untimed, as it is between two layers'
    calls in decode ("compiled_gap"); and actors that spin `work` s before echoing, as a worker's kernels take
    ("compiled_work"). Each graph torn down after."""
    from ray.dag import InputNode, MultiOutputNode

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, payload):
            return payload

        def work(self, payload):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < work:
                pass
            return payload

    def timed(call, gap: float = 0.0) -> float:
        call()
        total = 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < gap:
                pass
            t0 = time.perf_counter()
            call()
            total += time.perf_counter() - t0
        return total / reps

    actors = [Echo.remote() for _ in range(n)]
    out = dict(plain=timed(lambda: ray.get([a.echo.remote(msg) for a in actors])))
    for method in ("echo", "work"):
        with InputNode() as inp:
            dag = MultiOutputNode([getattr(a, method).bind(inp[i]) for i, a in enumerate(actors)])
        dag = dag.experimental_compile()
        call = partial(lambda g: ray.get(g.execute(*[msg] * n)), dag)
        if method == "echo":
            out["compiled"], out["compiled_gap"] = timed(call), timed(call, gap)
        else:
            out["compiled_work"] = timed(call)
        dag.teardown()
    for a in actors:
        ray.kill(a)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, choices=(1, 2, 4),
                    help="Ray workers, the experts of each layer split evenly (1: all on RAY0)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    # the host and its workers share the cores: each process's kernel thread pool gets its share, so that n + 1 pools
    # of every core's threads do not spin against each other (a 16-core run had 3 processes on 16 threads each)
    share = max(1, (os.cpu_count() or 1) // (args.workers + 1))
    for var in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(share)                 # before numba is imported; Ray's local workers inherit them

    import logging

    import ray

    import moert
    from moert.cost.cluster import NETS, RAY_CALL_US, local_added, network_seconds
    from moert.testing import write_qwen3moe

    D, E, K = 256, 16, 4
    path = Path(tempfile.mkdtemp()) / "bench-cluster.gguf"
    write_qwen3moe(path, n_layer=args.layers, n_embd=D, n_expert=E, n_expert_used=K, n_ff_exp=512, qtype="Q8_0",
                   seed=1)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             runtime_env={"env_vars": {v: os.environ[v] for v in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}})
    logging.getLogger("ray.dag.compiled_dag_node").setLevel(logging.WARNING)
    n = args.workers
    rules = ",".join(rf"\.ffn_.*_exps=RAY{j}@{j * E // n}-{(j + 1) * E // n - 1}" for j in range(n))
    opts = dict(gpu_layers=0, context_size=args.tokens + 8, threads=1, progress=False)
    models = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models["single"] = moert.load(path, **opts)
        models["unfused"] = moert.load(path, **opts)
        models["unfused"].fused_decode = False
        for calls in ("plain", "compiled"):
            os.environ["MOERT_RAY_CALLS"] = calls
            models[calls] = moert.load(path, overrides=rules, ray=f"local:{n}", ray_threads=1, **opts)
        os.environ.pop("MOERT_RAY_CALLS")
    group = models["compiled"].plan.remote[0].group
    assert group is not None and models["plain"].plan.remote[0].group is None
    group.release()                                  # its workers poll while compiled: only during its rounds
    msg = b"\0" * (12 + 4 * D + 8 * K)

    t = {k: [] for k in ("single", "unfused", "plain", "compiled", "floor_plain", "floor_compiled",
                         "floor_compiled_gap", "floor_compiled_work")}
    calls = {k: [] for k in ("plain", "compiled")}
    experts = []                                     # the unfused single process's "experts" phase, s per token
    for _ in range(args.rounds):
        for name in ("single", "unfused", "plain", "compiled"):
            seconds, per_call, phase = decode(models[name], args.tokens)
            t[name].append(seconds)
            if per_call is not None:
                calls[name].append(per_call)
            if name == "unfused":
                experts.append(phase)
        group.release()
        gap = (t["unfused"][-1] - experts[-1]) / args.layers      # the host's own part of a layer (fused off)
        for k, v in floors(ray, msg, 300, n, gap, calls["compiled"][-1][1]).items():
            t[f"floor_{k}"].append(v)

    def stats(xs, scale=1e3):
        return dict(min=min(xs) * scale, median=statistics.median(xs) * scale)

    res = dict(
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores ({share} kernel threads a "
                f"process), load "
                f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} (1/5/15 min, at the end)",
        model=f"qwen3moe-shaped Q8_0, {args.layers} MoE layers, D {D}, E {E}, K {K}", workers=n, tokens=args.tokens,
        rounds=args.rounds, ray=ray.__version__, compiles=group.compiles, command=" ".join(["python", *sys.argv]))
    for name in ("single", "unfused", "plain", "compiled"):
        res[f"{name}_ms_per_token"] = stats(t[name])
    # moert's own work, measured apart from the added cost: what the fused layer saves per layer (paired rounds),
    # one expert's kernel seconds for one token (the unfused run's experts phase / layers / K), the host's glue
    fused_s = statistics.median((u - s) / args.layers for s, u in zip(t["single"], t["unfused"]))
    expert_s = statistics.median(experts) / args.layers / K
    glue_s = glue_seconds(D, E, K, n)
    res["parts"] = dict(fused_saves_ms_per_layer=fused_s * 1e3, expert_kernel_ms=expert_s * 1e3,
                        glue_ms_per_layer=glue_s * 1e3, floor_compiled_gap_ms=stats(t["floor_compiled_gap"]),
                        floor_compiled_work_ms=stats(t["floor_compiled_work"]))
    for name in ("plain", "compiled"):
        added = [(b - a) / args.layers for a, b in zip(t["single"], t[name])]      # per MoE layer, same round
        terms = local_added(n, D, K, E, expert_s, fused_s, glue_s, calls=name)
        pred = terms["total"]
        floor = statistics.median(t[f"floor_{name}"])
        res[name] = dict(
            added_ms_per_layer=stats(added), floor_ms=stats(t[f"floor_{name}"]),
            call_round_trip_ms=statistics.median(c[0] for c in calls[name]) * 1e3,
            call_kernels_ms=statistics.median(c[1] for c in calls[name]) * 1e3,
            terms_ms={k: v * 1e3 for k, v in terms.items()},
            predicted_ms=pred * 1e3, error_vs_median=pred / statistics.median(added) - 1,
            error_vs_min=pred / min(added) - 1,
            with_floor_ms=(pred - terms["ray"] + network_seconds(NETS["local"], n, D, K, 1, floor * 1e6)) * 1e3,
            ray_published_us=RAY_CALL_US[name])
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"machine: {res['machine']}; Ray {res['ray']}\nmodel: {res['model']}; {args.tokens} decoded tokens x "
          f"{args.rounds} rounds (min / median ms)")
    p, c = res["plain"], res["compiled"]
    rows = [("single process, ms per token", res["single_ms_per_token"], None),
            (f"ray:{n}, ms per token", res["plain_ms_per_token"], res["compiled_ms_per_token"]),
            ("**added per MoE layer, ms**", p["added_ms_per_layer"], c["added_ms_per_layer"]),
            (f"Ray's floor: {n} echo actor(s) at once, ms", p["floor_ms"], c["floor_ms"])]
    print("| | plain actor calls | compiled graph |\n|---|---|---|")
    for label, a, b in rows:
        cell = (lambda s: f"{s['min']:.3f} / {s['median']:.3f}" if s else "")
        print(f"| {label} | {cell(a)} | {cell(b)} |")
    print(f"| a worker's call: round trip / its kernels, ms (median) | {p['call_round_trip_ms']:.3f} / "
          f"{p['call_kernels_ms']:.3f} | {c['call_round_trip_ms']:.3f} / {c['call_kernels_ms']:.3f} |")
    labels = dict(ray=f"Ray's call of {n} worker(s), published (moert/cost/cluster.py) + the messages",
                  kernels="split kernels: the busiest worker's experts instead of all K on the host",
                  fused="the fused layer the single process runs and a remote layer cannot",
                  glue="the host's masks, messages and sums",
                  busy="a worker running kernels, beyond them (WORKER_BUSY_US)")
    for k, label in labels.items():
        print(f"| predicted: {label}, ms | {p['terms_ms'][k]:+.3f} | {c['terms_ms'][k]:+.3f} |")
    print(f"| **predicted added per MoE layer, ms** | {p['predicted_ms']:.3f} | {c['predicted_ms']:.3f} |")
    print(f"| prediction vs measured added (median / min) | {p['error_vs_median']:+.0%} / {p['error_vs_min']:+.0%} "
          f"| {c['error_vs_median']:+.0%} / {c['error_vs_min']:+.0%} |")
    print(f"| the same with this run's Ray floor (median) for Ray's figure: measured here, not published, ms | "
          f"{p['with_floor_ms']:.3f} | {c['with_floor_ms']:.3f} |")
    q = res["parts"]
    print(f"parts (measured apart from the added cost): the fused layer saves {q['fused_saves_ms_per_layer']:.3f} ms "
          f"per layer (single {cell(res['single_ms_per_token'])}, fused off {cell(res['unfused_ms_per_token'])} ms "
          f"per token); one expert's kernels {q['expert_kernel_ms']:.3f} ms; glue {q['glue_ms_per_layer']:.3f} ms")
    print(f"Ray's compiled floor with the host busy between calls as in decode: "
          f"{cell(q['floor_compiled_gap_ms'])} ms; with actors busy as long as a worker's kernels: "
          f"{cell(q['floor_compiled_work_ms'])} ms")
    if n + 1 > (os.cpu_count() or 1):
        print(f"note: the host and its {n} workers are {n + 1} processes on {os.cpu_count()} cores; Ray's published "
              f"figures come from machines with a core for each")
    print(f"(graphs compiled for the compiled model: {res['compiles']}, one per round and one at load)")
    print(f"command: {res['command']}")
    for m in models.values():
        m.close()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
