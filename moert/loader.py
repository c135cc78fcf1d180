"""`moert.load(path, plan=None, *, kv=, ray=, ...) -> Model`: open the file, place it (or take your plan), load
the weights, build the runtime, warm it up, then apply the passes asked for.

    g    = gguf.open(path)                        the file (moert/gguf.py)
    plan = placement.auto_plan(g, n_ctx, ...)     unless you pass plan= (the CLI builds it once, prints it with -v)
    w    = weights.load_weights(g, plan)          tensors onto cpu / cuda:N / sim:N (moert/weights.py)
    m    = Model(g, arch, config, plan, w, ...)   KV cache, forward, stats (moert/model.py)
    vclock.attach(m, hardware)                    a pass: sim GPUs timed as `hardware`'s (moert/cost/vclock.py)

The runtime (model.py, experts.py, weights.py, devices/) imports nothing from the cost model or the cluster; this
module composes them, as gpt-fast's generate.py applies `apply_tp` to a finished model.
"""

from __future__ import annotations

import warnings
from typing import Any

from moert import models
from moert.config import DEFAULT_CONTEXT, MAX_CONTEXT
from moert.devices.config import accepts_device_config
from moert.errors import ArgumentError, ContextWarning, KernelOptionError, check_int
from moert.experts import OFFLOAD_MIN_BATCH
from moert.kvcache import KVConfig, flash_mode
from moert.model import MAX_BATCH, Model
from moert.threads import set_threads

# The flat keywords of earlier releases, still accepted: each is one field of a grouped option.
_FLAT_KV = {"cache_type_k": "type_k", "cache_type_v": "type_v", "flash_attn": "flash_attn"}
_FLAT_RAY = {"ray_model": "model", "ray_fallback": "fallback", "ray_threads": "threads", "ray_timeout": "timeout",
             "ray_calls": "calls"}


