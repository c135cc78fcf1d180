"""moert.predict against published llama.cpp / ik_llama.cpp figures of MoE models (bench/published.json).

    python bench/validate_published.py [--json [OUT]] [--only ID] [--graphs auto|POLICY] [--held-out]

For each entry: the zoo twin of its model, the hardware preset of its parts (a stated stand-in where the source
names no GPU or CPU), the placement its flags describe (--cpu-moe, --n-cpu-moe N, -ot exps=CPU, all on the
GPU, or a CPU-only run), and its test (prompt length, u-batch, generated tokens, depth, threads and KV-cache
bytes per element where stated; ik_llama.cpp's offload rule for its entries). Ends in one table: measured, predicted
as shipped, in-sample and out-of-sample (bench/published_cv.py: five efficiency factors, each fitted on its own kind
of figure; out of sample = leave one source out), and the term that dominates the predicted time; then:

  * per class (prefill / decode x cpu-only / hybrid / all-GPU): n, in-sample and out-of-sample geometric mean of
    |error| (exp(mean |ln(predicted / measured)|) - 1), the 68% spread of |ln| out of sample (moert.predict's ranges
    are read from it) and the worst ratio;
  * the worst out-of-sample figures with the term that dominates their predicted time;
  * ranking: for every two *placements* measured on the same box ('pair', placements that differ), whether the
    prediction orders them as the measurement does (closer than 5% in the measurement: noise, skipped), and where
    the measured gain is above x1.5, whether the predicted gain is within a factor 1.5 of it;
  * with --held-out only: the entries with a "collected" note (frozen before the model was shaped on them),
    predicted with the factors fitted on all the others. Without it their errors are not printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import warnings
from collections import defaultdict
from dataclasses import replace
from functools import cache
from pathlib import Path

import moert
import moert.cost.launch
from moert import cost, zoo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from published_cv import (  # noqa: E402
    PHASES,
    CrossValidation,
    geomean_abs,
    held_out,
    kind,
    log_err,
    placement_pairs,
    quantile_abs,
    ratio_pairs,
    recommendations,
    source,
)

from moert.cost import coverage  # noqa: E402

HERE = Path(__file__).resolve().parent
GRAPHS = os.environ.get("MOERT_GRAPHS", "auto")   # --graphs: moert.predict's CUDA-graph policy; auto: each entry's
NOISE = 0.05                                   # measured differences below this do not rank two placements


def load(path: Path = HERE / "published.json") -> list[dict]:
    """The entries of published.json."""
    with open(path) as f:
        return json.load(f)["entries"]


def machine(e: dict) -> moert.Hardware:
    """The preset of an entry's parts, stand-ins where the source names none; no GPU for a CPU-only run, and
    the stated RAM speed ("mem_mts") in place of the preset's where the source gives one."""
    h = e["hardware"]
    gpu, cpu = h.get("gpu") or h.get("stand_in_gpu"), h.get("cpu") or h.get("stand_in_cpu")
    hw = cost.preset(f"{gpu}+{cpu}" if gpu and not e["placement"].get("cpu_only") else cpu)
    if h.get("mem_mts"):
        c = hw.cpu
        c = replace(c, mem_mts=h["mem_mts"], mem_bw_gbs=cost.ddr_gbs(c.mem_channels, h["mem_mts"]))
        hw = replace(hw, cpu=c)
    return hw


def placement(e: dict) -> dict:
    """moert.plan's keyword arguments for the entry's flags."""
    p = e["placement"]
    if p.get("cpu_only"):
        return {"gpu_layers": 0}
    if p.get("all_gpu"):
        return {}
    if p.get("cpu_moe"):
        return {"cpu_moe": True}
    if "n_cpu_moe" in p:
        return {"n_cpu_moe": p["n_cpu_moe"]}
    return {"overrides": p["overrides"]}


def scaled(hw: moert.Hardware, cpu_bw: float = 1.0, cpu_compute: float = 1.0, link: float = 1.0,
           gpu_compute: float = 1.0, gpu_bw: float = 1.0) -> moert.Hardware:
    """hw with the efficiency shares times the factors of bench/published_cv.py (each share at most 1)."""
    c = replace(hw.cpu, bw_efficiency=min(1.0, hw.cpu.bw_efficiency * cpu_bw),
                compute_efficiency=min(1.0, hw.cpu.compute_efficiency * cpu_compute))
    gs = tuple(replace(g, compute_efficiency=min(1.0, g.compute_efficiency * gpu_compute),
                       bw_efficiency=min(1.0, g.bw_efficiency * gpu_bw)) for g in hw.gpus)
    lk = replace(hw.link, efficiency=min(1.0, hw.link.efficiency * link)) if hw.link else None
    return replace(hw, cpu=c, gpus=gs, link=lk)


