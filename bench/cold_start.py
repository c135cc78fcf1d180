"""Cold start: the first run on a fresh machine (nothing compiled) against a second run (warm Numba cache).

    python bench/cold_start.py [--modes none,int16,int8] [--rounds 1] [--json]

Per act_quant mode, in a fresh empty NUMBA_CACHE_DIR, a new process loads the demo model (`moert.load`
warms it up, compiling every kernel the model needs on the CPU) and generates 8 tokens; then a second
process does the same with that cache (warm). The last row is `moert demo` itself, cold and warm, as a
newcomer runs it (experts on the CPU, the rest on the simulated GPU). Times are wall-clock seconds of
the whole process, Python start-up and imports included; "compile" is the load's warm-up as the load
reports it. One table, with the machine and its load average, since compile time moves with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

LOAD = """
import time, moert
from moert.demo import demo_model_path
t = time.perf_counter()
m = moert.load(demo_model_path(), act_quant={aq!r}, cpu_moe=True, gpu_backend="sim", progress=False)
load = time.perf_counter() - t
m.generate("import os\\n", max_tokens=8, temperature=0)
print(load, m.warmup_seconds)
"""


def run(code_or_args: list[str], cache: str) -> tuple[float, str]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    t = time.perf_counter()
    p = subprocess.run(code_or_args, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode:
        raise SystemExit(f"{' '.join(code_or_args[:3])} failed:\n{p.stderr[-2000:]}")
    return time.perf_counter() - t, p.stdout


def measure(mode: str | None) -> dict:
    """mode: an act_quant mode, or None for `moert demo`."""
    with tempfile.TemporaryDirectory(prefix="moert-cold-") as cache:
        load_avg = os.getloadavg()[0]
        row = {"what": "moert demo" if mode is None else f"load + 8 tokens, act_quant={mode}",
               "load_average": round(load_avg, 2)}
        for phase in ("cold", "warm"):
            if mode is None:
                wall, _ = run([sys.executable, "-m", "moert", "demo"], cache)
                row[phase] = wall
            else:
                wall, out = run([sys.executable, "-c", LOAD.format(aq=None if mode == "none" else mode)], cache)
                row[phase] = wall
                row[f"{phase}_compile"] = float(out.split()[-1])
        return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="none,int16,int8", help="act_quant modes, comma-separated")
    ap.add_argument("--rounds", type=int, default=1, help="cold/warm pairs per row")
    ap.add_argument("--no-demo", action="store_true", help="skip the `moert demo` row")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    rows = []
    for _ in range(a.rounds):
        for mode in a.modes.split(","):
            rows.append(measure(mode))
        if not a.no_demo:
            rows.append(measure(None))
    if a.json:
        print(json.dumps({"machine": common.machine(with_bandwidth=False), "rows": rows}, indent=1))
        return
    print(common.machine_line(common.machine(with_bandwidth=False)))
    print(common.command())
    print(common.table(["run", "cold s", "of which warm-up", "warm s", "of which warm-up", "load avg"],
                       [[r["what"], f"{r['cold']:.1f}", _s(r.get("cold_compile")), f"{r['warm']:.1f}",
                         _s(r.get("warm_compile")), r["load_average"]] for r in rows]))


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


if __name__ == "__main__":
    main()
