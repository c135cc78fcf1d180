"""moert.kernels.gpu's decode matvec against the GPU's own device-to-device copy bandwidth (needs CuPy and a GPU).

    python bench/bench_gpu_kernels.py [--shape 4096x4096] [--types Q4_K,Q6_K,...] [--tokens 1] [--rows 1,2,4]
                                      [--chunks 2,4,8]

For each type and each (rows per program R, chunks per step C) (kernels/gpu/table.py; the table's own first),
it times the matvec
kernel (CUDA events, median of 50 after 5 warm-ups, including the first call's compile in neither), reads its
bandwidth as the weight's bytes over the time, and divides by a 1 GiB device-to-device copy's (read + write) as
the ceiling. It ends in one table: type, R, C, us per call, GB/s, % of copy, and the max |error| against the NumPy
twin relative to max |twin|. The target for 4096 x 4096 and larger is >= 60% of copy at T = 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
from common import device_seconds

from moert.kernels import gpu
from moert.quants import quantize


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="4096x4096", help="N x K of the weight (rows x columns)")
    ap.add_argument("--types", default="Q4_K,Q5_K,Q6_K,Q8_0,Q4_0,Q5_0,MXFP4,F16,BF16,F32")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--rows", default="", help="rows per program to try besides the table's, e.g. 1,2,4")
    ap.add_argument("--chunks", default="", help="chunks per step to try besides the table's, e.g. 2,4,8")
    a = ap.parse_args(argv)
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # no CuPy, no driver, no device
        print(f"bench_gpu_kernels needs CuPy and a CUDA GPU ({type(e).__name__}: {e}); pip install 'moert[gpu]'")
        return 2
    n, k = (int(s) for s in a.shape.split("x"))
    big = cp.empty(1 << 30, dtype=cp.uint8)
    copy_s = device_seconds(cp, lambda: big.copy(), reps=10)
    copy_bw = 2 * big.nbytes / copy_s                                     # read + write
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
    print(f"# {dev}, {n} x {k}, T = {a.tokens}; device-to-device copy {copy_bw / 1e9:.0f} GB/s")
    print(f"{'type':6} {'R':>3} {'C':>3} {'us':>9} {'GB/s':>7} {'% copy':>7} {'rel err':>9}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.tokens, k), dtype=np.float32)
    for name in a.types.split(","):
        raw = quantize(rng.standard_normal((n, k), dtype=np.float32), name)
        w, xd = cp.asarray(raw), cp.asarray(x)
        out = cp.empty((a.tokens, n), dtype=cp.float32)
        want = gpu.matmul_ref(raw, name, (n, k), x)
        base = gpu.GPU_TYPES[name]
        rows = [base.rows] + [int(v) for v in a.rows.split(",") if v and int(v) != base.rows]
        chunks = [base.chunks] + [int(v) for v in a.chunks.split(",") if v and int(v) != base.chunks]
        for r, c in [(r, c) for r in rows for c in chunks]:
            cfg = dataclasses.replace(base, rows=r, chunks=c)
            s = device_seconds(cp, lambda cfg=cfg, w=w, xd=xd, out=out: gpu.matvec(w, cfg, (n, k), xd, out=out))
            err = float(np.max(np.abs(cp.asnumpy(out) - want)) / np.max(np.abs(want)))
            bw = raw.nbytes / s
            print(f"{name:6} {r:>3} {c:>3} {s * 1e6:>9.1f} {bw / 1e9:>7.0f} {100 * bw / copy_bw:>6.0f}% {err:>9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
