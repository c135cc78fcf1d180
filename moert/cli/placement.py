"""Placement flags for the command line, named as in llama.cpp, and the `moert fit` subcommand.

    moert inspect MODEL -ot "\\.ffn_.*_exps=CPU" --gpu-backend sim --gpu-mem 6GiB   # plan + estimate
    moert fit MODEL --gpu-mem 6GiB [--ctx 0] [-ot ...] [--json]                   # rules that fit
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import warnings

from moert.cli.common import DEFAULT_CTX, fit_context, planned_context, sim_if_no_gpu
from moert.errors import PlacementWarning


def gpu_layers_arg(value: str) -> int | str:
    """-ngl's value: a layer count, "all" or "auto" (moert bench sweeps a comma list of them)."""
    v = value.strip().lower()
    if v in ("all", "auto"):
        return v
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, 'all' or 'auto', got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected N >= 0, 'all' or 'auto', got {value!r}")
    return n


def _floats(value: str) -> list[float]:
    """-ts 3,1 (or 3/1, as llama.cpp splits it): one share per GPU."""
    try:
        return [float(x) for x in re.split(r"[,/]+", value.strip()) if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected shares such as 3,1, got {value!r}") from None


def _mibs(value: str) -> list[int]:
    """--fit-target 1024 or 1024,2048: MiB to keep free per GPU (one value: every GPU)."""
    try:
        mibs = [int(x) for x in re.split(r"[,/]+", value.strip()) if x]
    except ValueError:
        mibs = []
    if not mibs or min(mibs) < 0:
        raise argparse.ArgumentTypeError(f"expected MiB per GPU such as 1024 or 1024,2048, got {value!r}")
    return mibs


def _on_off(value: str) -> bool:
    v = value.strip().lower()
    if v in ("on", "1", "true", "enabled"):
        return True
    if v in ("off", "0", "false", "disabled"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {value!r}")


def _kv_type(value: str) -> str:
    from moert.kvcache import KV_TYPES

    if value.strip().lower() in KV_TYPES:
        return value.strip().lower()
    raise argparse.ArgumentTypeError(f"KV cache type {value!r} is not supported: give one of {', '.join(KV_TYPES)} "
                                     f"(f16 is the default, as llama.cpp's; f32 keeps the logits exact)")


def _flash_attn(value: str) -> str:
    v = value.strip().lower()
    if v in ("on", "off", "auto", "1", "0"):
        return {"1": "on", "0": "off"}.get(v, v)
    raise argparse.ArgumentTypeError(f"{value!r}: give on, off or auto (as llama.cpp's -fa)")


def kv_args(args: argparse.Namespace) -> dict:
    """estimate()'s KV cache type and flash attention from -ctk, -ctv and -fa."""
    from moert.kvcache import DEFAULT_KV_TYPE, flash_mode

    types = (getattr(args, "cache_type_k", DEFAULT_KV_TYPE), getattr(args, "cache_type_v", DEFAULT_KV_TYPE))
    return {"kv_dtype": types, "flash_attn": flash_mode(getattr(args, "flash_attn", "auto"), types)}


def add_placement_args(parser: argparse.ArgumentParser, sweep=None) -> argparse.ArgumentParser:
    """Add llama.cpp's placement flags: -ot, -ngl, -cmoe, -ncmoe, -sm, -ts, -mg, -dev, --fit*, -c, -v, ...
    sweep=(ngl_type, ncmoe_type): -ngl and -ncmoe take comma lists (moert bench), default None."""
    g = parser.add_argument_group("placement (llama.cpp's flags)")
    g.add_argument("-ot", "--override-tensor", action="append", default=[], metavar="PATTERN=DEVICE,...",
                   help="put tensors whose name matches PATTERN (regex, re.search) on DEVICE: CPU, CUDA<N>, GPU<N>, "
                        "sim:N; comma-separated, repeatable; the first matching rule wins")
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers",
                   type=sweep[0] if sweep else gpu_layers_arg,
                   default=None if sweep else "all", metavar="N|all|auto" + (",..." if sweep else ""),
                   help="the last N of the n_layer+1 layers (output included) default to the GPU; 'auto' fits "
                        "(default: all)" + ("; a comma list sweeps" if sweep else ""))
    g.add_argument("-cmoe", "--cpu-moe", action="store_true", help="keep all MoE expert weights on the CPU")
    g.add_argument("-ncmoe", "--n-cpu-moe", type=sweep[1] if sweep else int, default=None,
                   metavar="N" + (",..." if sweep else ""),
                   help="keep the MoE expert weights of the first N layers on the CPU" + ("; a comma list sweeps"
                                                                                           if sweep else ""))
    g.add_argument("--n-cpu-moe-from", choices=("first", "last"), default="first",
                   help="with --n-cpu-moe: the first N layers (llama.cpp) or the last N (default: first)")
    g.add_argument("--gpu-backend", choices=("auto", "cupy", "sim"), default="auto",
                   help="auto: CuPy if it sees a GPU, else the CPU (with a warning); sim: simulated GPUs")
    g.add_argument("--gpu-mem", default=None, metavar="SIZE[,SIZE...]",
                   help="memory per GPU, e.g. 24GiB or 24GiB,8GiB (sim: sets the GPUs; cupy: caps them)")
    g.add_argument("-sm", "--split-mode", dest="split", choices=("layer", "none"), default="layer",
                   help="spread GPU layers over the GPUs in proportion to memory (layer) or use one GPU (none)")
    g.add_argument("-ts", "--tensor-split", type=_floats, default=None, metavar="N0,N1,...",
                   help="each GPU's share of the GPU layers, e.g. 3,1 (default: in proportion to memory)")
    g.add_argument("-mg", "--main-gpu", type=int, default=0, metavar="INDEX",
                   help="with -sm none: the GPU that takes every GPU layer (default: 0)")
    g.add_argument("-dev", "--device", type=_device_list, default=None, metavar="DEV,...",
                   help="the GPUs to offload to, e.g. CUDA1 or sim:0,sim:1 (none: do not offload); "
                        "--list-devices lists them")
    g.add_argument("--list-devices", action="store_true", help="print the available devices and exit")
    g.add_argument("-fit", "--fit", type=_on_off, default=False, metavar="on|off",
                   help="adjust what was not set (context, expert placement) to fit the GPU memory, as "
                        "`moert fit` does (default: off; llama.cpp's is on)")
    g.add_argument("-fitt", "--fit-target", type=_mibs, default=None, metavar="MiB[,MiB...]",
                   help="with --fit: memory to keep free per GPU, in MiB (default: 512 on CUDA, 0 on sim)")
    g.add_argument("-fitc", "--fit-ctx", type=int, default=256, metavar="N",
                   help="with --fit and in `moert fit`: the smallest context it may lower to (default: 256; "
                        "llama.cpp's is 4096)")
    g.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=int, default=None, metavar="N",
                   help=f"context size (default: {DEFAULT_CTX} as llama.cpp, or the trained context if smaller; 0: "
                        "the trained context; more than that is honoured with a warning, as llama.cpp): the KV "
                        "cache (run, chat, serve, bench) and the memory estimate (inspect; fit: 0 = the "
                        "largest that fits)")
    g.add_argument("-ctk", "--cache-type-k", type=_kv_type, default="f16", metavar="TYPE",
                   help="KV cache type of K: f16 (default, as llama.cpp), f32 (exact), bf16, q8_0")
    g.add_argument("-ctv", "--cache-type-v", type=_kv_type, default="f16", metavar="TYPE",
                   help="KV cache type of V: f16 (default, as llama.cpp), f32 (exact), bf16, q8_0")
    g.add_argument("-fa", "--flash-attn", type=_flash_attn, default="auto", metavar="on|off|auto",
                   help="flash attention: scores of 256 keys at a time, never (T, n_ctx); auto (default): on when "
                        "-ctk/-ctv is not f32")
    g.add_argument("--strict", action="store_true", help="a rule that matches nothing or never decides is an error")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="print each tensor a rule places, as llama.cpp's loader does")
    return parser


