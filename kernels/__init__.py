"""moert.kernels: Numba CPU kernels (installed as moert.kernels; each has a NumPy reference twin). Its subpackage
moert.kernels.gpu (kernels/gpu/) holds the Triton GPU kernels of the same GGML types, beside them in ktypes' table.

Dequantization fast paths (kernels/dequant.py; twins in moert/quants/dequant.py):

    dequantize(raw, type, shape)                   whole tensor -> float32 `shape`
    dequantize_rows(raw, type, shape, start, stop) rows [start, stop) of the (rows, row length) view
    dequantize_expert(raw, type, shape, e)         expert e of (n_expert, rows, cols) -> (rows, cols)
    dequantize_block_rows(rows, type)              (n, row_bytes) whole rows -> (n, row length), no shape checks

Slices read only their own bytes (a row range never splits a block), so dequantizing one expert of
a memory-mapped file touches only that expert's pages. Each takes `out=` to fill a preallocated
float32 array instead of allocating. Types not in DEQUANT_TYPES raise UnsupportedTypeError: use
`moert.quants.dequantize_fast`, which falls back to the reference.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from moert.quants.dequant import as_blocks, lookup, slice_expert, slice_rows
from moert.quants.types import GGMLType

from .ktypes import DEQUANT_TYPES, TYPES

__all__ = ["DEQUANT_TYPES", "dequantize", "dequantize_block_rows", "dequantize_expert", "dequantize_rows"]

# Up to this many blocks (a few rows: one token's embedding), a serial copy of the kernel: a parallel region
# costs more than the work, and on a busy machine it waits for a descheduled thread (one row of Q4_K, 2 threads:
# 9 us quiet, 8 ms under load, against about 1 us serial; measured on the 2-core AMD box).
_SERIAL_BLOCKS = 256


@functools.cache
def _serial(type_name: str):
    """The type's dequantize kernel compiled without threads (its prange runs as range), under a name of its own."""
    from .jit import variant

    kernel = TYPES[type_name].dequant
    return variant(kernel.py_func, f"{kernel.py_func.__name__}_serial", fastmath=kernel.targetoptions["fastmath"])


def dequantize(raw: np.ndarray, ggml_type: str | GGMLType, shape: Sequence[int],
               out: np.ndarray | None = None) -> np.ndarray:
    """Dequantize a tensor's raw bytes to float32 of `shape` with a Numba kernel (multi-threaded)."""
    t = lookup(ggml_type, DEQUANT_TYPES, "moert.kernels")
    shape, blocks = as_blocks(raw, t, shape)                        # (n_blocks, type_size)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}, "
                         f"got {out.dtype} {out.shape}")
    kernel, table = TYPES[t.name].dequant, TYPES[t.name].table
    if blocks.flags.writeable:  # always hand Numba read-only bytes (as a file map gives): one compiled variant
        blocks = blocks.view()
        blocks.flags.writeable = False
    if blocks.shape[0]:
        if blocks.shape[0] <= _SERIAL_BLOCKS:
            kernel = _serial(t.name)
        kernel(blocks, out.reshape(blocks.shape[0], t.block_size), table)
    return out


def dequantize_block_rows(rows: np.ndarray, type_name: str) -> np.ndarray:
    """(n, row_bytes) uint8 whole rows of a tensor of a type in DEQUANT_TYPES (what a weight's `data[ids]` gives)
    -> (n, row length) float32: `dequantize` without its per-call shape checks (a token's embedding: ~4 us)."""
    kt = TYPES[type_name]
    blocks = rows.reshape(-1, kt.block_bytes)                           # (n_blocks, type_size)
    if blocks.flags.writeable:                                          # one compiled variant, as dequantize
        blocks = blocks.view()
        blocks.flags.writeable = False
    out = np.empty((rows.shape[0], rows.shape[1] // kt.block_bytes * kt.block), dtype=np.float32)
    kernel = _serial(type_name) if blocks.shape[0] <= _SERIAL_BLOCKS else kt.dequant
    if blocks.shape[0]:
        kernel(blocks, out.reshape(blocks.shape[0], kt.block), kt.table)
    return out


def dequantize_rows(raw: np.ndarray, ggml_type: str | GGMLType, shape: Sequence[int], start: int, stop: int,
                    out: np.ndarray | None = None) -> np.ndarray:
    """Rows [start, stop) of the tensor seen as (rows, row length), dequantized: (stop - start, row)."""
    lookup(ggml_type, DEQUANT_TYPES, "moert.kernels")
    data, shape = slice_rows(raw, ggml_type, shape, start, stop)
    return dequantize(data, ggml_type, shape, out=out)


def dequantize_expert(raw: np.ndarray, ggml_type: str | GGMLType, shape: Sequence[int], e: int,
                      out: np.ndarray | None = None) -> np.ndarray:
    """Expert e of a stacked expert tensor (n_expert, rows, cols), dequantized: shape[1:]."""
    lookup(ggml_type, DEQUANT_TYPES, "moert.kernels")
    data, shape = slice_expert(raw, ggml_type, shape, e)
    return dequantize(data, ggml_type, shape, out=out)
