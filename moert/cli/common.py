"""What every `moert` subcommand shares: llama.cpp's flag conventions, the model argument, one-line messages.

    p = LlamaArgumentParser(...)      whole flags only: `-ctk f16` is never read as `-c tk`, nor `--ctx` as `--ctx-size`
    add_model_arg(p)                  MODEL positional, or -m/--model MODEL, as llama.cpp's tools take it
    refuse_other_llama_flags(p, cmd)  every flag of llama.cpp's common set this command lacks: a clear error
    flagify(message)                  "gpu_backend='sim'" -> "--gpu-backend sim": messages name flags, not arguments
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings

from moert.config import DEFAULT_CONTEXT as DEFAULT_CTX  # llama.cpp's default -c; moert.load's too

# llama.cpp's common flags (common/arg.cpp) that users bring along; each parser defines all of them, so none
# can be read as another (argparse would take `-ctk f16` for `-c tk` and `-ts 3,1` for `-t s`).
LLAMA_COMMON_FLAGS = ("-m", "-p", "-f", "-n", "-c", "-b", "-ub", "-t", "-tb", "-ngl", "-ot", "-cmoe", "-ncmoe",
                      "-sm", "-ts", "-mg", "-dev", "-fa", "-ctk", "-ctv", "-s", "-r", "--temp", "--top-k",
                      "--top-p", "--min-p", "--repeat-penalty", "-v", "--fit", "--fit-target", "--fit-ctx",
                      "--list-devices", "--no-mmap", "--mlock")

# Flags moert parses only to refuse (for now), with why and what to do instead.
NOT_YET = {
    "-tb": "moert uses one thread count for prompt and generation; give -t N",
    "--no-mmap": "this command reads only the header; --no-mmap is for the commands that run a model (run, chat)",
    "--mlock": "moert does not lock the model in RAM; drop --mlock",
}


class LlamaArgumentParser(argparse.ArgumentParser):
    """argparse, parsing as llama.cpp does: whole flags only, and errors on one line."""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def _get_option_tuples(self, option_string):
        # argparse's prefix matching: with allow_abbrev=False it still reads `-ctk` as `-c tk`; llama.cpp
        # never splits a flag, so neither do we (an unknown flag is an error, never another flag)
        return []

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {flagify(message)} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's, with "did you mean" for a misspelled flag (the subcommand's flags, when one was named)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            sub = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
            parser = sub.choices.get(getattr(ns, sub.dest, None), self) if sub else self
            parser.error(f"unrecognized arguments: {' '.join(extras)}{did_you_mean(extras, parser)}")
        return ns


def did_you_mean(extras: list[str], parser: argparse.ArgumentParser) -> str:
    """'; did you mean --cpu-moe?' for the first unknown flag close to one of the parser's (difflib), else ''."""
    import difflib

    known = [o for o, a in parser._option_string_actions.items() if a.help != argparse.SUPPRESS]
    for e in extras:
        flag = e.split("=")[0]
        if flag.startswith("-"):      # the longest flag it starts with (--temperature: --temp), the shortest that
            longer = sorted((k for k in known if k.startswith(flag)), key=len)     # starts with it, else the closest
            close = (sorted((k for k in known if len(k) > 3 and flag.startswith(k)), key=len, reverse=True)
                     or longer or difflib.get_close_matches(flag, known, n=1, cutoff=0.6))
            if close:
                return f"; did you mean {close[0]}?"
    return ""