_DEV_RE = re.compile(r"^(cuda|gpu|sim):?(\d+)$", re.IGNORECASE)


def _device_list(value: str) -> list[str]:
    """-dev CUDA0,CUDA1 / sim:0 / none: the device names, checked for spelling (existence at load)."""
    names = [x.strip() for x in value.split(",") if x.strip()]
    if names == ["none"] or (names and all(_DEV_RE.match(x) for x in names)):
        return names
    raise argparse.ArgumentTypeError(f"expected GPU names such as CUDA0, sim:1 (comma-separated) or none, "
                                     f"got {value!r}")


def selected_devices(args: argparse.Namespace) -> dict:
    """-dev: the GPU backend and the GPUs it names ({} without -dev), checked against those that exist."""
    from moert.devices.gpus import get_devices
    from moert.errors import PlacementError

    names = getattr(args, "device", None)
    if not names:
        return {}
    if names == ["none"]:
        return {"gpu_backend": "none", "gpu_layers": 0}
    kinds = {_DEV_RE.match(n).group(1).lower() for n in names}
    backend = "sim" if kinds == {"sim"} else ("cupy" if "sim" not in kinds else None)
    if backend is None:
        raise PlacementError(f"-dev {','.join(names)} mixes simulated and real GPUs; name one kind")
    if getattr(args, "gpu_backend", "auto") not in ("auto", backend):
        raise PlacementError(f"-dev {','.join(names)} names {backend} GPUs but --gpu-backend is {args.gpu_backend}")
    gpus = get_devices(backend, getattr(args, "gpu_mem", None))
    chosen = []
    for n in names:
        i = int(_DEV_RE.match(n).group(2))
        if i >= len(gpus):
            more = " (--gpu-mem 24GiB,24GiB makes two simulated GPUs)" if backend == "sim" else ""
            raise PlacementError(f"-dev {n}: no such device; devices that exist: "
                                 f"{', '.join(['cpu', *(g.name for g in gpus)])}{more}")
        chosen.append(gpus[i])
    return {"gpu_backend": backend, "devices": chosen}


