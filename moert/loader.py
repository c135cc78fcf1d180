"""`moert.load(path, plan=None, **runtime) -> Model`: open the file, place it (or take your plan), load the weights,
build the runtime, warm it up, then apply the passes asked for.

    g    = gguf.open(path)                        the file (moert/gguf.py)
    plan = placement.auto_plan(g, n_ctx, ...)     unless you pass plan= (the CLI builds it once, prints it with -v)
    w    = weights.load_weights(g, plan)          tensors onto cpu / cuda:N / sim:N (moert/weights.py)
    m    = Model(g, arch, config, plan, w, ...)   KV cache, forward, stats (moert/model.py)
    vclock.attach(m, hardware)                    a pass: sim GPUs timed as `hardware`'s (moert/cost/vclock.py)

The runtime (model.py, experts.py, weights.py, devices.py) imports nothing from the cost model; this module
composes the two, as gpt-fast's generate.py applies `apply_tp` to a finished model.
"""

from __future__ import annotations

import warnings
from typing import Any

from moert import models
from moert.config import DEFAULT_CONTEXT, MAX_CONTEXT
from moert.devices.config import accepts_device_config
from moert.errors import ArgumentError, ContextWarning, KernelOptionError, check_int
from moert.kvcache import DEFAULT_KV_TYPE, flash_mode, kv_type
from moert.model import MAX_BATCH, Model
from moert.threads import set_threads


@accepts_device_config
def load(model: Any, plan: Any = None, *, context_size: int | None = None, threads: int | None = None,
         progress: Any = None, n_batch: int = 512, warmup: bool = True, act_quant: str | None = None,
         mmap: bool = True, trace: bool | str = False, cache_type_k: str = DEFAULT_KV_TYPE,
         cache_type_v: str = DEFAULT_KV_TYPE, flash_attn: str | bool = "auto", hardware: Any = None,
         repack: bool = False, ray: str | None = None, ray_model: str | None = None, ray_fallback: str | None = None,
         ray_threads: int | None = None, ray_timeout: float | None = None, ray_calls: str | None = None,
         expert_cache: Any = None, stall_guard: bool = True, **placement: Any) -> Model:
    """Open a GGUF model, place its tensors (`plan`, a moert.Plan of this file; else moert.plan's keywords in
    `placement`: overrides, gpu_layers, cpu_moe, n_cpu_moe, gpu_backend, gpu_memory, ...), load them onto their
    devices, allocate the KV cache, and (warmup=True, llama.cpp's default too) run a few tokens through it and
    forget them, so the first real ones do not pay for compiling the kernels (`Model.warmup`).
    act_quant="int16": CPU one-token matmuls of Q4_K/Q6_K weights round x to int16 per 256-block; "int8": every
    CPU matmul of those types rounds x to int8 (llama.cpp's scheme; needs AVX2); see kernels/matmul_q.py. None
    (default): float. repack=True (--repack, with act_quant="int8"): CPU Q4_K weights are copied at load into
    kernels/repack.py's layout (the same int32 sums, results equal to float rounding, faster kernels, +2.8% of
    those bytes in memory: `Model.repacked_bytes`).
    context_size: the KV cache's tokens; not given, 4096 (llama.cpp's default) or the trained context if that is
    smaller; 0, the trained context; more than it is honoured with a ContextWarning, as llama.cpp does.
    mmap=False (--no-mmap) reads the file into memory instead of mapping it, so a file truncated or
    rewritten while the model is loaded cannot crash it (see README, "Bad input"). trace=True records every
    token's routing (`Model.trace`, moert/trace.py); trace="full" the router logits too.
    cache_type_k / cache_type_v (-ctk / -ctv): "f16" (default, llama.cpp's), "f32" (exact: what a float oracle
    needs), "bf16" or "q8_0", the KV cache's storage. flash_attn (-fa) "on": attention holds the scores of 256
    keys at a time, never (T, n_ctx); "auto" (default): on when a cache type is not f32 (those are read back a
    chunk at a time, so on by default), else off.
    hardware= (a moert.Hardware or a preset name, "rtx3090+ryzen-7950x"): time the sim GPUs as that hardware's
    (moert/cost/vclock.py; implies gpu_backend="sim" over "auto", and that hardware's GPU sizes unless gpu_memory=
    is given).
    ray= ("local:N", "HOST:PORT" or "auto"): the cluster whose workers hold the experts that RAY<N> rules place
    (moert/cluster/actors.py); ray_model: the file's path on the workers (default: the same path; a worker without it is
    sent its experts' bytes); ray_fallback="cpu": a lost worker's experts run on this host; ray_threads: kernel
    threads per worker; ray_timeout: seconds a layer call may take before its worker counts as hung; ray_calls:
    "compiled" (default: one Ray Compiled Graph execute a layer, moert/cluster/graph.py) or "plain" (one actor call
    per worker and layer: better where other jobs hold the cores, as the graph's channels spin; MOERT_RAY_CALLS).
    stall_guard=False (--no-stall-guard): every decode step runs on the threads set, even when another process
    stalls them (default True: moert/threads.py StallGuard sends the steps after a stalled one to one thread).
    expert_cache= (a moert.ExpertCache): copies of some CPU experts on a GPU, moved as the routing asks
    (moert/dynamic/runtime.py; it caches the experts the plan put on the CPU: cpu_moe=True, or n_cpu_moe=N)."""
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
    kv_types = (kv_type(cache_type_k), kv_type(cache_type_v))
    flash = flash_mode(flash_attn, kv_types)
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
        plan = use_cluster(plan, ray, ray_threads, ray_timeout, ray_fallback, ray_calls)
        try:
            weights = load_weights(g, plan, progress=progress)
            attach(weights, plan.remote, ray_model or g.path, act_quant, repack)
        except DeviceOutOfMemory as err:
            raise with_fit_suggestion(err, plan, n_ctx, kv_types, flash) from None
        try:
            m = Model(g, arch, config, plan, weights, n_ctx, n_batch, act_quant=act_quant, kv_types=kv_types,
                      flash_attn=flash, repack=repack)
            if not stall_guard:
                m.stall_guard = None
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
