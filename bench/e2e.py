"""End to end: moert vs llama.cpp on one Qwen3-30B-A3B-shaped file, every expert on the CPU, same threads.

    python bench/e2e.py [--layers 3] [--threads 2] [--prompt 64] [--decode 32] [--rounds 3] [--json out.json]
    python bench/e2e.py --act-quant none,int8        # float and int8-activation moert, both vs llama.cpp
    python bench/e2e.py ... --plot e2e.png           # and a bar chart of the table
    python bench/e2e.py --model any.gguf ...         # measure another GGUF instead of the built one
    python bench/e2e.py --llama-quantized ...        # the built shapes, quantized by llama.cpp (Q4_K_M from F16)
    python bench/e2e.py --shapes gpt-oss-20b ...     # a gpt-oss-20b-shaped MXFP4_MOE file instead (built once)
    python bench/e2e.py --overhead                   # Python overhead per decoded token per layer (tiny models)
    python bench/e2e.py -d 0,4096,16384,32768        # pp and tg at depth, as llama-bench -d (e2e_depth.py)
    python bench/e2e.py --full --act-quant none,int8  # the full 48-layer Qwen3-30B-A3B Q4_K_M twin (18.6 GB, random
                                                      # valid blocks: moert twin; written once into the zoo cache)

The benchmark model has Qwen3-30B-A3B's layer shapes (hidden 2048, 128 experts, 8 used, expert FFN 768,
32 query heads, 4 KV heads, head dim 128) but few layers and a 4096-token vocabulary without a
tokenizer (token ids in, logits out), quantized like llama.cpp's Q4_K_M (Q4_K; Q6_K for attn_v and
ffn_down) by moert's own quantizer. It is built once into moert's cache dir (`moert.demo.cache_dir()`).
`--shapes gpt-oss-20b`: gpt-oss-20b's layer shapes instead (hidden 2880, 32 experts, 4 used, expert FFN 2880,
64 query heads, 8 KV heads, head dim 64, sliding window 128, YaRN, attention sinks, biases), as llama.cpp's
MXFP4_MOE lays it out (experts MXFP4, every other matrix Q8_0): two quantized experts per tensor, tiled to 32
(the bytes, not the values, set the speed; routing is whatever the random router picks).

Each round runs prompt processing (a `--prompt`-token prompt from an empty context) then `--decode`
single-token steps, first in moert and then in llama.cpp (llama-cpp-python, when installed), in the same
process with the same thread count; the engines alternate every round and take turns going first, with a
pause between them so neither's spinning worker threads steal the other's cores. Reported: best and
median over rounds, tokens/s, effective GB/s (weight bytes a token must read / time per token) and
moert / llama.cpp. One table at the end; --json writes everything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from moert.bench import bytes_per_token  # weight bytes one decoded token reads (shared with `moert bench`)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import MODEL_VERSION, SHAPES  # noqa: E402

GPT_OSS = dict(D=2880, H=64, Hkv=8, Dh=64, E=32, K=4, F=2880, V=4096, ctx=4096, window=128, seed=20)


def gptoss_model_path(layers: int) -> Path:
    """The gpt-oss-20b-shaped benchmark model (MXFP4 experts, Q8_0 elsewhere), written on first use (about 450
    MB per layer)."""
    from moert.demo import cache_dir

    path = cache_dir() / f"bench-gpt-oss-20b-shapes-L{layers}-v{MODEL_VERSION}.gguf"
    if not path.exists():
        print(f"building {path} ({layers} layers) ...", flush=True)
        write_gptoss_shapes(path, layers)
    return path


def write_gptoss_shapes(path: Path, n_layer: int) -> None:
    """gpt-oss-20b's layers with random weights, written with gguf-py (raw MXFP4 / Q8_0 bytes by moert's quantizer)."""
    import gguf

    from moert.quants import quantize

    s, a = GPT_OSS, "gpt-oss"
    rng = np.random.default_rng(s["seed"])
    D, H, Hk, Dh, E, F, V = s["D"], s["H"], s["Hkv"], s["Dh"], s["E"], s["F"], s["V"]
    w = gguf.GGUFWriter(str(path) + ".tmp", a)
    for k, v in {"block_count": n_layer, "context_length": s["ctx"], "embedding_length": D, "feed_forward_length": F,
                 "expert_feed_forward_length": F, "expert_count": E, "expert_used_count": s["K"],
                 "attention.head_count": H, "attention.head_count_kv": Hk, "attention.key_length": Dh,
                 "attention.value_length": Dh, "attention.sliding_window": s["window"], "vocab_size": V,
                 "rope.scaling.original_context_length": 4096}.items():
        w.add_uint32(f"{a}.{k}", v)
    for k, v in {"attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 150000.0, "rope.scaling.factor": 32.0,
                 "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0}.items():
        w.add_float32(f"{a}.{k}", v)
    w.add_string(f"{a}.rope.scaling.type", "yarn")
    w.add_string("tokenizer.ggml.model", "none")

    def q8(*shape):
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[-1] ** -0.5)
        return quantize(x, "Q8_0"), gguf.GGMLQuantizationType.Q8_0

    def exps(rows, cols):                               # two experts, tiled to E
        two = quantize(rng.standard_normal((2, rows, cols), dtype=np.float32) * np.float32(cols ** -0.5), "MXFP4")
        return np.ascontiguousarray(np.tile(two, (E // 2, 1, 1))), gguf.GGMLQuantizationType.MXFP4

    def f32(*shape, base=0.0):
        return (base + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32), None

    tensors = [("token_embd.weight", q8(V, D))]
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", f32(D, base=1.0)), (b + "post_attention_norm.weight", f32(D, base=1.0)),
                    (b + "attn_q.weight", q8(H * Dh, D)), (b + "attn_k.weight", q8(Hk * Dh, D)),
                    (b + "attn_v.weight", q8(Hk * Dh, D)), (b + "attn_output.weight", q8(D, H * Dh)),
                    (b + "attn_q.bias", f32(H * Dh)), (b + "attn_k.bias", f32(Hk * Dh)),
                    (b + "attn_v.bias", f32(Hk * Dh)), (b + "attn_output.bias", f32(D)),
                    (b + "attn_sinks.weight", f32(H)),
                    (b + "ffn_gate_inp.weight", f32(E, D)), (b + "ffn_gate_inp.bias", f32(E)),
                    (b + "ffn_gate_exps.weight", exps(F, D)), (b + "ffn_up_exps.weight", exps(F, D)),
                    (b + "ffn_down_exps.weight", exps(D, F)), (b + "ffn_gate_exps.bias", f32(E, F)),
                    (b + "ffn_up_exps.bias", f32(E, F)), (b + "ffn_down_exps.bias", f32(E, D))]
    tensors += [("output_norm.weight", f32(D, base=1.0)), ("output.weight", q8(V, D))]
    for name, (data, qtype) in tensors:
        w.add_tensor(name, data, raw_dtype=qtype) if qtype is not None else w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    Path(str(path) + ".tmp").replace(path)


def full_twin_path() -> Path:
    """The full 48-layer Qwen3-30B-A3B Q4_K_M twin with random valid blocks (moert/cost/zoo_data.py), written into
    the zoo cache on first use with a progress bar; llama.cpp loads it too (its tokenizer model is "none")."""
    from tqdm import tqdm

    from moert.cost import zoo, zoo_data

    path = zoo.cache_dir() / "qwen3-30b-a3b-Q4_K_M-materialized.gguf"
    if not path.exists():
        with tqdm(total=0, unit="B", unit_scale=True, desc=f"writing {path.name}") as bar:
            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)
            zoo_data.materialize("qwen3-30b-a3b", "Q4_K_M", path, progress=progress)
    return path


def model_path(layers: int) -> Path:
    """The benchmark model, written on first use (about 390 MB and 30 s per layer)."""
    from moert.demo import cache_dir
    from moert.testing import write_qwen3moe

    path = cache_dir() / f"bench-qwen3moe-a3b-shapes-L{layers}-v{MODEL_VERSION}.gguf"
    if not path.exists():
        print(f"building {path} ({layers} layers) ...", flush=True)
        t0 = time.perf_counter()
        write_qwen3moe(path, n_layer=layers, **SHAPES)
        print(f"built in {time.perf_counter() - t0:.0f} s, {path.stat().st_size / 1e9:.2f} GB", flush=True)
    return path


# ---------------------------------------------------------------------------------------------- engines

class Moert:
    def __init__(self, path: Path, threads: int, n_ctx: int, experts: str, act_quant: str = "none"):
        import moert

        self.name = "moert" if act_quant == "none" else f"moert {act_quant}"
        repack = act_quant == "int8r"                     # int8 with the CPU Q4_K weights repacked at load
        act_quant = "int8" if repack else act_quant

        if experts == "grouped":                          # for comparison only: the pre-fused CPU path
            import moert.model as mm
            mm.fused_supports = lambda *qs: False
        t0 = time.perf_counter()
        self.m = moert.load(path, gpu_layers=0, threads=threads, context_size=n_ctx, progress=False,
                            act_quant=act_quant, repack=repack)
        self.load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.m.forward([1])                               # cold start: JIT cache load + first touch
        self.first_token_s = time.perf_counter() - t0
        self.m.reset()

    def prompt(self, tokens):
        self.m.reset()
        return self.m.forward(np.asarray(tokens), last_only=True)[-1]   # as llama.cpp: the last logits only

    def step(self, token):
        return self.m.forward(np.asarray([token]))[-1]


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path: Path, threads: int, n_ctx: int, n_batch: int):
        import llama_cpp

        self.lc = llama_cpp
        t0 = time.perf_counter()
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                                   n_batch=n_batch, n_ubatch=n_batch, n_gpu_layers=0, use_mmap=True,
                                   verbose=False)
        self.load_s = time.perf_counter() - t0
        self.first_token_s = float("nan")
        self.info = llama_cpp.llama_print_system_info().decode().strip()
        self.version = getattr(llama_cpp, "__version__", "?")

    def _logits(self):
        n = self.llm.n_vocab()
        p = self.lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(p, shape=(n,)).copy()

    def prompt(self, tokens):
        self.llm.reset()                                  # eval() then drops the cache past n_tokens = 0
        self.llm.eval(list(map(int, tokens)))
        return self._logits()

    def step(self, token):
        self.llm.eval([int(token)])
        return self._logits()


def run_round(engine, prompt, n_decode: int) -> tuple[float, list[float], np.ndarray]:
    """(prompt seconds, per-step decode seconds, logits after the prompt)."""
    t0 = time.perf_counter()
    logits = engine.prompt(prompt)
    pp = time.perf_counter() - t0
    steps, tok = [], int(np.argmax(logits))
    for _ in range(n_decode):
        t0 = time.perf_counter()
        out = engine.step(tok)
        steps.append(time.perf_counter() - t0)
        tok = int(np.argmax(out))
    return pp, steps, logits


# ---------------------------------------------------------------------------------------------- profile

def profile_decode(m, token: int = 7, steps: int = 8) -> dict:
    """moert's decode step: ms per phase (moert's own stats) of the fastest of `steps`, and the top
    Python functions (cProfile) over the same steps. A fused layer's time is the phase "layer" (moert/fused.py;
    Model.fused_decode = False splits it into attention, router, experts)."""
    import cProfile
    import io
    import pstats

    time.sleep(0.3)
    m.reset()
    m.forward(np.arange(1, 33))                                     # a 32-token context, as mid-conversation
    best = None
    pr = cProfile.Profile()
    for _ in range(steps):
        m.forward(np.asarray([token]))
        last = m.stats.last
        if best is None or last.seconds < best.seconds:
            best = last
    pr.enable()
    for _ in range(steps):
        m.forward(np.asarray([token]))
    pr.disable()
    phases = {p: round(best.phase_seconds(p) * 1e3, 2) for p in ("embed", "attention", "router", "experts",
                                                                  "layer", "transfers", "output")}
    phases["total"] = round(best.seconds * 1e3, 2)
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
    return dict(phases_ms=phases, cprofile_top=s.getvalue())


def python_overhead(threads: int, steps: int = 64) -> dict:
    """Seconds per decoded token per layer on tiny models (2 and 10 layers, 64 wide, 8 experts, Q8_0, so
    the kernels cost microseconds): the slope between them is what each layer's Python costs."""
    import moert
    from moert.demo import cache_dir
    from moert.testing import write_qwen3moe

    per_token = {}
    for L in (2, 10):
        p = cache_dir() / f"bench-tiny-qwen3moe-L{L}-v{MODEL_VERSION + 2}.gguf"
        if not p.exists():
            write_qwen3moe(p, n_layer=L, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8,
                           n_expert_used=2, n_ff_exp=64, n_vocab=256, qtype="Q8_0")
        m = moert.load(p, gpu_layers=0, threads=threads, context_size=512, progress=False)
        m.forward(np.arange(1, 9))
        ts = common.times(lambda m=m: m.forward(np.asarray([3])), rounds=steps, warmup=8)
        per_token[L] = statistics.median(ts)
        m.close()
    slope = (per_token[10] - per_token[2]) / 8
    return dict(threads=threads, per_token_ms={L: round(v * 1e3, 3) for L, v in per_token.items()},
                per_layer_ms=round(slope * 1e3, 4))


