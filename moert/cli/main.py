"""The `moert` command line: one function per subcommand; flags named as in llama.cpp."""

from __future__ import annotations

import argparse
import json
import os
import sys

from moert.cli.common import resolve_model
from moert.errors import MoertError


def _placement_requested(args: argparse.Namespace) -> bool:
    """Any placement flag given (or --plan): then inspect also prints the plan and the estimate."""
    return bool(args.plan or args.override_tensor or args.gpu_layers != "all" or args.cpu_moe
                or args.n_cpu_moe is not None or args.gpu_backend != "auto" or args.gpu_mem or args.ctx)


def cmd_inspect(args: argparse.Namespace) -> int:
    from moert import gguf
    from moert.cli.common import planned_context
    from moert.cli.placement import format_placement
    from moert.explain.summary import format_summary, summarize

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
        from moert.cli.placement import placement_from_args
        from moert.placement import auto_plan
        from moert.plots import placement_bars

        p = auto_plan(args.model, planned_context(args.model, args.ctx), **placement_from_args(args))
        print(f"placement plot: {placement_bars(p, args.plot)}",
              file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from moert.cli import bench as cli_bench
    from moert.cli import cache_sim as cli_cache_sim
    from moert.cli import compare as cli_compare
    from moert.cli import explain as cli_explain
    from moert.cli import hardware as cli_hardware
    from moert.cli import serve as cli_serve
    from moert.cli import trace as cli_trace
    from moert.cli import twin as cli_twin
    from moert.cli.common import LlamaArgumentParser, VersionAction, add_model_arg, refuse_other_llama_flags
    from moert.cli.generate import add_commands
    from moert.cli.placement import add_fit_args, add_placement_args

    p = LlamaArgumentParser(prog="moert", description="MoE inference on GGUF files with explicit tensor placement")
    p.add_argument("--version", action=VersionAction, help="print moert's version and exit")
    p.add_argument("--list-devices", action="store_true", help="print the available devices and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    q = sub.add_parser("inspect", help="show a GGUF file's hyperparameters, tensors and totals")
    add_model_arg(q)
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
    cli_trace.add_commands(sub)
    cli_serve.add_commands(sub)
    cli_hardware.add_commands(sub)
    cli_compare.add_commands(sub)
    cli_cache_sim.add_commands(sub)
    cli_twin.add_commands(sub)
    for name, parser in sub.choices.items():
        refuse_other_llama_flags(parser, name)
    return p


def main(argv: list[str] | None = None) -> int:
    from moert.cli.common import UsageError, flagify, one_line_warnings

    parser = build_parser()
    args = parser.parse_args(argv)
    one_line_warnings()
    earlier = set(sys.modules["moert.cluster"].started()) if "moert.cluster" in sys.modules else set()
    try:
        if args.list_devices:
            from moert.cli.common import list_devices

            print(list_devices(getattr(args, "gpu_mem", None)))
            return 0
        if args.command is None:
            parser.error("a command is required: demo, run, chat, serve, bench, inspect or fit")
        resolve_model(args)
        if isinstance(getattr(args, "model", None), str):  # zoo:NAME[@QUANT] -> the twin's path
            from moert.cost.zoo import resolve

            args.model_label, args.model = args.model, resolve(args.model)
        return args.func(args)
    except UsageError as e:
        print(f"moert {args.command}: error: {e} (see moert {args.command} --help)", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `moert inspect m.gguf | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (MoertError, OSError) as e:  # a bad file or bad flags: the message, no traceback
        print(f"moert {args.command}: error: {flagify(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:                 # Ctrl-C: 130, as llama-cli and shells report it
        if argv is None:                      # the command line: a KeyboardInterrupt that passed through some
            sys.stdout.flush()                # C-level exec (a compile) leaves CPython re-raising SIGINT at exit
            sys.stderr.flush()                # (exit -2) even though it was caught; leave with 130 now
            os._exit(130)
        return 130
    finally:
        if "moert.cluster" in sys.modules:    # --ray: the workers this command started (and their graphs) let go
            sys.modules["moert.cluster"].close_all(keep=earlier)
