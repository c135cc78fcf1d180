"""`moert bench MODEL`: llama-bench's pp/tg speed test on any GGUF, one table (or llama-bench's records).

    moert bench MODEL [-p 64,512] [-n 32] [-d 0,4096] [-r 3] [-t 1,2] [-ngl 0,all] [-ncmoe 0,8]
                      [-ctk f16,q8_0] [-ctv f16] [-fa 0,1] [-o md|csv|json|jsonl|sql] [placement flags]

Comma lists sweep, as in llama-bench: one model load per (-ngl, -ncmoe, -t, -ctk, -ctv, -fa) combination, and
in each, one test per (-d, -p) (pp) and per (-d, -n) (tg). -o json/jsonl/csv/sql: llama-bench's records
(moert/bench_records.py); --json: moert's own object (machine, model, settings, tests).
"""

from __future__ import annotations

import argparse
import json
import sys


def _counts(value: str) -> list[int]:
    """-p 64,512: token counts (0 skips the test), comma-separated as llama-bench takes them."""
    try:
        ns = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected token counts such as 64 or 64,512, got {value!r}") from None
    if not ns or min(ns) < 0:
        raise argparse.ArgumentTypeError(f"expected counts >= 0 (0 skips the test), got {value!r}")
    return ns


def _positives(value: str) -> list[int]:
    ns = _counts(value) if value.strip() else []
    if not ns or min(ns) < 1:
        raise argparse.ArgumentTypeError(f"expected N >= 1 (or a list: 1,2), got {value!r}")
    return ns


def _layer_list(value: str) -> list:
    from moert.cli.placement import gpu_layers_arg

    return [gpu_layers_arg(x) for x in value.split(",") if x.strip()]


def _positive(value: str) -> int:
    n = _positives(value)
    if len(n) != 1:
        raise argparse.ArgumentTypeError(f"expected one N >= 1, got {value!r}")
    return n[0]


def _kv_types(value: str) -> list[str]:
    """-ctk f16,q8_0: KV cache types, comma-separated."""
    from moert.cli.placement import _kv_type

    return [_kv_type(x) for x in value.split(",") if x.strip()] or [_kv_type(value)]


def _flash_list(value: str) -> list[str]:
    """-fa 0,1 (or on,off,auto): flash attention settings, comma-separated."""
    from moert.cli.placement import _flash_attn

    return [_flash_attn(x) for x in value.split(",") if x.strip()] or [_flash_attn(value)]


# (markdown column, args attribute, llama-bench's field): the flags a comma list sweeps, llama-bench's order
SWEPT = (("ngl", "gpu_layers", "n_gpu_layers"), ("ncmoe", "n_cpu_moe", "n_cpu_moe"),
         ("threads", "threads", "n_threads"), ("type_k", "cache_type_k", "type_k"),
         ("type_v", "cache_type_v", "type_v"), ("fa", "flash_attn", "flash_attn"))


def configurations(args: argparse.Namespace) -> list[dict]:
    """Every combination of the comma-listed flags, in llama-bench's order (-ngl, -ncmoe, -t, -ctk, -ctv, -fa)."""
    import itertools

    lists = [_listed(getattr(args, attr, None)) for _, attr, _ in SWEPT]
    return [dict(zip([attr for _, attr, _ in SWEPT], combo)) for combo in itertools.product(*lists)]


def _listed(v) -> list:
    return v if isinstance(v, list) and v else [v if not isinstance(v, list) else None]


def _warn_if_busy(threads: int) -> None:
    """A warning when other processes already load the cores the benchmark needs: its numbers would be low."""
    import os
    import sys

    from moert.cli.common import physical_cores

    threads = threads or physical_cores()
    load = os.getloadavg()[0]
    if load + threads > (os.cpu_count() or 1) + 0.5:
        print(f"warning: load average {load:.2f} on {os.cpu_count()} CPUs before the run: other processes compete "
              f"with the benchmark's {threads} thread(s), so t/s will be low and noisy", file=sys.stderr)


def cmd_bench(args: argparse.Namespace) -> int:
    import copy

    from moert import bench_records, gguf
    from moert.bench import check_fits, format_table, machine_info, model_info, placement_info, run_test
    from moert.cli.common import gpu_line
    from moert.cli.generate import load_from_args

    cpu_only = {str(c["gpu_layers"]) for c in configurations(args)} == {"0"}
    print(gpu_line(argparse.Namespace(**{**vars(args), "gpu_layers": "0" if cpu_only else "all"})),
          file=sys.stderr, flush=True)
    with gguf.open(args.model) as g:
        info = model_info(g)
    tests = [(p, 0, d) for d in args.depth for p in args.n_prompt if p] + \
            [(0, n, d) for d in args.depth for n in args.n_gen if n]
    trained = info["n_ctx_train"]
    ctx = args.ctx or max((sum(t) for t in tests), default=1)   # llama-bench's context: what the tests use
    check_fits(tests or [(0, 0, 0)], ctx, trained)   # before loading; past `trained`, load warns (as llama.cpp)
    _warn_if_busy(max(args.threads or [0]))
    swept = [(col, attr) for col, attr, _ in SWEPT if len(_listed(getattr(args, attr, None))) > 1]
    results, settings = [], None
    for conf in configurations(args):
        a = copy.copy(args)
        a.ctx = ctx
        a.gpu_layers = conf["gpu_layers"] if conf["gpu_layers"] is not None else "all"
        a.n_cpu_moe = conf["n_cpu_moe"] or None
        a.threads = conf["threads"]
        a.cache_type_k, a.cache_type_v, a.flash_attn = conf["cache_type_k"], conf["cache_type_v"], conf["flash_attn"]
        model = load_from_args(args.model, a)
        try:
            machine = machine_info()
            for p, n, d in tests:
                r = run_test(model, p, n, d, args.repetitions, warmup=args.warmup)
                r.params = {col: conf[attr] if conf[attr] is not None else "all" for col, attr in swept}
                r.config = {field: conf[attr] for _, attr, field in SWEPT if conf[attr] is not None}
                r.config.setdefault("n_threads", machine["threads"])
                results.append(r)
            settings = settings or dict(n_prompt=args.n_prompt, n_gen=args.n_gen, n_depth=args.depth,
                                        repetitions=args.repetitions, threads=machine["threads"],
                                        warmup=args.warmup, act_quant=args.act_quant, n_ubatch=args.ubatch_size,
                                        mmap=getattr(args, "mmap", True), repack=args.repack,
                                        **placement_info(model))
        finally:
            model.close()
    if args.json:
        print(json.dumps(dict(machine=machine, model=info, settings=settings, tests=[r.to_dict() for r in results]),
                         indent=1))
    elif args.output in ("json", "jsonl", "csv", "sql"):
        recs = [bench_records.record(machine, info, settings, r) for r in results]
        print(getattr(bench_records, f"format_{args.output}")(recs))
    else:
        print(format_table(machine, info, settings, results, several=len(configurations(args)) > 1))
    return 0


