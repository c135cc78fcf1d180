"""Placement flags for the command line, named as in llama.cpp, and the `moert fit` subcommand.

    moert inspect MODEL -ot "\\.ffn_.*_exps=CPU" --gpu-backend sim --gpu-mem 6GiB   # plan + estimate
    moert fit MODEL --gpu-mem 6GiB [--ctx 0] [-ot ...] [--json]                   # rules that fit
"""

from __future__ import annotations

import argparse
import json
import shlex
import warnings

from moert.errors import PlacementWarning


def _gpu_layers(value: str) -> int | str:
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


def add_placement_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add -ot, -ngl, --cpu-moe, --n-cpu-moe, --gpu-backend, --gpu-mem, --split-mode, -c/--ctx, --strict."""
    g = parser.add_argument_group("placement (llama.cpp's flags)")
    g.add_argument("-ot", "--override-tensor", action="append", default=[], metavar="PATTERN=DEVICE,...",
                   help="put tensors whose name matches PATTERN (regex, re.search) on DEVICE: CPU, CUDA<N>, GPU<N>, "
                        "sim:N; comma-separated, repeatable; the first matching rule wins")
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=_gpu_layers, default="all",
                   metavar="N|all|auto",
                   help="the last N of the n_layer+1 layers (output included) default to the GPU; 'auto' fits "
                        "(default: all)")
    g.add_argument("-cmoe", "--cpu-moe", action="store_true", help="keep all MoE expert weights on the CPU")
    g.add_argument("-ncmoe", "--n-cpu-moe", type=int, default=None, metavar="N",
                   help="keep the MoE expert weights of the first N layers on the CPU")
    g.add_argument("--n-cpu-moe-from", choices=("first", "last"), default="first",
                   help="with --n-cpu-moe: the first N layers (llama.cpp) or the last N (default: first)")
    g.add_argument("--gpu-backend", choices=("auto", "cupy", "sim"), default="auto",
                   help="auto: CuPy if it sees a GPU, else the CPU (with a warning); sim: simulated GPUs")
    g.add_argument("--gpu-mem", default=None, metavar="SIZE[,SIZE...]",
                   help="memory per GPU, e.g. 24GiB or 24GiB,8GiB (sim: sets the GPUs; cupy: caps them)")
    g.add_argument("-sm", "--split-mode", dest="split", choices=("layer", "none"), default="layer",
                   help="spread GPU layers over the GPUs in proportion to memory (layer) or use GPU 0 (none)")
    g.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=int, default=None, metavar="N",
                   help="context size: the KV cache (run, chat, bench) and the memory estimate (inspect; fit: 0 = the "
                        "largest that fits)")
    g.add_argument("--strict", action="store_true", help="a rule that matches nothing or never decides is an error")
    return parser


def placement_from_args(args: argparse.Namespace) -> dict:
    """The keyword arguments of moert.plan / moert.load / moert.fit from parsed placement flags."""
    from moert.placement import normalize_overrides

    return {
        "overrides": normalize_overrides(list(getattr(args, "override_tensor", None) or [])),
        "gpu_layers": getattr(args, "gpu_layers", "all"),
        "cpu_moe": bool(getattr(args, "cpu_moe", False)),
        "n_cpu_moe": getattr(args, "n_cpu_moe", None),
        "n_cpu_moe_from": getattr(args, "n_cpu_moe_from", "first"),
        "gpu_backend": getattr(args, "gpu_backend", "auto"),
        "gpu_memory": getattr(args, "gpu_mem", None),
        "split": getattr(args, "split", "layer"),
        "strict": bool(getattr(args, "strict", False)),
    }


def format_placement(model: str, args: argparse.Namespace, as_json: bool = False) -> str:
    """`moert inspect`'s placement part: Plan.explain() and the per-device estimate (or JSON of both)."""
    from moert import gguf
    from moert.placement.memory import estimate
    from moert.placement.strategies import auto_plan

    kw = placement_from_args(args)
    with gguf.open(model) as g:
        p = auto_plan(g, args.ctx or 0, **kw)
    ctx = args.ctx if args.ctx else _trained_context(p)
    est = estimate(p, ctx)
    if as_json:
        return json.dumps({"plan": p.to_dict(), "estimate": est.to_dict()}, indent=1)
    return p.explain() + "\n\n" + est.table()


def _trained_context(p) -> int:
    return int(p.metadata.get(f"{p.arch}.context_length", 4096) or 4096)


def add_fit_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `moert fit` subcommand's arguments: MODEL, the placement flags, --margin, --expert-order, --json."""
    parser.add_argument("model", help="path of a .gguf file")
    add_placement_args(parser)
    parser.add_argument("--margin", default=None, metavar="SIZE",
                        help="memory to keep free on each GPU (default: 512MiB on CUDA, 0 on sim)")
    parser.add_argument("--expert-order", choices=("last", "first"), default="last",
                        help="which layers' experts move to the CPU first (default: last)")
    parser.add_argument("--strategy", choices=("fit", "hot"), default="fit",
                        help="fit: llama.cpp's --fit (whole layers' experts to the CPU until the rest fits); hot: "
                        "the most-selected experts of --trace on the GPU first (default: fit)")
    parser.add_argument("--trace", default=None, metavar="NPZ", help="a routing trace (moert run --trace), "
                        "for --strategy hot")
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
    ctx = args.ctx or 4096
    trace = Trace.load(args.trace)
    rules = hot_experts(args.model, trace, gpu_memory=kw["gpu_memory"], context_size=ctx,
                        gpu_backend=kw["gpu_backend"], margin=args.margin)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = plan(args.model, rules, gpu_backend=kw["gpu_backend"], gpu_memory=kw["gpu_memory"])
    est = estimate(p, ctx)
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
    from moert.placement.strategies import fit

    if getattr(args, "strategy", "fit") == "hot":
        return cmd_fit_hot(args)
    kw = placement_from_args(args)
    strict = kw.pop("strict")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlacementWarning)
        r = fit(args.model, context_size=args.ctx or 0, margin=args.margin,
                expert_order=getattr(args, "expert_order", "last"), **kw)
    notes = [str(w.message) for w in caught if issubclass(w.category, PlacementWarning)]
    if strict and notes:
        from moert.errors import PlacementError

        raise PlacementError("strict placement: " + "; ".join(notes))
    if getattr(args, "json", False):
        print(json.dumps({**r.to_dict(), "warnings": notes}, indent=1))
        return 0 if r.success else 1
    devs = ", ".join(f"{d.name} ({_size(d.capacity)})" for d in (r.plan.devices if r.plan else [])) or "none"
    print(f"fit {args.model} on {devs}")
    print(f"  {'fits' if r.success else 'DOES NOT FIT'}: {r.message}")
    if r.success:
        cmd = [f"-ngl {r.gpu_layers}", f"-c {r.context_size}"]
        if r.rules:
            cmd.append(f"-ot {shlex.quote(r.overrides_string())}")
        print(f"  context: {r.context_size}   gpu layers: {r.gpu_layers}")
        print(f"  rules added by fit: {len(r.overrides)}")
        print(f"  flags: {' '.join(cmd)}")
    for n in notes:
        print(f"  warning: {n}")
    print()
    print(r.table())
    return 0 if r.success else 1


def _size(n):
    from moert.devices import format_size

    return format_size(n)


__all__ = ["add_fit_args", "add_placement_args", "cmd_fit", "format_placement", "placement_from_args"]
