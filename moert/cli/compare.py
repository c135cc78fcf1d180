"""`moert compare MODEL|zoo:NAME --hardware NAME`: placement strategies side by side, predicted (moert.predict).

    moert compare zoo:gpt-oss-120b --hardware rtx3090+ryzen-7950x [--ram 64GiB] [--disk nvme-gen4] [--no-mmap]
        [-ot ... | --n-cpu-moe N | --cpu-moe | -ngl N] [-t N] [-tb N] [-ub N] [-c N] [-ctk T] [-fa on|off]
        [--depth N] [-n N] [-p N] [--fit-margin MiB] [--quant Q4_K_M,Q8_0] [--json] [--plot PNG]

One row per strategy (moert/cost/strategies.py), a CPU-only row, and "yours" when placement or speed flags
are given (llama.cpp's spellings and defaults): fits (VRAM with --fit-margin free, and RAM: moert/cost/capacity.py;
past RAM llama.cpp's mmap pages experts in from disk, which the row says and its speed includes), GPU GiB per
GPU, RAM GiB, the share of expert selections served by a GPU, predicted pp and tg tok/s, what bounds decode,
and the shortest llama.cpp flags for the row (moert/cost/commandline.py). The output ends with the best fitting row
as one `llama-server` line and one `moert run` line. A dense model (no experts) gets an -ngl sweep instead.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings

from moert.cost.commandline import compact_ot


def _gpu_share(pred, plan) -> float:
    """Share of decoded-token expert bytes read on a GPU."""
    parts = [p for p in pred.parts if p.phase == "decode" and p.stage == "experts"]
    total = sum(p.bytes for p in parts) or 1.0
    return sum(p.bytes for p in parts if p.device.startswith("gpu")) / total


KV_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def entries(model: str, hw, context: int, trace=None, yours: dict | None = None) -> list[tuple]:
    """(name, rules or None, moert.plan keywords or None) of every row: the strategies (a model with experts on a
    machine with a GPU), the CPU-only row, an -ngl sweep for a dense model, and yours."""
    from moert.cost import strategies
    from moert.cost.shape import EXPERT
    from moert.placement.plan import model_info

    info = model_info(model)
    out: list[tuple] = []
    if not any(EXPERT.search(n) for n in info.tensors):
        if hw.gpus:                                   # no experts: placement is -ngl
            L = info.n_layer + 1
            out += [(f"{L - n} of {L} layers on the CPU", None, {"gpu_layers": n})
                    for n in sorted({L, 3 * L // 4, L // 2, L // 4})]
    elif hw.gpus:
        out += [(name, rules, None) for name, rules in strategies.named(model, hw, context, trace).items()]
    out.append(("everything on the CPU", None, {"gpu_layers": 0}))
    if yours is not None:                            # no GPU: llama.cpp runs every layer on the CPU
        out.append(("yours", None, yours if hw.gpus else {**yours, "gpu_layers": 0}))
    return out


def compare(model: str, hw, context: int, policy: str = "llama.cpp", trace=None, opts: dict | None = None,
            yours: dict | None = None, progress: bool = False) -> list[dict]:
    """Rows of the comparison (plain data); `best` marks the best fitting one. opts: n_prompt, n_gen, depth,
    threads, threads_batch, n_ubatch, ctk, fa, ram_gib, reserve_gib, disk, mmap (moert/cost/capacity.py), numa."""
    from moert.cost import capacity, commandline, strategies
    from moert.cost.predict import predict
    from moert.cost.range import choose, likely

    o = {"n_prompt": 512, "n_gen": 128, "depth": 0, "threads": None, "threads_batch": None, "n_ubatch": 512,
         "ctk": "f16", "fa": "on", "ram_gib": None, "reserve_gib": capacity.OS_RESERVE_GIB,
         "disk": capacity.DEFAULT_DISK, "mmap": True, "numa": "none", **(opts or {})}
    ram_gib = o["ram_gib"] or capacity.typical_ram_gib(hw)
    if o["numa"] in ("isolate", "numactl"):                     # pinned to one node: its share of the RAM
        ram_gib /= hw.cpu.numa_nodes
    kvb = KV_BYTES[o["ctk"]]
    todo = entries(model, hw, context, trace, yours)
    if progress:
        from tqdm import tqdm

        todo = tqdm(todo, desc="predicting", unit="row", file=sys.stderr, leave=False)
    rows = []
    for name, rules, kw in todo:
        if rules is None and kw is None:
            rows.append(dict(strategy=name, fits=False, gpu_gib=None, gpu_share=None, pp=None, tg=None, bound="",
                             ot="", flags=[], note="nothing of this kind fits"))
            continue
        p = strategies.hardware_plan(model, rules, hw) if rules is not None else commandline.plan_on(model, hw, **kw)
        args = dict(n_prompt=o["n_prompt"], n_gen=o["n_gen"], depth=o["depth"], n_ctx=context, policy=policy,
                    trace=trace, threads=o["threads"], n_ubatch=o["n_ubatch"], kv_bytes=kvb, numa=o["numa"],
                    flash_attn=o["fa"] != "off")
        r = predict(p, hw, **args)
        if o["threads_batch"] and o["threads_batch"] != o["threads"]:        # -tb: the prompt's threads
            r.prefill_tok_s = predict(p, hw, **{**args, "threads": o["threads_batch"]}).prefill_tok_s
        c = capacity.ram(p, ram_gib, context, kvb, o["reserve_gib"], o["mmap"])
        tg, pp, disk_gb = capacity.paged(r, c, capacity.disk(o["disk"]))
        note = "" if c.fits else ("does not fit in RAM: paged from disk" if o["mmap"] else
                                  "does not fit in RAM (--no-mmap)")
        flags = commandline.shortest_flags(model, rules or [], hw, target=p) if rules is not None else \
            commandline.shortest_flags(model, [], hw, target=p)
        rows.append(dict(strategy=name, fits=r.fits and (c.fits or o["mmap"]), gpu_gib=sum(
            m["need"] for m in r.memory.values()) / 2**30, gpu_gib_per=[m["need"] / 2**30 for m in r.memory.values()],
            ram_gib=(c.weights + c.other) / 2**30, paged=not c.fits, disk_gb_per_token=disk_gb,
            gpu_share=_gpu_share(r, p), pp=pp, tg=tg, bound="disk (page-ins)" if not c.fits else r.bound("decode"),
            ot=compact_ot(rules) if rules else "", flags=flags, note=note,
            pp_range=likely(pp, "prefill", r.kind(), len(r.extrapolating_in(("prefill",)))),
            tg_range=likely(tg, "decode", r.kind(), len(r.extrapolating_in(("decode",)))),
            extrapolating=r.extrapolating))
    choose(rows, "tg")                  # moert/cost/range.py: "best" only beyond the likely range, else a tie
    return rows


def context_of(model: str, ctx: int) -> int:
    """-c as llama.cpp reads it: N tokens, or 0 for the model's training context ({arch}.context_length)."""
    from moert import gguf
    from moert.errors import ArgumentError

    if ctx < 0:
        raise ArgumentError(f"-c {ctx}: give a context size in tokens (>= 1), or 0 for the model's own")
    if ctx:
        return ctx
    with gguf.open(model) as f:
        md = f.metadata
    n = md.get(f"{md.get('general.architecture')}.context_length")
    if not isinstance(n, int) or n < 1:
        raise ArgumentError(f"-c 0 asks for the model's training context, but {model} has no "
                            f"{md.get('general.architecture')}.context_length; give -c N")
    return n


