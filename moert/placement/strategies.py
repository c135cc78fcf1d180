"""Placement strategies: functions that return rules (TensorOverride lists), never flags in `forward`.

    fit(model, context_size, gpu_memory=...)      llama.cpp's --fit, composed with the user's rules (fit.py)
    hot_experts(model, trace, gpu_memory=...)     dense weights, router, attention, KV on the GPU, then the
                                                  experts a routing trace selected most, until it is full
    all_cpu_experts(model)                        llama.cpp --cpu-moe
    equal_share / random_experts / hot_per_layer  n experts of every layer on the GPU: 0..n-1, random (the
                                                  control), or a trace's hottest; n as large as fits
    cpu_layers(model, n, "first" | "last")        llama.cpp --n-cpu-moe N, or the last N (ik_llama.cpp)
    fit_order(model, hw, context)                 --fit's order on a Any: whole layers, then part of one
    cost_greedy(model, hw, context, trace)        moert's own: predicted decode seconds saved per GPU byte
    named(model, hw, context, trace)              the set `moert compare` runs, by name

A new strategy is a function here; `moert fit --strategy` and `moert compare` run them. The Any ones
use moert.predict's memory and cost model (moert/predict.py), imported when they run.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from moert.devices import Device, format_size, parse_size
from moert.errors import PlacementError
from moert.placement.build import plan
from moert.placement.fit import FitResult, auto_plan, fit, with_fit_suggestion  # noqa: F401  (re-exported)
from moert.placement.memory import EXPERT_TENSORS, estimate, metadata_int
from moert.placement.plan import Plan, model_info
from moert.placement.rules import EXPERT_REGEX, TensorOverride, expert_layer_regex, moe_rules


def hot_experts(model: Any, trace: Any, gpu_memory: Any = None, context_size: int = 4096, *,
                gpu_backend: str = "auto", n_batch: int = 512, margin: str | int | None = None,
                devices: list[Device] | None = None) -> list[TensorOverride]:
    """Rules that put dense weights, router, attention and KV on GPU 0, then the experts a routing trace
    selected most (most selections per byte first, over all layers) until the GPU is full; the rest of the
    experts on the CPU. `model`: a GGUF path, an open file or a Plan's model; `trace`: a moert.Trace or a
    path. The rules print as -ot with Plan.overrides_string()."""
    from moert.trace import Trace

    trace = trace if isinstance(trace, Trace) else Trace.load(trace)
    info = model_info(model.model if isinstance(model, Plan) else model)
    all_cpu = [TensorOverride(EXPERT_REGEX, "cpu", source="hot_experts")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = plan(info, all_cpu, gpu_backend=gpu_backend, gpu_memory=gpu_memory, devices=devices)
    if not base.devices:
        raise PlacementError("hot_experts places experts on a GPU, and there is none: pass gpu_backend='sim' "
                             "(--gpu-backend sim) and gpu_memory (--gpu-mem) to plan for one")
    gpu = base.devices[0]
    margin_b = parse_size(margin if margin is not None else (0 if gpu.kind == "sim" else "512MiB"))
    est = estimate(base, context_size, n_batch)
    counts = trace.counts()                                             # (L, E)
    layers = [il for il in range(info.n_layer) if f"blk.{il}.ffn_gate_exps.weight" in info.tensors]
    if counts.shape != (info.n_layer, metadata_int(info.metadata, "expert_count") or counts.shape[1]):
        raise PlacementError(f"the trace has {counts.shape[0]} layers x {counts.shape[1]} experts; the model "
                             f"{info.n_layer} layers: record the trace on this model")
    per_expert = {il: sum(info.tensors[n][2] // info.tensors[n][1][0] for n in info.tensors
                          if n.startswith(f"blk.{il}.") and EXPERT_TENSORS.search(n)) for il in layers}
    # the scratch an expert layer on the GPU adds (activations of its experts, one dequantized matrix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = plan(info, [TensorOverride(expert_layer_regex(layers[0]), gpu.name, experts=[0],
                                         source="hot_experts"), *all_cpu],
                   gpu_backend=gpu_backend, gpu_memory=gpu_memory, devices=base.devices) if layers else base
    extra = estimate(one, context_size, n_batch).devices[gpu.name].scratch - est.devices[gpu.name].scratch
    budget = gpu.capacity - margin_b - est.devices[gpu.name].total - max(extra, 0)
    if budget < 0:
        raise PlacementError(f"{gpu.name}: dense weights, KV cache and scratch at context {context_size} need "
                             f"{format_size(est.devices[gpu.name].total)} of {format_size(gpu.capacity)} "
                             f"(margin {format_size(margin_b)}) before any expert; lower the context or use fit")
    order = sorted(((il, e) for il in layers for e in np.flatnonzero(counts[il])),
                   key=lambda x: (-counts[x] / max(per_expert[x[0]], 1), x))
    chosen: dict[int, list[int]] = {}
    for il, e in order:
        if per_expert[il] <= budget:
            budget -= per_expert[il]
            chosen.setdefault(il, []).append(int(e))
    rules = [TensorOverride(expert_layer_regex(il), gpu.name if gpu.kind != "sim" else f"sim:{gpu.index}",
                            experts=sorted(ids), source="hot_experts") for il, ids in sorted(chosen.items())]
    everything = sum(map(len, chosen.values())) == sum(1 for il in layers for _ in range(counts.shape[1]))
    return rules if everything else rules + all_cpu          # the rest of the experts on the CPU




# ---------------------------------------------------------------- strategies on a Any (moert compare)

_EXPERT = re.compile(EXPERT_REGEX)


def all_cpu_experts(model) -> list[TensorOverride]:
    """Every expert tensor on the CPU (llama.cpp --cpu-moe)."""
    return moe_rules(cpu_moe=True)


def cpu_layers(model, n: int, which: str = "first") -> list[TensorOverride]:
    """The experts of the first n layers on the CPU (llama.cpp --n-cpu-moe), or the last n (ik_llama.cpp)."""
    return moe_rules(n_cpu_moe=n, n_layer=model_info(model).n_layer, n_cpu_moe_from=which)


def fit_order(model, hw, context: int = 4096) -> list[TensorOverride] | None:
    """llama.cpp's --fit order: dense weights and KV on the GPU, then whole layers front to back (so the last
    layers' experts stay on the CPU), then part of one more layer (its expert tensors one by one)."""
    found = smallest_fitting(model, hw, context, lambda n: cpu_layers(model, n, "last"))
    if found is None:
        return None
    n, rules = found
    info = model_info(model)
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


