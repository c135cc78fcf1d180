"""How far to trust a prediction: VALIDATION (out-of-sample errors on published figures), ranges, and ties.

    r = moert.predict(plan, hw)
    lo, hi = r.likely("decode")          # "decode 36 tok/s, likely 28-45"

VALIDATION is what `python bench/validate_published.py` measures on bench/published.json, by leaving one source out
(bench/published_cv.py): the geometric mean of |error| over figures the model's efficiency factors were *not* fitted
on, by phase and by class (prefill / decode x cpu-only / hybrid / all-GPU), and the 68% quantile of |ln(predicted /
measured)| of each class, which is the half-width of a prediction's likely range (in ln). "coverage" counts the
training figures of each class value of moert/cost/coverage.py (where fewer than 10, a prediction extrapolates and its
range widens); "pairs" and "ratio_spread68" are the same-box placement ratios' (published_cv.ratio_pairs), by which
two placements of one box tie or not. tests/test_published.py holds these equal to a fresh run, so a change to the
model restates them.
"""

from __future__ import annotations

import math

VALIDATION = {
    "figures": 88, "sources": 16, "error": 0.16, "decode_error": 0.14, "prefill_error": 0.18,
    "in_sample_error": 0.13, "worst": 1.97,
    "classes": {
        "prefill, cpu-only": {"n": 5, "error": 0.11, "spread68": 0.16},
        "prefill, hybrid": {"n": 15, "error": 0.18, "spread68": 0.21},
        "prefill, all-GPU": {"n": 26, "error": 0.19, "spread68": 0.21},
        "decode, cpu-only": {"n": 5, "error": 0.21, "spread68": 0.23},
        "decode, hybrid": {"n": 13, "error": 0.22, "spread68": 0.22},
        "decode, all-GPU": {"n": 24, "error": 0.08, "spread68": 0.07},
    },
    "ranked": 1, "ranked_of": 1,
    # the ratio of two placements' predictions on one box against the measured ratio: |ln| geometric mean and 68%
    "pairs": 9, "ratio_error": 0.032, "ratio_spread68": 0.013,
    # figures frozen before any term was shaped on them, never fitted, predicted with the factors of all the others
    "held_out": {"figures": 129, "error": 0.27, "worst": 3.6, "spread68": 0.24},
    # training figures per class value of moert/cost/coverage.py (fewer than 10: a prediction there extrapolates)
    "coverage": {
        "cpu": {"amd zen4": 21, "amd zen3": 10, "amd zen5": 2, "intel alder-lake": 2, "intel cascade-lake": 2,
            "intel raptor-lake": 1, "amd zen2": 0, "intel granite-rapids": 0, "intel sapphire-rapids": 0,
            "intel skylake-sp": 0},
        "isa": {"avx512-vnni": 25, "avx2": 13, "amx": 0, "avx512": 0},
        "sockets": {"1-socket": 38, "2-socket": 0},
        "gpu": {"workstation cuda": 32, "consumer cuda": 28, "consumer rocm": 11, "none": 10, "workstation rocm": 6,
            "consumer metal": 1, "datacenter rocm": 0},
        "depth": {"<4k": 51, "4k-32k": 37},
        "quant": {"mxfp4": 66, "legacy": 12, "k-quant": 10, "i-quant": 0},
        "engine": {"llama.cpp": 63, "ik_llama.cpp": 25},
        "kind": {"prefill, all-GPU": 26, "decode, all-GPU": 24, "prefill, hybrid": 15, "decode, hybrid": 13,
            "decode, cpu-only": 5, "prefill, cpu-only": 5},
    },
}
KINDS = ("cpu-only", "hybrid", "all-GPU")


def trust() -> str:
    """One line on how far to trust a prediction, from VALIDATION."""
    v = VALIDATION
    return (f"checked against {v['figures']} published llama.cpp / ik_llama.cpp figures from {v['sources']} sources, "
            f"each predicted with the model fitted on the other sources: off by {v['error']:.0%} (geometric mean; "
            f"decode {v['decode_error']:.0%}, prefill {v['prefill_error']:.0%}, worst x{v['worst']:.1f}; ranges are "
            f"each class's 68%); {v['held_out']['figures']} figures held out of every fit: off by "
            f"{v['held_out']['error']:.0%}; "
            f"placement changes on the same box ranked right {v['ranked']} of {v['ranked_of']}, their ratio off by "
            f"{v['ratio_error']:.0%} ({v['pairs']} same-box pairs; bench/RESULTS.md)")