def predict(e: dict, **factors: float) -> dict:
    """Predicted prompt and generation tok/s of an entry (None where the entry has no figure to compare), with the
    efficiency factors of bench/published_cv.py (`cpu_bw=`, ...), and the term dominating each phase's time."""
    return _predict(json.dumps(e, sort_keys=True), tuple(sorted(factors.items())), GRAPHS)


@cache
def _predict(entry: str, factors: tuple, _graphs: str) -> dict:
    e = json.loads(entry)
    hw = scaled(machine(e), **dict(factors))
    t = e["test"]
    plan = _plan(e["model"], tuple(hw.gpu_memory()), tuple(placement(e).items()), e.get("twin_quant"))
    r = moert.predict(plan, hw, n_prompt=t.get("n_prompt") or 0, n_gen=t.get("n_gen") or 1, depth=t.get("depth", 0),
                      n_ubatch=t.get("n_ubatch", 512), threads=t.get("threads"), kv_bytes=t.get("kv_bytes", 2),
                      policy="ik_llama.cpp" if e["engine"] == "ik_llama.cpp" else "llama.cpp", graphs=graphs(e),
                      mmap=mmap(e), numa=numa(e), repack=repack(e), build=build(e),
                      flash_attn=not re.search(r"(-fa|--flash-attn)\s+(0|off)\b", e.get("flags") or ""))
    wanted = e.get("predict", ["prompt", "gen"])
    return {"prompt": r.prefill_tok_s if e.get("prompt_tok_s") and "prompt" in wanted else None,
            "gen": r.decode_tok_s if e.get("gen_tok_s") and "gen" in wanted else None,
            "bound": {"prompt": r.bound("prefill"), "gen": r.bound("decode")},
            "term": {"prompt": term(r, "prefill"), "gen": term(r, "decode")}, "fits": r.fits}


def term(r, phase: str) -> str:
    """The (device, stage, bound) taking most of a phase's predicted time, with its share: "cpu experts memory 71%"."""
    out: dict = defaultdict(float)
    for p in r.parts:
        if p.phase == phase:
            out[f"{p.device} {p.stage} {p.bound}"] += p.seconds
    total = sum(out.values())
    if not total:
        return ""
    k = max(out, key=out.get)
    return f"{k} {100 * out[k] / total:.0f}%"


def mmap(e: dict) -> bool:
    """Whether the entry's engine mapped the GGUF (both engines' default; `--no-mmap` / `-mmp 0` in its flags: not),
    which makes op offload copy from pageable memory (moert.cost.hardware.Link.staged)."""
    return not re.search(r"--no-mmap|-mmp 0|--mmap 0", e.get("flags") or "")


def repack(e: dict) -> bool:
    """Whether the entry ran ik_llama.cpp with -rtr / --run-time-repack (llama-bench's `-rtr 1`): weights in RAM
    repacked, mmap off, and those of types its CUDA backend cannot run never offloaded (moert/cost/repack.py)."""
    on = re.search(r"(^|\s)(-rtr|--run-time-repack)(\s+1)?(\s|$)", e.get("flags") or "")
    return e["engine"] == "ik_llama.cpp" and bool(on) and not re.search(r"-rtr\s+0", e.get("flags") or "")


def build(e: dict) -> str:
    """The date of the entry's build where the source dates it ("build"), as moert.predict's `build` takes it; "" where
    its file's types are row-interleaved already (_R4 / _R8: ik_llama.cpp runs the same kernels on them before and
    after its on-the-fly repacking, moert/cost/predict.py IK_REPACK_DATE)."""
    return "" if re.search(r"_R[48]\b", e.get("quant", "")) else e.get("build", "")


def numa(e: dict) -> str:
    """The entry's --numa as moert.predict takes it (moert.cost.hardware.NUMA_MODES; "none" where none is stated).
    ggml's --numa numactl pins every thread to "the cpuset that numactl gave us" (ggml-cpu.c, set_numa_thread_affinity:
    the process's affinity), so without `numactl -N 0 -m 0` (or --cpunodebind / --membind / --physcpubind) in its flags
    it pins nothing and binds no memory: then it runs as without --numa."""
    mode = e["test"].get("numa", "none")
    bound = re.search(r"(^|[\s(])numactl\s+(-N|-m|-C|--cpunodebind|--membind|--physcpubind)", e.get("flags") or "")
    if mode == "numactl" and not bound:
        return "none"
    return mode