def placement_from_args(args: argparse.Namespace) -> dict:
    """The keyword arguments of moert.plan / moert.load / moert.fit from parsed placement flags."""
    from moert.placement import normalize_overrides

    kw = {
        "overrides": normalize_overrides(list(getattr(args, "override_tensor", None) or [])),
        "gpu_layers": getattr(args, "gpu_layers", "all"),
        "cpu_moe": bool(getattr(args, "cpu_moe", False)),
        "n_cpu_moe": getattr(args, "n_cpu_moe", None),
        "n_cpu_moe_from": getattr(args, "n_cpu_moe_from", "first"),
        "gpu_backend": getattr(args, "gpu_backend", "auto"),
        "gpu_memory": getattr(args, "gpu_mem", None),
        "split": getattr(args, "split", "layer"),
        "tensor_split": getattr(args, "tensor_split", None),
        "main_gpu": getattr(args, "main_gpu", 0),
        "strict": bool(getattr(args, "strict", False)),
    }
    return {**kw, **selected_devices(args)}


def fit_margin(args: argparse.Namespace):
    """--margin SIZE, else --fit-target MiB[,MiB...] as sizes (one value: every GPU), else None (fit's default)."""
    if getattr(args, "margin", None):
        return args.margin
    mibs = getattr(args, "fit_target", None)
    if not mibs:
        return None
    return f"{mibs[0]}MiB" if len(mibs) == 1 else [f"{m}MiB" for m in mibs]


def fitted(model, args: argparse.Namespace, kw: dict) -> tuple[dict, int | None, object]:
    """--fit on: the placement keywords, context and plan that `moert fit` finds (what was set stays); else the
    keywords and context as given and no plan (None: build it from them)."""
    from moert.errors import PlacementError
    from moert.placement.strategies import fit

    if not getattr(args, "fit", False):
        return kw, args.ctx, None
    kw = dict(kw)
    strict = kw.pop("strict", False)
    r = fit(model, context_size=fit_context(model, args), margin=fit_margin(args), min_context=args.fit_ctx, **kw,
            **kv_args(args))
    if not r.success:
        raise PlacementError(f"--fit on: {r.message}")
    if strict and r.plan.messages:
        raise PlacementError("strict placement: " + "; ".join(r.plan.messages))
    kw.update(overrides=r.rules, gpu_layers=r.gpu_layers, cpu_moe=False, n_cpu_moe=None, strict=strict)
    return kw, r.context_size, r.plan