def kind(devices) -> str:
    """The class of a prediction from the devices its parts ran on: "cpu-only", "all-GPU" or "hybrid"."""
    devs = {d for d in devices if d != "link"}
    gpus = any(d.startswith("gpu") for d in devs)
    return "hybrid" if gpus and "cpu" in devs else "all-GPU" if gpus else "cpu-only"


def spread(phase: str, kind_: str) -> float:
    """The half-width, in ln, of a `phase` ("prefill" or "decode") prediction's likely range for its class."""
    if phase not in ("prefill", "decode") or kind_ not in KINDS:
        raise ValueError(f"phase {phase!r} / kind {kind_!r}: use prefill or decode, and one of {', '.join(KINDS)}")
    return VALIDATION["classes"][f"{phase}, {kind_}"]["spread68"]


def likely(tok_s: float, phase: str, kind_: str, extrapolating: int = 0) -> tuple[float, float]:
    """(low, high) around a predicted tok/s: the class's 68% out-of-sample spread either way, widened for each of
    `extrapolating` uncovered classes by the held-out figures' spread (coverage.widened)."""
    from moert.cost.coverage import widened

    s = widened(spread(phase, kind_), extrapolating, VALIDATION["held_out"]["spread68"])
    return tok_s * math.exp(-s), tok_s * math.exp(s)


def simplicity(row: dict) -> tuple:
    """How simple a compare row's flags are: fewer characters of placement flags (its "flags", else its -ot) first,
    then a faster decode."""
    flags = " ".join(row.get("flags") or []) or row.get("ot") or ""
    return len(flags), -(row.get("tg") or 0.0)


def choose(rows: list[dict], key: str = "tg") -> dict | None:
    """Mark the rows that fit: "best" on one, "tied" on those that tie with it. Rows are placements of one model on
    one box, so what is wrong with one prediction is mostly wrong with the others too (the box's bandwidth, the
    build's kernels): two rows tie when the faster is ahead by less than the 68% spread of same-box placement
    ratios on published figures (VALIDATION's ratio_spread68), not by each prediction's own likely range. Then the
    one with the simplest flags among those tied is recommended ("why" says which). Rows need `key` and `fits`.
    The spread is the training pairs' (x1.013), not the held-out pairs' (|ln| 68% 0.36): a tie guards against naming
    the slower of two rows, and the held-out pairs miss in size, never in order (10 of 10 ordered right, the pick the
    measured fastest on 5 of 5 boxes: bench/published_cv.py recommendations); at x1.43 an 8 GB card's x1.18 from
    filling it (rtx4060+ryzen-7600, Qwen3-30B-A3B) would be called a tie and --cpu-moe recommended."""
    ok = sorted((r for r in rows if r.get("fits") and r.get(key)), key=lambda r: -r[key])
    for r in rows:
        r["best"], r["tied"] = False, False
    if not ok:
        return None
    top = ok[0]
    s = VALIDATION["ratio_spread68"]
    tied = [r for r in ok if r[key] >= top[key] * math.exp(-s)]
    if len(tied) == 1:
        top["best"], top["why"] = True, (f"faster than the next by more than placements on one box are off by "
                                         f"(x{math.exp(s):.3f}, {VALIDATION['pairs']} published same-box pairs)")
        return top
    pick = min(tied, key=simplicity)
    for r in tied:
        r["tied"] = True
    pick["best"] = True
    pick["why"] = (f"ties with {len(tied) - 1} other(s) within x{math.exp(s):.3f} of the fastest ({top['strategy']}: "
                   f"the 68% error of a same-box placement ratio); the simplest flags of those")
    return pick


__all__ = ["KINDS", "VALIDATION", "choose", "kind", "likely", "simplicity", "spread", "trust"]
