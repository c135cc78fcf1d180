"""`moert run`, `moert chat` and `moert demo`: load, stream tokens, report speed the way llama.cpp does."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time

from moert.cli import llama_flags
from moert.cli.args import add_sampling_args, sampling
from moert.errors import MoertError


def load_from_args(model: str, args: argparse.Namespace, announce: bool = False, **load_options):
    """moert.load with the placement (--fit), context, thread and batch flags, plus `load_options` (trace=...);
    the plan is built once here (fitted with --fit on, printed with -v) and handed to load; warnings print as
    they happen. announce (run, chat, serve): the GPU line (common.gpu_line) first on stderr, once the file has
    read as a model (a file that fails says one line: its error)."""
    from moert import gguf, models
    from moert.cli.common import physical_cores, planned_context, ray_options
    from moert.cli.placement import fitted, placement_from_args, print_overrides
    from moert.experts import OFFLOAD_MIN_BATCH
    from moert.kvcache import KVConfig
    from moert.loader import load
    from moert.placement.strategies import auto_plan

    hw = getattr(args, "hardware", None)
    if hw:                                   # a virtual clock times sim GPUs: make them, sized as its GPUs
        from moert.cost.machines import preset

        hw = preset(hw)
        args.gpu_backend = "sim" if args.gpu_backend == "auto" else args.gpu_backend
        args.gpu_mem = args.gpu_mem or ",".join(hw.gpu_memory()) or None
        load_options.setdefault("hardware", hw)
    placement = placement_from_args(args)
    placement.update({k: load_options.pop(k) for k in list(load_options) if k in placement})  # demo's own
    g = gguf.open(model, mmap=getattr(args, "mmap", True))
    try:
        if getattr(args, "override_kv", None):   # its metadata changed before anything reads it
            from moert.cli.llama_flags import apply_override_kv

            apply_override_kv(g, args.override_kv)
        models.read(g)                       # a file that lies about its model fails before any planning
        if announce:
            from moert.cli.common import gpu_line

            print(gpu_line(args), file=sys.stderr, flush=True)
        kw, ctx, plan = fitted(g, args, placement)
        ctx = planned_context(g, ctx)
        if plan is None:
            plan = auto_plan(g, ctx, **kw)
        if getattr(args, "verbose", False):
            print_overrides(plan)
        n_batch = min(args.batch_size, getattr(args, "ubatch_size", None) or args.batch_size)
        if getattr(args, "cache_slots", None) is not None:             # moert/dynamic/runtime.py
            from moert.dynamic import ExpertCache

            if not plan.devices:
                raise MoertError("--cache-slots keeps experts on a GPU: add --gpu-backend sim (or use a CUDA GPU) "
                                 "and --cpu-moe")
            load_options["expert_cache"] = ExpertCache(plan.devices[0].name, args.cache_slots, args.cache_policy,
                                                       not args.cache_pool, args.prefetch)
        return load(g, plan, context_size=ctx, threads=args.threads or physical_cores(), n_batch=n_batch,
                    warmup=getattr(args, "warmup", True), act_quant=getattr(args, "act_quant", "none"),
                    repack=getattr(args, "repack", False),
                    kv=KVConfig(getattr(args, "cache_type_k", "f16"), getattr(args, "cache_type_v", "f16"),
                                getattr(args, "flash_attn", "auto")),
                    stall_guard=getattr(args, "stall_guard", True), **ray_options(args),
                    **{"offload_min_batch": getattr(args, "offload_min_batch", OFFLOAD_MIN_BATCH), **load_options})
    except BaseException:
        g.close()
        raise


class _Interrupts:
    """Ctrl-C while streaming, kept: Python raises KeyboardInterrupt wherever the main thread is, and when that is a
    finalizer (a device buffer's weakref.finalize, run by the garbage collector) it prints "Exception ignored in" and
    the interrupt is lost. This handler raises it as Python's does and also records it, so the streaming loop raises it
    again at its next token. Installed only over Python's default handler, in the main thread (a job started in the
    background inherits SIGINT ignored, and keeps ignoring it)."""

    def __enter__(self):
        self.seen, self.old = False, None
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.old = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        self.seen = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.seen:
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)


def _stream_to_stdout(model, prompt, args, *, add_bos=None, echo: str = "") -> tuple[str, object]:
    """Stream a completion to stdout; Ctrl-C stops cleanly and keeps what was printed."""
    s = model.stream(prompt, args.n_predict, add_bos=add_bos, **sampling(args))
    out = []
    sys.stdout.write(echo)
    sys.stdout.flush()
    try:
        with _Interrupts() as ctrl_c:
            for piece in s:
                ctrl_c.check()            # one a finalizer swallowed
                out.append(piece)
                if not args.json:
                    sys.stdout.write(piece)
                    sys.stdout.flush()
            ctrl_c.check()
    except KeyboardInterrupt:
        iter(s).close()                   # TextStream iterates one generator: closing it resets the model
        print("\n[interrupted]", file=sys.stderr)
        raise                             # the command exits 130, as llama-cli (and a shell) report Ctrl-C
    return "".join(out), s.stats


def print_stats(model, gen_stats, file=None) -> None:
    """llama.cpp's three timing lines, moert's per-phase/per-device time and transfer table, and the
    memory each device used beside the estimate (as llama.cpp prints its memory breakdown); to `file`,
    standard error by default (looked up at the call: a default bound at import outlives a redirection)."""
    file = sys.stderr if file is None else file
    print("\n" + gen_stats.report(), file=file)
    print("\n" + str(model.stats.total), file=file)
    c = model.stats.cache
    if c is not None:                                                   # an expert cache (--cache-slots)
        recall = ", ".join("-" if r != r else f"{r:.0%}" for r in c.recall)            # NaN: no prediction
        pf = f"; prefetch recall per layer {recall}" if c.prefetched.any() else ""
        print(f"expert cache: hit rate {c.hit_rate:.1%} (hits {c.hits.tolist()}, misses {c.misses.tolist()} per "
              f"layer), {c.weight_bytes:,} weight bytes copied{pf}", file=file)
    print("\n" + memory_breakdown(model), file=file)


def memory_breakdown(model) -> str:
    """Per device: the estimate (weights, KV, scratch) and the measured peak of what moert allocated there."""
    from moert.devices import CPU, format_size
    from moert.placement.memory import estimate

    est = estimate(model.plan, model.context_size, model.n_batch, kv_dtype=model.kv.types,
                   flash_attn=model.flash_attn, repack=model.repack)
    lines = [f"{'memory':<8} {'weights':>11} {'KV':>11} {'scratch':>11} {'estimate':>11} {'measured peak':>14}"]
    for name, d in est.devices.items():
        dev = model.plan.device(name)
        mapped = model.weights.bytes_by_device()[name] if dev is CPU else 0   # file views: not allocations
        peak = f"{format_size(dev.peak + mapped)}"
        lines.append(f"{name:<8} {format_size(d.weights):>11} {format_size(d.kv):>11} {format_size(d.scratch):>11} "
                     f"{format_size(d.total):>11} {peak:>14}")
    lines.append("measured peak: what moert allocated there at its highest (cpu: plus the mapped weights); "
                 "the CPU's NumPy temporaries are not counted")
    if model.repacked_bytes:
        lines.append(f"--repack: {format_size(model.repacked_bytes)} of CPU Q4_K weights copied at load into the int8 "
                     f"kernels' layout (kernels/repack.py), in memory instead of the file's pages")
    return "\n".join(lines)


def finish(model, args: argparse.Namespace) -> None:
    """What run does after generating, with or without a vocabulary: the trace file, the expert plot."""
    if getattr(args, "trace", None):
        t = model.trace_stop()
        print(f"routing trace: {t.save(args.trace)} ({len(t)} tokens; `moert trace {args.trace}` summarises it)",
              file=sys.stderr)
    if args.expert_plot:
        from moert.plots import expert_heatmap

        print(f"expert selections: {expert_heatmap(model.stats.total.expert_counts, args.expert_plot)}",
              file=sys.stderr)


MAX_PROMPT_BYTES = 16 << 20   # -f FILE: a prompt file larger than this is refused (no model has that context)


def read_prompt_file(path: str) -> str:
    """The text of -f FILE: at most MAX_PROMPT_BYTES read (so -f /dev/zero ends), strict UTF-8."""
    with open(path, "rb") as f:
        raw = f.read(MAX_PROMPT_BYTES + 1)
    if len(raw) > MAX_PROMPT_BYTES:
        raise MoertError(f"-f {path}: the prompt file is larger than {MAX_PROMPT_BYTES >> 20} MiB; give a smaller "
                         f"file (a prompt must fit the context anyway)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MoertError(f"-f {path}: not UTF-8 text (byte {e.start}: {e.reason}); convert it, e.g. "
                         f"iconv -t UTF-8") from None


def check_n_predict(n: int) -> None:
    """-n: a count >= 0, or -1 (until the end of generation or a full context), as llama.cpp."""
    if n < -1:
        raise MoertError(f"-n {n}: give a number of tokens >= 0, or -1 to generate until the end of generation "
                         f"or a full context")


def cmd_run(args: argparse.Namespace) -> int:
    check_n_predict(args.n_predict)
    llama_flags.check(args)
    llama_flags.apply_escapes(args)
    if args.conversation:                  # llama-cli -cnv: a chat, -p its system prompt
        args.system_prompt = args.prompt
        return cmd_chat(args)
    prompt = read_prompt_file(args.file) if args.file else args.prompt
    if prompt is None:
        raise MoertError("no prompt: give one with -p TEXT or -f FILE")
    model = load_from_args(args.model, args, announce=True, trace=bool(getattr(args, "trace", None)))
    if not model.tokenizer.has_vocab:  # a vocabulary-less model runs from token ids
        return _run_ids(model, prompt, args)
    text, stats = _stream_to_stdout(model, llama_flags.bos_if_empty(model, prompt), args,
                                    echo="" if args.no_display_prompt or args.json else prompt)
    if args.json:
        print(json.dumps({"prompt": prompt, "text": text, "stop_reason": stats.stop_reason,
                          "timings": stats_dict(stats), "stats": model.stats.to_dict()}, indent=1))
    else:
        print()
    if args.stats:
        print_stats(model, stats)
    finish(model, args)
    return 0


def stats_dict(s) -> dict:
    return {"prompt_tokens": s.prompt_tokens, "prompt_ms": s.prompt_seconds * 1e3,
            "generated_tokens": s.generated_tokens, "generation_ms": s.generation_seconds * 1e3,
            "prompt_tokens_per_s": s.prompt_tokens / s.prompt_seconds if s.prompt_seconds else None,
            "generation_tokens_per_s": s.generated_tokens / s.generation_seconds if s.generation_seconds else None}


def _run_ids(model, prompt: str, args: argparse.Namespace) -> int:
    from moert.text.generate import GenerationStats, generate_ids
    from moert.text.sampling import SamplingParams

    try:
        ids = [int(x) for x in prompt.replace(",", " ").split()]
    except ValueError:
        raise MoertError("this model has no vocabulary (tokenizer.ggml.model = 'none'): give the prompt as "
                         "token ids, e.g. -p '1 2 3'") from None
    kw = sampling(args)
    kw.pop("stop")
    stats = GenerationStats()
    out = generate_ids(model, ids, args.n_predict, SamplingParams(**kw), stats)
    print(json.dumps({"prompt": ids, "tokens": out, "timings": stats_dict(stats), "stats": model.stats.to_dict()})
          if args.json else " ".join(map(str, out)))
    if args.stats:
        print_stats(model, stats)
    finish(model, args)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    check_n_predict(args.n_predict)
    llama_flags.apply_escapes(args)
    model = load_from_args(args.model, args, announce=True)
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", flush=True)
        line = sys.stdin.readline(MAX_PROMPT_BYTES + 1)
        if len(line) > MAX_PROMPT_BYTES:
            raise MoertError(f"a chat line longer than {MAX_PROMPT_BYTES >> 20} MiB; nothing was generated")
        if not line or line.strip() in ("/exit", "/quit"):
            return 0
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line.rstrip("\n")})
        from moert.text.generate import chat_prompt

        text, add_bos = chat_prompt(model, messages, getattr(args, "chat_template", None))
        reply, stats = _stream_to_stdout(model, text, args, add_bos=add_bos)
        print()
        messages.append({"role": "assistant", "content": reply})
        if args.stats:
            print_stats(model, stats)


def cmd_demo(args: argparse.Namespace) -> int:
    from moert.cli.common import gpu_line
    from moert.demo import DEMO_PROMPT, demo_model_path, expert_table
    from moert.devices.gpus import resolve
    from moert.explain.summary import format_summary, summarize
    from moert.gguf import open as open_gguf
    from moert.placement.memory import estimate

    t0 = time.perf_counter()
    backend = resolve(args.gpu_backend, fallback="sim")       # CuPy when it sees a CUDA device, else the sim
    print(gpu_line(args, fallback="sim"), flush=True)
    path = demo_model_path()
    with open_gguf(path) as f:
        print(format_summary(summarize(f), tensors=False))
    gpu = "cuda:0" if backend == "cupy" else "sim:0"
    print(f"\n== placement: experts on the CPU (--cpu-moe), everything else on {gpu} "
          f"({'a real GPU' if backend == 'cupy' else 'the simulated GPU'})\n")
    if args.threads is None:   # its experts are 128x256: a parallel region costs more than the work
        args.threads = 1
    t1 = time.perf_counter()
    model = load_from_args(str(path), args, cpu_moe=True, gpu_backend=backend, gpu_memory=args.gpu_mem)
    print(f"loaded in {time.perf_counter() - t1:.1f} s, of which {model.warmup_seconds or 0:.1f} s warming up (a "
          f"first run compiles the CPU kernels; later runs load them from Numba's cache)\n")
    print(model.plan.explain(only=r"^blk\.0\.|^output|^token_embd"))
    print("\n" + estimate(model.plan, model.context_size, model.n_batch, kv_dtype=model.kv.types,
                          flash_attn=model.flash_attn).table())
    print(f"\n== generating {args.n_predict} tokens, greedy, from a Python prompt (the model learned Python "
          f"from the standard library)\n")
    args.temp = 0.0
    text, stats = _stream_to_stdout(model, DEMO_PROMPT, args, echo=DEMO_PROMPT)
    print()
    print_stats(model, stats, file=sys.stdout)
    print("\n== what the experts learned\n")
    print(expert_table(model))
    print(f"\ndemo done in {time.perf_counter() - t0:.1f} s; follow one token through the model with:\n"
          f"  moert explain {path} -p 'for i in range(' --cpu-moe --gpu-backend sim")
    return 0


def add_commands(sub) -> None:
    """Register run, chat and demo on the top-level subparsers."""
    from moert.cli.common import add_hardware_arg, add_model_arg, add_offload_arg, add_ray_args
    from moert.cli.llama_flags import add_llama_flags
    from moert.cli.placement import add_placement_args

    r = sub.add_parser("run", help="generate text from a prompt, streaming tokens (like llama-cli -p)")
    add_model_arg(r)
    r.add_argument("-p", "--prompt", default=None, help="the prompt (token ids for a model without vocabulary)")
    r.add_argument("-f", "--file", default=None, help="read the prompt from a file")
    r.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    r.add_argument("--json", action="store_true", help="print one JSON object (text, timings) at the end")
    r.add_argument("--expert-plot", default=None, metavar="PNG", help="save a heatmap of which experts each "
                   "layer selected (needs matplotlib: the `plot` extra)")
    r.add_argument("--trace", default=None, metavar="NPZ", help="record every token's routing (ids, weights) "
                   "and save it (`moert trace NPZ` summarises it)")
    x = r.add_argument_group("expert cache (moert/dynamic; of the experts on the CPU: --cpu-moe or --n-cpu-moe N)")
    x.add_argument("--cache-slots", type=int, default=None, metavar="N", help="keep N experts per MoE layer on "
                   "GPU 0, moved as the routing asks (see m.stats.cache; --stats prints its hit rate)")
    x.add_argument("--cache-policy", choices=["lru", "lfu", "lfru"], default="lru", help="eviction policy (lru)")
    x.add_argument("--cache-pool", action="store_true", help="N experts in total, shared by the layers")
    x.add_argument("--prefetch", choices=["next-router"], default=None, help="copy the experts layer l + 1's "
                   "router picks for layer l's input early")
    add_sampling_args(r)
    add_placement_args(r)
    add_offload_arg(r)
    add_hardware_arg(r)
    add_ray_args(r)
    add_llama_flags(r)
    r.set_defaults(func=cmd_run, system_prompt=None)

    c = sub.add_parser("chat", help="interactive multi-turn chat with the model's chat template")
    add_model_arg(c)
    c.add_argument("-sys", "--system-prompt", default=None, help="a system message to start with")
    c.set_defaults(json=False)
    add_sampling_args(c)
    add_placement_args(c)
    add_offload_arg(c)
    add_llama_flags(c, conversation=False)
    c.set_defaults(func=cmd_chat)

    d = sub.add_parser("demo", help="the main job on a built-in model: inspect, place, generate, measure")
    d.set_defaults(func=cmd_demo, json=False, no_display_prompt=False)
    add_sampling_args(d, n_predict=48)
    d.add_argument("--gpu-mem", default=None, help="GPU memory for the demo's GPU (default: 24GiB sim)")
    d.set_defaults(ctx=None, override_tensor=[], gpu_layers="all", cpu_moe=True, n_cpu_moe=None,
                   n_cpu_moe_from="first", gpu_backend="auto", split="layer", strict=False)
