"""Measure this machine's CPU side, so the CPU half of a prediction rests on measurement: `calibrate()`.

    cpu = moert.calibrate()            # ~5 s: a CPU with measured rates (long=True: ~4x the samples)

What it measures (best of a few rounds each: other jobs share the machine and can only slow a run down; on one
thread in this process's CPU time, so the moments other jobs hold the core do not count):
  * read bandwidth, 1 thread and all threads: a vectorized sum over a buffer 8x the last-level cache;
  * moert's one-token matmul (kernels/matmul.py `Prepared`) per weight type and act_quant mode, on one
    thread, as GB/s of weights streamed: `kernel_gbs` (the model takes min(threads x rate, bandwidth));
  * its batched matmul (64 and 8 tokens: a dense batch, one expert's share) per type on one thread, as
    GFLOP/s: `kernel_gflops`. F32 weights (routers, norms) are NumPy's `x @ w.T`, as the model runs them; the
    F32 rates are also the "*" rate of a type not measured (moert keeps such weights as float32);
  * prompt attention (layers.attention over f32 caches, 64 tokens, Qwen3-30B-A3B's heads), as GFLOP/s of the
    FLOPs the cost model counts for it: `kernel_gflops["KV"]`;
  * the fixed cost of one kernel call (a tiny weight): `call_us`;
  * moert's per-layer and per-token cost beyond the kernels: decode steps of tiny qwen3moe models of 1, 3 and 5
    layers (every tensor on the CPU), interleaved; `layer_us` is the least-squares slope of each count's typical
    step (the median of its fastest quarter), `token_us` the intercept, both at least 0 (fit_overheads). On a busy
    machine (median step over twice the fastest) it measures once more, keeps the calmer run, warns, and says so
    in the CPU's `source` with the spread of the slope over rounds.
"""

from __future__ import annotations

import os
import platform
import time
import warnings

import numpy as np

_TYPES = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "F16", "BF16", "MXFP4", "F32")   # every kernel-table type, and F32
# kernels with quantized-activation variants
_ACT = {"Q4_K": ("int16", "int8"), "Q6_K": ("int16", "int8"), "MXFP4": ("int8",)}


def _read_kernels():
    from numba import njit, prange

    @njit(cache=True, fastmath={"reassoc", "contract"})
    def part(a, lo, hi):
        acc = np.zeros(64, dtype=np.float32)       # 8 accumulators of 8 lanes: adds never limit the read
        n = lo + (hi - lo) // 64 * 64
        for i in range(lo, n, 64):
            for j in range(64):
                acc[j] += a[i + j]
        return acc.sum()

    @njit(cache=True, parallel=True)
    def parts(a, n):
        out = np.zeros(n, dtype=np.float32)
        step = (a.shape[0] + n - 1) // n
        for p in prange(n):
            out[p] = part(a, min(p * step, a.shape[0]), min((p + 1) * step, a.shape[0]))
        return out.sum()

    return part, parts


def _clock():
    """The clock a measurement on one thread reads: this process's CPU time (time.process_time), so the seconds other
    jobs hold the core are not counted (on a shared machine a wall-clock minimum may never see a quiet moment); wall
    time when moert runs several threads (a CPU-time sum over threads is not a duration)."""
    import numba

    return time.process_time if numba.get_num_threads() == 1 else time.perf_counter