class _Refuse(argparse.Action):
    """A llama.cpp flag this command does not take: a clear error instead of a silent misreading."""

    def __init__(self, option_strings, dest, why: str = "", **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: {self.why}")


def refuse_other_llama_flags(parser: argparse.ArgumentParser, command: str) -> None:
    """Register every flag of LLAMA_COMMON_FLAGS that `parser` lacks as an error saying why."""
    for flag in LLAMA_COMMON_FLAGS:
        if flag in parser._option_string_actions:
            continue
        why = NOT_YET.get(flag, f"not a flag of `moert {command}`")
        nargs = 0 if flag in ("--no-mmap", "--mlock", "--list-devices", "-cmoe", "-v") else "?"
        parser.add_argument(flag, action=_Refuse, nargs=nargs, why=why, help=argparse.SUPPRESS,
                            dest=argparse.SUPPRESS, default=argparse.SUPPRESS)


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    """MODEL as a positional or as -m/--model (llama.cpp's spelling); resolve_model() checks one was given."""
    parser.add_argument("model", nargs="?", default=None, help="path of a .gguf file (or -m MODEL)")
    parser.add_argument("-m", "--model", dest="model_flag", default=None, metavar="MODEL",
                        help="path of a .gguf file, as llama.cpp's -m")


def resolve_model(args: argparse.Namespace) -> str | None:
    """args.model from MODEL or -m MODEL; None if the command takes no model. Raises UsageError if missing."""
    if not hasattr(args, "model_flag"):
        return getattr(args, "model", None)
    pos, flag = args.model, args.model_flag
    if pos and flag and pos != flag:
        raise UsageError(f"two models given: {pos} (MODEL) and {flag} (-m); give one")
    if not (pos or flag):
        raise UsageError("no model given: pass MODEL or -m MODEL (a .gguf file)")
    args.model = pos or flag
    return args.model


def add_hardware_arg(parser: argparse.ArgumentParser) -> None:
    """--hardware NAME (run, bench, explain): the sim GPUs' time is the cost model's for that preset hardware."""
    parser.add_argument("--hardware", default=None, metavar="NAME",
                        help="time the simulated GPUs (and transfers to them) as this preset hardware's, e.g. "
                             "rtx3090+ryzen-7950x (`moert hardware list`; a part or the whole machine may be a "
                             ".json file: moert/cost/machines.py), by the cost model; CPU work stays "
                             "measured. Implies --gpu-backend sim and --gpu-mem of its GPUs unless given")


class UsageError(Exception):
    """A command line that does not say what to run (exit 2, as argparse's own errors)."""


# "gpu_backend='sim'" in a message from the library reads "--gpu-backend sim" on the command line
_FLAGS = {"gpu_backend": "--gpu-backend", "gpu_layers": "-ngl", "gpu_memory": "--gpu-mem", "context_size": "-c",
          "tensor_split": "-ts", "main_gpu": "-mg", "split": "-sm", "n_cpu_moe": "--n-cpu-moe",
          "n_cpu_moe_from": "--n-cpu-moe-from", "threads": "-t", "n_batch": "-b", "act_quant": "--act-quant",
          "expert_order": "--expert-order", "margin": "--fit-target", "max_tokens": "-n",
          "cache_type_k": "-ctk", "cache_type_v": "-ctv", "flash_attn": "-fa", "overrides": "-ot", "seed": "-s",
          "temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
          "repeat_penalty": "--repeat-penalty", "repeat_last_n": "--repeat-last-n", "n_predict": "-n"}
_ARG_RE = re.compile(r"\b(" + "|".join(sorted(_FLAGS, key=len, reverse=True)) + r")=(['\"]?)([^'\",;)\s]*)\2")
# a bare argument name ("context_size must be ..."): only those with an underscore, never an English word
_BARE_RE = re.compile(r"\b(" + "|".join(sorted((k for k in _FLAGS if "_" in k), key=len, reverse=True))
                      + r")\b(?![=\[(])")


def add_ray_args(parser: argparse.ArgumentParser) -> None:
    """--ray and its options (run, serve, bench): experts that RAY<N> rules place run on Ray workers."""
    g = parser.add_argument_group("experts on Ray workers (moert/cluster/actors.py; pip install 'moert[cluster]')")
    g.add_argument("--ray", default=None, metavar="local:N|HOST:PORT|auto",
                   help="the cluster of the RAY<N> devices that -ot rules name (-ot 'blk\\.3\\.ffn_.*_exps=RAY0'): "
                        "local:N starts N workers on this machine; HOST:PORT or auto joins a cluster started with "
                        "`ray start`, worker N on its N-th node (sorted by address, this host last)")
    g.add_argument("--ray-model", default=None, metavar="PATH",
                   help="the model's path on the workers (default: the same path; a worker without the file is sent "
                        "its experts' bytes once)")
    g.add_argument("--ray-fallback", choices=("none", "cpu"), default="none",
                   help="cpu: a worker that dies or hangs has its experts run on this host from the mapped file "
                        "(a warning, counted); none (default): generation stops with an error naming it")
    g.add_argument("--ray-timeout", type=float, default=None, metavar="S",
                   help="seconds a worker may take for one layer before it counts as hung (default: 20)")
    g.add_argument("--ray-threads", type=int, default=None, metavar="N",
                   help="kernel threads per worker (default: 1 with local:N, else the node's cores)")
    g.add_argument("--ray-calls", choices=("compiled", "plain"), default=None,
                   help="compiled (default; MOERT_RAY_CALLS sets it too): one Ray Compiled Graph execute per MoE "
                        "layer over every worker, ~0.2-0.3 ms on an idle 2-core box; plain: one actor call per "
                        "worker and layer (~1.1 ms), steadier where other jobs hold the cores (the graph's "
                        "channels spin)")


def ray_options(args: argparse.Namespace) -> dict:
    """moert.load's ray= (a moert.RayConfig) from the --ray flags (none when the command has no such flags)."""
    if getattr(args, "ray", None) is None:
        return {}
    from moert.cluster import RayConfig

    return dict(ray=RayConfig(args.ray, model=args.ray_model, fallback=None if args.ray_fallback == "none" else "cpu",
                              timeout=args.ray_timeout, threads=args.ray_threads, calls=args.ray_calls))


def flagify(message: str) -> str:
    """A library message as the command line reads it: API arguments replaced by their flags."""
    message = _ARG_RE.sub(lambda m: f"{_FLAGS[m.group(1)]} {m.group(3)}", message)
    message = (message.replace("cpu_moe=True", "--cpu-moe").replace("strict=True", "--strict")
               .replace("warmup=False", "--no-warmup").replace("Plan.explain()", "moert inspect MODEL --plan")
               .replace(" template= ", " --chat-template ").replace(" template=)", " --chat-template)"))
    return _BARE_RE.sub(lambda m: _FLAGS[m.group(1)], message)


def one_line_warnings() -> None:
    """Every warning prints at once as one line `warning: ...` on stderr (no file, no line, no source)."""
    def show(message, category, filename, lineno, file=None, line=None):
        print(f"warning: {flagify(str(message))}", file=file or sys.stderr, flush=True)

    from moert.errors import PlacementWarning

    warnings.showwarning = show
    warnings.simplefilter("always", PlacementWarning)


def sim_if_no_gpu(args: argparse.Namespace) -> None:
    """Planning (fit, inspect) for a stated --gpu-mem with no GPU here: a simulated GPU of that size, said once."""
    import sys

    from moert.devices import cuda as _cuda

    if getattr(args, "gpu_mem", None) and getattr(args, "gpu_backend", "auto") == "auto" and not _cuda.device_count():
        args.gpu_backend = "sim"
        print(f"note: no GPU here ({_cuda.why_unavailable()}): planning for a simulated GPU of --gpu-mem "
              f"{args.gpu_mem}", file=sys.stderr)


def add_offload_arg(parser: argparse.ArgumentParser) -> None:
    """--offload-min-batch N (run, chat, bench, serve): llama.cpp's op offload threshold for CPU weights."""
    from moert.experts import OFFLOAD_MIN_BATCH

    parser.add_argument("--offload-min-batch", type=int, default=OFFLOAD_MIN_BATCH, metavar="N",
                        help=f"a batch of at least N tokens runs CPU weights' matmuls on the GPU, copying a weight's "
                             f"blocks (of experts: the selected ones') there for the call (llama.cpp's op offload; "
                             f"default {OFFLOAD_MIN_BATCH}, GGML_OP_OFFLOAD_MIN_BATCH; 0: never, as --no-op-offload)")


def gpu_line(args: argparse.Namespace, fallback: str = "none") -> str:
    """The first line of run, chat, bench and serve (demo: fallback "sim"): which GPU backend and device the command
    uses, or why none ("GPU: cuda:0 NVIDIA H200 (CuPy 14.2.0)", "GPU: none (no CUDA device: CuPy is not
    installed; ...)"); --hardware times a simulated GPU."""
    from moert.devices.gpus import describe

    backend = getattr(args, "gpu_backend", "auto")
    if getattr(args, "hardware", None) and backend == "auto":
        backend = "sim"
    line = describe(backend, fallback)
    if str(getattr(args, "gpu_layers", "all")) == "0" and not getattr(args, "override_tensor", None) \
            and not line.startswith("GPU: none"):
        line += "; -ngl 0: the CPU runs every layer"
    return line


def fit_context(model, args: argparse.Namespace) -> int:
    """The context fit starts from: -c N, -c 0 the largest that fits (up to the trained one), else -c's default."""
    return planned_context(model, None) if args.ctx is None else args.ctx


def planned_context(model, ctx: int | None) -> int:
    """The context of `-c` as every command reads it: N itself (more than the trained context is honoured, with
    moert.load's warning, as llama.cpp), 0 the model's trained context, not given DEFAULT_CTX (llama.cpp's
    default) or the trained context if that is smaller (no warning for a flag nobody gave)."""
    from moert.placement.plan import model_info

    if ctx:
        return ctx
    info = model_info(model)
    trained = int(info.metadata.get(f"{info.arch}.context_length", 0) or 0)
    if ctx == 0:
        return trained or DEFAULT_CTX
    return min(DEFAULT_CTX, trained) if trained else DEFAULT_CTX


def physical_cores() -> int:
    """CPU cores this process may run on, one per physical core (llama.cpp's default -t: no hyperthreads)."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores, cpu, phys = set(), None, "0"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key == "processor":
                    cpu = int(val)
                elif key == "physical id":
                    phys = val
                elif key == "core id" and cpu in allowed:
                    cores.add((phys, val))
    except (OSError, ValueError):
        pass
    return max(1, min(len(cores), len(allowed)) if cores else len(allowed))


def list_devices(gpu_mem: str | None = None) -> str:
    """--list-devices: the CPU, each CUDA device with total and free memory, and the simulated GPUs."""
    from moert.bench import cpu_model
    from moert.devices import cuda as _cuda
    from moert.devices.gpus import get_devices

    mib = 2**20
    meminfo = {}
    try:
        with open("/proc/meminfo") as f:
            meminfo = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in f)}
    except (OSError, ValueError):
        pass
    ram = (f", {meminfo['MemTotal'] // mib} MiB, {meminfo.get('MemAvailable', 0) // mib} MiB free"
           if "MemTotal" in meminfo else "")
    lines = ["Available devices:", f"  CPU: {cpu_model()} ({physical_cores()} physical cores{ram})"]
    n = _cuda.device_count()
    for i in range(n):
        free, total = _cuda.memory(i)
        lines.append(f"  CUDA{i}: {_cuda.device_name(i)} ({total // mib} MiB, {free // mib} MiB free)")
    if not n:
        lines.append(f"  CUDA: none ({_cuda.why_unavailable()})")
    for d in get_devices("sim", gpu_mem):
        lines.append(f"  {d.name}: simulated GPU ({d.capacity // mib} MiB, {d.capacity // mib} MiB free; "
                     f"--gpu-backend sim, sizes from --gpu-mem)")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """--version: moert's version and the versions it runs on (imported only when asked)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        import platform

        import numba
        import numpy

        from moert import __version__

        print(f"moert {__version__} (python {platform.python_version()}, numpy {numpy.__version__}, "
              f"numba {numba.__version__})")
        parser.exit(0)


__all__ = ["DEFAULT_CTX", "LLAMA_COMMON_FLAGS", "LlamaArgumentParser", "UsageError", "VersionAction",
           "add_hardware_arg", "add_model_arg", "add_offload_arg", "add_ray_args", "did_you_mean", "fit_context",
           "flagify", "gpu_line", "list_devices", "one_line_warnings", "physical_cores", "planned_context",
           "ray_options", "refuse_other_llama_flags", "resolve_model", "sim_if_no_gpu"]