def _opts(args: argparse.Namespace) -> tuple[dict, dict | None]:
    """compare's options from the flags, and yours: moert.plan keywords when a placement or speed flag is given."""
    from moert.devices import parse_size
    from moert.placement import normalize_overrides

    opts = dict(n_prompt=args.n_prompt, n_gen=args.n_predict, depth=args.depth, threads=args.threads,
                threads_batch=args.threads_batch, n_ubatch=args.ubatch_size, ctk=args.cache_type_k,
                fa=args.flash_attn, ram_gib=parse_size(args.ram) / 2**30 if args.ram else None,
                reserve_gib=args.os_reserve, disk=args.disk, mmap=not args.no_mmap, numa=args.numa or "none")
    given = any(v is not None for v in (args.gpu_layers, args.n_cpu_moe, args.threads, args.ubatch_size)) or \
        args.override_tensor or args.cpu_moe
    yours = None
    if given:
        yours = {"overrides": normalize_overrides(args.override_tensor), "cpu_moe": args.cpu_moe,
                 "n_cpu_moe": args.n_cpu_moe, "gpu_layers": "all" if args.gpu_layers is None else args.gpu_layers}
    opts["n_ubatch"] = args.ubatch_size or 512
    return opts, yours


def extrapolating(rows: list[dict]) -> list[str]:
    """Every row's extrapolation reasons (Prediction.extrapolating), each once, in the order first met."""
    return list(dict.fromkeys(x for r in rows for x in r.get("extrapolating") or []))


