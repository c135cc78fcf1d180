"""Where moert.predict misses on CPUs: a residual table of bench/published.json's CPU-only and two-socket figures, and
of those whose predicted prompt is mostly CPU matmuls (docs/cost-model.md, "Where it misses on server CPUs").

    python bench/published_residuals.py [--held-out] [--only ID[,ID]]

One row per figure: measured and predicted tok/s (with the efficiency factors fitted on every training figure, as
validate_published.py's held-out column), the ratio, the threads against the cores, the read rate the model assumed on
those threads, the share of the predicted time in the CPU's FFN and expert weights ("cpu w": reads or matmuls), its
attention stage ("att": projections and the KV cache), the GPU, the link and the fixed costs, and the tokens each
routed expert sees in a u-batch. Where the CPU's matmuls take most of a prompt's predicted time, "MAC/c": the int8
multiply-adds a core did per clock in them, measured (the measured time less the model's time for everything else)
against the model's. Held-out figures only with --held-out (read them last, as validate_published.py's).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_published as vp  # noqa: E402
from published_cv import CrossValidation, held_out  # noqa: E402

import moert  # noqa: E402
from moert.cost import coverage  # noqa: E402


def selected(e: dict) -> bool:
    """CPU-only and two-socket figures, and any whose predicted prompt is mostly CPU matmuls (filled in by rows())."""
    return e["use"] == "error" and (e["placement"].get("cpu_only") or (e["hardware"].get("cpu") or "").startswith("2x"))


def shares(r, phase: str) -> dict[str, float]:
    """The predicted time of a phase by where it goes: CPU weights, CPU attention, GPU, link, fixed costs."""
    out = dict.fromkeys(("cpu w", "cpu att", "gpu", "link", "fixed"), 0.0)
    for p in r.parts:
        if p.phase != phase:
            continue
        key = ("fixed" if p.bound == "overhead" else "link" if p.device == "link" else "gpu" if p.device != "cpu"
               else "cpu att" if p.stage == "attention" else "cpu w")
        out[key] += p.seconds
    total = sum(out.values()) or 1.0
    return {k: v / total for k, v in out.items()}


def rows(entries: list[dict], factors: dict, show_held_out: bool) -> list[dict]:
    """The residual rows of the selected figures (see the module's docstring)."""
    out = []
    for e in entries:
        if e["use"] != "error" or (held_out(e) and not show_held_out):
            continue
        t = e["test"]
        hw = vp.scaled(vp.machine(e), **factors)
        plan = vp._plan(e["model"], tuple(hw.gpu_memory()), tuple(vp.placement(e).items()), e.get("twin_quant"))
        policy = "ik_llama.cpp" if e["engine"] == "ik_llama.cpp" else "llama.cpp"
        r = moert.predict(plan, hw, n_prompt=t.get("n_prompt") or 0, n_gen=t.get("n_gen") or 1,
                          depth=t.get("depth", 0), n_ubatch=t.get("n_ubatch", 512), threads=t.get("threads"),
                          kv_bytes=t.get("kv_bytes", 2), policy=policy, graphs=vp.graphs(e), mmap=vp.mmap(e),
                          numa=vp.numa(e), repack=vp.repack(e), build=vp.build(e))
        c, n = hw.cpu, r.settings["threads"]
        md, arch = plan.metadata, plan.metadata["general.architecture"]
        E, K = md.get(f"{arch}.expert_count") or 1, md.get(f"{arch}.expert_used_count") or 1
        B = min(t.get("n_ubatch", 512), t.get("n_prompt") or 1)
        for m, phase in (("prompt", "prefill"), ("gen", "decode")):
            meas, pred = e.get(f"{m}_tok_s"), (r.prefill_tok_s if m == "prompt" else r.decode_tok_s)
            if not meas or m not in e.get("predict", ["prompt", "gen"]):
                continue
            sh = shares(r, phase)
            if not selected(e) and not (phase == "prefill" and sh["cpu w"] > 0.5):
                continue
            row = {"id": e["id"], "held_out": held_out(e), "metric": m, "engine": e["engine"], "cpu": c.name,
                   "kind": coverage.classes(hw, t.get("depth", 0), e.get("quant", ""), e["engine"], vp.kind(e))["cpu"],
                   "threads": n, "cores": c.cores, "measured": meas, "predicted": pred, "ratio": pred / meas,
                   "read_gbs": c.read_gbs(n), "shares": sh, "tokens_per_expert": B * K / E if phase == "prefill"
                   else None, "build": vp.build(e), "repack": vp.repack(e)}
            if phase == "prefill" and sh["cpu w"] > 0.5:
                row["mac"] = _macs(r, e, c, n, meas)
            out.append(row)
    return out


def _macs(r, e: dict, c, n: int, meas: float) -> tuple[float, float] | None:
    """(measured, modelled) int8 multiply-adds a core did per clock in the prompt's CPU FFN and expert matmuls: their
    FLOPs over the measured time less the model's time for everything else (None where that leaves no time)."""
    pp = [p for p in r.parts if p.phase == "prefill"]
    mine = [p for p in pp if p.device == "cpu" and p.stage != "attention" and p.bound != "overhead"]
    flops, other = sum(p.flops for p in mine), r.prefill_s - sum(p.seconds for p in mine)
    left = e["test"]["n_prompt"] / meas - other
    if left <= 0 or not flops:
        return None
    per = 2 * n * c.ghz * 1e9
    return flops / left / per, flops / sum(p.seconds for p in mine) / per


def _tok(t: float | None) -> str:
    return f"{t:>7.1f}  " if t else f"{'-':>7}  "


def table(rs: list[dict]) -> str:
    """The rows, prompts then decode, by CPU, and their geometric-mean |error|."""
    head = (f"{'figure':<52} {'':2} {'measured':>8} {'predicted':>9} {'x':>5}  {'cpu':<22} {'thr/cores':>9} "
            f"{'GB/s':>5}  {'cpu w':>5} {'att':>4} {'gpu':>4} {'link':>4} {'fix':>4}  {'tok/exp':>7}  MAC/c meas/model")
    lines = [head, "-" * len(head)]
    for x in sorted(rs, key=lambda x: (x["metric"], x["cpu"], x["id"])):
        s, mac = x["shares"], x.get("mac")
        lines.append(f"{x['id'][:51]:<52} {'pp' if x['metric'] == 'prompt' else 'tg':2} {x['measured']:>8.1f} "
                     f"{x['predicted']:>9.1f} {x['ratio']:>5.2f}  {x['kind'][:22]:<22} "
                     f"{str(x['threads']) + '/' + str(x['cores']):>9} {x['read_gbs']:>5.0f}  {s['cpu w']:>5.2f} "
                     f"{s['cpu att']:>4.2f} {s['gpu']:>4.2f} {s['link']:>4.2f} {s['fixed']:>4.2f}  " +
                     _tok(x["tokens_per_expert"]) + (f"{mac[0]:.1f}/{mac[1]:.1f}" if mac else "")
                     + (" [held out]" if x["held_out"] else ""))
    logs = [math.log(x["ratio"]) for x in rs]
    if logs:
        lines.append(f"{len(logs)} figures, geometric mean |error| {math.exp(sum(map(abs, logs)) / len(logs)) - 1:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--held-out", action="store_true", help="also the frozen figures (read them last)")
    ap.add_argument("--only", default=None, metavar="ID[,ID]", help="only these entries")
    a = ap.parse_args(argv)
    entries = vp.load()
    cv = CrossValidation(entries, vp.predict)
    factors = cv.fit(cv.training())
    if a.only:
        keep = set(a.only.split(","))
        entries = [e for e in entries if e["id"] in keep]
    print("factors fitted on every training figure: " + ", ".join(f"{k} x{v:.2f}" for k, v in factors.items()))
    print(table(rows(entries, factors, a.held_out)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MOERT_QUIET", "1")
    sys.exit(main())