def print_overrides(p, file=None) -> None:
    """-v: one line per tensor a rule placed, as llama.cpp's loader logs it."""
    import sys

    for e in p:
        if e.rule is not None:
            dev = e.device.upper().replace(":", "") if e.device.startswith(("cpu", "cuda")) else e.device
            print(f"tensor {e.name} ({e.nbytes // 2**20} MiB {e.type}) buffer type overridden to {dev}",
                  file=file or sys.stderr)


def format_placement(model: str, args: argparse.Namespace, as_json: bool = False) -> str:
    """`moert inspect`'s placement part: Plan.explain() and the per-device estimate (or JSON of both)."""
    from moert import gguf
    from moert.placement.memory import estimate
    from moert.placement.strategies import auto_plan

    sim_if_no_gpu(args)
    kw, ctx, p = fitted(model, args, placement_from_args(args))
    ctx = planned_context(model, ctx)
    if p is None:
        with gguf.open(model) as g:
            p = auto_plan(g, ctx, **kw)
    if getattr(args, "verbose", False):
        print_overrides(p)
    est = estimate(p, ctx, **kv_args(args))
    if as_json:
        return json.dumps({"plan": p.to_dict(), "estimate": est.to_dict()}, indent=1)
    from moert.cli.common import flagify

    text = "\n".join(flagify(x) if x.startswith("warning:") else x for x in p.explain().splitlines())
    return text + "\n\n" + est.table()


