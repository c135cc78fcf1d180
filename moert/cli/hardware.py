"""`moert hardware list|calibrate`: the preset parts and this machine's measured CPU side.

    moert hardware list [--json]                  preset GPUs, CPUs and links with their figures
    moert hardware calibrate [--long] [-t N] [--json]   measure this CPU (moert.cost.calibrate)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict


def cmd_hardware(args: argparse.Namespace) -> int:
    from moert.cost import presets
    from moert.cost.calibrate import calibrate

    if args.action == "list":
        print(json.dumps(presets.to_dict(), indent=1) if args.json else presets.table())
        return 0
    cpu = calibrate(long=args.long, threads=args.threads)
    if args.json:
        print(json.dumps(asdict(cpu), indent=1))
        return 0
    print(f"{cpu.name}: {cpu.source}")
    print(f"  read bandwidth   {cpu.bw_1thread_gbs:.2f} GB/s (1 thread), "
          f"{cpu.mem_bw_gbs:.2f} GB/s ({cpu.cores} thread{'s' if cpu.cores > 1 else ''})")
    print(f"  overheads        {cpu.call_us:.1f} us per kernel call, {cpu.layer_us:.0f} us per layer, "
          f"{cpu.token_us:.0f} us per forward")
    print("  one thread       GB/s (one-token matmul)   GFLOP/s (64-token matmul)")
    flops = dict(cpu.kernel_gflops)
    for k, v in cpu.kernel_gbs:     # int16 applies to one token only: no 64-token figure, a dash (never nan)
        f = f"{flops[k]:>8.2f}" if k in flops else f"{'-':>8}"
        print(f"    {k:<14} {v:>8.2f}                  {f}")
    if "KV" in flops:
        print(f"  prompt attention {flops['KV']:.2f} GFLOP/s (one thread, f32 cache, 64 tokens)")
    return 0


def add_commands(sub) -> None:
    """Register `hardware` on the top-level subparsers."""
    h = sub.add_parser("hardware", help="preset hardware for predictions, and this machine's CPU measured",
                       allow_abbrev=False)
    h.add_argument("action", choices=("list", "calibrate"), help="list: preset parts; calibrate: measure this CPU")
    h.add_argument("--json", action="store_true", help="print JSON")
    h.add_argument("--long", action="store_true", help="calibrate: more and larger samples (~4x longer)")
    h.add_argument("-t", "--threads", type=int, default=None, help="calibrate: threads for the multi-thread figures")
    h.set_defaults(func=cmd_hardware)


__all__ = ["add_commands", "cmd_hardware"]