@accepts_device_config
def load(model: Any, plan: Any = None, *, context_size: int | None = None, threads: int | None = None,
         n_batch: int = 512, act_quant: str | None = None, repack: bool = False, kv: Any = None, ray: Any = None,
         hardware: Any = None, expert_cache: Any = None, trace: bool | str = False, mmap: bool = True,
         warmup: bool = True, progress: Any = None, stall_guard: bool = True, **placement: Any) -> Model:
    """Open a GGUF model, place its tensors (`plan`, a moert.Plan of this file; else moert.plan's keywords in
    `placement`: overrides, gpu_layers, cpu_moe, n_cpu_moe, gpu_backend, gpu_memory, ..., or device_config=
    moert.DeviceConfig(...)), load them onto their devices, allocate the KV cache, and (warmup=True, llama.cpp's
    default too) run a few tokens through it and forget them, so the first real ones do not pay for compiling the
    kernels (`Model.warmup`).
    context_size (-c): the KV cache's tokens; not given, 4096 (llama.cpp's default) or the trained context if that
    is smaller; 0, the trained context; more than it is honoured with a ContextWarning, as llama.cpp does.
    threads (-t), n_batch (-b): kernel threads; the most tokens one forward takes.
    act_quant="int16": CPU one-token matmuls of Q4_K/Q6_K weights round x to int16 per 256-block; "int8": every
    CPU matmul of those types rounds x to int8 (llama.cpp's scheme; needs AVX2); see kernels/matmul_q.py. None
    (default): float. repack=True (--repack, with act_quant="int8"): CPU Q4_K weights are copied at load into
    kernels/repack.py's layout (the same int32 sums, results equal to float rounding, faster kernels, +2.8% of
    those bytes in memory: `Model.repacked_bytes`).
    kv= a moert.KVConfig (cache types and flash attention: -ctk / -ctv / -fa), or one cache type name for both.
    ray= a moert.RayConfig, or its address ("local:N", "HOST:PORT", "auto"): the cluster whose workers hold the
    experts that RAY<N> rules place (moert/cluster/).
    hardware= (a moert.Hardware or a preset name, "rtx3090+ryzen-7950x"): time the sim GPUs as that hardware's
    (moert/cost/vclock.py; implies gpu_backend="sim" over "auto", and that hardware's GPU sizes unless gpu_memory=
    is given). expert_cache= (a moert.ExpertCache): copies of some CPU experts on a GPU, moved as the routing asks
    (moert/dynamic/runtime.py; it caches the experts the plan put on the CPU: cpu_moe=True, or n_cpu_moe=N).
    trace=True records every token's routing (`Model.trace`, moert/trace.py); trace="full" the router logits too.
    mmap=False (--no-mmap) reads the file into memory instead of mapping it, so a file truncated or rewritten while
    the model is loaded cannot crash it (docs/bad-input.md). stall_guard=False (--no-stall-guard): every decode
    step runs on the threads set, even when another process stalls them (default True: moert/threads.py
    StallGuard sends the steps after a stalled one to one thread). offload_min_batch= (a placement keyword,
    --offload-min-batch): a forward of at least this many tokens runs the matmuls of CPU weights on a GPU,
    copying there for the call a dense weight's bytes, an expert tensor's selected experts' (llama.cpp's op
    offload, GGML_OP_OFFLOAD_MIN_BATCH = 32, the default; 0: never; counted in TransferStats.offload_bytes).
    The flat keywords cache_type_k / cache_type_v / flash_attn and ray_model / ray_fallback / ray_threads /
    ray_timeout / ray_calls are still accepted, each standing for its field of kv= or ray=."""
    kv, ray = _grouped(kv, ray, placement)
    offload_min_batch = check_int("offload_min_batch", placement.pop("offload_min_batch", OFFLOAD_MIN_BATCH), 0)
    from moert import gguf
    from moert.cluster import attach, use_cluster
    from moert.errors import DeviceOutOfMemory
    from moert.kernels import matmul_q
    from moert.placement import Plan
    from moert.placement.strategies import auto_plan, with_fit_suggestion
    from moert.weights import load_weights

    if plan is not None and not isinstance(plan, Plan):
        raise ArgumentError(f"plan= takes a moert.Plan (moert.plan(path, ...)), not {type(plan).__name__}; give "
                            f"placement rules as overrides=")
    if plan is not None and placement:
        raise ArgumentError(f"give a plan or placement keywords ({', '.join(sorted(placement))}), not both: the plan "
                            f"already says where every tensor goes")
    if matmul_q.mode(act_quant) != 2 and repack:  # a bad or unsupported act_quant fails before any loading
        raise KernelOptionError(f"repack=True (--repack) applies to act_quant='int8' (the kernels that read the "
                                f"repacked layout), not act_quant={act_quant!r}: add act_quant='int8' or drop repack")
    kv_types = kv.types()
    flash = flash_mode(kv.flash_attn, kv_types)
    if context_size is not None:
        context_size = check_int("context_size", context_size, 0, MAX_CONTEXT)
    n_batch = check_int("n_batch", n_batch, 1, MAX_BATCH)
    if threads is not None:
        check_int("threads", threads, 1)
    if isinstance(hardware, str):
        from moert.cost.machines import preset

        hardware = preset(hardware)
    if hardware is not None and plan is None:
        placement["gpu_backend"] = "sim" if placement.get("gpu_backend", "auto") == "auto" else placement["gpu_backend"]
        if placement.get("gpu_memory") is None:
            placement["gpu_memory"] = hardware.gpu_memory() or None
    owned = not isinstance(model, gguf.GGUFFile)
    g = gguf.open(model, mmap=mmap) if owned else model
    try:
        g.check_real()                # a zoo twin (header only, the data a hole of zeros) cannot run
        arch, config = models.read(g)
        if threads:
            set_threads(int(threads))
        # not given: llama.cpp's default, or the trained context if smaller (no warning for what nobody asked);
        # 0: the trained context; more than it: honoured, with llama.cpp's warning
        n_ctx = (min(DEFAULT_CONTEXT, config.n_ctx_train) if context_size is None
                 else context_size or config.n_ctx_train)
        if n_ctx > config.n_ctx_train:              # honoured, as llama.cpp does, with its warning
            warnings.warn(ContextWarning(f"context_size={n_ctx} > the {config.n_ctx_train} tokens the model was "
                                         f"trained for: possible training context overflow (quality may drop "
                                         f"past {config.n_ctx_train})"), stacklevel=3)
        plan = auto_plan(g, n_ctx, kv_dtype=kv_types, flash_attn=flash, **placement) if plan is None else plan
        # RAY<N> devices: the cluster's workers started and answering
        plan = use_cluster(plan, ray.address if ray else None, *((ray.threads, ray.timeout, ray.fallback, ray.calls)
                                                                  if ray else ()))
        try:
            weights = load_weights(g, plan, progress=progress)
            attach(weights, plan.remote, (ray.model if ray else None) or g.path, act_quant, repack)
        except DeviceOutOfMemory as err:
            raise with_fit_suggestion(err, plan, n_ctx, kv_types, flash) from None
        try:
            m = Model(g, arch, config, plan, weights, n_ctx, n_batch, act_quant=act_quant, kv_types=kv_types,
                      flash_attn=flash, repack=repack)
            if not stall_guard:
                m.stall_guard = None
            m.offload_min_batch = offload_min_batch
            if hardware is not None:
                from moert.cost import vclock

                vclock.attach(m, hardware)
        except BaseException:
            weights.free()
            raise
    except BaseException:
        for d in plan.remote if plan is not None else ():     # Ray workers started for this load
            d.close()
        if owned:
            g.close()
        raise
    if warmup:
        try:
            m.warmup(progress=progress is not False)
        except BaseException:
            m.close()
            raise
    if expert_cache is not None:
        try:
            m.use_expert_cache(expert_cache)
        except BaseException:
            m.close()
            raise
    if trace:
        m.trace_start(full=trace == "full")
    return m


def _grouped(kv: Any, ray: Any, flat: dict) -> tuple[KVConfig, Any]:
    """kv= and ray= as their values, with the flat keywords of earlier releases (taken out of `flat`) folded in."""
    from dataclasses import replace

    from moert.cluster import RayConfig

    grouped = {"kv": kv is not None and not isinstance(kv, str), "ray": isinstance(ray, RayConfig)}
    kv = KVConfig.of(kv)
    ray = RayConfig.of(ray)
    for group, names in (("kv", _FLAT_KV), ("ray", _FLAT_RAY)):
        given = {field: v for name, field in names.items() if (v := flat.pop(name, None)) is not None}
        if not given:
            continue
        if grouped[group]:
            raise ArgumentError(f"{group}= and {', '.join(n for n, f in names.items() if f in given)} both given: "
                                f"give the fields in {group}= only")
        if group == "kv":
            kv = replace(kv, **given)
        elif ray is None:
            raise ArgumentError(f"{', '.join('ray_' + k for k in given)} given without a cluster: add "
                                f"ray='local:N' (or ray=moert.RayConfig(...))")
        else:
            ray = replace(ray, **given)
    return kv, ray
