"""Grouped cross-validation of moert.predict on bench/published.json (used by validate_published.py).

The cost model's efficiency shares (moert/cost/hardware.py: a CPU's bw_efficiency and compute_efficiency, a GPU's
bw_efficiency and compute_efficiency with the link's) are the numbers published figures can move. Five factors scale
them, each fitted only on the figures of its own kind:

    key           scales                                   fitted on
    cpu_bw        every CPU's bw_efficiency                decode with a CPU part (cpu-only, hybrid)
    cpu_compute   every CPU's compute_efficiency           prefill of cpu-only runs
    link          the link's efficiency                    prefill of hybrid runs (op offload over PCIe)
    gpu_compute   every GPU's compute_efficiency           prefill of all-GPU runs
    gpu_bw        every GPU's bw_efficiency                decode of all-GPU runs

Three ways to count the error of a figure:
  * in-sample: the factors fitted on every training figure, the figure among them;
  * out-of-sample: leave one *source* out (a URL: a PR, a thread, a page is one box, one person, one build, so its
    figures are not independent): the factors are fitted on every other source's figures, then the left-out source is
    predicted. This is what a new user's numbers should expect;
  * held out: entries with a "collected" note were frozen before the model was shaped on them; they are predicted
    with the factors fitted on all the training figures and never enter a fit (reported apart, last).
"""

from __future__ import annotations

import json
import math
from functools import cache

KEYS = ("cpu_bw", "cpu_compute", "link", "gpu_compute", "gpu_bw")
GRID = [0.25 * 16 ** (i / 12) for i in range(13)]   # factors 0.25 .. 4, 26% apart: the fit interpolates between
PHASES = (("prompt", "prefill"), ("gen", "decode"))
KINDS = ("cpu-only", "hybrid", "all-GPU")


def kind(e: dict) -> str:
    """"hybrid" (experts on the CPU, the rest on a GPU), or a control: "cpu-only" or "all-GPU"."""
    p = e["placement"]
    return "cpu-only" if p.get("cpu_only") else "all-GPU" if p.get("all_gpu") else "hybrid"


def key_for(e: dict, metric: str) -> str:
    """The factor that a figure of the entry is fitted into (see the module's table)."""
    k = kind(e)
    if metric == "gen":
        return "gpu_bw" if k == "all-GPU" else "cpu_bw"
    return {"cpu-only": "cpu_compute", "hybrid": "link", "all-GPU": "gpu_compute"}[k]


def held_out(e: dict) -> bool:
    return bool(e.get("collected"))


def source(e: dict) -> str:
    """The entry's group for leave-one-source-out: its source URL without a fragment."""
    return e["source"].split("#")[0].rstrip("/")


def log_err(pred: float | None, meas: float | None) -> float | None:
    return math.log(pred / meas) if pred and meas else None


def geomean_abs(logs: list[float]) -> float | None:
    """exp(mean |ln(predicted / measured)|) - 1: the typical error, either way."""
    return math.exp(sum(abs(x) for x in logs) / len(logs)) - 1 if logs else None


def quantile_abs(logs: list[float], q: float = 0.68) -> float | None:
    """The q-quantile of |ln(predicted / measured)| (linear between order statistics): a spread around 1."""
    if not logs:
        return None
    xs = sorted(abs(x) for x in logs)
    pos = q * (len(xs) - 1)
    i = int(pos)
    return xs[i] if i + 1 >= len(xs) else xs[i] + (pos - i) * (xs[i + 1] - xs[i])


