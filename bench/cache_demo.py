"""Expert caches on the shipped demo model's own routing (moert/data/demo-qwen3moe.gguf, a trained qwen3moe:
4 layers, 16 experts, top-2): hit rate per policy and size, and the predicted decode on two preset boxes against
the static placement of the same GPU bytes (the trace's hottest experts of each layer: hot_per_layer).

    python bench/cache_demo.py [--tokens 160] [--plot bench/cache-demo-hitrate.png] [--json]

The trace: generate() from the prompts below (seeded sampling, temperature 0.8), one after another, the whole
run recorded (prefill chunks and decode tokens) with a prefetching cache attached, so the trace keeps its
next-router guesses. The caches replay it (moert.replay); the predictions cost its decode tokens
(moert.predict(..., cache=, trace=); "+ prefetch": the recorded guesses copied beside each layer's experts).
Ends in markdown tables for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import moert  # noqa: E402
from moert.cost.machines import preset  # noqa: E402
from moert.dynamic import POLICIES, ExpertCache, sweep  # noqa: E402
from moert.placement.rules import EXPERT_REGEX, TensorOverride, expert_layer_regex  # noqa: E402

MODEL = ROOT / "moert" / "data" / "demo-qwen3moe.gguf"
PROMPTS = ["import os\nimport sys\n\n\ndef main(", "class Parser:\n    def __init__(self, text):\n",
           "def read_config(path):\n    \"\"\"Read a JSON file.\"\"\"\n", "for i, line in enumerate(lines):\n",
           "import re\n\nPATTERN = re.compile(", "def test_sorted():\n    assert"]
BOXES = ["rtx3090+ryzen-7950x", "rtx4060+ryzen-7600"]
SLOTS = [1, 2, 4, 6, 8, 12, 16]


PREFETCH = ExpertCache("sim:0", 4, "lru", prefetch="next-router")   # runs while the trace is recorded


def record(tokens: int):
    m = moert.load(MODEL, cpu_moe=True, gpu_backend="sim", trace=True, context_size=256, expert_cache=PREFETCH)
    for i, p in enumerate(PROMPTS):
        m.generate(p, tokens, seed=i)
    t = m.trace_stop()
    plan, stats = m.plan, m.stats.cache
    m.close()
    return t, plan, stats


def static_plan(counts, n: int, hw):
    """The trace's n most-selected experts of each layer on the GPU, the rest on the CPU."""
    rules = [TensorOverride(expert_layer_regex(il), "sim:0", experts=sorted(c.argsort()[::-1][:n].tolist()))
             for il, c in enumerate(counts) if n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.plan(MODEL, [*rules, TensorOverride(EXPERT_REGEX, "cpu")], gpu_backend="sim",
                          gpu_memory=hw.gpu_memory())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=160, help="tokens generated per prompt")
    ap.add_argument("--plot", default=None, help="hit-rate plot PNG")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t, plan, pf = record(args.tokens)
    policies = list(POLICIES)
    runs = sweep(t, SLOTS, policies, expert_bytes=moert.dynamic.expert_bytes(MODEL))
    rows = [r.to_dict() for r in runs]
    by = {(r["policy"], r["slots"]): r for r in rows}
    pred = {}
    for box in BOXES:
        hw = preset(box)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cpu_plan = moert.plan(MODEL, cpu_moe=True, gpu_backend="sim", gpu_memory=hw.gpu_memory())
        for s in SLOTS:
            kw = dict(n_prompt=64, n_gen=128, depth=0)
            pred[box, "static hot", s] = moert.predict(static_plan(t.counts(), s, hw), hw, trace=t.counts(),
                                                       **kw).decode_tok_s
            for p in ("lru", "lfu", "lfru", "static"):
                c = ExpertCache("sim:0", s, p, hot=t)
                pred[box, p, s] = moert.predict(cpu_plan, hw, cache=c, trace=t, **kw).decode_tok_s
            for p in ("lru", "lfu"):                  # the guesses the recording's prefetch made (Trace.prefetch)
                c = ExpertCache("sim:0", s, p, prefetch="next-router")
                pred[box, p + " + prefetch", s] = moert.predict(cpu_plan, hw, cache=c, trace=t, **kw).decode_tok_s
        pred[box, "all on CPU", 0] = moert.predict(cpu_plan, hw, trace=t.counts(), n_prompt=64, n_gen=128).decode_tok_s
    if args.json:
        print(json.dumps({"rows": rows, "predicted": {f"{b}|{p}|{s}": v for (b, p, s), v in pred.items()}}, indent=1))
    print(f"\n{platform.node()}: {len(t)} tokens ({int(t.prefill.sum())} in prompts) of {MODEL.name}, "
          f"{t.n_layer} layers x {t.n_expert} experts, top-{t.ids.shape[2]}; `python bench/cache_demo.py`\n")
    print("| hit rate | " + " | ".join(f"{s} slots" for s in SLOTS) + " |")
    print("|---|" + "---:|" * len(SLOTS))
    for p in policies:
        print(f"| {p} | " + " | ".join(f"{by[p, s]['hit_rate']:.1%}" for s in SLOTS) + " |")
    print("\nKiB copied to the GPU per token (admissions):\n")
    print("| policy | " + " | ".join(f"{s}" for s in SLOTS) + " |")
    print("|---|" + "---:|" * len(SLOTS))
    for p in policies:
        print(f"| {p} | " + " | ".join(f"{by[p, s]['bytes_per_token'] / 1024:.1f}" for s in SLOTS) + " |")
    for box in BOXES:
        print(f"\npredicted decode tok/s on {box} (all experts on the CPU: {pred[box, 'all on CPU', 0]:,.0f}):\n")
        print("| placement | " + " | ".join(f"{s}" for s in SLOTS) + " |")
        print("|---|" + "---:|" * len(SLOTS))
        for p in ("static hot", "lru", "lfu", "lfru", "static", "lru + prefetch", "lfu + prefetch"):
            label = "static hot_per_layer (no cache)" if p == "static hot" else f"cache: {p}"
            print(f"| {label} | " + " | ".join(f"{pred[box, p, s]:,.0f}" for s in SLOTS) + " |")
    plain = moert.replay(t, ExpertCache("sim:0", 4, "lru"))
    print(f"\nprefetch='next-router' during the recording (LRU, 4 slots per layer): hit rate {pf.hit_rate:.1%} "
          f"(without prefetch, replayed: {plain.hit_rate:.1%}); prefetched experts copied: "
          f"{int(pf.prefetch_admissions.sum())}, misses admitted: {int(pf.admissions.sum())}\n")
    print("| layer | " + " | ".join(str(il) for il in range(t.n_layer)) + " |")
    print("|---|" + "---:|" * t.n_layer)
    for name, v in (("precision", pf.precision), ("recall", pf.recall)):
        print(f"| {name} | " + " | ".join("-" if v[il] != v[il] else f"{v[il]:.1%}" for il in range(t.n_layer)) + " |")
    if args.plot:
        from moert.plots import hit_rate_plot

        path = hit_rate_plot(rows, args.plot, f"{MODEL.name}: {len(t)} tokens of its own routing, "
                                               f"{t.n_expert} experts, top-{t.ids.shape[2]}")
        print(f"\nplot: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