def add_fit_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `moert fit` subcommand's arguments: MODEL, the placement flags, --margin, --expert-order, --json."""
    from moert.cli.common import add_model_arg

    add_model_arg(parser)
    add_placement_args(parser)
    parser.add_argument("--margin", default=None, metavar="SIZE",
                        help="memory to keep free on each GPU, e.g. 1GiB (or --fit-target MiB; default: 512MiB on "
                             "CUDA, 0 on sim)")
    parser.add_argument("--expert-order", choices=("last", "first"), default="last",
                        help="which layers' experts move to the CPU first (default: last)")
    parser.add_argument("--strategy", choices=("fit", "hot"), default="fit",
                        help="fit: llama.cpp's --fit (whole layers' experts to the CPU until the rest fits); hot: "
                        "the most-selected experts of --trace on the GPU first (default: fit)")
    parser.add_argument("--trace", default=None, metavar="NPZ", help="a routing trace (moert run --trace), "
                        "for --strategy hot")
    parser.add_argument("--repack", action="store_true",
                        help="count --repack's copy of the CPU Q4_K weights in the CPU's memory (run --act-quant "
                             "int8 --repack)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(func=cmd_fit)
    return parser


def cmd_fit_hot(args: argparse.Namespace) -> int:
    """`moert fit --strategy hot --trace T`: the trace's hottest experts on the GPU, as -ot rules."""
    from moert.errors import PlacementError
    from moert.placement.build import plan
    from moert.placement.memory import estimate
    from moert.placement.strategies import hot_experts
    from moert.trace import Trace

    if not args.trace:
        raise PlacementError("--strategy hot needs --trace NPZ (record one with: moert run MODEL ... --trace NPZ)")
    kw = placement_from_args(args)
    ctx = planned_context(args.model, args.ctx)
    trace = Trace.load(args.trace)
    rules = hot_experts(args.model, trace, gpu_memory=kw["gpu_memory"], context_size=ctx,
                        gpu_backend=kw["gpu_backend"], margin=args.margin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = plan(args.model, rules, gpu_backend=kw["gpu_backend"], gpu_memory=kw["gpu_memory"])
    est = estimate(p, ctx, **kv_args(args), repack=getattr(args, "repack", False))
    hits = trace.hits(p)
    gpu_share = sum(v for d, v in hits.items() if d != "cpu")
    ok = est.fits()
    if getattr(args, "json", False):
        print(json.dumps({"success": ok, "strategy": "hot", "context_size": ctx, "overrides": p.overrides_string(),
                          "hits": hits, "estimate": est.to_dict()}, indent=1))
        return 0 if ok else 1
    print(f"hot experts of {args.trace} ({len(trace)} tokens) on {', '.join(d.name for d in p.devices)}, "
          f"context {ctx}: {'fits' if ok else 'DOES NOT FIT'}")
    print(f"  flags: -c {ctx} -ot {shlex.quote(p.overrides_string())}")
    print(f"  the trace's expert selections served by the GPU: {gpu_share:.1%} "
          f"({', '.join(f'{d} {v:.1%}' for d, v in hits.items())})")
    print()
    print(est.table())
    return 0 if ok else 1


def cmd_fit(args: argparse.Namespace) -> int:
    """`moert fit`: the context, the -ot rules and the per-device breakdown that fit the GPUs (1 if none)."""
    from moert.cli.common import flagify
    from moert.errors import PlacementError
    from moert.placement.strategies import fit

    if getattr(args, "strategy", "fit") == "hot":
        return cmd_fit_hot(args)
    sim_if_no_gpu(args)
    kw = placement_from_args(args)
    strict = kw.pop("strict")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlacementWarning)
        r = fit(args.model, context_size=fit_context(args.model, args), margin=fit_margin(args),
                min_context=args.fit_ctx,
                **kv_args(args), expert_order=getattr(args, "expert_order", "last"), **kw)
    notes = [str(w.message) for w in caught if issubclass(w.category, PlacementWarning)]
    if strict and notes:
        raise PlacementError("strict placement: " + "; ".join(notes))
    if r.plan is not None and not r.plan.devices and kw["gpu_backend"] != "none":
        from moert.devices import cuda as _cuda

        _cuda.device_count()
        if args.gpu_mem:  # the user asked about GPU memory: answering "fits on the CPU" would mislead
            raise PlacementError(f"--gpu-mem {args.gpu_mem} sizes a GPU, but --gpu-backend {kw['gpu_backend']} "
                                 f"found none ({_cuda.why_unavailable()}); add --gpu-backend sim to fit a "
                                 f"simulated GPU of that size")
        notes = [f"no GPU: --gpu-backend {kw['gpu_backend']} found none ({_cuda.why_unavailable()}), so "
                 f"everything runs on the CPU; --gpu-backend sim --gpu-mem SIZE fits a simulated GPU"]
        r.message = "on the CPU only"
    if getattr(args, "repack", False) and r.estimate is not None:   # the CPU's memory only: the fit is the same
        from moert.placement.memory import estimate

        r.estimate = estimate(r.plan, r.estimate.context_size, r.estimate.n_batch, **kv_args(args), repack=True)
    if getattr(args, "json", False):
        print(json.dumps({**r.to_dict(), "warnings": notes}, indent=1))
        return 0 if r.success else 1
    devs = ", ".join(f"{d.name} ({_size(d.capacity)})" for d in (r.plan.devices if r.plan else [])) or "none"
    print(f"fit {args.model} on {devs}")
    print(f"  {'fits' if r.success else 'DOES NOT FIT'}: {r.message}")
    if r.success:
        from moert.placement.flags import shortest_flags

        flags = shortest_flags(args.model, r.plan, r.gpu_layers, r.rules, kw)
        print(f"  context: {r.context_size}   gpu layers: {r.gpu_layers}")
        print(f"  rules added by fit: {len(r.overrides)}")
        print(f"  flags: {' '.join(x for x in (flags, f'-c {r.context_size}') if x)}"
              + ("  (with your -ot rules)" if kw["overrides"] and "-ot" not in flags else ""))
    for n in notes:
        print(f"  warning: {flagify(n)}")
    print()
    print(r.table())
    return 0 if r.success else 1


def _size(n):
    from moert.devices import format_size

    return format_size(n)


__all__ = ["add_fit_args", "add_placement_args", "cmd_fit", "fit_margin", "fitted", "format_placement",
           "placement_from_args", "print_overrides", "selected_devices"]
