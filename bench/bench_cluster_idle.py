"""What an idle `moert serve` with experts on Ray workers costs in CPU, with the compiled graph kept and released.

    python bench/bench_cluster_idle.py [--rounds 3] [--seconds 3] [--workers 2] [--json]

A local cluster of `--workers` (each MoE layer's experts on one worker, layers dealt round-robin) behind the
server's engine (moert.serve.server.Server with --ray-idle-seconds 5, driven by FastAPI's TestClient). Each round:
  first      a request after the graph was released (round 0: after moert.load's warm-up compiled it), ms;
  next       the same request at once (the graph compiled), ms: first - next is about the recompile;
  compiled   each worker's and the host's CPU, % of one core, over `--seconds` right after (/proc/PID/stat's
             utime + stime): the graph's workers poll their channels while they wait;
  released   the same once the server released the graph (--ray-idle-seconds after the last request).
Both requests give the same text (checked). `uptime`'s load is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cpu_share(pid: int, seconds: float) -> float:
    """The share of one core the process used over `seconds`."""
    def ticks() -> int:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])

    t0, c0 = time.monotonic(), ticks()
    time.sleep(seconds)
    return (ticks() - c0) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - t0)


def shares(pids: list[int], seconds: float) -> list[float]:
    """cpu_share of every pid over the same `seconds`, in %."""
    out: dict[int, float] = {}
    threads = [threading.Thread(target=lambda p=p: out.__setitem__(p, cpu_share(p, seconds))) for p in pids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [round(out[p] * 100, 1) for p in pids]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="each CPU measurement's window")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from fastapi.testclient import TestClient

    import moert
    from moert.serve.app import create_app
    from moert.serve.server import Server
    from moert.testing import gpt2_vocab_metadata, write_qwen3moe

    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    path = write_qwen3moe(Path(tempfile.mkdtemp()) / "m.gguf", n_layer=2 * a.workers, n_expert=4,
                          vocab=gpt2_vocab_metadata())
    rules = ",".join(rf"blk\.{i}\.ffn_.*_exps=RAY{i % a.workers}" for i in range(2 * a.workers))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = moert.load(path, context_size=64, progress=False, gpu_layers=0, ray=f"local:{a.workers}", overrides=rules)
    pids = [d.pid for d in m.plan.remote] + [os.getpid()]
    g = m.plan.remote[0].group
    server = Server(m, name="m", ray_idle_s=5)
    ask = {"prompt": [1, 2, 3], "max_tokens": 8, "temperature": 0}
    rows = []
    try:
        with TestClient(create_app(server)) as c:
            for _ in range(a.rounds):
                t0 = time.perf_counter()
                first = c.post("/v1/completions", json=ask).json()["choices"][0]["text"]
                t1 = time.perf_counter()
                again = c.post("/v1/completions", json=ask).json()["choices"][0]["text"]
                t2 = time.perf_counter()
                assert first == again, (first, again)
                kept = shares(pids, a.seconds)
                while not server.idle.released:
                    time.sleep(0.05)
                time.sleep(0.2)
                rows.append(dict(first_ms=(t1 - t0) * 1e3, next_ms=(t2 - t1) * 1e3, compiled=kept,
                                 released=shares(pids, a.seconds), compiles=g.compiles, releases=g.releases))
    finally:
        server.close()
        m.close()
    uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    if a.json:
        print(json.dumps(dict(rows=rows, uptime=uptime)))
        return 0
    names = ", ".join([f"ray:{i}" for i in range(a.workers)] + ["host"])
    print(uptime[0])
    print(f"| round | first request ms | next ms | idle CPU % compiled ({names}) | released | compiles / releases |")
    print("|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        print(f"| {i} | {r['first_ms']:.0f} | {r['next_ms']:.0f} | {r['compiled']} | {r['released']} | "
              f"{r['compiles']} / {r['releases']} |")
    print(uptime[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
