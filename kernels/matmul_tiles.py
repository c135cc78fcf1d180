"""A prompt's float matmul at the speed of the machine's sgemm: y = x @ W.T for many tokens, W's rows a tile at a
time dequantized into a float32 buffer, then BLAS (sgemm) multiplies the tile with every token of the chunk.

    tiled(type_name)              the parallel kernel of one GGML type, or None (no SciPy: Numba's np.dot needs it)
    Tiled(w)                      a weight made ready: call(x, out) -> out (T, R); None-able as above
    tiled_ref(x, w)               the twin: the reference dequantizer, then x @ W.T

A batch's float kernels (kernels/matmul.py) decode each block and multiply it with 4 tokens at a time: memory-
friendly, but far from the core's FMA rate once the batch is big (a prompt chunk of 512 tokens reads each weight
once, then is compute-bound). Here one work item is TILE rows of W: dequantized exactly as kernels/dequant.py
does (bit for bit the reference's values) into a buffer the item reuses, then np.dot (sgemm) of the chunk's
tokens with it; the items spread over the threads, each sgemm on its own thread. Same results as the batch
kernels up to float rounding (the sums run in another order); tests/test_kernels_matmul_tiles.py checks both.

Dimension legend: T tokens, R rows (output features), C columns (input features).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util

import numpy as np
from numba import prange

from moert.kernels.blockdot import PRANGE_ONLY
from moert.kernels.jit import threads, variant
from moert.kernels.ktypes import TYPES
from moert.kernels.qtensor import QTensor
from moert.quants.dequant import dequantize as _ref_dequantize

__all__ = ["MIN_TOKENS", "Tiled", "one_blas_thread", "serial_dequant", "tiled", "tiled_ref"]

MIN_TOKENS = 128         # from this many tokens a float matmul takes the tiles (fewer: kernels/matmul.py's;
#                          Q4_K/Q6_K 4096 x 2048 on 2 threads: 0.8-1.0x at 32-64 tokens, 1.1-1.4x at 128, 1.5-2x at 512)
TILE_BYTES = 1 << 19     # float32 bytes of one tile (rows x C): an L2's share

# Bound per type by `tiled`: deq (the type's dequantize kernel, compiled serial), BLOCK, BYTES. Placeholders.
deq = None
BLOCK = BYTES = 0


def _tiled(w, x, out, f16, rows):
    """out (T, R) = x (T, C) @ W.T: tiles of `rows` rows of w (R, row_bytes) dequantized, then sgemm, in prange."""
    R, C, T = w.shape[0], x.shape[1], x.shape[0]
    per_row = w.shape[1] // BYTES                                       # blocks a row
    for i in prange((R + rows - 1) // rows):
        r0 = i * rows
        n = min(R, r0 + rows) - r0
        tile = np.empty((n, C), dtype=np.float32)                       # (n, C) this item's buffer
        deq(w[r0:r0 + n].reshape(n * per_row, BYTES), tile.reshape(n * per_row, BLOCK), f16)
        y = np.dot(x, tile.T)                                           # (T, n) sgemm
        for t in range(T):
            for j in range(n):
                out[t, r0 + j] = y[t, j]


@functools.cache
def tiled(type_name: str):
    """The tiled kernel of one type, kernel(w, x, out, f16, rows), made on first use; None where SciPy (Numba's
    BLAS for np.dot) is missing or the type has no dequantize kernel."""
    kt = TYPES.get(type_name)
    if kt is None or kt.dequant is None or kt.layout is None or importlib.util.find_spec("scipy") is None:
        return None
    return variant(_tiled, f"tiled_{type_name.lower()}", parallel=PRANGE_ONLY, fastmath={"reassoc", "contract"},
                   deq=serial_dequant(type_name), BLOCK=kt.block, BYTES=kt.block_bytes)


@functools.cache
def serial_dequant(type_name: str):
    """The type's dequantize kernel (kernels/dequant.py: kernel(blocks, y, f16), exact) compiled without threads,
    for a tile inside a parallel region."""
    kt = TYPES[type_name]
    return variant(kt.dequant.py_func, f"deq_tile_{type_name.lower()}", fastmath=False)   # its prange runs as range


_BLAS = None          # threadpoolctl's views of every loaded BLAS, SciPy's (Numba's np.dot) included


@contextlib.contextmanager
def one_blas_thread():
    """Every BLAS on one thread inside: each of the kernel's threads runs its own sgemm."""
    global _BLAS
    if _BLAS is None:
        import scipy.linalg.cython_blas  # noqa: F401  (loads SciPy's BLAS, so threadpoolctl sees it)
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController().select(user_api="blas").lib_controllers
    before = [(lib, lib.get_num_threads()) for lib in _BLAS]
    for lib, k in before:
        if k != 1:
            lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib, k in before:
            if k != 1:
                lib.set_num_threads(k)


class Tiled:
    """A weight's tiled float matmul: its raw rows, kernel and tile height looked up once."""

    __slots__ = ("kernel", "raw", "f16", "rows", "shape")

    def __init__(self, w: QTensor, raw: np.ndarray, kernel):
        self.kernel, self.raw, self.f16, self.shape = kernel, raw, TYPES[w.type].table, tuple(w.shape)
        self.rows = max(8, min(256, TILE_BYTES // (4 * w.shape[1])))

    def __call__(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """x (T, C) float32 C-contiguous -> out (T, R)."""
        rows = self.rows
        n_items = -(-self.shape[0] // rows)
        if n_items < 4 * threads():                                     # >= 4 items a thread: none idles long
            rows = max(8, -(-self.shape[0] // (4 * threads())))
        with one_blas_thread():
            self.kernel(self.raw, x, out, self.f16, rows)
        return out

    @classmethod
    def make(cls, w: QTensor, raw: np.ndarray) -> Tiled | None:
        """Tiled for a weight whose float prompt matmuls can take it (raw: its (R, row_bytes) rows), else None."""
        kernel = tiled(w.type) if len(w.shape) == 2 else None
        return None if kernel is None else cls(w, raw, kernel)


def tiled_ref(x: np.ndarray, w: QTensor) -> np.ndarray:
    """The twin: W dequantized whole by the reference (moert.quants), then x @ W.T (T, R) float32."""
    return np.asarray(x, dtype=np.float32) @ _ref_dequantize(w.raw, w.type, w.shape).T
