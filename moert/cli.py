"""The `moert` command line: one function per subcommand; flags named as in llama.cpp."""

from __future__ import annotations

import argparse
import json
import os
import sys

from moert.errors import MoertError


def cmd_inspect(args: argparse.Namespace) -> int:
    from moert import gguf
    from moert.summary import format_summary, summarize

    with gguf.open(args.model) as f:
        s = summarize(f)
    if args.json:
        print(json.dumps(s, indent=1))
    else:
        print(format_summary(s, tensors=not args.no_tensors))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moert", description="MoE inference on GGUF files with explicit tensor placement")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    q = sub.add_parser("inspect", help="show a GGUF file's hyperparameters, tensors and totals")
    q.add_argument("model", help="path of a .gguf file")
    q.add_argument("--json", action="store_true", help="print JSON instead of tables")
    q.add_argument("--no-tensors", action="store_true", help="omit the per-tensor table")
    q.set_defaults(func=cmd_inspect)
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
