"""Attention and prompts at depth, the current kernels against the previous ones, interleaved rounds in one process
(ratios side by side: this machine is shared, its absolute times are not).

    python bench/depth_ab.py kernel [-d 256,4096,16384,32768] [--rounds 15]     one token's attention
    python bench/depth_ab.py kernel --split-before COMMIT [...]                  flash_decode.py then and now
    python bench/depth_ab.py decode [--layers 2] [-d 512,4096,16384] [--rounds 6] [--steps 32]
    python bench/depth_ab.py prompt [--layers 2] [-d 0,4096] [--rounds 5] [--prompt 512]

kernel: 32 query / 4 KV heads of 128 over an f16 cache, the previous kernels/layers.py (read from git, --before,
default d19a328) against kernels/flash_decode.py: one thread (the CPU time of the calling thread) and all threads
(wall). decode: the benchmark file's decode steps at depth, the block path (Model.fused_decode off) with the
previous kernels and the stall guard without its depth restart, against the current. prompt: a float prompt of
--prompt tokens at depth with the previous prompt kernels, then each new one added (kernels/matmul_tiles.py,
kernels/moe_tiles.py, kernels/flash_prompt.py), and numpy's sgemm on the same threads in the same rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def previous_layers(commit: str, name: str = "layers"):
    """kernels/{name}.py as it was at `commit`, as a module (Numba's cache off: it is not a file of the tree)."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:kernels/{name}.py"], check=True,
                         capture_output=True, text=True).stdout.replace("cache=True", "cache=False")
    path = Path("/tmp") / f"moert_{name}_{commit}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"moert.kernels.{name}_previous", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def interleave(fns: dict, rounds: int, clock=time.perf_counter) -> dict:
    """name -> seconds of each round, the order alternating every round."""
    for f in fns.values():
        f()
    ts = {n: [] for n in fns}
    for r in range(rounds):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t = clock()
            fns[n]()
            ts[n].append(clock() - t)
    return ts


def kernel(args) -> None:
    if args.split_before:
        from moert.kernels import flash_decode as new
        old = previous_layers(args.split_before, "flash_decode")
        for S in args.depth:
            _split_at(old, new, S, args.rounds)
        return
    from moert.kernels import layers as new
    old = previous_layers(args.before)
    for S in args.depth:
        _kernel_at(old, new, S, args.rounds)


def _split_at(old, new, S: int, rounds: int) -> None:
    """One depth of `kernel --split-before`: kernels/flash_decode.py then and now, one token: attend1 on one
    thread, split_attention on all."""
    import numba
    rng = np.random.default_rng(0)
    H, Hk, Dh = 32, 4, 128
    kc, vc = (rng.standard_normal((S, Hk, Dh)).astype(np.float16).view(np.uint16) for _ in range(2))
    q = rng.standard_normal((1, H, Dh)).astype(np.float32)
    sinks, out, scale = np.full(H, -np.inf, np.float32), np.empty((H, Dh), np.float32), np.float32(0.088)
    numba.set_num_threads(1)
    one = interleave({"previous": lambda: old.attend1(q[0], kc, vc, 0, S, scale, sinks, out),
                      "current": lambda: new.attend1(q[0], kc, vc, 0, S, scale, sinks, out)}, rounds, time.thread_time)
    n = numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(n)
    par = interleave({name: (lambda m=m: m.split_attention(q, m.Cache(kc), m.Cache(vc), S - 1, scale, None))
                      for name, m in (("previous", old), ("current", new))}, rounds)
    _report(S, one, par, n)


def _kernel_at(old, new, S: int, rounds: int) -> None:
    """One depth of `kernel`: the previous and current one-token attention, one thread and all."""
    import numba

    from moert.kernels.flash_decode import attend1
    rng = np.random.default_rng(0)
    H, Hk, Dh = 32, 4, 128
    kc, vc = (rng.standard_normal((S + 8, Hk, Dh)).astype(np.float16).view(np.uint16) for _ in range(2))
    q, k = rng.standard_normal((1, H, Dh)).astype(np.float32), rng.standard_normal((1, Hk, Dh)).astype(np.float32)
    sinks, out, scale = np.full(H, -np.inf, np.float32), np.empty((H, Dh), np.float32), np.float32(0.088)
    numba.set_num_threads(1)
    one = interleave({"previous": lambda: old._attention1(q[0], kc, vc, 0, S, scale, sinks, out),
                      "current": lambda: attend1(q[0], kc, vc, 0, S, scale, sinks, out)}, rounds, time.thread_time)
    n = numba.config.NUMBA_NUM_THREADS
    numba.set_num_threads(n)
    par = interleave({"previous": lambda: old.attention_decode(q, k, k, kc, vc, S, 0.088, None),
                      "current": lambda: new.attention_decode(q, k, k, kc, vc, S, 0.088, None)}, rounds)
    _report(S, one, par, n)


