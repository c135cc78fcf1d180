"""llama.cpp's CPU flash attention at depth, read as FLOPs a core-cycle: what moert.cost's attention terms for llama.cpp
are read from (moert/cost/kinds.py, LLAMA_CPU_ATTN_*).

    python bench/llama_cpu_attention.py [--kv f16,q8_0] [-d 0,4096,16384] [--prompt 512] [--decode 16] [--json OUT]
    PYTHONPATH=/path/to/an/older/llama_cpp python bench/llama_cpu_attention.py ...   # another build, same table
    python bench/llama_cpu_attention.py --sweep-bench PATH/llama-sweep-bench ...      # ik_llama.cpp's (or any) binary

llama.cpp's file of the e2e benchmark's Qwen3-30B-A3B-shaped layers (`bench/e2e.py --llama-quantized` writes it:
6 layers, 32 query / 4 KV heads of 128), every tensor on the CPU, flash attention on, one KV cache type per engine
(`--kv`: f16, q8_0 for K and V). Per depth (ascending), each engine's context is filled once; then each round
rewinds it to the depth and times a `--prompt`-token prompt (pp) and `--decode` one-token steps (tg), engines
alternating. The attention's share is what depth adds: (time at depth - time at depth 0) / layers, against its
FLOPs, 2 x tokens x n_kv x H x (Dk + Dv) a layer (n_kv the mean position over the timed tokens), divided by threads x
the clock /proc/cpuinfo states (a VM's clock under load is not visible: an assumption, said in the table).

ggml's CPU kernel behind it (ggml-cpu/ops.cpp, ggml_compute_forward_flash_attn_ext_f16) changed with the build:
before llama.cpp PR 19012 ("ggml-cpu: Use tiled FA for prompt-processing", 2026-01-22) every query row ran the
one-query kernel (a vec_dot of each key, an online-softmax step, a vec_mad of each value); after it a prompt of 64+
rows runs `flash_attn_ext_tiled` (Q x K and P x V as SIMD GEMM tiles), but only with K and V both F16 or F32: a
q8_0 cache still takes the one-query kernel. The table says which llama_cpp (its version) ran. With --sweep-bench,
a llama-sweep-bench binary (ik_llama.cpp's, whose CPU flash attention is its own iqk kernel) runs the same file with
-fa, `--sweep-stride` rows at each depth and `--output-format jsonl`, once per cache type; the same columns follow.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common

KV_TYPES = {"f16": 1, "q8_0": 8}          # GGML_TYPE_F16, GGML_TYPE_Q8_0
KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32}


def _clock_ghz() -> float:
    """The clock /proc/cpuinfo states (the first core's 'cpu MHz'), GHz."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1000
    raise SystemExit("no 'cpu MHz' line in /proc/cpuinfo")


def _engine(path, kv: str, n_ctx: int, threads: int, batch: int):
    import llama_cpp

    t = KV_TYPES[kv]
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=batch, n_ubatch=batch, n_threads=threads,
                           n_threads_batch=threads, flash_attn=True, type_k=t, type_v=t, n_gpu_layers=0,
                           verbose=False, logits_all=False)


def _ids(n: int, start: int, n_vocab: int) -> list[int]:
    return [(start + i) * 4567 % (n_vocab - 20) + 10 for i in range(n)]


def _fill(llm, depth: int, n_vocab: int, batch: int) -> None:
    """The context continued up to `depth` tokens (from where it is)."""
    while llm.n_tokens < depth:
        n = min(batch, depth - llm.n_tokens)
        llm.eval(_ids(n, llm.n_tokens, n_vocab))


def _pp(llm, depth: int, n: int, n_vocab: int) -> float:
    llm.n_tokens = depth
    t0 = time.perf_counter()
    llm.eval(_ids(n, 100_000, n_vocab))
    return time.perf_counter() - t0


def _tg(llm, depth: int, n: int, n_vocab: int) -> float:
    llm.n_tokens = depth
    t0 = time.perf_counter()
    for i in range(n):
        llm.eval([_ids(1, 200_000 + i, n_vocab)[0]])
    return time.perf_counter() - t0


