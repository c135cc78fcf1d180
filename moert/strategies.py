"""Placement strategies: plain functions that return rules (TensorOverride lists), to compare with predict.

    rules = strategies.cost_greedy(model, hw)      # or all_cpu_experts(model), cpu_layers(model, 12, "last"), ...
    p = moert.plan(model, rules, gpu_backend="sim", gpu_memory=hw.gpu_memory())

Each takes what it needs (a GGUF path / open file / twin, a Hardware, a context) and returns rules that go
after the user's; none of them threads a flag through the runtime. `smallest_fitting(...)` searches the
n of an n-layer strategy for the fewest CPU layers that still fit the hardware's GPU memory.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

from moert.errors import PlacementError
from moert.hardware import Hardware
from moert.placement import _model_info, plan
from moert.rules import EXPERT_REGEX, TensorOverride, expert_layer_regex, moe_rules

_EXPERT = re.compile(EXPERT_REGEX)


def all_cpu_experts(model) -> list[TensorOverride]:
    """Every expert tensor on the CPU (llama.cpp --cpu-moe)."""
    return moe_rules(cpu_moe=True)


def cpu_layers(model, n: int, which: str = "first") -> list[TensorOverride]:
    """The experts of the first n layers on the CPU (llama.cpp --n-cpu-moe), or the last n (ik_llama.cpp)."""
    return moe_rules(n_cpu_moe=n, n_layer=_model_info(model).n_layer, n_cpu_moe_from=which)


def fit_order(model, hw: Hardware, context: int = 4096) -> list[TensorOverride] | None:
    """llama.cpp's --fit order: dense weights and KV on the GPU, then whole layers front to back (so the last
    layers' experts stay on the CPU), then part of one more layer (its expert tensors one by one)."""
    found = smallest_fitting(model, hw, context, lambda n: cpu_layers(model, n, "last"))
    if found is None:
        return None
    n, rules = found
    info = _model_info(model)
    if n == 0:
        return rules
    il = info.n_layer - n                                                # the first CPU layer: split it
    tensors = [t for t in info.tensors if t.startswith(f"blk.{il}.") and _EXPERT.search(t)]
    rest = cpu_layers(model, n - 1, "last")
    keep = list(tensors)
    for t in sorted(tensors, key=lambda t: ("gate" not in t, "up" not in t)):   # gate, up, then down
        trial = [x for x in keep if x != t]
        if fits(model, rest + _exact(trial), hw, context):
            keep = trial
    return rest + _exact(keep) if len(keep) < len(tensors) else rules


def _exact(names) -> list[TensorOverride]:
    return [TensorOverride("^" + re.escape(n) + "$", "cpu", source="strategy") for n in names]


def fits(model, rules, hw: Hardware, context: int) -> bool:
    """Whether `rules` fit the hardware's GPUs at `context` (predict's memory model: f16 KV, llama.cpp buffers)."""
    from moert.predict import gpu_memory

    return all(v["need"] <= v["capacity"] for v in gpu_memory(_plan(model, rules, hw), hw, context).values())


def smallest_fitting(model, hw: Hardware, context: int, make: Callable[[int], list]) -> tuple[int, list] | None:
    """The smallest n whose rules `make(n)` fit (n = CPU layers; more never needs more GPU memory), or None."""
    n_layer = _model_info(model).n_layer
    lo, hi = 0, n_layer
    if not fits(model, make(hi), hw, context):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(model, make(mid), hw, context) else (mid + 1, hi)
    return lo, make(lo)


def cost_greedy(model, hw: Hardware, context: int = 4096, trace=None) -> list[TensorOverride]:
    """moert's own: start from all experts on the CPU, then bring experts to the GPU in order of predicted
    decode seconds saved per GPU byte (a trace's hot layers first), while they fit: whole layers first (a
    layer half on each side pays a link round trip per token), then single tensors of the layers left."""
    from moert.predict import _selection

    info = _model_info(model)
    q = _selection(info.metadata, trace, info.n_layer)                  # (n_layer, E)
    gpu_gbs = hw.gpus[0].read_gbs()
    by_layer: dict[int, list[tuple[float, str, int]]] = {}
    for name, (typ, shape, nbytes) in info.tensors.items():
        m = re.match(r"blk\.(\d+)\.", name)
        if not m or not _EXPERT.search(name) or len(shape) < 3 or int(m.group(1)) >= info.n_layer:
            continue
        il = int(m.group(1))
        read = nbytes * float(q[il].sum()) / shape[0]                  # bytes a token reads of it
        saved = read / (hw.cpu.matvec_gbs(typ) * 1e9) - read / (gpu_gbs * 1e9)
        by_layer.setdefault(il, []).append((saved, name, nbytes))
    value = lambda ts: sum(t[0] for t in ts) / sum(t[2] for t in ts)  # noqa: E731  (seconds saved per byte)
    on_cpu = {n for ts in by_layer.values() for _, n, _ in ts}
    for il in sorted(by_layer, key=lambda il: (-value(by_layer[il]), il)):
        trial = on_cpu - {n for _, n, _ in by_layer[il]}
        if fits(model, _exact(sorted(trial)), hw, context):
            on_cpu = trial
    for _saved, name, _nbytes in sorted((t for ts in by_layer.values() for t in ts if t[1] in on_cpu),
                                        key=lambda t: -t[0] / t[2]):
        if fits(model, _exact(sorted(on_cpu - {name})), hw, context):
            on_cpu = on_cpu - {name}
    return _compact(_exact(sorted(on_cpu)), info.n_layer)


def _compact(rules: list[TensorOverride], n_layer: int) -> list[TensorOverride]:
    """Whole layers whose three expert tensors are all on the CPU become one layer rule (shorter -ot)."""
    names = {r.pattern for r in rules}
    out, done = [], set()
    for il in range(n_layer):
        mine = {p for p in names if p.startswith(f"^blk\\.{il}\\.")}
        if len(mine) == 3:
            out.append(TensorOverride(expert_layer_regex(il), "cpu", source="strategy"))
            done |= mine
    return out + [r for r in rules if r.pattern not in done]


def _plan(model, rules, hw: Hardware):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan(model, rules, gpu_backend="sim", gpu_memory=hw.gpu_memory() or None,
                    gpu_layers="all" if hw.gpus else 0)


def named(model, hw: Hardware, context: int = 4096, trace=None) -> dict[str, list[TensorOverride] | None]:
    """The strategies `moert compare` runs, by name (None: nothing of that kind fits)."""
    if not hw.gpus:
        raise PlacementError(f"{hw.name} has no GPU: every strategy is the same (all on the CPU)")
    out: dict[str, list | None] = {"all experts on CPU (--cpu-moe)": all_cpu_experts(model)}
    for which, label in (("first", "--n-cpu-moe N (first N layers)"), ("last", "last N layers (ik_llama.cpp)")):
        found = smallest_fitting(model, hw, context, lambda n, w=which: cpu_layers(model, n, w))
        out[label.replace(" N", f" {found[0]}") if found else label] = found[1] if found else None
    out["--fit order (front layers, then part of one)"] = fit_order(model, hw, context)
    out["cost-greedy (moert)"] = cost_greedy(model, hw, context, trace)
    return out


__all__ = ["all_cpu_experts", "cost_greedy", "cpu_layers", "fit_order", "fits", "named", "smallest_fitting"]
