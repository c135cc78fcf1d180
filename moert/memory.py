"""Pre-flight memory: what a plan needs on each device (estimate), and a plan that fits (fit).

The estimate, per device d, for a context of n_ctx tokens processed in chunks of at most T = min(n_batch,
n_ctx) tokens (legend: E embedding, H / Hkv query / KV heads, Dk Dv head dims, X experts, K experts
used, F expert hidden, V vocabulary, s = bytes per KV element, f32 = 4 bytes):

    weights(d) = sum of the GGUF bytes of the tensors placed on d (quantized bytes: no dequantization at load)
    kv(d)      = sum over layers whose attention runs on d of  n_ctx * Hkv * (Dk + Dv) * s
    scratch(d) = temporaries of one chunk, an upper bound over the layers on d:
                 4 * T * E * f32                           hidden, residual, normed, attention/FFN output
               + T * (2 * H * max(Dk, Dv) + 2 * Hkv * Dk) * f32      q, attention output, new k and v
               + 2 * H * T * n_ctx * f32                   scores and their softmax
               + 2 * T * X * f32                           router logits and probabilities
               + T * K * (3 * F + E) * f32                 gate, up, activation, expert output (if experts on d)
               + T * V * f32                               logits (if the output layer is on d)
               + 2 * largest dequantized matrix on d * f32 (one expert of an *_exps tensor)
    total(d)   = weights + kv + scratch;  on a GPU it must be <= capacity (fit also keeps `margin` free)

`estimate` is an upper bound of what `load_weights` plus `allocate_kv_cache` really allocate on a sim
device (tests/test_memory.py checks it on a sim GPU whose capacity is exactly the estimate); the scratch
term assumes the forward pass works in chunks of at most n_batch tokens and dequantizes one expert at a time.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moert.device_config import accepts_device_config
from moert.devices import Device, format_size, parse_size
from moert.errors import DeviceOutOfMemory, PlacementError, PlacementWarning
from moert.placement import (
    EXPERT_REGEX,
    Plan,
    TensorOverride,
    _build,
    _gpu_layers,
    _model_info,
    _split,
    expert_layer_regex,
    format_overrides,
    main_gpu_split,
    moe_rules,
    normalize_overrides,
)

F32 = 4
_EXPERTS = re.compile(EXPERT_REGEX)


# --------------------------------------------------------------------------------------------- KV cache

@dataclass(frozen=True)
class KVSpec:
    """The KV cache's shape: per layer K (n_ctx, n_head_kv, head_dim_k) and V (n_ctx, n_head_kv, head_dim_v)."""

    n_layer: int      # {arch}.block_count
    n_head_kv: int    # {arch}.attention.head_count_kv (default: head_count, as llama.cpp)
    head_dim_k: int   # {arch}.attention.key_length (default: embedding_length / head_count)
    head_dim_v: int   # {arch}.attention.value_length (default: head_dim_k)

    @classmethod
    def from_metadata(cls, md: dict) -> KVSpec:
        """From GGUF metadata; a missing key is an error naming it."""
        arch = md.get("general.architecture")
        if not isinstance(arch, str):
            raise PlacementError("metadata 'general.architecture' is missing; cannot size the KV cache")

        def key(k: str, default: Any = None) -> int:
            v = md.get(f"{arch}.{k}", default)
            if v is None:
                raise PlacementError(f"metadata key '{arch}.{k}' is missing; cannot size the KV cache")
            if isinstance(v, (list, tuple)):  # per-layer values: size for the largest
                v = max(v)
            return int(v)

        n_head = key("attention.head_count")
        dk = key("attention.key_length", key("embedding_length") // max(n_head, 1))
        return cls(key("block_count"), key("attention.head_count_kv", n_head), dk,
                   key("attention.value_length", dk))

    def layer_bytes(self, n_ctx: int, dtype: Any = np.float32) -> int:
        """Bytes of one layer's K and V for n_ctx tokens."""
        return n_ctx * self.n_head_kv * (self.head_dim_k + self.head_dim_v) * np.dtype(dtype).itemsize


def kv_spec(config: Any) -> KVSpec:
    """A KVSpec from a KVSpec, a Plan, GGUF metadata, or a config object with n_layer/n_head_kv/head_dim."""
    if isinstance(config, KVSpec):
        return config
    if isinstance(config, Plan):
        return KVSpec.from_metadata(config.metadata)
    if isinstance(config, dict):
        return KVSpec.from_metadata(config)
    g = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)
    n_layer, n_head_kv = g("n_layer", "block_count"), g("n_head_kv", "head_count_kv")
    dk = g("head_dim_k", "key_length", "head_dim")
    dv = g("head_dim_v", "value_length", "head_dim") or dk
    if None in (n_layer, n_head_kv, dk):
        raise PlacementError(f"cannot size a KV cache from {type(config).__name__}: it needs n_layer, "
                             f"n_head_kv and head_dim (or pass GGUF metadata / a Plan)")
    return KVSpec(int(n_layer), int(n_head_kv), int(dk), int(dv))