class CrossValidation:
    """Fits and predictions of one set of entries; `predict(e, **factors)` is validate_published.predict."""

    def __init__(self, entries: list[dict], predict):
        self.entries = [e for e in entries if e["use"] == "error"]
        self.by_id = {e["id"]: e for e in self.entries}
        self._predict = predict
        self.curve = cache(self._curve)

    def _curve(self, entry_id: str, metric: str) -> tuple[float, ...] | None:
        """ln(predicted / measured) of one entry's `metric` at every GRID value of its factor (None: no figure)."""
        e = self.by_id[entry_id]
        k = key_for(e, metric)
        errs = [log_err(self._predict(e, **{k: f})[metric], e.get(f"{metric}_tok_s")) for f in GRID]
        return None if errs[0] is None else tuple(errs)

    def fit(self, train: list[dict]) -> dict[str, float]:
        """Each factor chosen so that the training figures of its kind have a mean log error of zero (1.0 where
        there are none): every entry's log error is computed at the GRID factors once and interpolated linearly in
        ln(factor); the nearer end of the grid if no factor in it does."""
        out = {}
        for key in KEYS:
            curves = [c for e in train for m, _ in PHASES if key_for(e, m) == key
                      for c in [self.curve(e["id"], m)] if c is not None]
            out[key] = _zero(curves)
        return out

    def training(self) -> list[dict]:
        return [e for e in self.entries if not held_out(e)]

    def run(self) -> dict:
        """In-sample, leave-one-source-out and held-out log errors per figure, with the factors behind each."""
        train = self.training()
        f_all = self.fit(train)
        rows = {}
        for e in train:
            rows[e["id"]] = {"in_sample": self._errors(e, f_all)}
        sources = sorted({source(e) for e in train})
        folds = {}
        for s in sources:
            f = self.fit([e for e in train if source(e) != s])
            folds[s] = f
            for e in train:
                if source(e) == s:
                    rows[e["id"]]["out_of_sample"] = self._errors(e, f)
        for e in self.entries:
            if held_out(e):
                rows[e["id"]] = {"held_out": self._errors(e, f_all)}
        return {"factors": f_all, "folds": folds, "rows": rows, "sources": len(sources),
                "classes": self.classes(rows)}

    def _errors(self, e: dict, factors: dict) -> dict:
        p = self._predict(e, **factors)
        return {m: log_err(p[m], e.get(f"{m}_tok_s")) for m, _ in PHASES}

    def classes(self, rows: dict) -> list[dict]:
        """Per phase and kind, and per phase, and overall: n, geometric-mean |error| and the 68% spread of |ln|
        for in-sample, out-of-sample and held-out figures; the worst ratio out of sample."""
        groups: dict[str, dict[str, list[float]]] = {}
        for e in self.entries:
            r = rows[e["id"]]
            for m, phase in PHASES:
                for label in (f"{phase}, {kind(e)}", phase, "all"):
                    g = groups.setdefault(label, {"in_sample": [], "out_of_sample": [], "held_out": []})
                    for how, errs in r.items():
                        if errs.get(m) is not None:
                            g[how].append(errs[m])
        order = [f"{ph}, {k}" for _, ph in PHASES for k in KINDS] + ["prefill", "decode", "all"]
        out = []
        for label in order:
            g = groups.get(label)
            if not g:
                continue
            oos = g["out_of_sample"]
            out.append({"class": label, "n": len(oos), "n_held_out": len(g["held_out"]),
                        "in_sample": geomean_abs(g["in_sample"]), "out_of_sample": geomean_abs(oos),
                        "spread68": quantile_abs(oos), "worst": math.exp(max(map(abs, oos))) if oos else None,
                        "held_out": geomean_abs(g["held_out"]), "held_out_spread68": quantile_abs(g["held_out"]),
                        "held_out_worst": math.exp(max(map(abs, g["held_out"]))) if g["held_out"] else None})
        return out


def _zero(curves: list[tuple[float, ...]]) -> float:
    """The factor where the mean of the curves (each rising with the factor) crosses zero; 1.0 with no curves."""
    if not curves:
        return 1.0
    mean = [sum(c[i] for c in curves) / len(curves) for i in range(len(GRID))]
    if mean[0] >= 0 or mean[-1] <= 0:
        return GRID[0] if mean[0] >= 0 else GRID[-1]
    i = next(i for i in range(len(GRID) - 1) if mean[i] < 0 <= mean[i + 1])
    w = mean[i] / (mean[i] - mean[i + 1])
    return math.exp(math.log(GRID[i]) + w * (math.log(GRID[i + 1]) - math.log(GRID[i])))


def placement_pairs(rows: list[dict], noise: float) -> list[dict]:
    """Every two counted entries of a pair (same box) whose placements differ, per figure both measured beyond
    `noise`, with the same test (prompt, u-batch, depth, threads): is the predicted order right, and where the
    measured gain is above x1.5, is the predicted gain within a factor 1.5 of it? (Pairs that only change the u-batch
    are the model's scaling, not a placement choice.)"""
    out = []
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["pair"] and r["use"] != "excluded":
            groups.setdefault(r["pair"], []).append(r)
    for g, rs in groups.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                if a["placement"] == b["placement"] or a["test"] != b["test"]:
                    continue                              # a u-batch or depth sweep, not a choice of placement
                for m in ("prompt", "gen"):
                    ma, mb, pa, pb = a[m]["measured"], b[m]["measured"], a[m]["predicted"], b[m]["predicted"]
                    if not (ma and mb and pa and pb) or abs(math.log(ma / mb)) < noise:
                        continue
                    gain, pgain = max(ma, mb) / min(ma, mb), (pa / pb if ma > mb else pb / pa)
                    out.append({"pair": g, "a": a["id"], "b": b["id"], "metric": m, "measured": [ma, mb],
                                "predicted": [pa, pb], "right": pa != pb and (ma > mb) == (pa > pb),
                                "gain": gain, "predicted_gain": pgain,
                                "gain_ok": gain <= 1.5 or abs(math.log(pgain / gain)) <= math.log(1.5)})
    return out


