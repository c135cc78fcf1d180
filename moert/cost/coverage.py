"""Where the cost model has been checked: the classes of a machine and setting, and what a prediction outside them says.

    classes(hw, depth=0, quant="Q4_K", engine="llama.cpp", kind_="hybrid")
        -> {"cpu": "amd zen4", "isa": "avx512-vnni", "sockets": "1-socket", "gpu": "consumer cuda", "depth": "<4k",
            "quant": "k-quant", "engine": "llama.cpp", "kind": "hybrid"}
    reasons(cls, phases)   -> ["no figure from a 2-socket box", "2 figures at depth >32k"]

Every published figure (bench/published.json) and every prediction falls in one value of each axis. VALIDATION's
"coverage" (moert/cost/range.py) counts the training figures of each value: the figures whose out-of-sample errors
set the likely ranges (held-out figures are not counted: no range was read from them). A prediction whose machine
or setting falls in a value with fewer than MIN_FIGURES is extrapolating: `Prediction.extrapolating` says where, and
its likely range widens (`widened`). The CPU's axes are not asked of an all-GPU run, nor the GPU's of a CPU-only one.
"""

from __future__ import annotations

import math
import re

MIN_FIGURES = 10
AXES = ("cpu", "isa", "sockets", "gpu", "depth", "quant", "engine", "kind")
CPU_AXES = ("cpu", "isa", "sockets")
_SAYS = {"cpu": "from {v} CPUs", "isa": "from CPUs whose int8 path is {v}", "sockets": "from {v} boxes",
         "gpu": "from {v} GPUs", "depth": "at depth {v}", "quant": "of {v} weights", "engine": "from {v}",
         "kind": "of {v}"}


def depth_class(depth: float) -> str:
    """The KV depth a test starts at: "<4k" (below 4096), "4k-32k" (to 32768), ">32k"."""
    return "<4k" if depth < 4096 else "4k-32k" if depth <= 32768 else ">32k"


def quant_family(name: str) -> str:
    """A GGML type or a quant mix's name ("Q4_K_M", "UD-Q4_K_XL", "IQ4_XS", "MXFP4", "Q8_0", "BF16") as its family:
    "k-quant", "i-quant", "legacy" (Q4_0 ... Q8_0), "mxfp4", "float" or "other"."""
    n = name.upper()
    if "MXFP4" in n:
        return "mxfp4"
    if re.search(r"(^|[^A-Z])IQ\d", n):
        return "i-quant"
    if re.search(r"Q\d_K", n):
        return "k-quant"
    if re.search(r"Q\d_\d", n):
        return "legacy"
    if re.search(r"(^|[^A-Z])(B?F16|F32)", n):
        return "float"
    return "other"


def plan_quant(plan) -> str:
    """The GGML type holding most of a plan's expert bytes (else most of all its bytes)."""
    from moert.cost.shape import EXPERT

    by: dict[str, float] = {}
    ents = [e for e in plan if EXPERT.search(e.name)] or list(plan)
    for e in ents:
        by[e.type] = by.get(e.type, 0.0) + e.nbytes
    return max(by, key=by.get) if by else ""


def classes(hw, depth: float = 0, quant: str = "", engine: str = "llama.cpp", kind_: str = "hybrid") -> dict:
    """The class value of each axis for a run of `kind_` ("cpu-only", "hybrid", "all-GPU") on `hw` (None: the axis
    is not asked of this kind of run)."""
    c, g = hw.cpu, hw.gpus[0] if hw.gpus and kind_ != "cpu-only" else None
    out = {"cpu": f"{c.vendor} {c.generation}" if c.vendor and c.generation else "unstated",
           "isa": c.isa or "unstated", "sockets": f"{c.sockets}-socket",
           "gpu": "none" if g is None else f"{g.tier} {g.api}" if g.tier and g.api else "unstated",
           "depth": depth_class(depth), "quant": quant_family(quant), "engine": engine, "kind": kind_}
    if kind_ == "all-GPU":
        out.update(dict.fromkeys(CPU_AXES))
    return out


def of(pred, plan, hw) -> dict:
    """The classes of a moert.predict Prediction of `plan` on `hw` (its settings' depth and policy, its kind)."""
    engine = "ik_llama.cpp" if pred.settings.get("policy") == "ik_llama.cpp" else "llama.cpp"
    return classes(hw, pred.settings.get("depth", 0), plan_quant(plan), engine, pred.kind())


def _figures(n: int) -> str:
    return "no figure" if n == 0 else f"{n} figure{'s' * (n != 1)}"


def reasons(cls: dict, coverage: dict, phases=("prefill", "decode")) -> list[str]:
    """Why a prediction of class values `cls` extrapolates: one line per axis value with fewer than MIN_FIGURES
    training figures in `coverage` ({axis: {value: n}}); the kind axis per phase ("5 figures of decode, cpu-only")."""
    out = []
    for axis in AXES:
        v = cls.get(axis)
        if v is None or v == "unstated":
            continue
        for value in ([f"{ph}, {v}" for ph in phases] if axis == "kind" else [v]):
            n = coverage.get(axis, {}).get(value, 0)
            if n < MIN_FIGURES:
                out.append(f"{_figures(n)} {_SAYS[axis].format(v=value)}")
    return out


def widened(spread: float, n_reasons: int, held_out_spread: float) -> float:
    """A likely range's half-width (ln) with `n_reasons` uncovered axes: each adds, in quadrature, the 68% spread of
    the held-out figures (those collected where the model had not been shaped: the measured error of a prediction
    made outside its training classes), as independent errors add: sqrt(s^2 + k h^2)."""
    return math.sqrt(spread ** 2 + n_reasons * held_out_spread ** 2)


__all__ = ["AXES", "MIN_FIGURES", "classes", "depth_class", "of", "plan_quant", "quant_family", "reasons", "widened"]
