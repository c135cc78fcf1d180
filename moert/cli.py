"""The `moert` command line: one function per subcommand; flags named as in llama.cpp."""

from __future__ import annotations

import argparse
import json
import os
import sys

from moert.errors import MoertError


def _placement_requested(args: argparse.Namespace) -> bool:
    """Any placement flag given (or --plan): then inspect also prints the plan and the estimate."""
    return bool(args.plan or args.override_tensor or args.gpu_layers != "all" or args.cpu_moe
                or args.n_cpu_moe is not None or args.gpu_backend != "auto" or args.gpu_mem or args.ctx)


def cmd_inspect(args: argparse.Namespace) -> int:
    from moert import gguf
    from moert.placement_cli import format_placement
    from moert.summary import format_summary, summarize

    with gguf.open(args.model) as f:
        s = summarize(f)
    placed = _placement_requested(args)
    if args.json:
        if placed:
            s.update(json.loads(format_placement(args.model, args, as_json=True)))
        print(json.dumps(s, indent=1))
    else:
        print(format_summary(s, tensors=not (args.no_tensors or placed)))
        if placed:
            print("\n" + format_placement(args.model, args))
    if args.plot:
        from moert.placement import plan
        from moert.placement_cli import placement_from_args
        from moert.plots import placement_bars

        print(f"placement plot: {placement_bars(plan(args.model, **placement_from_args(args)), args.plot)}",
              file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from moert import cli_bench, cli_explain
    from moert.cli_generate import add_commands
    from moert.placement_cli import add_fit_args, add_placement_args

    p = argparse.ArgumentParser(prog="moert", description="MoE inference on GGUF files with explicit tensor placement")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    q = sub.add_parser("inspect", help="show a GGUF file's hyperparameters, tensors and totals")
    q.add_argument("model", help="path of a .gguf file")
    q.add_argument("--json", action="store_true", help="print JSON instead of tables")
    q.add_argument("--no-tensors", action="store_true", help="omit the per-tensor table")
    q.add_argument("--plot", default=None, metavar="PNG", help="save a bar chart of weights per device, "
                   "split by the deciding rule (needs matplotlib: the `plot` extra)")
    q.add_argument("--plan", action="store_true", help="also print the placement plan and memory estimate "
                   "(implied by any placement flag)")
    add_placement_args(q)
    q.set_defaults(func=cmd_inspect)

    add_fit_args(sub.add_parser("fit", help="find the context size and -ot rules that fit the GPU memory"))
    add_commands(sub)
    cli_bench.add_commands(sub)
    cli_explain.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `moert inspect m.gguf | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (MoertError, OSError) as e:  # a bad file or bad flags: the message, no traceback
        print(f"moert {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