def graphs(e: dict) -> str:
    """The CUDA-graph policy the entry is predicted with: --graphs, or with "auto" the entry's own ("graphs": what its
    engine's build did, by the source's date: "one-per-device" before llama.cpp PR 18934 / ik_llama.cpp PR 1172, "none"
    for HIP builds), "per-split" where it states none."""
    return e.get("graphs", "per-split") if GRAPHS == "auto" else GRAPHS


@cache
def _plan(model: str, gpu_memory: tuple, kw: tuple, quant: str | None = None):
    """The entry's placement of the model's zoo twin (in the entry's "twin_quant" mix, else the twin's own) on sim
    GPUs of the hardware's sizes (made once)."""
    kw = {"gpu_layers": "all", **dict(kw)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not gpu_memory:                                       # a CPU-only run: no sim GPU at all
            return moert.plan(zoo.path(model, quant), gpu_layers=0)
        return moert.plan(zoo.path(model, quant), gpu_backend="sim", gpu_memory=list(gpu_memory), **kw)


def run(entries: list[dict], show_held_out: bool = False) -> dict:
    """Predictions, in-sample / out-of-sample / held-out errors, classes and placement ranking for the entries."""
    cv = CrossValidation(entries, predict).run()
    rows = []
    for e in entries:
        p0 = predict(e)
        errs = cv["rows"].get(e["id"], {})
        row = {"id": e["id"], "use": e["use"], "model": e["model"], "hardware": machine(e).name, "flags": e["flags"],
               "engine": e["engine"], "pair": e.get("pair"), "placement": e["placement"],
               "test": {k: v for k, v in e["test"].items() if k not in ("note", "tool", "n_gen")}, "source": source(e),
               "bound": p0["bound"], "term": p0["term"], "fits": p0["fits"], "kind": kind(e),
               "n_ubatch": e["test"].get("n_ubatch", 512), "held_out": held_out(e),
               "classes": coverage.classes(machine(e), e["test"].get("depth", 0), e.get("quant", ""), e["engine"],
                                           kind(e))}
        for m in ("prompt", "gen"):
            meas = e.get(f"{m}_tok_s")
            row[m] = {"measured": meas, "predicted": p0[m], "error": _pct(log_err(p0[m], meas))}
            for how in ("in_sample", "out_of_sample", "held_out"):
                if how in errs:
                    row[m][how] = _pct(errs[how][m])
        rows.append(row)
    classes = cv["classes"]
    ratios = [x for x in ratio_pairs(rows) if show_held_out or not x["held_out"]]
    by_class = class_table(rows, show_held_out)
    recommend = [x for x in recommendations(rows, NOISE) if show_held_out or not x["held_out"]]
    if not show_held_out:                          # frozen figures: no error of theirs is shown while shaping terms
        for r in rows:
            if r["held_out"]:
                for m in ("prompt", "gen"):
                    r[m] = {"measured": r[m]["measured"], "hidden": True}
        classes = [{k: v for k, v in c.items() if not k.startswith("held_out")} for c in classes]
    ranking = placement_pairs([r for r in rows if not r["held_out"] or show_held_out], NOISE)
    return {"recommend": recommend, "census": census(entries), "factors": cv["factors"], "sources": cv["sources"],
            "rows": rows, "classes": classes, "ranking": ranking, "worst": worst(rows), "by_class": by_class,
            "coverage": {a: {v["value"]: v["n"] for v in vs} for a, vs in by_class.items()},
            "ratios": {"pairs": ratios, **ratio_summary([x for x in ratios if not x["held_out"]]),
                       "held_out": ratio_summary([x for x in ratios if x["held_out"]])}}


def ratio_summary(pairs: list[dict]) -> dict:
    """n, geometric-mean |error| and 68% spread of |ln| of same-box placement ratios (published_cv.ratio_pairs)."""
    logs = [x["ln_error"] for x in pairs]
    return {"n": len(logs), "error": geomean_abs(logs), "spread68": quantile_abs(logs)}


def class_table(rows: list[dict], show_held_out: bool) -> dict:
    """Per coverage axis (moert/cost/coverage.py) and value: n training figures, their out-of-sample error and 68%
    spread, and the held-out figures' n (their error with show_held_out only); the kind axis per phase."""
    out: dict = {}
    for axis in coverage.AXES:
        groups: dict = {}
        for r in rows:
            v = r["classes"][axis]
            if v is None or r["use"] != "error":
                continue
            for m, phase in PHASES:
                c = r[m]
                if c["measured"] is None:
                    continue
                g = groups.setdefault(f"{phase}, {v}" if axis == "kind" else v, {"oos": [], "held": []})
                if r["held_out"]:
                    if c.get("held_out") is not None or not show_held_out:
                        g["held"].append(math.log1p(c["held_out"]) if show_held_out else 0.0)
                elif c.get("out_of_sample") is not None:
                    g["oos"].append(math.log1p(c["out_of_sample"]))
        out[axis] = [{"value": v, "n": len(g["oos"]), "out_of_sample": geomean_abs(g["oos"]),
                      "spread68": quantile_abs(g["oos"]), "n_held_out": len(g["held"]),
                      **({"held_out": geomean_abs(g["held"])} if show_held_out else {})}
                     for v, g in sorted(groups.items(), key=lambda kv: (-len(kv[1]["oos"]), kv[0]))]
    return out


def census(entries: list[dict]) -> dict:
    """How much the set holds: entries and figures counted (not 'excluded'), sources, and boxes. A box is the stated
    (GPU, CPU) pair; where a source names only one part, the part and the source (two people's RTX 3090s with unstated
    CPUs are two boxes, and one person's CPU-only run may be the CPU of a box counted already: an upper count)."""
    counted = [e for e in entries if e["use"] != "excluded"]
    boxes = set()
    for e in counted:
        h = e["hardware"]
        g, c = h.get("gpu"), h.get("cpu")
        boxes.add((g, c) if g and c else (g, c, source(e)))
    figures = sum(e.get(f"{m}_tok_s") is not None for e in counted for m in ("prompt", "gen"))
    return {"entries": len(counted), "figures": figures, "boxes": len(boxes),
            "sources": len({source(e) for e in counted}), "held_out_figures": sum(
                e.get(f"{m}_tok_s") is not None for e in counted if held_out(e) for m in ("prompt", "gen"))}


def _pct(x: float | None) -> float | None:
    return math.expm1(x) if x is not None else None


def worst(rows: list[dict], n: int = 6) -> list[dict]:
    """The n counted training figures furthest off out of sample, with the term dominating their predicted time."""
    out = [{"id": r["id"], "metric": m, "error": r[m]["out_of_sample"], "term": r["term"][m]}
           for r in rows for m in ("prompt", "gen") if r[m].get("out_of_sample") is not None]
    return sorted(out, key=lambda x: -abs(math.log1p(x["error"])))[:n]


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.0f}%" if pct else (f"{x:,.0f}" if x >= 100 else f"{x:.1f}")