def _best(fn, rounds: int, clock=None) -> float:
    clock = clock or _clock()
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def read_bandwidth(mib: int = 256, rounds: int = 3, threads: int = 1) -> float:
    """GB/s `threads` threads read from a buffer of `mib` MiB (best of `rounds`)."""
    part, parts = _read_kernels()
    a = np.ones(mib * (1 << 20) // 4, dtype=np.float32)   # written once, so every page is really there
    fn = (lambda: part(a, 0, a.shape[0])) if threads == 1 else (lambda: parts(a, threads))
    return a.nbytes / _best(fn, rounds, time.process_time if threads == 1 else time.perf_counter) / 1e9


def _weight(type_name: str, rows: int, cols: int, seed: int = 0):
    """A (rows, cols) weight of `type_name`: 16 quantized random rows tiled (the rate does not depend on values)."""
    from moert.kernels.qtensor import QTensor
    from moert.quants import quantize

    rng = np.random.default_rng(seed)
    tile = quantize(rng.standard_normal((16, cols), dtype=np.float32), type_name)
    tile = tile.view(np.uint8).reshape(16, -1)
    raw = np.ascontiguousarray(np.tile(tile, (rows // 16, 1)))
    raw.flags.writeable = False                            # as a file map gives it: one compiled variant
    return QTensor(raw, type_name, (rows, cols))


def kernel_rates(mib: int = 128, rounds: int = 3, types=_TYPES) -> tuple[dict, dict]:
    """One thread: GB/s of the one-token matmul per type (and type/act_quant), GFLOP/s of a 64-token one."""
    from moert.kernels import matmul as km
    from moert.kernels import simd

    cols = 2048
    gbs, gflops = {}, {}
    x1 = np.random.default_rng(1).standard_normal((1, cols), dtype=np.float32)
    x64 = np.random.default_rng(2).standard_normal((64, cols), dtype=np.float32)
    for t in types:
        row_bytes = km.weight_bytes(_weight(t, 16, cols)) // 16
        rows = max(16, (mib << 20) // row_bytes // 16 * 16)
        w = _weight(t, rows, cols)
        modes = [None] + [m for m in _ACT.get(t, ()) if m != "int8" or simd.available()]
        for mode in modes:
            p = _matmul(w, mode)
            s = _best(lambda p=p: p(x1), rounds)
            gbs[t if mode is None else f"{t}/{mode}"] = round(w.raw.nbytes / s / 1e9, 3)
        small = _weight(t, 512, cols)                      # 64 tokens x 512 rows: compute, not memory
        for mode in [None] + [m for m in modes if m == "int8"]:        # int16 applies to one token only
            p = _matmul(small, mode)
            key = t if mode is None else f"{t}/{mode}"
            for x, suffix in ((x64, ""), (x64[:8], "@8")):             # 8 tokens: what one expert sees
                s = _best(lambda p=p, x=x: p(x), rounds)
                gflops[key + suffix] = round(2 * x.shape[0] * 512 * cols / s / 1e9, 3)
    if "F32" in gflops:                                    # a type without a kernel is kept as float32
        gflops["*"], gflops["*@8"] = gflops["F32"], gflops["F32@8"]
    return gbs, gflops


def _matmul(w, act_quant: str | None):
    """x -> x @ w.T as the model runs it: the kernel table's matmul, or NumPy's for F32 weights (model.py)."""
    from moert.kernels import matmul as km

    if w.type == "F32":
        dense = w.raw.view(np.float32).reshape(w.shape)
        return lambda x: x @ dense.T
    return km.Prepared(w, act_quant=act_quant)


def attention_gflops(rounds: int = 3, tokens: int = 64, heads: tuple[int, int, int] = (32, 4, 128)) -> float:
    """GFLOP/s of a prompt's attention (layers.attention, f32 caches, empty before it) counted as the cost model
    counts it: 2 x T x n_kv x H x (Dk + Dv), n_kv the batch's mean position (T / 2). heads: (H, H_kv, D)."""
    from moert.layers import attention

    (H, Hk, D), T = heads, tokens
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((T, h, D), dtype=np.float32) for h in (H, Hk, Hk))
    kc, vc = np.zeros((T, Hk, D), np.float32), np.zeros((T, Hk, D), np.float32)
    s = _best(lambda: attention(q, k, v, kc, vc, 0), rounds)
    return 2.0 * T * (T / 2) * H * 2 * D / s / 1e9


def call_overhead_us(rounds: int = 2000) -> float:
    """Microseconds of one kernel call on a tiny weight (16 x 256 Q8_0): dispatch, checks, allocation."""
    from moert.kernels import matmul as km

    p = km.Prepared(_weight("Q8_0", 16, 256))
    x = np.ones((1, 256), dtype=np.float32)
    for _ in range(50):
        p(x)
    clock = _clock()
    t0 = clock()
    for _ in range(rounds):
        p(x)
    return (clock() - t0) / rounds * 1e6


LAYER_COUNTS = (1, 3, 5)          # tiny models' depths: the per-layer cost is a least-squares slope over three


def fit_overheads(times: dict[int, list[float]]) -> dict:
    """(us per layer, us per token) from decode-step seconds per layer count, `{layers: [step, ...]}`, robust to a
    busy machine: each count's typical step is the median of its fastest quarter (a noisy minimum of one lucky step
    is what made the old two-point difference go negative or 7 ms), the layer cost the least-squares slope over
    every count, clamped at 0 and the token cost at 0; the spread is the middle half (quartiles) of the slopes of
    single rounds (each round is a pass over every count, so contention hits all counts alike). "busy": a count's
    median step over twice its fastest,
    i.e. another job held a core for a good part of the run."""
    ns = sorted(times)
    if len(ns) < 2 or any(not times[n] for n in ns):
        raise ValueError("fit_overheads needs step times for at least two layer counts")

    def typical(xs):
        xs = sorted(xs)
        q = xs[:max(1, len(xs) // 4)]
        return q[len(q) // 2]

    def slope(ys):
        mx, my = sum(ns) / len(ns), sum(ys) / len(ys)
        b = sum((x - mx) * (y - my) for x, y in zip(ns, ys)) / sum((x - mx) ** 2 for x in ns)
        return b, my - b * mx

    layer, token = slope([typical(times[n]) for n in ns])
    rounds = min(len(times[n]) for n in ns)
    per_round = sorted(slope([times[n][i] for n in ns])[0] for i in range(rounds))
    per_round = per_round[rounds // 4: max(rounds // 4 + 1, rounds - rounds // 4)]      # the middle half of the rounds
    ratio = max(sorted(times[n])[len(times[n]) // 2] / min(times[n]) for n in ns)
    return {"layer_us": max(layer, 0.0) * 1e6, "token_us": max(token, 0.0) * 1e6,
            "layer_us_spread": (max(min(per_round), 0.0) * 1e6, max(max(per_round), 0.0) * 1e6),
            "busy": ratio > 2.0, "median_over_min": ratio, "negative_slope": layer < 0}


def model_overheads(steps: int = 40, detail: bool = False):
    """(us per layer, us per token) of moert's decode beyond the kernels: tiny models of LAYER_COUNTS layers,
    their decode steps interleaved round by round (fit_overheads; detail=True: its whole dict)."""
    import moert
    from moert.demo import cache_dir
    from moert.testing import write_qwen3moe

    shape = dict(n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_expert=8, n_expert_used=2, n_ff_exp=64,
                 n_vocab=256, qtype="Q8_0", context_length=1024)
    models = {}
    try:
        for n in LAYER_COUNTS:
            path = cache_dir() / f"calibrate-qwen3moe-L{n}.gguf"
            if not path.exists():
                write_qwen3moe(path, n_layer=n, **shape)
            models[n] = moert.load(path, gpu_layers=0, context_size=steps + 8, progress=False)
            models[n].forward([1])
        times: dict[int, list[float]] = {n: [] for n in LAYER_COUNTS}
        clock = _clock()
        for i in range(steps):                       # interleaved: contention slows every count in the same round
            for n, m in models.items():
                t0 = clock()
                m.forward([i % 200 + 1], last_only=True)
                times[n].append(clock() - t0)
    finally:
        for m in models.values():
            m.close()
    fit = fit_overheads(times)
    return fit if detail else (fit["layer_us"], fit["token_us"])


def calibrate(long: bool = False, threads: int | None = None):
    """A CPU with this machine's measured rates (see the module docstring); long=True: more samples."""
    import numba

    from moert.bench import cpu_model
    from moert.cost.hardware import CPU
    from moert.threads import set_threads

    before = numba.get_num_threads()
    n = int(threads or before)
    rounds = 8 if long else 3
    try:
        set_threads(1)
        bw1 = read_bandwidth(512 if long else 256, rounds, 1)
        gbs, gflops = kernel_rates(256 if long else 128, rounds)   # 4x+ the L3: DRAM
        gflops["KV"] = round(attention_gflops(rounds), 3)
        call = call_overhead_us(8000 if long else 2000)
        set_threads(n)
        bwn = read_bandwidth(512 if long else 256, rounds, n) if n > 1 else bw1
        over = model_overheads(120 if long else 40, detail=True)
        if over["busy"]:                             # once more: a busy spell may have passed
            again = model_overheads(120 if long else 40, detail=True)
            over = min((over, again), key=lambda f: f["median_over_min"])
        layer, token = over["layer_us"], over["token_us"]
    finally:
        set_threads(before)
    # a kernel that streamed r GB/s on one thread from a buffer 4x the L3 shows DRAM delivers r: the float-sum
    # probe reads below what the int8 kernels stream, so the per-thread cap is the larger of the two
    bw1 = max(bw1, *gbs.values())
    bwn = max(bwn, bw1) if n > 1 else bw1
    name = f"local ({cpu_model()}, {n} thread{'s' if n > 1 else ''})"
    lo, hi = over["layer_us_spread"]
    note = (f"; layer_us {layer:.0f} (rounds {lo:.0f}-{hi:.0f})" + ("; the machine was busy: steps' median "
            f"{over['median_over_min']:.1f}x their fastest, overheads may be high" if over["busy"] else ""))
    if over["busy"]:
        warnings.warn(f"calibrate: the machine was busy (decode steps' median {over['median_over_min']:.1f}x their "
                      f"fastest); per-layer cost {layer:.0f} us (rounds {lo:.0f}-{hi:.0f}); run again when it is idle "
                      f"for steadier figures", stacklevel=2)
    # the measured all-thread read is the CPU's whole bandwidth here: efficiency 1 of it
    return CPU(name, n, round(bwn, 2), ghz=1.0, flops_per_cycle=1, bw_efficiency=1.0, compute_efficiency=1.0,
               call_us=round(call, 2), layer_us=round(layer, 1), token_us=round(token, 1),
               kernel_gbs=tuple(sorted(gbs.items())), kernel_gflops=tuple(sorted(gflops.items())),
               bw_1thread_gbs=round(bw1, 2),
               source=f"moert.calibrate(long={long}) on {platform.node() or os.uname().nodename}{note}")


__all__ = ["LAYER_COUNTS", "attention_gflops", "calibrate", "call_overhead_us", "fit_overheads", "kernel_rates",
           "model_overheads", "read_bandwidth"]