def fits(model, rules, hw, context: int) -> bool:
    """Whether `rules` fit the hardware's GPUs at `context` (predict's memory model: f16 KV, llama.cpp buffers)."""
    from moert.predict import gpu_memory

    return all(v["need"] <= v["capacity"] for v in gpu_memory(hardware_plan(model, rules, hw), hw, context).values())


def smallest_fitting(model, hw, context: int, make: Callable[[int], list]) -> tuple[int, list] | None:
    """The smallest n whose rules `make(n)` fit (n = CPU layers; more never needs more GPU memory), or None."""
    n_layer = model_info(model).n_layer
    lo, hi = 0, n_layer
    if not fits(model, make(hi), hw, context):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(model, make(mid), hw, context) else (mid + 1, hi)
    return lo, make(lo)


def cost_greedy(model, hw, context: int = 4096, trace=None) -> list[TensorOverride]:
    """moert's own: start from all experts on the CPU, then bring experts to the GPU in order of predicted
    decode seconds saved per GPU byte (a trace's hot layers first), while they fit: whole layers first (a
    layer half on each side pays a link round trip per token), then single tensors of the layers left."""
    from moert.predict_shape import selection

    info = model_info(model)
    q = selection(info.metadata, trace, info.n_layer)                  # (n_layer, E)
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


