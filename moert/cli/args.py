"""The flags that run, chat, serve and bench share: sampling, threads and batches, activation quantization."""

from __future__ import annotations

import argparse


def add_sampling_args(p: argparse.ArgumentParser, n_predict: int = 64) -> None:
    """llama.cpp's sampling and context flags (-n, --temp, --top-k, --top-p, --min-p, --repeat-penalty, -s, -t, -b)."""
    g = p.add_argument_group("generation (llama.cpp's flags)")
    g.add_argument("-n", "--n-predict", type=int, default=n_predict, metavar="N", help="tokens to generate (-1: "
                   f"until the end of generation or a full context; default: {n_predict})")
    g.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default: 0.8)")
    g.add_argument("--top-k", type=int, default=40, help="keep the K most likely tokens; 0 = off (default: 40)")
    g.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling; 1.0 = off (default: 0.95)")
    g.add_argument("--min-p", type=float, default=0.05, help="drop tokens below P x the best; 0 = off (default: 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=1.0, help="penalize repeats; 1.0 = off (default: 1.0)")
    g.add_argument("--repeat-last-n", type=int, default=64, help="tokens the penalty looks back (default: 64)")
    g.add_argument("--presence-penalty", type=float, default=0.0, metavar="N", help="OpenAI's: subtract N from "
                   "the logit of every token generated so far; 0 = off (default: 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, metavar="N", help="OpenAI's: subtract N x "
                   "(times generated so far) from each token's logit; 0 = off (default: 0)")
    g.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed; -1: random (default: -1, as llama.cpp)")
    g.add_argument("-r", "--reverse-prompt", "--stop", dest="stop", action="append", default=[], metavar="TEXT",
                   help="stop when this text is generated (repeatable)")
    add_thread_batch_args(g)
    g.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the one-token warm-up run at "
                   "load (then the first token pays for compiling the CPU kernels on a first run)")
    g.add_argument("--no-mmap", dest="mmap", action="store_false", help="read the model into memory instead of "
                   "mapping it (slower to load; a file truncated while the model runs cannot crash it)")
    add_act_quant_arg(g)
    g.add_argument("--stats", action="store_true", help="print llama.cpp-style timings and moert's per-device "
                   "time and transfer breakdown")


def add_thread_batch_args(g) -> None:
    """-t, -b, -ub: CPU threads (default: the physical cores) and prompt tokens per forward chunk."""
    g.add_argument("-t", "--threads", type=positive, default=None, metavar="N",
                   help="CPU threads for the kernels (default: the physical cores, as llama.cpp). A call reading "
                        "under 512 KB of weights runs on one thread at any -t, and decode steps that stall on a "
                        "busy core (a worker thread descheduled) send the next ones to one thread for a while "
                        "(docs/cli.md, 'Threads')")
    g.add_argument("--no-stall-guard", dest="stall_guard", action="store_false",
                   help="every decode step on -t threads even when another process stalls them (for benchmarks that "
                        "must measure exactly -t; moert's own flag: llama.cpp has no guard)")
    g.add_argument("-b", "--batch-size", type=positive, default=512, metavar="N",
                   help="prompt tokens per forward chunk (default: 512)")
    g.add_argument("-ub", "--ubatch-size", type=positive, default=512, metavar="N",
                   help="physical batch: a chunk is min(-b, -ub) tokens (default: 512)")


def positive(value: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected N >= 1, got {value!r}")
    return n


def sampling(args: argparse.Namespace) -> dict:
    """The sampling flags as Model.generate's keywords (seed -1: random, as llama.cpp)."""
    return dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n, seed=args.seed,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                stop=args.stop or None)


def add_act_quant_arg(g) -> None:
    """--act-quant, for every command that loads a model to run it (run, chat, bench)."""
    g.add_argument("--act-quant", choices=["none", "int16", "int8"], default="none",
                   help="CPU matmuls of Q4_K/Q6_K weights read x rounded per 256 values: int16 in decode, "
                   "int8 everywhere (llama.cpp's scheme, needs AVX2; fastest); default: none, float")
    g.add_argument("--repack", action="store_true",
                   help="with --act-quant int8: copy the CPU Q4_K weights at load into the int8 kernels' own layout "
                   "(kernels/repack.py: scales unpacked, sub-blocks paired): the same integer sums (output equal to "
                   "float rounding), faster kernels, +2.8%% of those bytes in memory instead of the file's pages (as "
                   "llama.cpp's CPU repack, which it does by default)")
