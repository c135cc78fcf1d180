"""`moert bench MODEL`: llama-bench's pp/tg speed test on any GGUF, one table (or one JSON object).

    moert bench MODEL [-p 64] [-n 32] [-r 3] [-t THREADS] [-b BATCH] [-c CTX] [--json] [placement flags]
"""

from __future__ import annotations

import argparse
import json


def _tokens(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected N >= 0 (0 skips the test), got {value!r}")
    return n


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected N >= 1, got {value!r}")
    return n


def cmd_bench(args: argparse.Namespace) -> int:
    from moert import gguf
    from moert.bench import bench, check_fits, format_table, machine_info, model_info, placement_info
    from moert.cli_generate import load_from_args

    with gguf.open(args.model) as g:
        info = model_info(g)
    need = args.n_prompt + args.n_gen
    ctx = args.ctx or need                         # llama-bench's context: just what the tests use
    trained = info["n_ctx_train"]
    check_fits(args.n_prompt, args.n_gen, min(ctx, trained) if trained else ctx, trained)   # before loading
    args.ctx = ctx
    model = load_from_args(args.model, args)
    try:
        results = bench(model, args.n_prompt, args.n_gen, args.repetitions, warmup=args.warmup)
        machine = machine_info()
        settings = dict(n_prompt=args.n_prompt, n_gen=args.n_gen, repetitions=args.repetitions,
                        threads=machine["threads"], warmup=args.warmup, act_quant=args.act_quant,
                        **placement_info(model))
    finally:
        model.close()
    if args.json:
        print(json.dumps(dict(machine=machine, model=info, settings=settings,
                              tests=[r.to_dict() for r in results]), indent=1))
    else:
        print(format_table(machine, info, settings, results))
    return 0


def add_commands(sub) -> None:
    """Register bench on the top-level subparsers."""
    from moert.cli_common import add_model_arg
    from moert.cli_generate import add_act_quant_arg
    from moert.placement_cli import add_placement_args

    b = sub.add_parser("bench", help="measure prompt processing and generation speed (like llama-bench)",
                       description="Time prompt processing (pp: one forward of -p token ids from an empty "
                       "context) and text generation (tg: -n one-token forwards after them), -r times each, "
                       "and print one table: tokens/s as mean ± std and best, ms/token, and the effective "
                       "GB/s of weights a decoded token reads. Token ids are seeded random ids, so any GGUF "
                       "works, with or without a vocabulary. The context (-c) defaults to -p + -n.")
    add_model_arg(b)
    g = b.add_argument_group("tests (llama-bench's flags)")
    g.add_argument("-p", "--n-prompt", type=_tokens, default=64, metavar="N",
                   help="prompt tokens of the pp test; 0 skips it (default: 64)")
    g.add_argument("-n", "--n-gen", type=_tokens, default=32, metavar="N",
                   help="generated tokens of the tg test; 0 skips it (default: 32)")
    g.add_argument("-r", "--repetitions", type=_positive, default=3, metavar="N",
                   help="repetitions of each test (default: 3)")
    g.add_argument("-t", "--threads", type=_positive, default=None, help="CPU threads for the kernels")
    g.add_argument("-b", "--batch-size", type=_positive, default=512, help="prompt tokens per forward chunk")
    g.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up (at load, and the untimed round before the tests)")
    add_act_quant_arg(g)
    g.add_argument("--json", action="store_true", help="print one JSON object (machine, model, settings, "
                   "every sample of every test) instead of the table")
    add_placement_args(b)
    b.set_defaults(func=cmd_bench)


__all__ = ["add_commands", "cmd_bench"]