def sweep(args) -> dict:
    """{kv: {depth: {"pp": seconds, "tg": seconds}}} from a llama-sweep-bench binary's jsonl rows (-fa on)."""
    import subprocess

    from llama_quantized import llama_quantized_path

    path = args.model or llama_quantized_path(6, args.threads)
    step = args.prompt
    if any(d % step for d in args.depth):
        raise SystemExit(f"--sweep-bench measures every u-batch ({step} tokens): depths must be multiples of it")
    stride = max(1, min(d // step for d in args.depth if d) if any(args.depth) else 1)
    out: dict = {}
    for kv in args.kv:
        cmd = [args.sweep_bench, "-m", str(path), "-c", str(max(args.depth) + step), "-b", str(step), "-ub",
               str(step), "-n", str(args.decode), "-t", str(args.threads), "-fa", "on", "-ctk", kv, "-ctv", kv,
               "--sweep-stride", str(stride), "--output-format", "jsonl"]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        text = done.stdout + "\n" + done.stderr          # ik_llama.cpp's build prints its jsonl rows to stderr
        rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        out[kv] = {r["n_kv"]: {"pp": [r["t_pp"]], "tg": [r["t_tg"]]} for r in rows if r["n_kv"] in args.depth}
    return {"results": out, "path": path, "engine": f"llama-sweep-bench ({args.sweep_bench})"}


def measure(args) -> dict:
    import llama_cpp
    from llama_quantized import llama_quantized_path

    path = args.model or llama_quantized_path(6, args.threads)
    depths = sorted(set(args.depth))
    if args.sweep_bench:
        got = sweep(args)
        return _table(args, got["results"], depths, _shape(path), got["engine"], path)
    n_ctx = max(depths) + max(args.prompt, args.decode) + 64
    engines = {kv: _engine(path, kv, n_ctx, args.threads, args.prompt) for kv in args.kv}
    first = next(iter(engines.values()))
    n_vocab = first.n_vocab()
    shape = _shape(path)
    for _ in range(2):                                # warm-up, untimed: twice the timed work at depth 0
        for llm in engines.values():
            _pp(llm, 0, args.prompt, n_vocab)
            _tg(llm, 0, args.decode, n_vocab)
    res: dict = {kv: {} for kv in engines}
    for d in depths:
        for llm in engines.values():
            llm.n_tokens = min(llm.n_tokens, d)
            _fill(llm, d, n_vocab, args.prompt)
        for r in range(args.rounds):
            order = list(engines.items())
            for kv, llm in order if r % 2 == 0 else order[::-1]:
                cell = res[kv].setdefault(d, {"pp": [], "tg": []})
                cell["pp"].append(_pp(llm, d, args.prompt, n_vocab))
                cell["tg"].append(_tg(llm, d, args.decode, n_vocab))
    return _table(args, res, depths, shape, f"llama_cpp {llama_cpp.__version__}", path)


def _shape(path) -> dict:
    """Layers and attention heads of the GGUF at `path` (moert's reader: no engine needed)."""
    from moert import gguf

    md = gguf.open(str(path)).metadata
    arch = md["general.architecture"]
    return {"layers": int(md[f"{arch}.block_count"]), "H": int(md[f"{arch}.attention.head_count"]),
            "Hkv": int(md[f"{arch}.attention.head_count_kv"]), "Dk": int(md[f"{arch}.attention.key_length"]),
            "Dv": int(md[f"{arch}.attention.value_length"])}


def _table(args, res: dict, depths: list[int], shape: dict, engine: str, path) -> dict:
    """The attention's FLOPs a core-cycle per cache type and depth from {kv: {depth: {"pp": [s], "tg": [s]}}}."""
    ghz = _clock_ghz()
    rows, out = [], {"llama_cpp": engine, "model": str(path), "shape": shape, "threads": args.threads,
                     "ghz_stated": ghz, "prompt": args.prompt, "decode": args.decode, "kv": {}}
    for kv, by_depth in res.items():
        out["kv"][kv] = {}
        base = {m: statistics.median(by_depth[depths[0]][m]) for m in ("pp", "tg")}
        for d in depths:
            cell = {}
            for m, n in (("pp", args.prompt), ("tg", args.decode)):
                t = statistics.median(by_depth[d][m])
                n_kv = d + (n - 1) / 2        # the mean position the timed tokens attend from
                flops = 2 * n * n_kv * shape["H"] * (shape["Dk"] + shape["Dv"]) * shape["layers"]
                extra = t - base[m]
                fpc = flops / extra / (args.threads * ghz * 1e9) if d > depths[0] and extra > 0 else None
                cell[m] = {"tok_s": n / t, "s": t, "attention_s": extra, "flops": flops, "flops_per_core_cycle": fpc}
            out["kv"][kv][d] = cell
            rows.append([kv, d, f"{cell['pp']['tok_s']:.1f}", _f(cell["pp"]["flops_per_core_cycle"]),
                         f"{cell['tg']['tok_s']:.1f}", _f(cell["tg"]["flops_per_core_cycle"])])
    out["table"] = common.table(["KV", "depth", f"pp{args.prompt} t/s", "pp attention FLOPs/core-cycle",
                                 f"tg{args.decode} t/s", "tg attention FLOPs/core-cycle"], rows)
    return out


def _f(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="a GGUF instead of the e2e benchmark's llama.cpp-quantized 6-layer file")
    p.add_argument("--kv", type=lambda s: s.split(","), default=["f16", "q8_0"], help="KV cache types: f16,q8_0")
    p.add_argument("-d", "--depth", type=lambda s: [int(x) for x in s.split(",")], default=[0, 4096, 16384])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--decode", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--sweep-bench", help="a llama-sweep-bench binary to run instead of llama-cpp-python")
    args = p.parse_args(argv)
    bad = [k for k in args.kv if k not in KV_TYPES]
    if bad or 0 not in args.depth:
        raise SystemExit(f"--kv takes {', '.join(KV_TYPES)}; -d must include 0 (got {args.kv}, {args.depth})")
    out = measure(args)
    out["machine"] = common.machine(args.threads, with_bandwidth=False)
    print(common.machine_line(out["machine"]))
    print(f"# {out['llama_cpp']}, {out['threads']} threads, clock as /proc/cpuinfo states: "
          f"{out['ghz_stated']:.3f} GHz; command: {common.command()}")
    print(out.pop("table"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
