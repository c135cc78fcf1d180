"""Placement strategies: functions that return rules (TensorOverride lists), never flags in `forward`.

    fit(model, context_size, gpu_memory=...)      llama.cpp's --fit, composed with the user's rules (fit.py)
    hot_experts(model, trace, gpu_memory=...)     dense weights, router, attention, KV on the GPU, then the
                                                  experts a routing trace selected most, until it is full
    all_cpu_experts(model)                        llama.cpp --cpu-moe
    equal_share / random_experts / hot_per_layer  n experts of every layer on the GPU: 0..n-1, random (the
                                                  control), or a trace's hottest; n as large as fits
    cpu_layers(model, n, "first" | "last")        llama.cpp --n-cpu-moe N, or the last N (ik_llama.cpp)

A new strategy is a function here, or in moert/cost/strategies.py when it needs hardware (equal_share,
random_experts, hot_per_layer, fit_order, cost_greedy, named: the set `moert compare` runs).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from moert.devices import Device, format_size, parse_size
from moert.errors import PlacementError
from moert.kvcache import DEFAULT_KV_TYPE
from moert.placement.build import plan
from moert.placement.fit import FitResult, auto_plan, fit, with_fit_suggestion  # noqa: F401  (re-exported)
from moert.placement.memory import EXPERT_TENSORS, estimate, metadata_int
from moert.placement.plan import Plan, model_info
from moert.placement.rules import EXPERT_REGEX, TensorOverride, expert_layer_regex, moe_rules


def hot_experts(model: Any, trace: Any, gpu_memory: Any = None, context_size: int = 4096, *,
                gpu_backend: str = "auto", n_batch: int = 512, margin: str | int | None = None,
                devices: list[Device] | None = None, kv_dtype: Any = DEFAULT_KV_TYPE,
                flash_attn: bool | None = None) -> list[TensorOverride]:
    """Rules that put dense weights, router, attention and KV on GPU 0, then the experts a routing trace
    selected most (most selections per byte first, over all layers) until the GPU is full; the rest of the
    experts on the CPU. `model`: a GGUF path, an open file or a Plan's model; `trace`: a moert.Trace or a
    path. The rules print as -ot with Plan.overrides_string(). kv_dtype, flash_attn: the KV cache as estimate's
    (f16 by default, as moert.load's)."""
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
    est = estimate(base, context_size, n_batch, kv_dtype, flash_attn)
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
    extra = estimate(one, context_size, n_batch, kv_dtype, flash_attn).devices[gpu.name].scratch - \
        est.devices[gpu.name].scratch
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


def all_cpu_experts(model) -> list[TensorOverride]:
    """Every expert tensor on the CPU (llama.cpp --cpu-moe)."""
    return moe_rules(cpu_moe=True)


def cpu_layers(model, n: int, which: str = "first") -> list[TensorOverride]:
    """The experts of the first n layers on the CPU (llama.cpp --n-cpu-moe), or the last n (ik_llama.cpp)."""
    return moe_rules(n_cpu_moe=n, n_layer=model_info(model).n_layer, n_cpu_moe_from=which)


__all__ = ["FitResult", "all_cpu_experts", "auto_plan", "cpu_layers", "fit", "hot_experts", "with_fit_suggestion"]