def _print_rows(rows: list[dict], ram_note: str) -> None:
    print(f"{'row':<50} {'fits':<5} {'GPU GiB':>11} {'RAM GiB':>8} {'GPU exp%':>8} {'pp':>9} {'tg':>8} "
          f"{'tg likely':>13}  decode bound")
    for r in rows:
        if r["gpu_gib"] is None:
            print(f"{r['strategy']:<50} {'no':<5} {'-':>11} {'-':>8} {'-':>8} {'-':>9} {'-':>8} {'-':>13}  {r['note']}")
            continue
        per = "+".join(f"{g:.1f}" for g in r["gpu_gib_per"]) if len(r["gpu_gib_per"]) > 1 else f"{r['gpu_gib']:.2f}"
        mark = " *" if r["best"] else " =" if r.get("tied") else ""      # = ties with the best (moert/cost/range.py)
        likely = "{:.1f}-{:.1f}".format(*r["tg_range"])
        note = f"; {r['note']} ({r['disk_gb_per_token']:.2f} GB a token)" if r["paged"] else \
            (f"; {r['note']}" if r["note"] else "")
        print(f"{r['strategy']:<50} {'yes' if r['fits'] else 'NO':<5} {per:>11} {r['ram_gib']:>8.1f} "
              f"{100 * r['gpu_share']:>7.0f}% {r['pp']:>9.1f} {r['tg']:>8.2f} {likely:>13}  {r['bound']}{note}{mark}")
        flags = " ".join(r["flags"]) or "(no placement flags)"
        print(f"    {flags if len(flags) <= 160 else flags[:120] + f'... ({len(flags)} characters: --json)'}")
    print(ram_note)


