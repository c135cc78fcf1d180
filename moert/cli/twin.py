"""`moert twin NAME -o PATH [--layers N] [--quant Q]`: a zoo twin with random valid weights, that runs.

    moert twin zoo:qwen3-30b-a3b -o q30.gguf                 # 48 layers, Q4_K_M, 18.6 GB at disk speed
    moert twin qwen3-30b-a3b -o q30-2.gguf --layers 2        # the first 2 layers
    moert bench q30.gguf -p 512 -n 128 -ngl all               # then run it like any file (token ids, no text)

The writer is moert/cost/zoo_data.py (one quantized pool of blocks per GGML type, tiled at disk speed).
"""

from __future__ import annotations

import argparse
import sys
import time


def cmd_twin(args: argparse.Namespace) -> int:
    from moert.cost.zoo_data import materialize
    from moert.devices import format_size

    shown = [-1.0]

    def progress(done: int, total: int) -> None:
        if done / total - shown[0] >= 0.1 or done == total:
            shown[0] = done / total
            print(f"\r{format_size(done)} of {format_size(total)}", end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    p = materialize(args.twin, args.quant, args.output, layers=args.layers, seed=args.seed,
                    progress=None if args.quiet else progress)
    dt = time.perf_counter() - t0
    size = p.stat().st_size
    if not args.quiet:
        print(file=sys.stderr)
    print(f"{p}: {format_size(size)} in {dt:.1f} s ({size / dt / 1e9:.2f} GB/s)")
    return 0


def add_commands(sub) -> None:
    """Register `twin` on the top-level subparsers."""
    t = sub.add_parser("twin", help="write a zoo twin with random valid weights (a full-size file that runs)")
    t.add_argument("twin", metavar="NAME", help="a zoo model (zoo:qwen3-30b-a3b or qwen3-30b-a3b; moert compare "
                   "lists them)")
    t.add_argument("-o", "--output", default=None, help="the file to write (default: the zoo cache folder)")
    t.add_argument("--layers", type=int, default=None, metavar="N", help="keep the first N layers")
    t.add_argument("--quant", default=None, metavar="Q", help="the quant mix (default: the twin's, e.g. Q4_K_M)")
    t.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    t.add_argument("-q", "--quiet", action="store_true", help="no progress")
    t.set_defaults(func=cmd_twin)


__all__ = ["add_commands", "cmd_twin"]
