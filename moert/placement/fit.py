"""The fit strategy: llama.cpp's --fit, composed with the user's rules (strategies.py re-exports it).

    fit(model, context_size, gpu_memory=...)    experts of whole layers to the CPU until the rest fits, then
                                                less context, then fewer GPU layers
    auto_plan(model, context, gpu_layers=...)   moert.plan with gpu_layers="auto" resolved by fit
    with_fit_suggestion(err, plan, context)     an out-of-memory error with the rules fit finds
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from moert.devices import Device, format_size, parse_size
from moert.devices.config import accepts_device_config
from moert.errors import PlacementError, PlacementWarning
from moert.kvcache import DEFAULT_KV_TYPE
from moert.placement.build import build, gpu_layer_count, main_gpu_split, parse_split
from moert.placement.memory import EXPERT_TENSORS, Estimate, estimate, metadata_int
from moert.placement.plan import Plan, model_info
from moert.placement.rules import TensorOverride, expert_layer_regex, format_overrides, moe_rules, normalize_overrides


@dataclass
class FitResult:
    """What fit found: the rules and context that fit, or why nothing does."""

    success: bool
    context_size: int
    gpu_layers: int
    overrides: list[TensorOverride]            # the rules fit added (after the user's, which it never changes)
    rules: list[TensorOverride]                # user + shortcut + fit rules: pass these to plan()/load()
    bytes_by_device: dict[str, int]            # estimated total per device
    message: str
    plan: Plan | None = field(default=None, repr=False)
    estimate: Estimate | None = field(default=None, repr=False)

    def overrides_string(self) -> str:
        """The -ot string to pass (all rules, in order)."""
        return format_overrides(self.rules)

    def table(self) -> str:
        return self.estimate.table() if self.estimate is not None else ""

    def to_dict(self) -> dict:
        return {"success": self.success, "context_size": self.context_size, "gpu_layers": self.gpu_layers,
                "overrides": self.overrides_string(), "added_overrides": format_overrides(self.overrides),
                "bytes_by_device": self.bytes_by_device, "message": self.message,
                "estimate": self.estimate.to_dict() if self.estimate is not None else None}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


@accepts_device_config
def fit(model: Any, context_size: int = 0, overrides: Any = None, gpu_layers: int | str = "all",
        cpu_moe: bool = False, n_cpu_moe: int | None = None, gpu_backend: str = "auto", gpu_memory: Any = None,
        margin: str | int | list | None = None, split: str = "layer", *, n_cpu_moe_from: str = "first",
        tensor_split: Any = None, main_gpu: int = 0,
        expert_order: str = "last", n_batch: int = 512, kv_dtype: Any = DEFAULT_KV_TYPE, min_context: int = 256,
        devices: list[Device] | None = None, flash_attn: bool | None = None) -> FitResult:
    """Find rules (after the user's) and a context that fit the GPUs: experts to CPU, then less context.

    Strategy: keep the user's rules; dense weights, router, attention and KV default to the GPU(s);
    move whole layers' expert tensors to the CPU (`expert_order` "last" layers first, or "first") until
    the rest fits with `margin` free (one size, or a list: one per GPU; default 512MiB on CUDA, 0 on sim);
    then, if context_size was 0, take the largest context that fits (capped at the trained context, at least
    `min_context`); with gpu_layers="auto", then fewer GPU layers. kv_dtype, flash_attn: as estimate's (f16, the
    default of moert.load and llama.cpp; flash_attn None: on when the cache is not f32, -fa auto).
    """
    info = model_info(model)
    split = split if isinstance(split, tuple) else parse_split(split, tensor_split)
    split, devices = main_gpu_split(split, main_gpu, devices, gpu_backend, gpu_memory)
    if expert_order not in ("last", "first"):
        raise PlacementError(f"expert_order must be 'last' or 'first', got {expert_order!r}")
    if context_size < 0:
        raise PlacementError(f"context_size must be >= 0 (0 = the largest that fits), got {context_size}")
    user = normalize_overrides(overrides) + moe_rules(cpu_moe, n_cpu_moe, info.n_layer, n_cpu_moe_from)
    n_gpu = info.n_layer + 1 if gpu_layers in ("all", "auto") else gpu_layer_count(gpu_layers, info.n_layer)
    base = build(info, user, n_gpu, gpu_backend, gpu_memory, split, False, devices, warn=False)
    if margin is None:  # a real GPU loses memory to the CUDA context and allocator; a simulated one does not
        margin = 0 if all(d.kind == "sim" for d in base.devices) else "512MiB"
    margins = list(margin) if isinstance(margin, (list, tuple)) else [margin] * max(len(base.devices), 1)
    if len(margins) != max(len(base.devices), 1):
        raise PlacementError(f"margin lists {len(margins)} sizes but there are {len(base.devices)} GPUs "
                             f"({', '.join(d.name for d in base.devices)}); give one size, or one per GPU")
    margin_b = {d.name: parse_size(m) for d, m in zip(base.devices, margins)}
    trained = metadata_int(info.metadata, "context_length") if info.metadata else 0
    if context_size == 0 and not trained:
        raise PlacementError(f"context_size=0 asks for the trained context, but metadata key "
                             f"'{info.arch}.context_length' is missing; pass a context size")
    want = context_size or trained

    def result(ok: bool, p: Plan, ctx: int, msg: str) -> FitResult:
        final = build(info, p.rules, p.gpu_layers if p.devices else n_gpu, gpu_backend, gpu_memory, split,
                       False, p.devices, warn=False)
        for m in final.messages:
            warnings.warn(m, PlacementWarning, stacklevel=4)  # past fit and accepts_device_config
        est = estimate(final, ctx, n_batch, kv_dtype, flash_attn)
        added = len(final.rules) - len(user)
        if base.devices:
            msg += (f"; {added} layer(s) of expert tensors moved to the CPU" if added else
                    "; no expert tensor moved")
        return FitResult(ok, ctx, final.gpu_layers, final.rules[len(user):], final.rules, est.total_by_device(),
                         msg, final, est)

    if not base.devices:
        return result(True, base, want, "no GPU: every tensor is on the CPU")

    def fits(p: Plan, ctx: int) -> bool:
        return estimate(p, ctx, n_batch, kv_dtype, flash_attn).fits(margin_b)

    def overfull(p: Plan, ctx: int) -> set[str]:
        est = estimate(p, ctx, n_batch, kv_dtype, flash_attn)
        return {n for n, d in est.devices.items() if not d.fits(margin_b.get(n, 0))}

    p = base
    order = range(info.n_layer - 1, -1, -1) if expert_order == "last" else range(info.n_layer)
    for il in order:
        over = overfull(p, want)
        if not over:
            break
        # only experts that sit on an over-full GPU by default; the user's rules decide the rest
        names = [e.name for e in p if e.layer == il and e.rule is None and e.device in over
                 and EXPERT_TENSORS.search(e.name)]
        if names:
            p = p._with_rule(TensorOverride(expert_layer_regex(il), "cpu", source="fit"), names)
    if fits(p, want):
        return result(True, p, want, f"fits at context {want}")

    def largest_context(p: Plan) -> int:
        lo, hi = min(min_context, want), want
        if not fits(p, lo):
            return 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(p, mid) else (lo, mid - 1)
        return lo // 256 * 256 if lo >= 256 else lo  # llama.cpp pads contexts to 256

    if context_size == 0:
        ctx = largest_context(p)
        if ctx:
            return result(True, p, ctx, f"fits at context {ctx} (reduced from {want})")
    if gpu_layers == "auto":  # last resort: fewer GPU layers (binary search; fewer layers never need more)
        def attempt(n: int) -> tuple[Plan, int]:
            q = build(info, p.rules, n, gpu_backend, gpu_memory, split, False, base.devices, warn=False)
            # drop fit's rules for experts that now default to the CPU anyway
            keep = [r for r in p.rules[len(user):] if any(e.rule is r and q.default_device(e.layer) != "cpu"
                                                           for e in q)]
            q = build(info, user + keep, n, gpu_backend, gpu_memory, split, False, base.devices, warn=False)
            return q, (want if fits(q, want) else (largest_context(q) if context_size == 0 else 0))

        lo, hi, best = 0, n_gpu - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            q, ctx = attempt(mid)
            if ctx:
                best, lo = (q, ctx, mid), mid + 1
            else:
                hi = mid - 1
        if best is not None:
            q, ctx, n = best
            return result(True, q, ctx, f"fits at context {ctx} with gpu_layers={n} of {n_gpu}")
    est = estimate(p, min(min_context, want) if context_size == 0 else want, n_batch, kv_dtype, flash_attn)
    worst = [d for n, d in est.devices.items() if not d.fits(margin_b.get(n, 0))]
    detail = "; ".join(f"{d.device} needs {format_size(d.total)} (weights {format_size(d.weights)}, "
                       f"KV {format_size(d.kv)}, scratch {format_size(d.scratch)}) but has "
                       f"{format_size(d.capacity)} - margin {format_size(margin_b.get(d.device, 0))}"
                       for d in worst)
    msg = (f"does not fit at context {est.context_size} even with every expert tensor the rules allow on the "
           f"CPU: {detail}. Give the GPU more memory (--gpu-mem), lower gpu_layers (-ngl), move more tensors "
           f"to the CPU (-ot), or use a smaller context")
    return FitResult(False, est.context_size, p.gpu_layers, p.rules[len(user):], p.rules, est.total_by_device(),
                     msg, p, est)





def auto_plan(model: Any, context_size: int = 0, gpu_layers: int | str = "all", *, kv_dtype: Any = DEFAULT_KV_TYPE,
              flash_attn: bool | None = None, **plan_options: Any) -> Plan:
    """moert.plan, with gpu_layers='auto' resolved by `fit` for `context_size` (0: the largest that fits) and the
    KV cache type the model will allocate (kv_dtype, flash_attn: as estimate's)."""
    from moert.placement.build import plan

    if gpu_layers != "auto":
        return plan(model, gpu_layers=gpu_layers, **plan_options)
    strict = plan_options.pop("strict", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = fit(model, context_size=context_size, gpu_layers="auto", kv_dtype=kv_dtype, flash_attn=flash_attn,
                **plan_options)
    if not r.success:
        raise PlacementError(f"gpu_layers='auto': {r.message}")
    if strict and r.plan.messages:
        raise PlacementError("strict placement: " + "; ".join(r.plan.messages))
    for w in caught:
        warnings.warn(w.message, w.category, stacklevel=2)
    return r.plan


def with_fit_suggestion(err: Any, plan: Plan, context_size: int, kv_dtype: Any = DEFAULT_KV_TYPE,
                        flash_attn: bool | None = None) -> Any:
    """A DeviceOutOfMemory from loading `plan`, with the rules `fit` finds for the same GPUs appended."""
    from moert.errors import DeviceOutOfMemory

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the plan's own warnings were given already
            r = fit(plan.model, context_size=context_size, overrides=plan.rules, gpu_layers=plan.gpu_layers,
                    split=plan.split, tensor_split=plan.tensor_split, devices=plan.devices, margin=0,
                    kv_dtype=kv_dtype, flash_attn=flash_attn)
        hint = (f" A plan that fits (context {r.context_size}): -ot \"{r.overrides_string()}\" -ngl {r.gpu_layers}."
                if r.success else f" `moert fit` finds no plan for these GPUs: {r.message}.")
    except Exception as e:  # noqa: BLE001 - the suggestion must never hide the real error
        hint = f" (fit could not suggest a plan: {e})"
    new = DeviceOutOfMemory(err.device, err.requested, err.used, err.capacity, err.what)
    new.args = (str(new) + hint,)
    new.suggestion = hint.strip()
    return new


__all__ = ["FitResult", "auto_plan", "fit", "with_fit_suggestion"]
