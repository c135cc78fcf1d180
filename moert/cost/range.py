"""How far to trust a prediction: VALIDATION (out-of-sample errors on published figures), ranges, and ties.

    r = moert.predict(plan, hw)
    lo, hi = r.likely("decode")          # "decode 36 tok/s, likely 28-45"

VALIDATION is what `python bench/validate_published.py` measures on bench/published.json, by leaving one source out
(bench/published_cv.py): the geometric mean of |error| over figures the model's efficiency factors were *not* fitted
on, by phase and by class (prefill / decode x cpu-only / hybrid / all-GPU), and the 68% quantile of |ln(predicted /
measured)| of each class, which is the half-width of a prediction's likely range (in ln). tests/test_published.py
holds these equal to a fresh run, so a change to the model restates them.
"""

from __future__ import annotations

import math

VALIDATION = {
    "figures": 88, "sources": 16, "error": 0.16, "decode_error": 0.14, "prefill_error": 0.19,
    "in_sample_error": 0.14, "worst": 1.97,
    "classes": {
        "prefill, cpu-only": {"n": 5, "error": 0.21, "spread68": 0.19},
        "prefill, hybrid": {"n": 15, "error": 0.18, "spread68": 0.21},
        "prefill, all-GPU": {"n": 26, "error": 0.19, "spread68": 0.21},
        "decode, cpu-only": {"n": 5, "error": 0.21, "spread68": 0.23},
        "decode, hybrid": {"n": 13, "error": 0.22, "spread68": 0.22},
        "decode, all-GPU": {"n": 24, "error": 0.08, "spread68": 0.07},
    },
    "ranked": 1, "pairs": 1,
    # figures frozen before any term was shaped on them, never fitted, predicted with the factors of all the others
    "held_out": {"figures": 21, "error": 0.23, "worst": 2.46},
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
            f"placement changes on the same box ranked right {v['ranked']} of {v['pairs']} (bench/RESULTS.md)")


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


def likely(tok_s: float, phase: str, kind_: str) -> tuple[float, float]:
    """(low, high) around a predicted tok/s: the class's 68% out-of-sample spread either way."""
    s = spread(phase, kind_)
    return tok_s * math.exp(-s), tok_s * math.exp(s)


def simplicity(row: dict) -> tuple:
    """How simple a compare row's flags are: fewer characters of placement flags (its "flags", else its -ot) first,
    then a faster decode."""
    flags = " ".join(row.get("flags") or []) or row.get("ot") or ""
    return len(flags), -(row.get("tg") or 0.0)


def choose(rows: list[dict], key: str = "tg") -> dict | None:
    """Mark the rows that fit: "best" on one, "tied" on those within its likely range. A strategy is named best
    outright only when it is faster than every other by more than the range's half-width (its `key`_range low end
    is above the next one's prediction); otherwise the strategies tie and the one with the simplest flags among them
    is recommended ("why" says which). Rows need `key`, `fits` and `key`_range (low, high)."""
    ok = sorted((r for r in rows if r.get("fits") and r.get(key)), key=lambda r: -r[key])
    for r in rows:
        r["best"], r["tied"] = False, False
    if not ok:
        return None
    top = ok[0]
    lo = top[f"{key}_range"][0]
    tied = [r for r in ok if r[key] >= lo]
    if len(tied) == 1:
        top["best"], top["why"] = True, "faster than the next beyond the likely range"
        return top
    pick = min(tied, key=simplicity)
    for r in tied:
        r["tied"] = True
    pick["best"] = True
    pick["why"] = (f"ties with {len(tied) - 1} other(s) within the likely range of the fastest "
                   f"({top['strategy']}); the simplest flags of those")
    return pick


__all__ = ["KINDS", "VALIDATION", "choose", "kind", "likely", "simplicity", "spread", "trust"]
