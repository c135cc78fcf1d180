"""Load-time repack of Q4_K weights for the int8 kernels (act_quant="int8", opt-in with repack=True): each
144-byte GGUF block becomes a 148-byte one whose 8 scales and 8 mins are one byte each and whose nibbles
are laid out for the kernel (kernels/simd.py q4kr_row), which then needs a quarter fewer instructions
and half the scale shuffles of the kernel over GGUF's blocks (bench/HISTORY.md, 2026-11-24 run M).

    GGUF Q4_K   | d f16 | dmin f16 | scales[12] (6-bit sc, m packed) | qs[128]           |   144 bytes
    repacked    | d f16 | dmin f16 | sc[8] u8 | m[8] u8             | qs[128] (paired)  |   148 bytes (+2.8%)

The pairing. GGUF's 32 bytes p (p < 4) hold sub-block 2p in their low nibbles and 2p + 1 in their high
ones, so the kernel multiplies each by its own broadcast scale. Here the two sub-blocks of a pair are
interleaved two weights at a time: the 64 weights of pair p in the order PAIR (weights 64p + PAIR[k]),
the first 32 of them in the low nibbles of bytes 20 + 32p + k (k < 32), the next 32 in the high ones.
The int8 x is read in the same order (pair_x8), so the u8 x s8 products come out of vpmaddubsw with
sub-block 2p in the even 16-bit lanes and 2p + 1 in the odd ones: the low- and high-nibble products add
in 16 bits (each at most 2 * 15 * 127), and one vpmaddwd with the pair's two scales repeated (one
in-lane vpshufd) takes both sub-blocks.

The kernel's int32 sums per block are the same integers as over GGUF's blocks; their float lanes add up
in another order, so results match the plain int8 kernel to float rounding, not bit for bit
(tests/test_kernels_repack.py). The repacked copy lives in memory (the file's pages of that tensor are
no longer read): a model reports its bytes (Model.repacked_bytes). The twins (*_ref) are NumPy.

    repack_q4_k(raw)         raw (N, nb*144) uint8 rows of Q4_K blocks -> (N, nb*148), Numba
    repack_q4_k_ref(raw)     the NumPy twin
    pair_x8(x8)              int8 x (T, C) with its columns in PAIR order, Numba (x_q4_kr: the kernel's x)
    pair_x8_ref(x8)          the NumPy twin
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moert.kernels.matmul_q import neg16
from moert.quants.dequant import _scale_min_k4

__all__ = ["BYTES", "PACKED_BYTES", "PAIR", "pair_x8", "pair_x8_ref", "repack_q4_k", "repack_q4_k_ref", "repacked",
           "x_q4_kr"]

BYTES, PACKED_BYTES = 144, 148      # a Q4_K block as GGUF stores it, and repacked

# Weight k (k < 64) of a pair of sub-blocks in the repacked order: two weights of the first sub-block, two
# of the second, and so on (PAIR[4i + e] = 2i + e, PAIR[4i + 2 + e] = 32 + 2i + e, e < 2).
PAIR = np.array([32 * ((k // 2) % 2) + 2 * (k // 4) + k % 2 for k in range(64)], dtype=np.int64)


@njit(cache=True)
def repack_q4_k(raw):
    """raw (N, nb*144) uint8 -> (N, nb*148) uint8, every block's scales and mins unpacked (ggml's
    get_scale_min_k4: for j < 4 the low 6 bits of bytes j, j+4; for j >= 4 the nibbles of byte j+4 with
    the top 2 bits of bytes j-4, j) and its nibbles in PAIR order. PAIR puts at byte 4i + e of a pair the
    low nibbles of its bytes j = 2i + e and j + 16 (weights j, j + 16), at byte 4i + 2 + e their high ones
    (weights 32 + j, 48 + j): whole bytes masked and shifted, no per-weight gather (~10x the first version)."""
    N, nb = raw.shape[0], raw.shape[1] // BYTES
    src = raw.reshape(N * nb, BYTES)
    out = np.empty((N * nb, PACKED_BYTES), dtype=np.uint8)
    for n in range(N * nb):
        b, o = src[n], out[n]
        for k in range(4):
            o[k] = b[k]
        for j in range(4):
            a, m, h = b[4 + j], b[8 + j], b[12 + j]
            o[4 + j] = a & 63
            o[12 + j] = m & 63
            o[8 + j] = (h & 15) | ((a >> 6) << 4)
            o[16 + j] = (h >> 4) | ((m >> 6) << 4)
        for p in range(4):
            q, d = 16 + 32 * p, 20 + 32 * p
            for i in range(8):
                for e in range(2):
                    lo, hi = b[q + 2 * i + e], b[q + 2 * i + e + 16]
                    o[d + 4 * i + e] = (lo & 15) | ((hi & 15) << 4)
                    o[d + 4 * i + 2 + e] = (lo >> 4) | (hi & 240)
    return out.reshape(N, nb * PACKED_BYTES)


def repack_q4_k_ref(raw: np.ndarray) -> np.ndarray:
    """NumPy twin of repack_q4_k: the scales and mins as moert.quants' reference dequantizer decodes them,
    the nibbles (GGUF's order: weight 64p + 32h + l is nibble h of byte 32p + l) gathered in PAIR order."""
    N = raw.shape[0]
    b = np.asarray(raw, dtype=np.uint8).reshape(-1, BYTES)                 # (N * nb, 144) blocks
    sc, mn = _scale_min_k4(np, b[:, 4:16])                              # the reference dequantizer's decoder
    q = b[:, 16:].reshape(-1, 4, 1, 32)
    w = np.concatenate([q & 15, q >> 4], axis=2).reshape(-1, 4, 64)       # (n, pair, weight) in GGUF's order
    w = w[:, :, PAIR]
    qs = (w[:, :, :32] | (w[:, :, 32:] << 4)).reshape(-1, 128)
    return np.concatenate([b[:, 0:4], sc, mn, qs], axis=1).reshape(N, -1)


@njit(cache=True, inline="always")
def pair_x8(x8):
    """int8 x (T, C) -> its columns in PAIR order: as 16-bit pairs of weights, each 64-byte group's first 16
    pairs and last 16 interleaved."""
    T, C = x8.shape
    out = np.empty((T, C), dtype=np.int8)
    x16, o16 = x8.view(np.int16), out.view(np.int16)
    for t in range(T):
        for g in range(C // 64):                                        # 64-byte groups, as 32 16-bit pairs
            base = 32 * g
            for m in range(16):
                o16[t, base + 2 * m] = x16[t, base + m]
                o16[t, base + 2 * m + 1] = x16[t, base + 16 + m]
    return out


@njit(cache=True, inline="always")
def x_q4_kr(xq, x8, xd, xb):
    """The repacked kernel's x (matmul_q.x_q4_k's, with x8 in PAIR order): made once per matmul, as the
    drivers make every kernel's x."""
    return xq, pair_x8(x8), xd, neg16(xb)


def pair_x8_ref(x8: np.ndarray) -> np.ndarray:
    """NumPy twin of pair_x8 over all columns: x[..., 64g + PAIR[k]] at column 64g + k."""
    T, C = x8.shape
    return np.ascontiguousarray(x8.reshape(T, C // 64, 64)[:, :, PAIR].reshape(T, C))


def repacked(raw: np.ndarray) -> np.ndarray:
    """A Q4_K tensor's rows, (..., row_bytes) uint8 of any leading shape, repacked: a read-only array of the
    same leading shape (the kernels take read-only bytes, as a file map gives)."""
    lead = raw.shape[:-1]
    out = repack_q4_k(np.ascontiguousarray(raw).reshape(-1, raw.shape[-1])).reshape(*lead, -1)
    out.flags.writeable = False
    return out