def add_commands(sub) -> None:
    """Register bench on the top-level subparsers."""
    from moert.cli.args import add_act_quant_arg
    from moert.cli.common import add_hardware_arg, add_model_arg, add_offload_arg, add_ray_args
    from moert.cli.placement import add_placement_args

    b = sub.add_parser("bench", help="measure prompt processing and generation speed (like llama-bench)",
                       conflict_handler="resolve",     # -ctk/-ctv/-fa below take comma lists here
                       description="Time prompt processing (pp: one forward of -p token ids from an empty "
                       "context) and text generation (tg: -n one-token forwards after them), -r times each, "
                       "and print one table: tokens/s as mean ± std and best, ms/token, and the effective "
                       "GB/s of weights a decoded token reads. Token ids are seeded random ids, so any GGUF "
                       "works, with or without a vocabulary. The context (-c) defaults to -p + -n.")
    add_model_arg(b)
    g = b.add_argument_group("tests (llama-bench's flags)")
    g.add_argument("-p", "--n-prompt", type=_counts, default=[64], metavar="N[,N...]",
                   help="prompt tokens of the pp tests; 0 skips them (default: 64)")
    g.add_argument("-n", "--n-gen", type=_counts, default=[32], metavar="N[,N...]",
                   help="generated tokens of the tg tests; 0 skips them (default: 32)")
    g.add_argument("-d", "--n-depth", dest="depth", type=_counts, default=[0], metavar="N[,N...]",
                   help="tokens already in the context when a test starts (default: 0)")
    g.add_argument("-r", "--repetitions", type=_positive, default=3, metavar="N",
                   help="repetitions of each test (default: 3)")
    g.add_argument("-o", "--output", choices=("md", "csv", "json", "jsonl", "sql"), default="md",
                   help="output format: md (default), a table; csv, json, jsonl, sql: llama-bench's records, its field "
                   "names (model_type, n_prompt, n_gen, avg_ts, stddev_ts, ...), so its tooling reads them")
    g.add_argument("--no-stall-guard", dest="stall_guard", action="store_false",
                   help="every decode step on the -t threads even when another process stalls them (default: the "
                        "steps after a stalled one run on one thread, and the table says how many did)")
    g.add_argument("-t", "--threads", type=_positives, default=None, metavar="N[,N...]",
                   help="CPU threads for the kernels (default: the physical cores; see moert run --help)")
    g.add_argument("-b", "--batch-size", type=_positive, default=512, help="prompt tokens per forward chunk")
    g.add_argument("-ub", "--ubatch-size", type=_positive, default=512, help="physical batch: a chunk is "
                   "min(-b, -ub) tokens (default: 512)")
    g.add_argument("--no-warmup", dest="warmup", action="store_false",
                   help="skip the warm-up (at load, and the untimed round before the tests)")
    add_act_quant_arg(g)
    g.add_argument("--json", action="store_true", help="moert's own JSON object (machine, model, settings, every "
                   "sample of every test) instead of the table; -o json is llama-bench's list of records")
    add_placement_args(b, sweep=(_layer_list, _counts))
    add_offload_arg(b)
    k = b.add_argument_group("KV cache and attention (comma lists sweep, as llama-bench's)")
    ctk, ctv = b.get_default("cache_type_k"), b.get_default("cache_type_v")    # the run/serve defaults
    k.add_argument("-ctk", "--cache-type-k", type=_kv_types, default=[ctk], metavar="TYPE[,TYPE...]",
                   help=f"KV cache type of K: f32, f16, bf16, q8_0 (default: {ctk})")
    k.add_argument("-ctv", "--cache-type-v", type=_kv_types, default=[ctv], metavar="TYPE[,TYPE...]",
                   help=f"KV cache type of V (default: {ctv})")
    k.add_argument("-fa", "--flash-attn", type=_flash_list, default=["auto"], metavar="0|1|auto[,...]",
                   help="flash attention: 1 (on), 0 (off), auto (default: on when -ctk/-ctv is not f32)")
    add_hardware_arg(b)
    add_ray_args(b)
    b.set_defaults(func=cmd_bench)


__all__ = ["add_commands", "cmd_bench"]