def kv_cache_bytes(config: Any, n_ctx: int, dtype: Any = np.float32) -> int:
    """Bytes of the whole KV cache (every layer's K and V) for n_ctx tokens."""
    s = kv_spec(config)
    return s.n_layer * s.layer_bytes(n_ctx, dtype)


@dataclass
class KVCache:
    """Per-layer K and V arrays, each on its layer's attention device."""

    k: list
    v: list
    devices: list[Device]
    n_ctx: int
    dtype: Any

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.k + self.v)

    def bytes_by_device(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d, k, v in zip(self.devices, self.k, self.v):
            out[d.name] = out.get(d.name, 0) + int(k.nbytes) + int(v.nbytes)
        return out

    def free(self) -> None:
        """Give every layer's K and V back to its device."""
        for d, k, v in zip(self.devices, self.k, self.v):
            d.free(k)
            d.free(v)
        self.k, self.v, self.devices = [], [], []


def allocate_kv_cache(plan: Plan, n_ctx: int, dtype: Any = np.float32, config: Any = None) -> KVCache:
    """Zeroed K and V, float32 (n_ctx, n_head_kv, head_dim) per layer on its attention device (accounted)."""
    s = kv_spec(config if config is not None else plan)
    cache = KVCache([], [], [], n_ctx, np.dtype(dtype))
    done: list[tuple[Device, Any]] = []
    try:
        for il in range(s.n_layer):
            dev = plan.attention_device(il)
            done.append((dev, dev.zeros((n_ctx, s.n_head_kv, s.head_dim_k), dtype, what=f"blk.{il} KV cache (K)")))
            done.append((dev, dev.zeros((n_ctx, s.n_head_kv, s.head_dim_v), dtype, what=f"blk.{il} KV cache (V)")))
            cache.k.append(done[-2][1])
            cache.v.append(done[-1][1])
            cache.devices.append(dev)
    except DeviceOutOfMemory:
        for dev, a in done:  # leave nothing half-allocated behind
            dev.free(a)
        raise
    return cache


# --------------------------------------------------------------------------------------------- estimate

@dataclass
class DeviceEstimate:
    """Bytes one device needs: weights + KV + scratch."""

    device: str
    capacity: int | None
    weights: int = 0
    kv: int = 0
    scratch: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.scratch

    @property
    def free(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.total

    def fits(self, margin: int = 0) -> bool:
        return self.capacity is None or self.total + margin <= self.capacity


@dataclass
class Estimate:
    """Per-device memory of a plan at a context size (see the module docstring for the formula)."""

    context_size: int
    n_batch: int
    kv_dtype: str
    devices: dict[str, DeviceEstimate]

    def fits(self, margin: int | dict[str, int] = 0) -> bool:
        """Every device fits with `margin` bytes free (one for all, or per device name)."""
        return all(d.fits(margin.get(n, 0) if isinstance(margin, dict) else margin)
                   for n, d in self.devices.items())

    def total_by_device(self) -> dict[str, int]:
        return {n: d.total for n, d in self.devices.items()}

    def table(self) -> str:
        """llama.cpp-style memory breakdown: device, capacity, weights, KV, scratch, total, free."""
        head = f"{'device':<8} {'capacity':>11} {'weights':>11} {'KV':>11} {'scratch':>11} {'total':>11} {'free':>11}"
        rows = [f"memory at context {self.context_size} (KV {self.kv_dtype}, batch {self.n_batch}):", head]
        for d in self.devices.values():
            rows.append(f"{d.device:<8} {format_size(d.capacity):>11} {format_size(d.weights):>11} "
                        f"{format_size(d.kv):>11} {format_size(d.scratch):>11} {format_size(d.total):>11} "
                        f"{format_size(d.free):>11}")
        return "\n".join(rows)

    def to_dict(self) -> dict:
        return {"context_size": self.context_size, "n_batch": self.n_batch, "kv_dtype": self.kv_dtype,
                "devices": {n: {"capacity": d.capacity, "weights": d.weights, "kv": d.kv, "scratch": d.scratch,
                                "total": d.total, "free": d.free} for n, d in self.devices.items()}}


def _md_int(md: dict, key: str, default: int = 0) -> int:
    v = md.get(f"{md.get('general.architecture')}.{key}", default)
    return int(max(v) if isinstance(v, (list, tuple)) else v)


def estimate(plan: Plan, context_size: int, n_batch: int = 512, kv_dtype: Any = np.float32) -> Estimate:
    """Bytes of weights + KV cache + compute scratch per device, for `context_size` tokens."""
    if context_size < 0:
        raise PlacementError(f"context_size must be >= 0, got {context_size}")
    md = plan.metadata
    devs = {n: DeviceEstimate(n, plan.device(n).capacity) for n in plan.device_names()}
    for e in plan:
        devs[e.device].weights += e.nbytes
    n_ctx = int(context_size)
    T = max(min(n_batch, n_ctx), 1)
    spec = KVSpec.from_metadata(md) if md else None
    if spec is None:  # a names-only plan: weights only
        return Estimate(n_ctx, n_batch, np.dtype(kv_dtype).name, devs)
    E, H = _md_int(md, "embedding_length"), _md_int(md, "attention.head_count")
    X, K = _md_int(md, "expert_count"), _md_int(md, "expert_used_count")
    F = _md_int(md, "expert_feed_forward_length")
    V = _md_int(md, "vocab_size") or (plan["token_embd.weight"].shape[0] if "token_embd.weight" in plan else 0)
    Dk, Dv, Hkv = spec.head_dim_k, spec.head_dim_v, spec.n_head_kv

    attn_on: set[str] = set()
    for il in range(spec.n_layer):
        d = plan.attention_device(il).name
        devs[d].kv += spec.layer_bytes(n_ctx, kv_dtype)
        attn_on.add(d)
    experts_on = {e.device for e in plan if _EXPERTS.search(e.name)}
    logits_on = {plan.device_of("output.weight")} if "output.weight" in plan else set()
    biggest: dict[str, int] = {}
    for e in plan:
        if e.type in ("F32", "?") or len(e.shape) < 2:
            continue
        n = int(np.prod(e.shape[-2:] if len(e.shape) >= 3 else e.shape, dtype=np.int64)) * F32
        biggest[e.device] = max(biggest.get(e.device, 0), n)
    for name, d in devs.items():
        if d.weights == 0 and d.kv == 0:
            continue
        s = 0
        if name in attn_on:
            s += 4 * T * E * F32 + T * (2 * H * max(Dk, Dv) + 2 * Hkv * Dk) * F32 + 2 * H * T * n_ctx * F32
            s += 2 * T * X * F32
        if name in experts_on:
            s += 4 * T * E * F32 + T * K * (3 * F + E) * F32
        if name in logits_on:
            s += T * V * F32
        s += 2 * biggest.get(name, 0)
        d.scratch = s
    return Estimate(n_ctx, n_batch, np.dtype(kv_dtype).name, devs)


# ------------------------------------------------------------------------------------------------- fit

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
        expert_order: str = "last", n_batch: int = 512, kv_dtype: Any = np.float32, min_context: int = 256,
        devices: list[Device] | None = None) -> FitResult:
    """Find rules (after the user's) and a context that fit the GPUs: experts to CPU, then less context.

    Strategy: keep the user's rules; dense weights, router, attention and KV default to the GPU(s);
    move whole layers' expert tensors to the CPU (`expert_order` "last" layers first, or "first") until
    the rest fits with `margin` free (one size, or a list: one per GPU; default 512MiB on CUDA, 0 on sim);
    then, if context_size was 0, take the largest context that fits (capped at the trained context, at least
    `min_context`); with gpu_layers="auto", then fewer GPU layers.
    """
    info = _model_info(model)
    split = split if isinstance(split, tuple) else _split(split, tensor_split)
    split, devices = main_gpu_split(split, main_gpu, devices, gpu_backend, gpu_memory)
    if expert_order not in ("last", "first"):
        raise PlacementError(f"expert_order must be 'last' or 'first', got {expert_order!r}")
    if context_size < 0:
        raise PlacementError(f"context_size must be >= 0 (0 = the largest that fits), got {context_size}")
    user = normalize_overrides(overrides) + moe_rules(cpu_moe, n_cpu_moe, info.n_layer, n_cpu_moe_from)
    n_gpu = info.n_layer + 1 if gpu_layers in ("all", "auto") else _gpu_layers(gpu_layers, info.n_layer)
    base = _build(info, user, n_gpu, gpu_backend, gpu_memory, split, False, devices, warn=False)
    if margin is None:  # a real GPU loses memory to the CUDA context and allocator; a simulated one does not
        margin = 0 if all(d.kind == "sim" for d in base.devices) else "512MiB"
    margins = list(margin) if isinstance(margin, (list, tuple)) else [margin] * max(len(base.devices), 1)
    if len(margins) != max(len(base.devices), 1):
        raise PlacementError(f"margin lists {len(margins)} sizes but there are {len(base.devices)} GPUs "
                             f"({', '.join(d.name for d in base.devices)}); give one size, or one per GPU")
    margin_b = {d.name: parse_size(m) for d, m in zip(base.devices, margins)}
    trained = _md_int(info.metadata, "context_length") if info.metadata else 0
    if context_size == 0 and not trained:
        raise PlacementError(f"context_size=0 asks for the trained context, but metadata key "
                             f"'{info.arch}.context_length' is missing; pass a context size")
    want = context_size or trained

    def result(ok: bool, p: Plan, ctx: int, msg: str) -> FitResult:
        final = _build(info, p.rules, p.gpu_layers if p.devices else n_gpu, gpu_backend, gpu_memory, split,
                       False, p.devices, warn=False)
        for m in final.messages:
            warnings.warn(m, PlacementWarning, stacklevel=4)  # past fit and accepts_device_config
        est = estimate(final, ctx, n_batch, kv_dtype)
        added = len(final.rules) - len(user)
        if base.devices:
            msg += (f"; {added} layer(s) of expert tensors moved to the CPU" if added else
                    "; no expert tensor moved")
        return FitResult(ok, ctx, final.gpu_layers, final.rules[len(user):], final.rules, est.total_by_device(),
                         msg, final, est)

    if not base.devices:
        return result(True, base, want, "no GPU: every tensor is on the CPU")

    def fits(p: Plan, ctx: int) -> bool:
        return estimate(p, ctx, n_batch, kv_dtype).fits(margin_b)

    def overfull(p: Plan, ctx: int) -> set[str]:
        est = estimate(p, ctx, n_batch, kv_dtype)
        return {n for n, d in est.devices.items() if not d.fits(margin_b.get(n, 0))}

    p = base
    order = range(info.n_layer - 1, -1, -1) if expert_order == "last" else range(info.n_layer)
    for il in order:
        over = overfull(p, want)
        if not over:
            break
        # only experts that sit on an over-full GPU by default; the user's rules decide the rest
        names = [e.name for e in p if e.layer == il and e.rule is None and e.device in over
                 and _EXPERTS.search(e.name)]
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
            q = _build(info, p.rules, n, gpu_backend, gpu_memory, split, False, base.devices, warn=False)
            # drop fit's rules for experts that now default to the CPU anyway
            keep = [r for r in p.rules[len(user):] if any(e.rule is r and q.default_device(e.layer) != "cpu"
                                                           for e in q)]
            q = _build(info, user + keep, n, gpu_backend, gpu_memory, split, False, base.devices, warn=False)
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
    est = estimate(p, min(min_context, want) if context_size == 0 else want, n_batch, kv_dtype)
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


__all__ = [
    "DeviceEstimate", "Estimate", "FitResult", "KVCache", "KVSpec", "allocate_kv_cache", "estimate", "fit",
    "kv_cache_bytes", "kv_spec",
]