def _f2(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(res: dict) -> str:
    """The one table, then the classes, the worst figures and the ranking."""
    head = (f"{'entry':<40} {'test':<4} {'measured':>9} {'shipped':>8} {'in-smpl':>8} {'out-smpl':>8}  "
            f"term dominating the predicted time")
    n = res["census"]
    lines = [f"{n['entries']} entries, {n['figures']} figures ({n['held_out_figures']} held out), {n['boxes']} boxes, "
             f"{n['sources']} sources", head, "-" * len(head)]
    for r in res["rows"]:
        for m, label in (("prompt", "pp"), ("gen", "tg")):
            c = r[m]
            if c["measured"] is None:
                continue
            if c.get("hidden"):
                lines.append(f"{r['id']:<40} {label:<4} {_f(c['measured']):>9}  (held out: not shown)")
                continue
            cells = (_f(c.get("error"), True), _f(c.get("in_sample"), True),
                     _f(c.get("out_of_sample", c.get("held_out")), True))
            tag = " [held out]" if r["held_out"] else "" if r["use"] == "error" else f" [{r['use']}]"
            lines.append(f"{r['id']:<40} {label:<4} {_f(c['measured']):>9} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8}  "
                         f"{r['term'][m]}{tag}")
    f = res["factors"]
    lines += ["", "factors fitted on every training figure (each on its own kind; bench/published_cv.py): " +
              ", ".join(f"{k} x{v:.2f}" for k, v in f.items()),
              f"geometric mean of |error| by class ({res['sources']} sources; out of sample = leave one source out):",
              f"  {'class':<20} {'n':>3} {'in-sample':>10} {'out-of-sample':>14} {'68% |ln|':>9} {'worst':>6}"
              + ("   held out (n, error, worst)" if any("held_out" in c for c in res["classes"]) else "")]
    for c in res["classes"]:
        line = (f"  {c['class']:<20} {c['n']:>3} {_f(c['in_sample'], True).lstrip('+'):>10} "
                f"{_f(c['out_of_sample'], True).lstrip('+'):>14} {_f(c['spread68']):>9} "
                f"{'' if c['worst'] is None else 'x' + format(c['worst'], '.2f'):>6}")
        if "held_out" in c and c["n_held_out"]:
            line += f"   {c['n_held_out']}, {_f(c['held_out'], True).lstrip('+')}, x{c['held_out_worst']:.2f}"
        lines.append(line)
    lines.append("worst figures out of sample (error, the term dominating their predicted time):")
    lines += [f"  {w['id']:<40} {'pp' if w['metric'] == 'prompt' else 'tg'} {_f(w['error'], True):>6}  {w['term']}"
              for w in res["worst"]]
    lines.append(f"by coverage class (training figures: n, out of sample, 68% |ln|; held out: n"
                 f"{', error' if any('held_out' in v for vs in res['by_class'].values() for v in vs) else ''}; "
                 f"fewer than {coverage.MIN_FIGURES} training figures: a prediction there extrapolates):")
    for axis, vs in res["by_class"].items():
        for v in vs:
            held = f"{v['n_held_out']}" + (f", {_f(v['held_out'], True).lstrip('+')}" if "held_out" in v else "")
            lines.append(f"  {axis:<8} {v['value']:<26} {v['n']:>3} {_f(v['out_of_sample'], True).lstrip('+'):>6} "
                         f"{_f2(v['spread68']):>5}   held out {held}{'' if v['n'] >= coverage.MIN_FIGURES else '  *'}")
    ra = res["ratios"]
    lines.append(f"same-box placement ratios (predicted / measured): {ra['n']} pairs, off by "
                 f"{_f(ra['error'], True).lstrip('+')}, 68% |ln| {_f2(ra['spread68'])}" +
                 (f"; held out {ra['held_out']['n']}, {_f(ra['held_out']['error'], True).lstrip('+')}"
                  if ra["held_out"]["n"] else ""))
    rk = res["ranking"]
    big = [x for x in rk if x["gain"] > 1.5]
    lines.append(f"placements on the same box (pairs that change the placement, > {NOISE:.0%} apart): "
                 f"{sum(x['right'] for x in rk)} of {len(rk)} in the measured order; gain within x1.5 where the "
                 f"measured gain is above x1.5: {sum(x['gain_ok'] for x in big)} of {len(big)}")
    rc = res["recommend"]
    lines.append(f"compare's recommendation on each box and test (decode; right: the measured fastest or within "
                 f"{NOISE:.0%}): {sum(x['right'] for x in rc)} of {len(rc)}" + "".join(
                     f"\n  {'right' if x['right'] else 'WRONG'}: {x['recommended']} ({x['measured_share']:.0%} of the "
                     f"fastest, {x['fastest']}){' [held out]' if x['held_out'] else ''}" for x in rc))
    for x in rk:
        lines.append(f"  {'right' if x['right'] else 'WRONG'}: {x['a']} vs {x['b']} ({x['metric']}): measured "
                     f"{x['measured'][0]:g} vs {x['measured'][1]:g} (x{x['gain']:.2f}), predicted "
                     f"{x['predicted'][0]:.1f} vs {x['predicted'][1]:.1f} (x{x['predicted_gain']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", nargs="?", const="-", default=None, metavar="OUT",
                    help="write the results as JSON to OUT (or stdout without OUT) instead of the table")
    ap.add_argument("--only", default=None, metavar="ID[,ID]", help="only these entries")
    ap.add_argument("--held-out", action="store_true", help="also show the frozen entries' errors (read them last)")
    ap.add_argument("--graphs", default=GRAPHS, choices=("auto", *moert.cost.launch.GRAPHS),
                    help="moert.predict's CUDA-graph launch policy for every entry (moert/cost/launch.py); auto "
                         "(default): each entry's build's, its 'graphs' field")
    ap.add_argument("--published", default=str(HERE / "published.json"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    globals()["GRAPHS"] = a.graphs
    entries = load(Path(a.published))
    if a.only:
        keep = set(a.only.split(","))
        entries = [e for e in entries if e["id"] in keep]
    res = run(entries, show_held_out=a.held_out)
    if a.json == "-":
        print(json.dumps(res, indent=1))
    elif a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    else:
        print(table(res))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MOERT_QUIET", "1")
    sys.exit(main())