def recommendations(rows: list[dict], noise: float = 0.05) -> list[dict]:
    """Per box and test ('pair' group, figures whose test agrees), the placement `moert compare` would recommend
    from the predictions (moert/cost/range.choose: the fastest unless others tie with it by the same-box ratio
    error, then the simplest flags) against the measurement: right when its measured figure is the fastest or within
    `noise` of it. On decode (compare's key, "tg"); a group needs two placements measured."""
    from moert.cost.range import choose

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["pair"] and r["use"] != "excluded" and r["gen"]["measured"] and r["gen"].get("predicted"):
            t = tuple(r["test"].get(k) for k in DEPENDS["gen"])
            groups.setdefault((r["pair"], t), []).append(r)
    out = []
    for (g, _), rs in groups.items():
        if len({json_key(r["placement"]) for r in rs}) < 2:
            continue
        cand = [{"id": r["id"], "tg": r["gen"]["predicted"], "fits": r["fits"] is not False, "strategy": r["id"],
                 "flags": placement_flags(r["placement"])} for r in rs]
        pick = choose(cand, "tg")
        if pick is None:
            continue
        measured = {r["id"]: r["gen"]["measured"] for r in rs}
        best = max(measured, key=measured.get)
        out.append({"pair": g, "recommended": pick["id"], "fastest": best, "tied": pick.get("tied", False),
                    "measured_share": measured[pick["id"]] / measured[best],
                    "right": measured[pick["id"]] >= (1 - noise) * measured[best],
                    "held_out": any(r["held_out"] for r in rs)})
    return out


def placement_flags(p: dict) -> list[str]:
    """An entry's placement as the flags moert compare's rows carry (range.simplicity counts them)."""
    if p.get("cpu_only"):
        return ["-ngl", "0"]
    if p.get("all_gpu"):
        return []
    if p.get("cpu_moe"):
        return ["--cpu-moe"]
    if "n_cpu_moe" in p:
        return ["--n-cpu-moe", str(p["n_cpu_moe"])]
    return ["-ot", p.get("overrides", "")]


def json_key(x) -> str:
    return json.dumps(x, sort_keys=True)


# What each metric of a figure depends on in its test: two placements on one box compare on a metric only when these
# agree (decode does not see the u-batch, so a u-batch sweep's placements still compare at decode).
DEPENDS = {"prompt": ("n_prompt", "n_ubatch", "depth", "threads"), "gen": ("depth", "threads", "kv_bytes")}


def ratio_pairs(rows: list[dict]) -> list[dict]:
    """Every two counted figures of one metric on one box (a 'pair' group) whose placements differ and whose tests
    agree on what the metric depends on (DEPENDS): ln(predicted ratio / measured ratio), the error of the *ratio*
    between two placements, which shares most of what is wrong with each (the box's bandwidth, the build's kernels).
    Predictions as shipped (the factors fitted on every training figure move both figures of a box alike)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["pair"] and r["use"] != "excluded":
            groups.setdefault(r["pair"], []).append(r)
    out = []
    for g, rs in groups.items():
        for i, a in enumerate(rs):
            for b in rs[i + 1:]:
                if a["placement"] == b["placement"]:
                    continue
                for m, keys in DEPENDS.items():
                    ma, mb, pa, pb = a[m]["measured"], b[m]["measured"], a[m].get("predicted"), b[m].get("predicted")
                    if not (ma and mb and pa and pb) or any(a["test"].get(k) != b["test"].get(k) for k in keys):
                        continue
                    out.append({"pair": g, "a": a["id"], "b": b["id"], "metric": m, "measured": ma / mb,
                                "predicted": pa / pb, "ln_error": math.log((pa / pb) / (ma / mb)),
                                "held_out": bool(a["held_out"] or b["held_out"])})
    return out


__all__ = ["DEPENDS", "GRID", "KEYS", "CrossValidation", "geomean_abs", "held_out", "json_key", "key_for", "kind",
           "log_err", "placement_flags", "placement_pairs", "quantile_abs", "ratio_pairs", "recommendations", "source"]