def cmd_compare(args: argparse.Namespace) -> int:
    from moert.cost import capacity, commandline, zoo
    from moert.cost.coverage import MIN_FIGURES
    from moert.cost.machines import preset
    from moert.cost.predict import VALIDATION, trust
    from moert.cost.range import choose

    if args.cluster:                                    # experts over several hosts: moert/cli/cluster.py
        from moert.cli.cluster import cmd_cluster

        return cmd_cluster(args)
    if not args.hardware:
        from moert.cli.common import UsageError

        raise UsageError("compare needs --hardware NAME (one machine) or --cluster SPEC (several hosts)")
    label = getattr(args, "model_label", args.model)
    hw = preset(args.hardware)
    if args.gpu_mem:
        from dataclasses import replace

        from moert.devices import parse_size

        sizes = [parse_size(s) / 2**30 for s in args.gpu_mem.split(",")]
        hw = replace(hw, gpus=tuple(replace(g, mem_gib=s) for g, s in zip(hw.gpus, sizes)),
                     name=f"{hw.name} ({args.gpu_mem})")
    from dataclasses import replace

    hw = replace(hw, gpus=tuple(replace(g, reserved_gib=args.fit_margin / 1024) for g in hw.gpus))
    opts, yours = _opts(args)
    ram_gib = opts["ram_gib"] or capacity.typical_ram_gib(hw)
    quants = [q.strip() for q in args.quant.split(",")] if args.quant else [None]
    if quants != [None] and not label.startswith("zoo:"):
        from moert.errors import ArgumentError

        raise ArgumentError(f"--quant compares a zoo twin's quant mixes; {label} is a file of one quant: give "
                            f"zoo:NAME (moert.zoo) or drop --quant")
    if args.cache_slots and args.trace is None:
        from moert.cli.common import UsageError

        raise UsageError("--cache-slots replays a routing trace: give --trace FILE (moert run ... --trace FILE)")
    trace = None
    if args.trace is not None:                              # moert/dynamic/formats.py: moert's or llama.cpp's
        from moert.dynamic.formats import read

        trace = read(args.trace)
    rows, models = [], {}
    for q in quants:
        model = str(zoo.path(label[4:].partition("@")[0], q)) if q else args.model
        ctx = context_of(model, args.ctx)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = compare(model, hw, ctx, args.policy, None if trace is None else trace.counts(), opts=opts,
                          yours=yours, progress=sys.stderr.isatty())
            if args.cache_slots:                            # expert-cache rows (moert/dynamic/compare.py)
                from moert.dynamic.compare import cache_rows

                got += cache_rows(model, hw, ctx, trace, args.cache_slots, args.cache_policy, args.policy, got)
        for r in got:
            r["quant"], r["strategy"] = q, (f"[{q}] " if q else "") + r["strategy"]
        rows += got
        models[q] = ctx
    if len(quants) > 1:                                     # one best over every quant, beyond the likely range
        choose(rows, "tg")
    best = next((r for r in rows if r["best"]), None)
    path = label
    if label.startswith("zoo:"):
        name = label[4:].partition("@")[0]
        path = f"{name}-{(best or {}).get('quant') or label.partition('@')[2] or zoo.TWINS[name].quant}.gguf"
    ctx = models[(best or {}).get("quant")] if best else models[quants[0]]
    run = commandline.run_flags(best["flags"], ctx, opts["ctk"], opts["fa"], opts["threads"],
                                args.ubatch_size) if best else []
    extra = (["-tb", str(args.threads_batch)] if args.threads_batch else []) + (["--no-mmap"] if args.no_mmap else [])
    extra += ["--numa", args.numa] if args.numa else []
    commands = {"llama-server": commandline.server_command(path, run + extra),      # moert run: one thread count
                "moert run": commandline.server_command(path, run, "moert run")} if best else {}
    ram_note = (f"RAM: {ram_gib:g} GiB ({'--ram' if opts['ram_gib'] else 'assumed: typical for the CPU; --ram'}"
                f" sets it), {opts['reserve_gib']:g} GiB kept for the OS; past it llama.cpp's mmap pages experts "
                f"from disk ({capacity.disk(opts['disk']).name}, --disk), as moert/cost/capacity.py models it")
    if hw.cpu.numa_nodes > 1:
        ram_note += (f"\nNUMA: {hw.cpu.numa_nodes} nodes, --numa {opts['numa']}" + (
            " (not given): the weights' pages sit on one node, so every core reads one node's memory; --numa "
            "distribute with the page cache dropped first reads all of it (hardware.numa_view)"
            if opts["numa"] == "none" else ""))
    if args.json:
        print(json.dumps(dict(model=label, hardware=hw.name, context=ctx, policy=args.policy, ram_gib=ram_gib,
                              numa=opts["numa"], numa_nodes=hw.cpu.numa_nodes,
                              disk=opts["disk"], fit_margin_mib=args.fit_margin, rows=rows, commands=commands,
                              extrapolating=extrapolating(rows), validation=VALIDATION), indent=1))
    else:
        print(f"{label} on {hw.name}, context {ctx}, pp{opts['n_prompt']} tg{opts['n_gen']} at depth "
              f"{opts['depth']}, prefill policy {args.policy}; predicted by moert.predict (llama.cpp-class "
              f"kernels at the efficiencies in moert/cost/hardware.py); VRAM keeps {args.fit_margin:g} MiB free "
              f"(--fit-margin)\n")
        if any(re.fullmatch(r"\d+ of \d+ layers on the CPU", r["strategy"]) for r in rows):
            print("no experts: placement is -ngl (the layers kept on the GPU)\n")
        _print_rows(rows, ram_note)
        if best:
            print(f"\nbest (*): {best['strategy']}: {best['why']}" + ("; = the rows it ties with" if best.get(
                "tied") else "") + f"\n  {commands['llama-server']}\n  {commands['moert run']}")
        else:
            print("\nnothing fits: give the GPU more memory, or a smaller context (-c)")
        print(f"how far to trust it: {trust()}")
        ex = extrapolating(rows)
        if ex:
            print(f"extrapolating (fewer than {MIN_FIGURES} published figures checked the model here, so the likely "
                  f"ranges above are wider: moert/cost/coverage.py):" + "".join(f"\n  {r}" for r in ex))
    if args.plot:
        from moert.plots import compare_bars

        print(f"plot: {compare_bars(rows, args.plot, f'{label} on {hw.name}')}", file=sys.stderr)
    return 0


def _on_off(v: str) -> str:
    if v not in ("on", "off", "auto"):
        raise argparse.ArgumentTypeError(f"expected on, off or auto, got {v!r}")
    return v


