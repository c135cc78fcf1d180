"""moert.kernels.gpu.attention on a GPU: decode attention's GB/s over the KV cache against a device-to-device copy,
and a prompt's TFLOP/s, per cache type (needs CuPy and a GPU; --dry: tiny shapes under Triton's interpreter).

    python bench/bench_gpu_attention.py [--kv f16,bf16,q8_0,f32] [--depths 4096,32768] [--heads 32/4] [--dim 128]
                                        [--tokens 1] [--prompt 512] [--dry]

Decode: q (T, H, D) at position `depth` over caches that hold depth + T rows; out, work and the position made on
the device first (the timed call allocates nothing), CUDA events around each call, the median of 50 after 5
warm-ups (the first call compiles). GB/s: the bytes of K and V the visible keys occupy over the time; % copy:
against a 1 GiB device-to-device copy's (read + write). Prompt: --prompt tokens at depth 0, causal, 4 H D T (T + 1)
/ 2 FLOPs (two dots per visible key). rel err: max |kernel - twin| / max |twin|, the twin in float64 on the host
(the first depth only; a prompt's f16 operands put it near 1e-3). Nothing here has run on a GPU yet.
"""

from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
from common import device_seconds

from moert.kernels import gpu
from moert.kernels.gpu import attn

_STORED = {"f32": (np.float32,), "f16": (np.float16,), "bf16": (np.uint16,), "q8_0": (np.int8, np.float16)}
_ROW_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}       # bytes per cached value


def cache(kind: str, x: np.ndarray) -> tuple:
    """x (n_ctx, Hk, D) float32 stored as a cache of `kind` on the host: (kind, values[, scales])."""
    n, hk, d = x.shape
    parts = [np.zeros((n, hk, d), _STORED[kind][0])] + ([np.zeros((n, hk, d // 32), np.float16)]
                                                        if kind == "q8_0" else [])
    c = (kind, *parts)
    attn.write_ref(c, x, 0)
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default="f16,bf16,q8_0,f32", help="cache types, -ctk names")
    ap.add_argument("--depths", default="4096,32768", help="positions of the decode step")
    ap.add_argument("--heads", default="32/4", help="query heads / KV heads")
    ap.add_argument("--dim", type=int, default=128, help="head dims of K and V")
    ap.add_argument("--tokens", type=int, default=1, help="decode tokens (up to 8)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens (0: no prompt rows)")
    ap.add_argument("--dry", action="store_true", help="NumPy arrays, Triton's interpreter, tiny shapes")
    a = ap.parse_args(argv)
    if a.dry:
        xp, backend, reps, copy_bytes = np, "interpret", 1, 1 << 20
        a.depths, a.heads, a.dim, a.prompt = "40", "4/2", 32, min(a.prompt, 12)
    else:
        try:
            import cupy as xp

            xp.cuda.runtime.getDeviceCount()
        except Exception as e:  # no CuPy, no driver, no device
            print(f"bench_gpu_attention needs CuPy and a CUDA GPU ({type(e).__name__}: {e}); pip install 'moert[gpu]'"
                  f", or --dry")
            return 2
        backend, reps, copy_bytes = None, 50, 1 << 30
    h, hk = (int(v) for v in a.heads.split("/"))
    copy_bw = copy_gbs(xp, copy_bytes) * 1e9
    name = "NumPy (--dry: interpreter times)" if xp is np else \
        xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)["name"].decode()
    print(f"# {name}; heads {h}/{hk} of {a.dim}; device-to-device copy {copy_bw / 1e9:.0f} GB/s")
    print(f"{'kv':5} {'what':>12} {'us':>10} {'GB/s':>7} {'% copy':>7} {'TFLOP/s':>8} {'rel err':>9}")
    for r in measure(xp, a.kv.split(","), [int(v) for v in a.depths.split(",")], h, hk, a.dim, a.tokens, a.prompt,
                     reps, backend):
        err = float("nan") if r["rel_err"] is None else r["rel_err"]
        if r["tflops"] is None:
            print(f"{r['kv']:5} {r['what']:>12} {r['us']:>10.1f} {r['gbs']:>7.0f} "
                  f"{100 * r['gbs'] * 1e9 / copy_bw:>6.0f}% {'':>8} {err:>9.1e}")
        else:
            print(f"{r['kv']:5} {r['what']:>12} {r['us']:>10.1f} {'':>7} {'':>7} {r['tflops']:>8.1f} {err:>9.1e}")
    return 0


def copy_gbs(xp, nbytes: int = 1 << 30) -> float:
    """GB/s of a device-to-device copy of nbytes, read + write (what a kernel reading the cache once can reach)."""
    big = xp.empty(nbytes, dtype=np.uint8)
    return 2 * nbytes / device_seconds(xp, lambda: big.copy(), 10) / 1e9


def measure(xp, kinds: list[str], depths: list[int], h: int, hk: int, d: int, t: int = 1, prompt: int = 512,
            reps: int = 50, backend: str | None = None):
    """The table's rows one at a time, as dicts: kv, what, us, then gbs (decode: K and V bytes read / s) or tflops
    (prompt), and rel_err (None where not checked). xp: NumPy or CuPy; backend: None, or "interpret"."""
    rng = np.random.default_rng(0)
    n_ctx = max(max(depths) + t, prompt)
    kx, vx = (rng.standard_normal((n_ctx, hk, d), dtype=np.float32) for _ in range(2))
    for kind in kinds:
        kh, vh = cache(kind, kx), cache(kind, vx)
        kc, vc = ((kind, *(xp.asarray(p) for p in c[1:])) for c in (kh, vh))
        for i, depth in enumerate(depths):
            qh = rng.standard_normal((t, h, d), dtype=np.float32)
            q, pos = xp.asarray(qh), xp.full(1, depth, dtype=np.int32)
            n_split = attn.splits(depth + t, hk)
            out = xp.empty((t, h * d), dtype=np.float32)
            work = xp.empty(attn.work_size(t, h, d, n_split), dtype=np.float32)
            s = device_seconds(xp, functools.partial(gpu.attention, q, kc, vc, pos, n_split=n_split, out=out,
                                                     work=work, backend=backend), reps)
            err = _err(out, gpu.attention_ref(qh, kh, vh, depth)) if i == 0 else None
            gbs = (depth + t) * hk * 2 * d * _ROW_BYTES[kind] / s / 1e9
            yield dict(kv=kind, what=f"T={t} @{depth}", us=s * 1e6, gbs=gbs, tflops=None, rel_err=err)
        if prompt:
            qh = rng.standard_normal((prompt, h, d), dtype=np.float32)
            q = xp.asarray(qh)
            out = xp.empty((prompt, h * d), dtype=np.float32)
            s = device_seconds(xp, functools.partial(gpu.attention, q, kc, vc, 0, out=out, backend=backend),
                               max(1, reps // 5))
            tflops = 4 * h * d * prompt * (prompt + 1) / 2 / s / 1e12
            yield dict(kv=kind, what=f"prompt {prompt}", us=s * 1e6, gbs=None, tflops=tflops,
                       rel_err=_err(out, gpu.attention_ref(qh, kh, vh, 0)))


def _err(got, want: np.ndarray) -> float:
    got = got.get() if hasattr(got, "get") else np.asarray(got)
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


if __name__ == "__main__":
    sys.exit(main())