def _report(S: int, one: dict, par: dict, n: int) -> None:
    for name, ts in (("1 thread (CPU time)", one), (f"{n} threads", par)):
        p, c = statistics.median(ts["previous"]), statistics.median(ts["current"])
        print(f"{S:6d} keys, {name:20s}: previous {p * 1e3:7.2f} ms, current {c * 1e3:7.2f} ms: {p / c:.2f}x "
              f"(best {min(ts['previous']) / min(ts['current']):.2f}x)", flush=True)


def _model(args, n_ctx: int):
    import moert

    sys.path.insert(0, str(ROOT / "bench"))
    import e2e
    return moert.load(e2e.model_path(args.layers), gpu_layers=0, threads=2, context_size=n_ctx, progress=False)


def _fill(m, upto: int, done: int) -> int:
    fill = np.arange(upto) * 4567 % 4000 + 10
    m.position = done
    for a in range(done, upto, 512):
        m.forward(fill[a:min(upto, a + 512)], last_only=True)
    return upto


def decode(args) -> None:
    import moert.layers as ml
    from moert.kernels import layers as new
    from moert.threads import StallGuard

    old, restart = previous_layers(args.before), StallGuard.at
    m = _model(args, max(args.depth) + 64)
    m.fused_decode = False

    def use(name):
        ml._fast = old if name == "previous" else new
        StallGuard.at = (lambda self, pos: None) if name == "previous" else restart
    done = 0
    for d in args.depth:
        done = _fill(m, d, done)
        ts = {"previous": [], "current": []}
        for r in range(args.rounds):
            for name in (("previous", "current") if r % 2 == 0 else ("current", "previous")):
                use(name)
                time.sleep(0.2)
                m.position = d
                steps = []
                for _ in range(args.steps):
                    t = time.perf_counter()
                    m.forward(np.asarray([7]))
                    steps.append(time.perf_counter() - t)
                ts[name].append(statistics.median(steps))
        use("current")
        p, c = statistics.median(ts["previous"]), statistics.median(ts["current"])
        print(f"tg{args.steps} at depth {d}: previous {1 / p:.1f} tok/s, current {1 / c:.1f}: {p / c:.2f}x "
              f"(best {min(ts['previous']) / min(ts['current']):.2f}x)", flush=True)


def prompt(args) -> None:
    from threadpoolctl import threadpool_limits

    import moert.kernels.flash_prompt as fp
    import moert.kernels.matmul_tiles as mt
    import moert.kernels.moe_tiles as et
    big, on = 1 << 62, fp.available
    conf = {"previous": (big, big, False), "+ dense tiles": (mt.MIN_TOKENS, big, False),
            "+ expert tiles": (mt.MIN_TOKENS, et.MIN_TOKENS, False),
            "+ prompt attention (all)": (mt.MIN_TOKENS, et.MIN_TOKENS, True)}

    def use(c):
        mt.MIN_TOKENS, et.MIN_TOKENS, a = conf[c]
        fp.available = on if a else (lambda: False)
    m = _model(args, max(args.depth) + args.prompt + 64)
    toks = np.arange(args.prompt) * 7919 % 4000 + 10
    a, b = np.random.rand(args.prompt, 2048).astype(np.float32), np.random.rand(2048, 4096).astype(np.float32)
    done = 0
    for d in args.depth:
        done = _fill(m, d, done)
        fns = {}
        for c in conf:
            def run(c=c, d=d):
                use(c)
                m.position = d
                m.forward(toks, last_only=True)
            fns[c] = run
        with threadpool_limits(2):
            fns["numpy sgemm"] = lambda: a @ b
            ts = interleave(fns, args.rounds)
        use("+ prompt attention (all)")
        base = statistics.median(ts["previous"])
        for c in conf:
            md = statistics.median(ts[c])
            print(f"pp{args.prompt} at depth {d}, {c:26s}: {args.prompt / md:6.1f} tok/s, {base / md:.2f}x previous",
                  flush=True)
        print(f"numpy sgemm ({args.prompt} x 2048) @ (2048 x 4096), 2 threads: "
              f"{2 * args.prompt * 2048 * 4096 / statistics.median(ts['numpy sgemm']) / 1e9:.0f} GFLOP/s", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["kernel", "decode", "prompt"])
    ap.add_argument("-d", "--depth", type=lambda s: [int(v) for v in s.split(",")])
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--before", default="d19a328", help="the commit whose kernels/layers.py is 'previous'")
    ap.add_argument("--split-before", metavar="COMMIT", help="kernel: compare kernels/flash_decode.py at COMMIT "
                    "(attend1, split_attention) with the current one instead")
    args = ap.parse_args(argv)
    defaults = {"kernel": ([256, 4096, 16384, 32768], 15), "decode": ([512, 4096, 16384], 6),
                "prompt": ([0, 4096], 5)}[args.what]
    args.depth, args.rounds = args.depth or defaults[0], args.rounds or defaults[1]
    {"kernel": kernel, "decode": decode, "prompt": prompt}[args.what](args)
    print(f"# command: python {' '.join(['bench/depth_ab.py'] + (argv if argv is not None else sys.argv[1:]))}")


if __name__ == "__main__":
    main()