# ------------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GGUF to measure instead of the built benchmark model")
    ap.add_argument("--shapes", choices=["qwen3-30b-a3b", "gpt-oss-20b"], default="qwen3-30b-a3b",
                    help="the built model's layer shapes (gpt-oss-20b: MXFP4_MOE)")
    ap.add_argument("--layers", type=int, default=3, help="layers of the built model (390 MB each)")
    ap.add_argument("--full", action="store_true", help="the full-size Qwen3-30B-A3B Q4_K_M twin (48 layers, 18.6 GB; "
                    "written once, about 140 s at this box's disk speed), not --layers of the built model")
    ap.add_argument("--llama-quantized", action="store_true",
                    help="the built model quantized by llama.cpp (Q4_K_M from F16, via llama-cpp-python), not moert")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=32, help="decoded tokens per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--experts", choices=["default", "grouped"], default="default",
                    help="moert's CPU expert kernel: the default (kernels/moe_fused.py) or the grouped "
                         "per-expert path (kernels/moe.py) it replaced")
    ap.add_argument("--no-llama", action="store_true", help="moert only")
    ap.add_argument("--no-moert", action="store_true", help="llama.cpp only (e2e_full.py runs each engine in a "
                    "process of its own: both do not fit in memory with the full-size file)")
    ap.add_argument("--act-quant", default="none", type=lambda s: s.split(","),
                    help="moert's activation modes, comma-separated, each its own engine in the same run: none "
                         "(float, the default), int16, int8 (opt-in kernels/matmul_q.py), int8r (int8 with Q4_K "
                         "repacked at load, kernels/repack.py), e.g. none,int8")
    ap.add_argument("--overhead", action="store_true", help="also measure Python overhead per token per layer")
    ap.add_argument("--profile", action="store_true", help="also profile one moert decode step")
    ap.add_argument("--json", type=Path, help="write all results here")
    ap.add_argument("--plot", type=Path, help="write a bar chart of pp and decode tokens/s per engine (PNG)")
    ap.add_argument("-d", "--depth", type=lambda s: [int(v) for v in s.split(",")], help="depths: e2e_depth.py")
    ap.add_argument("--variants", default="", type=lambda s: [v for v in s.split(",") if v], help="with -d: "
                    "moert engines with a kernel choice off, each in turn: one-thread-attention, no-tiles")
    args = ap.parse_args(argv)

    if args.full:
        path = args.model or full_twin_path()
    elif args.llama_quantized:
        from llama_quantized import llama_quantized_path
        path = args.model or llama_quantized_path(args.layers, args.threads)
    else:
        path = args.model or (gptoss_model_path if args.shapes == "gpt-oss-20b" else model_path)(args.layers)
    n_ctx = args.prompt + args.decode + 64 + max(args.depth or [0])   # + room for the profiled steps
    sizes = bytes_per_token(path)
    mach = common.machine(args.threads)

    for aq in args.act_quant:
        if aq not in ("none", "int16", "int8", "int8r"):
            ap.error(f"--act-quant: {aq!r} is not one of none, int16, int8, int8r")
    engines = [] if args.no_moert else [Moert(path, args.threads, n_ctx, args.experts, aq) for aq in args.act_quant]
    moerts = [e.name for e in engines]
    llama_note = ""
    if not args.no_llama:
        try:
            engines.append(LlamaCpp(path, args.threads, n_ctx, n_batch=max(args.prompt, 1)))
        except ImportError:
            llama_note = "llama-cpp-python is not installed: moert only"
    if not engines:
        ap.error("no engine to run: --no-moert needs llama-cpp-python (and no --no-llama)")
    n_vocab = engines[0].m.n_vocab if moerts else engines[0].llm.n_vocab()
    n_ids = max(min(4000, n_vocab - 10), 1)                    # --model: a smaller vocabulary than the built one
    prompt = (np.arange(args.prompt) * 7919 % n_ids + 10).tolist()
    if args.depth:                                               # the sweep, its table and plot: e2e_depth.py
        import e2e_depth
        return e2e_depth.sweep(args, path, engines, len(moerts), lambda: Moert(path, args.threads, n_ctx, args.experts,
                               args.act_quant[0]), llama_note, n_ids, mach)
    res: dict[str, dict] = {e.name: dict(pp=[], tg=[], load_s=e.load_s, first_token_s=e.first_token_s)
                            for e in engines}
    logits = {}
    for r in range(args.rounds):
        order = engines if r % 2 == 0 else engines[::-1]
        for e in order:
            time.sleep(0.3)                                   # let the other engine's threads go idle
            pp, steps, lg = run_round(e, prompt, args.decode)
            res[e.name]["pp"].append(pp)
            res[e.name]["tg"].append(statistics.median(steps))
            logits[e.name] = lg
            print(f"round {r + 1} {e.name:9s}: pp{args.prompt} {args.prompt / pp:7.1f} tok/s, "
                  f"decode {1 / statistics.median(steps):6.1f} tok/s", flush=True)

    for e in engines:
        if e.name in moerts:
            res[e.name]["profile"] = profile_decode(e.m)
    if args.overhead and moerts:
        res[moerts[0]]["python_overhead"] = [python_overhead(n) for n in sorted({1, args.threads})]

    rows = []
    for name, d in res.items():
        pp_b, pp_m = common.best_median(d["pp"])
        tg_b, tg_m = common.best_median(d["tg"])
        d.update(pp_tok_s=args.prompt / pp_m, pp_tok_s_best=args.prompt / pp_b, tg_tok_s=1 / tg_m,
                 tg_tok_s_best=1 / tg_b, tg_GBps=sizes["decode"] / tg_m / 1e9,
                 tg_bw_fraction=sizes["decode"] / tg_m / 1e9 / mach["bw_GBps"])
        rows.append([name, f"{d['pp_tok_s']:.1f} ({d['pp_tok_s_best']:.1f})",
                     f"{d['tg_tok_s']:.2f} ({d['tg_tok_s_best']:.2f})",
                     f"{d['tg_GBps']:.2f}", f"{d['tg_bw_fraction']:.0%}", f"{d['load_s']:.2f}",
                     f"{d['first_token_s']:.2f}"])
    ratios = {}                                               # per moert engine, vs llama.cpp
    for name in moerts if "llama.cpp" in res else []:
        m, ll = res[name], res["llama.cpp"]
        r = ratios[name] = dict(pp=m["pp_tok_s"] / ll["pp_tok_s"], tg=m["tg_tok_s"] / ll["tg_tok_s"],
                                pp_best=m["pp_tok_s_best"] / ll["pp_tok_s_best"],
                                tg_best=m["tg_tok_s_best"] / ll["tg_tok_s_best"])
        rows.append([f"{name} / llama.cpp", f"{r['pp']:.2f}x ({r['pp_best']:.2f}x)",
                     f"{r['tg']:.2f}x ({r['tg_best']:.2f}x)", "", "", "", ""])
        a, b = logits[name], logits["llama.cpp"]
        r["logits_corr"] = float(np.corrcoef(a, b)[0, 1])
        r["same_argmax"] = bool(np.argmax(a) == np.argmax(b))

    print()
    print(f"# moert vs llama.cpp, {path.name}: {sizes['file'] / 1e9:.2f} GB file, "
          f"{sizes['decode'] / 1e6:.1f} MB read per decoded token ({sizes['experts_per_token'] / 1e6:.1f} MB experts)")
    print(f"# {common.machine_line(mach)}")
    print(f"# every tensor on the CPU, {args.threads} threads; moert experts: {args.experts}; "
          f"median of {args.rounds} rounds (best in parentheses); decode = median step of {args.decode}")
    if "llama.cpp" in res:
        print(f"# llama-cpp-python {engines[-1].version}: {engines[-1].info}")
    if llama_note:
        print(f"# {llama_note}")
    print(common.table(["engine", f"pp{args.prompt} tok/s", "decode tok/s", "decode GB/s", "of bandwidth",
                        "load s", "first token s"], rows))
    for name, r in ratios.items():
        print(f"# last prompt's logits, {name} vs llama.cpp: correlation {r['logits_corr']:.4f}, "
              f"same argmax: {r['same_argmax']}")
    for name in moerts:
        print(f"# {name} decode step, ms per phase: {res[name]['profile']['phases_ms']}")
    for o in (res[moerts[0]].get("python_overhead", []) if moerts else []):
        print(f"# Python overhead per decoded token per layer, {o['threads']} thread(s): {o['per_layer_ms']} ms "
              f"(tiny Q8_0 models; ms per token with 2 and 10 layers: {o['per_token_ms']})")
    if args.profile:
        for name in moerts:
            print(f"# {name}:\n{res[name]['profile']['cprofile_top']}")
    print(f"# command: {common.command()}")
    out = dict(machine=mach, model=str(path), sizes=sizes, args={k: str(v) for k, v in vars(args).items()},
               results={k: {kk: vv for kk, vv in v.items()} for k, v in res.items()}, ratio=ratios)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    if args.plot:
        from moert.plots import speed_bars
        speeds = {k: {f"pp{args.prompt}": v["pp_tok_s"], "decode": v["tg_tok_s"]} for k, v in res.items()}
        speed_bars(speeds, args.plot, baseline="llama.cpp" if "llama.cpp" in res else None,
                   title=f"{path.name}, {args.threads} threads, median of {args.rounds} rounds")
        print(f"# plot: {args.plot}")
    return out


if __name__ == "__main__":
    main()