def add_commands(sub) -> None:
    """Register `compare` on the top-level subparsers."""
    from moert.cost import capacity
    from moert.cost.hardware import NUMA_MODES
    from moert.cost.predict import POLICIES

    c = sub.add_parser("compare", help="predicted speed of placement strategies on preset hardware",
                       allow_abbrev=False)
    c.add_argument("model", help="a .gguf file or zoo:NAME (a twin: moert.zoo)")
    c.add_argument("--hardware", default=None, help="preset parts joined by '+' (`moert hardware list`), any of "
                   "them a .json file of a part, or one .json file of the whole machine (moert/cost/machines.py)")
    c.add_argument("--gpu-mem", default=None, metavar="SIZE[,SIZE]", help="override the GPUs' memory, e.g. 8GiB")
    c.add_argument("-c", "--ctx", "--ctx-size", dest="ctx", type=int, default=4096,
                   help="context the KV cache is sized for (default 4096; 0: the model's own, as llama.cpp)")
    c.add_argument("--policy", choices=POLICIES, default="llama.cpp", help="prefill op-offload policy")
    y = c.add_argument_group("your setup (llama.cpp's flags; any of them adds a 'yours' row)")
    y.add_argument("-ot", "--override-tensor", action="append", default=[], metavar="PATTERN=DEVICE,...")
    y.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="gpu_layers", type=int, default=None)
    y.add_argument("-cmoe", "--cpu-moe", action="store_true")
    y.add_argument("-ncmoe", "--n-cpu-moe", type=int, default=None, metavar="N")
    y.add_argument("-t", "--threads", type=int, default=None, help="threads (default: the CPU's cores)")
    y.add_argument("-tb", "--threads-batch", type=int, default=None, help="threads for the prompt (default: -t)")
    y.add_argument("-ub", "--ubatch-size", type=int, default=None, help="physical batch (default 512)")
    y.add_argument("--numa", choices=NUMA_MODES[1:], default=None, help="as llama.cpp, on a CPU of several NUMA "
                   "nodes ('2x epyc-9374f'): distribute, isolate or numactl (one node); not given: every core reads "
                   "one node's memory (moert/cost/hardware.py numa_view)")
    y.add_argument("-ctk", "--cache-type-k", choices=sorted(KV_BYTES), default="f16", help="KV cache type (f16)")
    y.add_argument("-fa", "--flash-attn", type=_on_off, default="on",
                   help="flash attention (on; llama.cpp's CPU attention kernels depend on it)")
    y.add_argument("--depth", type=int, default=0, help="KV position the tests start at (llama-bench -d)")
    y.add_argument("-n", "--n-predict", type=int, default=128, help="tokens decoded (tg, default 128)")
    y.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (pp, default 512)")
    m = c.add_argument_group("capacity (moert/cost/capacity.py)")
    m.add_argument("--ram", default=None, metavar="SIZE", help="installed RAM, e.g. 64GiB (default: typical for "
                   "the CPU's memory channels, said so)")
    m.add_argument("--os-reserve", type=float, default=capacity.OS_RESERVE_GIB, metavar="GiB",
                   help=f"RAM kept by the OS and other programs (default {capacity.OS_RESERVE_GIB:g})")
    m.add_argument("--disk", choices=sorted(capacity.DISKS), default=capacity.DEFAULT_DISK,
                   help="the drive the model is paged from when it does not fit in RAM")
    m.add_argument("--no-mmap", action="store_true", help="as llama.cpp: load into RAM, so it must fit")
    m.add_argument("--fit-margin", type=float, default=1024.0, metavar="MiB",
                   help="VRAM kept free per GPU, as llama.cpp's --fit-target (default 1024)")
    c.add_argument("--quant", default=None, metavar="Q[,Q...]", help="zoo twins: compare these quant mixes "
                   "(moert/cost/quant_mix.py), e.g. Q4_K_M,Q8_0")
    c.add_argument("--trace", default=None, metavar="FILE", help="a routing trace of the model (moert run --trace, "
                   "or a llama-moe-trace CSV): adds the hot-experts row; what --cache-slots replays")
    c.add_argument("--cache-slots", default=None, metavar="N[,N]", type=lambda v: [int(x) for x in v.split(",")],
                   help="rows for an expert cache of N experts per layer on GPU 0 over --cpu-moe, predicted on "
                        "--trace (moert/dynamic)")
    c.add_argument("--cache-policy", default=["lru"], type=lambda v: v.split(","), metavar="P[,P]",
                   help="the cache rows' policies: lru, lfu, lfru, static (default lru)")
    c.add_argument("--json", action="store_true", help="print JSON (stdout is JSON only)")
    c.add_argument("--plot", default=None, metavar="PNG", help="bars of predicted pp and tg per strategy")
    c.add_argument("--cluster", default=None, metavar="SPEC", help="several hosts instead, each a machine with its "
                   "RAM, e.g. '4x(epyc-9354+ram-192GiB)' (the first is the head; moert/cost/cluster.py)")
    c.add_argument("--net", default="25gbe", metavar="NAME", help="the network between --cluster's hosts: 1gbe, "
                   "10gbe, 25gbe (default), 100gbe, ib-hdr")
    c.set_defaults(func=cmd_compare)


__all__ = ["add_commands", "cmd_compare", "compare", "context_of", "extrapolating"]
