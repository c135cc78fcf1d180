"""Rules -> a Plan: every tensor (and every expert of an expert tensor) gets a device; first match wins.

    rules = parse_overrides(r"\\.ffn_.*_exps=CPU")      # llama.cpp's -ot syntax, or TensorOverride.cpu(...)
    p = plan("model.gguf", rules, gpu_layers="all", gpu_backend="sim")

The semantics (llama.cpp's -ot, --cpu-moe, -ngl, -ts) are described in plan.py's docstring.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from moert.devices import Device
from moert.devices.config import accepts_device_config
from moert.devices.gpus import get_devices
from moert.devices.remote import RemoteDevice
from moert.errors import PlacementError, PlacementWarning
from moert.placement.plan import (
    _LAYER_RE,
    _OUTPUT_RE,
    Placement,
    Plan,
    _has_expert_axis,
    _layer_gpu,
    _Model,
    model_info,
)
from moert.placement.rules import TensorOverride, format_overrides, literal_name, moe_rules, normalize_overrides

SPLIT_MODES = ("layer", "none")
MATCH_BUDGET_S = 5.0   # all rules against all names (each search is bounded too: rules.MATCH_TIMEOUT_S)


def gpu_layer_count(gpu_layers: Any, n_layer: int) -> int:
    if gpu_layers == "all":
        return n_layer + 1
    if isinstance(gpu_layers, str) and gpu_layers.strip().isdigit():
        gpu_layers = int(gpu_layers)
    if isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < 0:
        raise PlacementError(f"gpu_layers must be 'all', 'auto' or an int >= 0, got {gpu_layers!r}")
    return min(gpu_layers, n_layer + 1)  # -ngl 999 means all, as in llama.cpp


@accepts_device_config
def plan(model: Any, overrides: Any = None, gpu_layers: int | str = "all", cpu_moe: bool = False,
         n_cpu_moe: int | None = None, gpu_backend: str = "auto", gpu_memory: Any = None,
         split: str = "layer", strict: bool = False, *, n_cpu_moe_from: str = "first",
         tensor_split: Sequence[float] | None = None, main_gpu: int = 0, devices: list[Device] | None = None,
         n_layer: int | None = None) -> Plan:
    """Decide every tensor's device (nothing is loaded); see the module docstring for the semantics.

    `model`: a GGUF path, an open GGUFFile, or a list of tensor names. `tensor_split` gives the GPUs'
    shares of the layers (llama.cpp's -ts; default: their capacities); `main_gpu` with split="none" is the GPU
    that takes every GPU layer (llama.cpp's -mg). `devices` reuses GPU devices from get_devices().
    `gpu_layers="auto"` is a strategy (strategies.auto_plan), not a plan.
    """
    info = model_info(model, n_layer)
    user = normalize_overrides(overrides)
    split, devices = main_gpu_split(parse_split(split, tensor_split), main_gpu, devices, gpu_backend, gpu_memory)
    if gpu_layers == "auto":
        raise PlacementError("gpu_layers='auto' is a strategy, not a plan: call moert.fit(...) (or "
                             "moert.placement.strategies.auto_plan) for it; moert.load(..., gpu_layers='auto') and "
                             "the CLI's -ngl auto do")
    rules = user + moe_rules(cpu_moe, n_cpu_moe, info.n_layer, n_cpu_moe_from)
    return build(info, rules, gpu_layer_count(gpu_layers, info.n_layer), gpu_backend, gpu_memory, split, strict,
                 devices, stacklevel=3)  # past accepts_device_config


def parse_split(split: str, tensor_split: Sequence[float] | None) -> str | tuple[float, ...]:
    """"layer", "none", or explicit shares (a tuple) when tensor_split is given."""
    if split not in SPLIT_MODES:
        raise PlacementError(f"split={split!r} is not supported; use one of {', '.join(SPLIT_MODES)}")
    if tensor_split is None or split == "none":
        return split
    try:
        shares = tuple(float(x) for x in tensor_split)
    except (TypeError, ValueError):
        shares = ()
    if not shares or not all(math.isfinite(x) and x >= 0 for x in shares) or sum(shares) <= 0:
        raise PlacementError(f"tensor_split={list(tensor_split)!r}: give one finite share >= 0 per GPU, not all zero "
                             f"(e.g. 3,1)")
    return shares


def main_gpu_split(split: str | tuple[float, ...], main_gpu: int, devices: list[Device] | None, gpu_backend: str,
                   gpu_memory: Any) -> tuple[str | tuple[float, ...], list[Device] | None]:
    """llama.cpp's -mg: with split "none", every GPU layer on GPU `main_gpu` (as one-hot layer shares)."""
    if not main_gpu:
        return split, devices
    gpus = list(devices) if devices is not None else get_devices(gpu_backend, gpu_memory)
    if isinstance(main_gpu, bool) or not isinstance(main_gpu, int) or not 0 <= main_gpu < len(gpus):
        raise PlacementError(f"main_gpu={main_gpu!r}: there is no GPU {main_gpu}; GPUs that exist: "
                             f"{', '.join(f'{i} ({g.name})' for i, g in enumerate(gpus)) or 'none'}")
    if split != "none":  # llama.cpp uses the main GPU only without a layer split
        return split, gpus
    return tuple(1.0 if i == main_gpu else 0.0 for i in range(len(gpus))), gpus


def build(info: _Model, rules: list[TensorOverride], n_gpu: int, gpu_backend: str, gpu_memory: Any,
           split: str | tuple[float, ...], strict: bool, devices: list[Device] | None, stacklevel: int = 2,
           warn: bool = True) -> Plan:
    backend = (gpu_backend or "auto").lower()
    gpus = list(devices) if devices is not None else get_devices(backend, gpu_memory)
    messages: list[str] = []

    tensors = dict(info.tensors)
    tied: dict[str, str] = {}
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        # llama.cpp loads token_embd a second time as the output layer's matrix (TENSOR_DUPLICATED)
        tensors["output.weight"] = tensors["token_embd.weight"]
        tied["output.weight"] = "token_embd.weight"

    # which GPU backend is really in use, and whether anything asks for a GPU
    wants_gpu = any(r.device != "cpu" and not r.remote for r in rules) or (n_gpu > 0 and any(
        _layer_of(n, info.n_layer) is not None for n in tensors))
    fallback = False
    if not gpus:
        if wants_gpu and backend == "auto":
            from moert.devices import cuda as _cuda

            _cuda.device_count()
            messages.append(f"no usable GPU backend ({_cuda.why_unavailable()}): every tensor is placed on the "
                            f"CPU; pass gpu_backend='sim' to simulate a GPU, or gpu_layers=0 to plan for "
                            f"the CPU only")
            fallback = True
        elif wants_gpu:
            raise PlacementError(f"the plan puts tensors on a GPU (gpu_layers={n_gpu} or a GPU rule) but "
                                 f"gpu_backend={gpu_backend!r} has no GPU; use gpu_layers=0, "
                                 f"gpu_backend='auto' to fall back to the CPU, or gpu_backend='sim'")
    used_backend = gpus[0].kind.replace("cuda", "cupy") if gpus else "none"
    if gpus:
        for i, r in enumerate(rules):
            if r.remote:
                continue
            if r.device != "cpu" and r.device_index >= len(gpus):
                raise PlacementError(f"rule #{i} {r}: there is no {r.device} (GPU index {r.device_index}); "
                                     f"devices that exist: {', '.join(['cpu', *(g.name for g in gpus)])}")
            # CUDA<N> on a simulated GPU: the sim stands in for that CUDA device, so a command line written for
            # llama.cpp plans and runs unchanged with --gpu-backend sim; sim:N on a real GPU stays an error
            if r.backend is not None and r.backend != gpus[0].kind and not (r.backend == "cuda" and
                                                                           gpus[0].kind == "sim"):
                raise PlacementError(f"rule #{i} {r} names a {r.backend} device but the GPU backend is "
                                     f"{used_backend}; pass gpu_backend="
                                     f"{'sim' if r.backend == 'sim' else 'cupy'!r} or spell it GPU{r.device_index}")
    n_gpu_eff = n_gpu if gpus else 0
    if isinstance(split, tuple):
        if gpus and len(split) != len(gpus):
            raise PlacementError(f"tensor_split has {len(split)} shares but there are {len(gpus)} GPUs "
                                 f"({', '.join(g.name for g in gpus)}); give one share per GPU")
        shares, split = split, "layer"
    else:
        shares = tuple(float(g.capacity) for g in gpus) if split == "layer" else None

    entries: dict[str, Placement] = {}
    split_tensors: dict[str, tuple[Placement, ...]] = {}
    matched = [0] * len(rules)
    decided = [0] * len(rules)
    shadowed_by: list[int | None] = [None] * len(rules)
    t_match = time.perf_counter()
    exact: dict[str, list[int]] = {}             # ^<literal>$ rules: a lookup, not a search per tensor
    searched: list[tuple[int, TensorOverride]] = []
    for i, r in enumerate(rules):
        lit = literal_name(r.pattern)
        if lit is None:
            searched.append((i, r))
        else:
            exact.setdefault(lit, []).append(i)
    for name, (typ, shape, nbytes) in tensors.items():
        layer = _layer_of(name, info.n_layer)
        hits = sorted(exact.get(name, []) + [i for i, r in searched if r.matches(name)])
        if time.perf_counter() - t_match > MATCH_BUDGET_S:
            raise PlacementError(f"matching the rules against the tensor names took over {MATCH_BUDGET_S} s "
                                 f"(at {name!r}); simplify the patterns: {format_overrides(rules)}")
        for i in hits:
            matched[i] += 1
            if i != hits[0] and shadowed_by[i] is None:
                shadowed_by[i] = hits[0]
        base = Placement(name, typ, shape, nbytes, "", None, None, "", layer, None, tied.get(name))

        def placed(i: int | None, experts: tuple[int, ...] | None = None, base: Placement = base) -> Placement:
            """The placement rule i (None: the default) gives this tensor, or its experts `experts`."""
            if i is None:
                dev, reason = _default(base.layer, info.n_layer, n_gpu, n_gpu_eff, gpus, shares, fallback)
                return replace(base, device=dev, reason=reason, experts=experts,
                               nbytes=_piece_bytes(base, experts))
            r = rules[i]
            if r.remote and not _has_expert_axis(base.name, base.shape):
                raise PlacementError(f"rule #{i} {r} matches {base.name}, but a Ray worker holds routed experts only "
                                     f"(ffn_*_exps tensors); narrow the pattern, e.g. r'blk\\.3\\.ffn_.*_exps'")
            dev = r.device if r.remote else "cpu" if (r.device == "cpu" or fallback) else gpus[r.device_index].name
            reason = f"rule #{i}" + (" (no GPU: CPU fallback)" if fallback and r.device != "cpu" else "")
            return replace(base, device=dev, rule=r, rule_index=i, reason=reason, experts=experts,
                           nbytes=_piece_bytes(base, experts))

        owners = _expert_owners(name, shape, hits, rules) if any(rules[i].experts for i in hits) else None
        if owners is None:                              # the first matching rule takes the whole tensor
            if hits:
                decided[hits[0]] += 1
            entries[name] = placed(hits[0] if hits else None)
        else:                                           # first match wins per (tensor, expert)
            for i in {o for o in owners if o is not None}:
                decided[i] += 1
            groups: dict[int | None, list[int]] = {}
            for e, o in enumerate(owners):
                groups.setdefault(o, []).append(e)
            if len(groups) == 1:
                entries[name] = placed(owners[0])
            else:
                split_tensors[name] = tuple(placed(o, tuple(ids)) for o, ids in groups.items())

    for i, r in enumerate(rules):
        if matched[i] == 0:
            example = next(iter(info.tensors), "?")
            messages.append(f"rule #{i} {r} ({r.source}) matches no tensor of this model; tensor names look "
                            f"like {example!r} (Plan.explain() lists them all)")
        elif decided[i] == 0:
            j = shadowed_by[i]
            messages.append(f"rule #{i} {r} ({r.source}) never decides: each of the {matched[i]} tensors it "
                            f"matches was already taken by an earlier rule (first by rule #{j} {rules[j]}); "
                            f"reorder the rules or remove one")
    if strict and messages:
        raise PlacementError("strict placement: " + "; ".join(messages))
    if warn:
        for m in messages:
            warnings.warn(m, PlacementWarning, stacklevel=stacklevel + 1)
    n_remote = 1 + max((r.device_index for r in rules if r.remote), default=-1)
    remote = [RemoteDevice(i) for i in range(n_remote)]     # placeholders: moert.load connects the workers
    return Plan(info, rules, entries, gpus, n_gpu_eff, used_backend, split, messages, shares, split_tensors,
                remote)


def _piece_bytes(p: Placement, experts: tuple[int, ...] | None) -> int:
    """Bytes of experts `experts` of tensor p (all of it for None): each expert is an equal slice."""
    return p.nbytes if experts is None else p.nbytes // p.shape[0] * len(experts)


def _expert_owners(name: str, shape: tuple[int, ...], hits: list[int], rules: list[TensorOverride]) -> list:
    """For each expert of tensor `name`, the index of the first matching rule that takes it (None: none does).
    A rule with an expert set takes only those experts; one without takes every expert still undecided."""
    for i in hits:
        r = rules[i]
        if r.experts is None:
            continue
        if not _has_expert_axis(name, shape):
            raise PlacementError(f"rule #{i} {r} has an expert set but matches {name} {shape}, which has no "
                                 f"expert axis; narrow the pattern to the *_exps tensors")
        if r.experts[-1] >= shape[0]:
            raise PlacementError(f"rule #{i} {r} names expert {r.experts[-1]} but {name} has {shape[0]} experts "
                                 f"(ids 0-{shape[0] - 1})")
    owners: list[int | None] = [None] * shape[0]
    for i in hits:
        for e in (range(shape[0]) if rules[i].experts is None else rules[i].experts):
            if owners[e] is None:
                owners[e] = i
    return owners


def _layer_of(name: str, n_layer: int) -> int | None:
    m = _LAYER_RE.match(name)
    if m:
        return int(m.group(1))
    return n_layer if _OUTPUT_RE.match(name) else None


def _default(layer: int | None, n_layer: int, n_gpu: int, n_gpu_eff: int, gpus: list[Device],
             shares: tuple[float, ...] | None, fallback: bool) -> tuple[str, str]:
    what = "output layer" if layer == n_layer else f"layer {layer}"
    if layer is None:
        return "cpu", "input layer, kept on the CPU (a row lookup; llama.cpp never offloads it)"
    i_gpu_start = n_layer + 1 - n_gpu
    if layer < i_gpu_start:
        return "cpu", f"{what} is not among the last {n_gpu} of {n_layer + 1} layers (gpu_layers={n_gpu})"
    if fallback or not n_gpu_eff:
        return "cpu", f"{what} is a GPU layer, but there is no GPU (CPU fallback)"
    dev = _layer_gpu(layer, n_layer, n_gpu_eff, gpus, shares)
    return dev.name, f"{what} is among the last {n_gpu} of {n_layer + 1} layers (gpu_layers={n_gpu})"


__all__ = ["MATCH_BUDGET_S", "SPLIT_MODES", "build", "gpu_layer_count", "main_gpu_split", "parse_split", "plan"]
