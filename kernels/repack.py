"""Load-time repack of Q4_K weights for the int8 kernels (act_quant="int8", opt-in with repack=True): each
144-byte GGUF block becomes a 148-byte one whose 8 scales and 8 mins are one byte each, so the one-token
and batch int8 kernels (kernels/simd.py q4kr_row) load them with one instruction instead of unpacking
the 6-bit fields of every block (about a quarter of the kernel's instructions; bench/RESULTS.md).

    GGUF Q4_K   | d f16 | dmin f16 | scales[12] (6-bit sc, m packed) | qs[128] |   144 bytes
    repacked    | d f16 | dmin f16 | sc[8] u8 | m[8] u8             | qs[128] |   148 bytes (+2.8%)

d, dmin and the nibbles are copied as they are, so the kernel's sums are the same bit for bit
(tests/test_kernels_repack.py). The repacked copy lives in memory (the file's pages of that tensor are no
longer read): a model reports its bytes (Model.repacked_bytes). The twin (repack_q4_k_ref) is NumPy.

    repack_q4_k(raw)       raw (N, nb*144) uint8 rows of Q4_K blocks -> (N, nb*148), Numba
    repack_q4_k_ref(raw)   the NumPy twin
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moert.quants.dequant import _scale_min_k4

__all__ = ["BYTES", "PACKED_BYTES", "repack_q4_k", "repack_q4_k_ref", "repacked"]

BYTES, PACKED_BYTES = 144, 148      # a Q4_K block as GGUF stores it, and repacked


@njit(cache=True)
def repack_q4_k(raw):
    """raw (N, nb*144) uint8 -> (N, nb*148) uint8, every block's scales and mins unpacked (ggml's
    get_scale_min_k4: for j < 4 the low 6 bits of bytes j, j+4; for j >= 4 the nibbles of byte j+4 with
    the top 2 bits of bytes j-4, j)."""
    N, nb = raw.shape[0], raw.shape[1] // BYTES
    out = np.empty((N, nb * PACKED_BYTES), dtype=np.uint8)
    for r in range(N):
        for b in range(nb):
            i, o = b * BYTES, b * PACKED_BYTES
            for k in range(4):
                out[r, o + k] = raw[r, i + k]
            for j in range(4):
                a, m, h = raw[r, i + 4 + j], raw[r, i + 8 + j], raw[r, i + 12 + j]
                out[r, o + 4 + j] = a & 63
                out[r, o + 12 + j] = m & 63
                out[r, o + 8 + j] = (h & 15) | ((a >> 6) << 4)
                out[r, o + 16 + j] = (h >> 4) | ((m >> 6) << 4)
            for k in range(128):
                out[r, o + 20 + k] = raw[r, i + 16 + k]
    return out


def repack_q4_k_ref(raw: np.ndarray) -> np.ndarray:
    """NumPy twin of repack_q4_k: the scales and mins as moert.quants' reference dequantizer decodes them."""
    N = raw.shape[0]
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, BYTES)                 # (N * nb, 144) blocks
    sc, mn = _scale_min_k4(np, b[:, 4:16])                              # the reference dequantizer's decoder
    return np.concatenate([b[:, 0:4], sc, mn, b[:, 16:]], axis=1).reshape(N, -1)


def repacked(raw: np.ndarray) -> np.ndarray:
    """A Q4_K tensor's rows, (..., row_bytes) uint8 of any leading shape, repacked: a read-only array of the
    same leading shape (the kernels take read-only bytes, as a file map gives)."""
    lead = raw.shape[:-1]
    out = repack_q4_k(np.ascontiguousarray(raw).reshape(-1, raw.shape[-1])).reshape(*lead, -1)
    out.flags.writeable = False
    return out
