"""act_quant="int8" for the types whose int8 kernels round x per 32 (the kernel table's `q8_32`: Q8_0, as
llama.cpp's CPU matmul rounds x for a Q8_0 or MXFP4 weight), not per 256 as kernels/matmul_q.py's Q4_K/Q6_K.

    drivers(name, quant, rows32)       (serial, parallel) as kernels/matmul.py's kernels_for returns them
    group(names, quants, rows32s)      kernels/matmul.py's one-region q/k/v kernel, x rounded once for all three

quant(x) -> (x8 (T, C) int8, xd (T, C/32) float32 steps) and rows32(w, x8, xd, out, r0, r1, b0, b1, f16) are
the entry's pair (kernels/q8_0.py). MXFP4 keeps the drivers of its own (kernels/mxfp4.py make_drivers).
Dimension legend: T tokens, R rows, C columns.
"""

from __future__ import annotations

from numba import prange

from moert.kernels.blockdot import PRANGE_ONLY, Z0
from moert.kernels.jit import variant

__all__ = ["drivers", "group"]

# Bound per type (or triple of types) by drivers / group; the placeholders only name them.
quant = quant0 = rows32 = rows32_0 = rows32_1 = rows32_2 = None


def _serial32(w, x, out, r0, r1, b0, b1, f16):
    """Rows [r0, r1), blocks [b0, b1) on the calling thread, x rounded per 32 first."""
    x8, xd = quant(x)
    rows32(w, x8, xd, out, r0, r1, b0, b1, f16)


def _parallel32(w, x, out, nb, f16, chunk):
    """All rows, `chunk` rows per task, one parallel region; x rounded once, before it."""
    x8, xd = quant(x)
    R = w.shape[0]
    n = (R + chunk - 1) // chunk
    for i in prange(n):
        rows32(w, x8, xd, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, f16)


def _group3_32(x, w0, o0, nb0, f0, w1, o1, nb1, f1, w2, o2, nb2, f2, chunk):
    """o_k = x @ W_k.T for k < 3 in one region (kernels/matmul.py's _group3), x rounded per 32 once."""
    x8, xd = quant0(x)
    R0, R1, R2 = w0.shape[0], w1.shape[0], w2.shape[0]
    n0, n1, n2 = (R0 + chunk - 1) // chunk, (R1 + chunk - 1) // chunk, (R2 + chunk - 1) // chunk
    for i in prange(n0 + n1 + n2):
        if i < n0:
            rows32_0(w0, x8, xd, o0, i * chunk, min(R0, (i + 1) * chunk), Z0, nb0, f0)
        elif i < n0 + n1:
            j = i - n0
            rows32_1(w1, x8, xd, o1, j * chunk, min(R1, (j + 1) * chunk), Z0, nb1, f1)
        else:
            j = i - n0 - n1
            rows32_2(w2, x8, xd, o2, j * chunk, min(R2, (j + 1) * chunk), Z0, nb2, f2)


def drivers(name: str, q, rows) -> tuple:
    """(serial, parallel) of one type in the per-32 int8 mode: serial(w, x, out, r0, r1, b0, b1, f16),
    parallel(w, x, out, nb, f16, chunk)."""
    n = name.lower()
    return (variant(_serial32, f"serial_{n}_q32", quant=q, rows32=rows),
            variant(_parallel32, f"parallel_{n}_q32", parallel=PRANGE_ONLY, quant=q, rows32=rows))


def group(names: tuple[str, str, str], quants: tuple, rows: tuple):
    """The one-region kernel of three weights in the per-32 int8 mode; None when their types round x
    differently (then each weight is called on its own)."""
    if len(set(quants)) != 1:
        return None
    return variant(_group3_32, "group_" + "_".join(t.lower() for t in names) + "_q32", parallel=PRANGE_ONLY,
                   quant0=quants[0], rows32_0=rows[0], rows32_1=rows[1], rows32_2=rows[2])
