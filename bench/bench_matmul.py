"""Fused dequantize-and-dot throughput per type: matrix x vector and matrix x batch, vs NumPy and gguf-py.

    pytest bench/bench_matmul.py --benchmark-enable            # pytest-benchmark; GB/s etc. in extra_info
    python bench/bench_matmul.py [--rows 16384 --cols 8192] [--rounds 5] [--types Q4_K,Q6_K] [--json f]
    python bench/bench_matmul.py --asm                          # vector instructions in the hot loops

Rows "int16" and "int8" are the opt-in quantized-activation kernels (kernels/matmul_q.py, act_quant="int16"
(one token) / "int8" (any batch; needs AVX2)) for the types that have them, "int8r" the int8 kernels over
Q4_K repacked at load (kernels/repack.py; GB/s still counts the file's bytes), measured in the same run as
the float rows. MXFP4 (gpt-oss's experts, kernels/mxfp4.py) and Q8_0 (kernels/q8_0.py) have int8 rows with x
rounded per 32, as llama.cpp's.

GB/s counts the weight bytes the kernel streams (quantized, as stored); a matrix of 16384 x 8192 is larger
than any last-level cache here (Q4_K: 75 MB), so matvec figures are from memory, as in decode. The
"of 1-thread BW" column divides the 1-thread figure by this machine's measured 1-thread read bandwidth
(bench/bandwidth.py). Baselines: "reference" is moert's NumPy dequantizer then x @ W.T (the kernels'
twin), "gguf-py" is gguf.quants.dequantize then x @ W.T; both run once (they are slow).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numba
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from moert.kernels import matmul as mm  # noqa: E402
from moert.kernels import matmul_q as mq  # noqa: E402
from moert.kernels import simd  # noqa: E402
from moert.kernels.qtensor import QTensor  # noqa: E402
from moert.quants import quantize  # noqa: E402

QUANT_MODES = ["int16", "int8"] if simd.available() else ["int16"]
TYPES = ["Q4_K", "MXFP4", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16", "F32"]
SHAPE = (16384, 8192)


def make_weight(name: str, shape=SHAPE, seed: int = 0) -> QTensor:
    """A (rows, cols) weight: 512 quantized Gaussian rows, tiled (the bytes, not the values, set the speed)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((min(512, shape[0]), shape[1]), dtype=np.float32)
    raw = w if name == "F32" else quantize(w, name)
    raw = np.ascontiguousarray(np.tile(raw, (-(-shape[0] // raw.shape[0]), 1))[:shape[0]])
    return QTensor(raw, name, shape)


def runner(impl: str, w: QTensor, x: np.ndarray):
    """A no-argument callable computing x @ W.T once with `impl` ("numba", "int16", "int8", "reference",
    "gguf-py")."""
    if impl in ("numba", "int16", "int8", "int8r"):
        out = np.empty((x.shape[0], w.shape[0]), np.float32)
        p = mm.Prepared(w, act_quant={"numba": None, "int8r": "int8"}.get(impl, impl), repack=impl == "int8r")
        return lambda: p(x, out)
    if impl == "reference":
        return lambda: mm.matmul_ref(x, w)
    import gguf

    def ggufpy():
        dense = w.raw if w.type == "F32" else gguf.quants.dequantize(w.raw, gguf.GGMLQuantizationType[w.type])
        return x @ dense.reshape(w.shape).T
    return ggufpy


_weights: dict[str, QTensor] = {}


@pytest.mark.parametrize("T", [1, 16])
@pytest.mark.parametrize("impl", ["numba", "int8", "reference", "gguf-py"])
@pytest.mark.parametrize("name", TYPES)
def test_matmul_throughput(benchmark, name, impl, T):
    if impl == "int8" and ("int8" not in QUANT_MODES or not (mm.TYPES[name].quant or mm.TYPES[name].q8_32)):
        pytest.skip(f"no int8 kernels for {name} on this CPU" if "int8" in QUANT_MODES else "no AVX2")
    w = _weights.setdefault(name, make_weight(name))
    x = np.random.default_rng(1).standard_normal((T, w.shape[1]), dtype=np.float32)
    fn = runner(impl, w, x)
    fn()
    benchmark.pedantic(fn, rounds=5 if impl in ("numba", "int8") else 1, iterations=1)
    best = benchmark.stats.stats.min
    R, C = w.shape
    benchmark.extra_info.update(type=name, impl=impl, T=T, threads=numba.get_num_threads(),
                                bytes=int(w.raw.nbytes), GB_per_s=round(w.raw.nbytes / best / 1e9, 3),
                                Gweights_per_s=round(R * C / best / 1e9, 3),
                                GMAC_per_s=round(T * R * C / best / 1e9, 3))


def measure(types, shape, rounds: int, threads: int, baselines: bool) -> list[dict]:
    """Best-of-`rounds` wall time per (type, T) for the kernels on 1 and `threads` threads, baselines once."""
    out = []
    for name in types:
        w = make_weight(name, shape)
        kt = mm.TYPES[name]
        modes = [m for m in QUANT_MODES if kt.quant or (kt.q8_32 and m == "int8")]   # MXFP4: int8 only
        if "int8" in modes and kt.packed:                                 # Q4_K: also repacked at load
            modes.append("int8r")
        batch = [(m, 16) for m in ("int8", "int8r") if m in modes]
        for mode, T in [("numba", 1), *[(m, 1) for m in modes], ("numba", 16), *batch]:
            x = np.random.default_rng(1).standard_normal((T, shape[1]), dtype=np.float32)
            r = dict(type=name, T=T, mode=mode, bytes=int(w.raw.nbytes), weights=shape[0] * shape[1])
            for n in sorted({1, threads}):
                numba.set_num_threads(n)
                ts = common.times(runner(mode, w, x), rounds)
                r[f"numba_{n}t"] = min(ts)
                r[f"numba_{n}t_median"] = float(np.median(ts))
            numba.set_num_threads(threads)
            if baselines and mode == "numba":
                for impl in ("reference", "gguf-py"):
                    r[impl] = min(common.times(runner(impl, w, x), 1, warmup=0))
            out.append(r)
            print(f"  {name} T={T} {mode}: {w.raw.nbytes / r['numba_1t'] / 1e9:.2f} GB/s 1 thread", file=sys.stderr,
                  flush=True)
    return out


def asm_report(types) -> str:
    """Vector instructions in each type's one-token row kernel, compiled fresh (cached code has no asm)."""
    import re

    lines = ["| kernel | ymm FMA | ymm int->float | zero/sign-extends | vpmaddwd | vpmaddubsw | instructions |",
             "|---|---|---|---|---|---|---|"]
    for name in types:
        w = make_weight(name, (64, 1024))
        mm.matmul(np.ones((1, 1024), np.float32), w)
        mm.matmul(np.ones((4, 1024), np.float32), w)
        if mm.TYPES[name].quant:
            mm.Prepared(w, act_quant="int16")(np.ones((1, 1024), np.float32))
        fns = [(f.py_func.__name__, f) for f in mm.TYPES[name].made()]
        if mm.TYPES[name].quant:
            fns.append((f"_rows1q_{name.lower()}", getattr(mq, f"_rows1q_{name.lower()}")))
        if mm.TYPES[name].quant and "int8" in QUANT_MODES:
            for rp in (False, True) if mm.TYPES[name].packed else (False,):
                p = mm.Prepared(w, act_quant="int8", repack=rp)          # its row kernels are inlined here
                p(np.ones((1, 1024), np.float32))
                fns.append((f"int8 serial driver ({name}{', repacked' if rp else ''})", p.serial))
        for label, fn in fns:
            if not fn.signatures:
                continue
            asm = fn.inspect_asm(fn.signatures[0])
            body = [ln for ln in asm.splitlines() if ln.startswith("\t") and not ln.startswith("\t.")]
            counts = [len(re.findall(p, asm)) for p in (r"vfmadd\w*ps\s.*ymm", r"vcvtdq2ps\s.*ymm", r"vpmov[sz]x",
                                                         r"vpmaddwd", r"vpmaddubsw")]
            lines.append(f"| {label} | " + " | ".join(map(str, counts)) + f" | {len(body)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=SHAPE[0])
    ap.add_argument("--cols", type=int, default=SHAPE[1])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", "-t", type=int, default=numba.get_num_threads())
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--asm", action="store_true", help="count vector instructions in the hot loops and exit")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    types = args.types.split(",")
    if args.asm:
        if "NUMBA_CACHE_DIR" not in os.environ:   # inspect_asm needs a fresh compile: rerun with an empty cache
            with tempfile.TemporaryDirectory() as d:
                sys.exit(subprocess.call([sys.executable, *sys.argv], env={**os.environ, "NUMBA_CACHE_DIR": d}))
        print(asm_report(types))
        return
    mach = common.machine(args.threads)
    shape = (args.rows, args.cols)
    res = measure(types, shape, args.rounds, args.threads, not args.no_baselines)
    bw1 = mach["bw_1thread_GBps"]
    rows = []
    for r in res:
        gb = lambda s, r=r: r["bytes"] / s / 1e9  # noqa: E731
        n = args.threads
        label = r["T"] if r["mode"] == "numba" else f"{r['T']} {r['mode']}"
        rows.append([r["type"], label, f"{gb(r['numba_1t']):.2f}", f"{r['weights'] / r['numba_1t'] / 1e9:.2f}",
                     f"{gb(r['numba_1t']) / bw1:.0%}", f"{gb(r[f'numba_{n}t']):.2f}",
                     f"{r['T'] * r['weights'] / r[f'numba_{n}t'] / 1e9:.1f}",
                     f"{gb(r['reference']):.3f}" if "reference" in r else "-",
                     f"{gb(r['gguf-py']):.3f}" if "gguf-py" in r else "-"])
    print(f"\n# x @ W.T from quantized bytes, W {shape[0]} x {shape[1]}; best of {args.rounds}")
    print(f"# {common.machine_line(mach)}")
    print(common.table(["type", "T", "GB/s 1 thread", "Gweights/s 1 thread", "of 1-thread BW",
                        f"GB/s {args.threads} threads", f"GMAC/s {args.threads} threads",
                        "reference GB/s", "gguf-py GB/s"], rows))
    print(f"# command: {common.command()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(machine=mach, shape=shape, results=res), f, indent=1)


if __name__ == "__main__":
    main()