def hardware_plan(model, rules, hw) -> Plan:
    """The plan of `rules` on a Hardware's GPUs, simulated (what predict and compare read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return plan(model, rules, gpu_backend="sim", gpu_memory=hw.gpu_memory() or None,
                    gpu_layers="all" if hw.gpus else 0)


def _per_layer(model, pick: Callable[[int, int], list[int]], n: int) -> list[TensorOverride]:
    """Experts pick(layer, n) of each layer on GPU 0, every other expert on the CPU."""
    info = model_info(model)
    layers = sorted({int(t.split(".")[1]) for t in info.tensors if t.startswith("blk.") and _EXPERT.search(t)})
    sets = {il: pick(il, n) for il in layers} if n > 0 else {}
    if sets and all(ids == sets[layers[0]] for ids in sets.values()):       # one set for every layer: one rule
        return [TensorOverride(EXPERT_REGEX, "gpu:0", experts=sets[layers[0]], source="strategy"),
                *all_cpu_experts(model)]
    rules = [TensorOverride(expert_layer_regex(il), "gpu:0", experts=ids, source="strategy")
             for il, ids in sets.items()]
    return rules + all_cpu_experts(model)


def experts_per_layer(model, hw, context: int, pick: Callable[[int, int], list[int]]) -> list | None:
    """The most experts per layer, chosen by pick(layer, n), that fit on GPU 0 (binary search on n)."""
    E = metadata_int(model_info(model).metadata, "expert_count")
    if not E or not fits(model, _per_layer(model, pick, 0), hw, context):
        return None
    lo, hi = 0, E
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(model, _per_layer(model, pick, mid), hw, context) else (lo, mid - 1)
    return _per_layer(model, pick, lo)


def equal_share(model, hw, context: int = 4096) -> list | None:
    """The same number of experts of every layer on the GPU (experts 0..n-1), as many as fit."""
    return experts_per_layer(model, hw, context, lambda il, n: list(range(n)))


def random_experts(model, hw, context: int = 4096, seed: int = 0) -> list | None:
    """The control: as many experts per layer as equal_share, chosen at random (seeded) in each layer."""
    E = metadata_int(model_info(model).metadata, "expert_count")
    rng = np.random.default_rng(seed)
    order = {il: [int(e) for e in rng.permutation(E)] for il in range(model_info(model).n_layer)}
    return experts_per_layer(model, hw, context, lambda il, n: sorted(order[il][:n]))


def hot_per_layer(model, hw, context: int, counts: np.ndarray) -> list | None:
    """The n most-selected experts of each layer of a trace's counts (n_layer, E) on the GPU, as many as fit."""
    order = np.argsort(-np.asarray(counts), axis=1, kind="stable")
    return experts_per_layer(model, hw, context, lambda il, n: sorted(int(e) for e in order[il][:n]))


def named(model, hw, context: int = 4096, trace=None) -> dict[str, list[TensorOverride] | None]:
    """The strategies `moert compare` runs, by name (None: nothing of that kind fits)."""
    if not hw.gpus:
        raise PlacementError(f"{hw.name} has no GPU: every strategy is the same (all on the CPU)")
    out: dict[str, list | None] = {"all experts on CPU (--cpu-moe)": all_cpu_experts(model)}
    for which, label in (("first", "--n-cpu-moe N (first N layers)"), ("last", "last N layers (ik_llama.cpp)")):
        found = smallest_fitting(model, hw, context, lambda n, w=which: cpu_layers(model, n, w))
        if found and found[0] == 0:       # everything fits: one row says so ("last 0 layers" is the same placement)
            out["--n-cpu-moe 0 (every expert on the GPU)"] = found[1]
            break
        out[label.replace(" N", f" {found[0]}") if found else label] = found[1] if found else None
    out["--fit order (front layers, then part of one)"] = fit_order(model, hw, context)
    out["equal share of experts per layer"] = equal_share(model, hw, context)
    out["random experts (control)"] = random_experts(model, hw, context)
    if trace is not None:
        out["hot experts per layer (trace)"] = hot_per_layer(model, hw, context, trace)
    out["cost-greedy (moert)"] = cost_greedy(model, hw, context, trace)
    return out


__all__ = ["FitResult", "all_cpu_experts", "auto_plan", "cost_greedy", "cpu_layers", "equal_share",
           "experts_per_layer", "fit", "fit_order", "fits", "hardware_plan", "hot_experts", "hot_per_layer",
           "named", "random_experts", "smallest_fitting", "with_fit_suggestion"]
