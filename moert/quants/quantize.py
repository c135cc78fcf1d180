"""Quantizers: float32 -> GGML blocks, vectorized NumPy, for building synthetic test models.

They write correct GGML encodings (moert/quants/dequant.py draws the layouts) with small error,
but do not copy llama.cpp's search: a scale from the block's range, then for the k-quants two
rounds of "round to the grid, refit scale (and min) by least squares". Every scale is rounded to
its stored precision (fp16, 6-bit, int8) before the weights are rounded, so the weights are
quantized against the scale the dequantizer will actually use.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moert.errors import UnsupportedTypeError
from moert.quants.types import TYPES, GGMLType

CHUNK = 1 << 18  # weights per pass: bounds the temporaries, keeps them in cache

_F16_MAX = 65504.0


def _f16(d):
    """float32 scales -> (fp16 bytes (n, 2), the float32 value the dequantizer will read (n,))."""
    h = np.minimum(d, _F16_MAX).astype(np.float16)
    return h.view(np.uint8).reshape(-1, 2), h.astype(np.float32)


def _inv(d):
    """1 / d, and 0 where d is 0."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _signed_max(x):
    """The element of largest magnitude along the last axis, with its sign: (...)."""
    i = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, i, axis=-1)[..., 0]


# --- plain types ------------------------------------------------------------------------------

def quant_f32(x):
    return x.astype("<f4").view(np.uint8).reshape(len(x), 4)


def quant_f16(x):
    return x.astype("<f2").view(np.uint8).reshape(len(x), 2)


def quant_bf16(x):
    """Round to nearest even, NaN kept quiet; as ggml_compute_fp32_to_bf16."""
    n = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    with np.errstate(over="ignore"):  # the rounding add wraps only for NaNs, which are not selected
        r = np.where(nan, (n >> 16) | 64, (n + (0x7FFF + ((n >> 16) & 1))) >> 16)
    return r.astype("<u2").view(np.uint8).reshape(len(x), 2)


# --- 32-weight blocks: x is (n, 32) ------------------------------------------------------------

def quant_q8_0(x):
    """| d f16 | qs[32] int8 |, d = max|x| / 127."""
    db, d = _f16(np.abs(x).max(axis=1) / 127)
    q = np.clip(np.rint(x * _inv(d)[:, None]), -127, 127).astype(np.int8)
    return np.concatenate([db, q.view(np.uint8)], axis=1)


def _nibbles(q):
    """(n, 32) of 4-bit values -> (n, 16): q[j] low nibble, q[j + 16] high nibble."""
    return (q[:, :16] & 0xF) | ((q[:, 16:] & 0xF) << 4)


def quant_q4_0(x):
    """| d f16 | qs[16] |, d = -max / 8 so the largest magnitude lands exactly on -8."""
    db, d = _f16(_signed_max(x) / -8)
    q = np.clip(np.rint(x * _inv(d)[:, None]) + 8, 0, 15).astype(np.uint8)
    return np.concatenate([db, _nibbles(q)], axis=1)


def quant_q5_0(x):
    """| d f16 | qh u32 | qs[16] |, d = -max / 16."""
    db, d = _f16(_signed_max(x) / -16)
    q = np.clip(np.rint(x * _inv(d)[:, None]) + 16, 0, 31).astype(np.uint8)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")                        # (n, 4)
    return np.concatenate([db, qh, _nibbles(q)], axis=1)


def quant_mxfp4(x):
    """| e E8M0 | qs[16] |: e = floor(log2 max|x|) - 2 + 127 (so max|x| / 2^(e-127) is in [4, 8), the top of
    E2M1's range), each weight the nearest of the 16 values times 2^(e-128), ties to the lower code (ggml's
    quantize_row_mxfp4_ref and gguf-py)."""
    from moert.quants.dequant import MXFP4_VALUES, e8m0_half

    amax = np.abs(x).max(axis=1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2 + 127, 0).astype(np.uint8)      # (n,)
    d = e8m0_half(np, e)                                                        # (n,) float32
    grid = d[:, None, None] * np.asarray(MXFP4_VALUES, dtype=np.float32)        # (n, 1, 16)
    q = np.abs(grid - x[:, :, None]).argmin(axis=-1).astype(np.uint8)           # (n, 32)
    return np.concatenate([e[:, None], _nibbles(q)], axis=1)


# --- k-quants: x is (n, 256) -------------------------------------------------------------------

def _fit_affine(x, nmax: int, rounds: int = 2):
    """Per sub-block x ~ s * q - m, q in [0, nmax], m >= 0: (s, m), each x.shape[:-1]."""
    lo = np.minimum(x.min(axis=-1), 0)
    s = (x.max(axis=-1) - lo) / nmax
    m = -lo
    k = x.shape[-1]
    sx = x.sum(axis=-1)
    for _ in range(rounds):
        q = np.clip(np.rint((x + m[..., None]) * _inv(s)[..., None]), 0, nmax)
        sq, sqq, sqx = q.sum(axis=-1), (q * q).sum(axis=-1), (q * x).sum(axis=-1)
        det = k * sqq - sq * sq
        ok = det > 0
        s_new = np.where(ok, (k * sqx - sx * sq) / np.where(ok, det, 1), s)
        m_new = (s_new * sq - sx) / k
        neg = m_new < 0  # the min must be >= 0: refit the scale alone
        s_new = np.where(neg & (sqq > 0), sqx / np.where(sqq > 0, sqq, 1), s_new)
        m_new = np.maximum(m_new, 0)
        good = s_new > 0
        s, m = np.where(good, s_new, s), np.where(good, m_new, m)
    return s.astype(np.float32), m.astype(np.float32)


def _six_bits(v):
    """(n, 8) non-negative -> (fp16 bytes of the super-scale (n, 2), its value (n, 1), 6-bit codes)."""
    db, d = _f16(v.max(axis=1) / 63)
    return db, d[:, None], np.clip(np.rint(v * _inv(d)[:, None]), 0, 63).astype(np.uint8)


def _pack_scale_min_k4(sc, m):
    """(n, 8) 6-bit scales and mins -> the 12 scale bytes of Q4_K/Q5_K (layout in dequant.py)."""
    return np.concatenate([
        (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6),
        (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6),
        (sc[:, 4:] & 0xF) | ((m[:, 4:] & 0xF) << 4),
    ], axis=1)


def _affine_k(x, nmax: int):
    """Shared by Q4_K and Q5_K: (d, dmin bytes (n, 4), scale bytes (n, 12), q (n, 8, 32))."""
    n = x.shape[0]
    xs = x.reshape(n, 8, 32)
    s, m = _fit_affine(xs, nmax)
    db, d, sc = _six_bits(s)
    mb, dmin, mq = _six_bits(m)
    scale = (d * sc.astype(np.float32))[:, :, None]                             # (n, 8, 1), as dequant
    mn = (dmin * mq.astype(np.float32))[:, :, None]
    q = np.clip(np.rint((xs + mn) * _inv(scale)), 0, nmax).astype(np.uint8)     # (n, 8, 32)
    return np.concatenate([db, mb], axis=1), _pack_scale_min_k4(sc, mq), q


def quant_q4_k(x):
    """| d | dmin | scales[12] | qs[128] |: sub-blocks 2p, 2p+1 in the nibbles of qs[32p:32p+32]."""
    n = x.shape[0]
    dm, scales, q = _affine_k(x, 15)
    qs = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, 128)
    return np.concatenate([dm, scales, qs], axis=1)


def quant_q5_k(x):
    """| d | dmin | scales[12] | qh[32] | qs[128] |: bit j of qh[l] = bit 4 of sub-block j, weight l."""
    n = x.shape[0]
    dm, scales, q = _affine_k(x, 31)
    qs = ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).reshape(n, 128)
    qh = np.packbits(q >> 4, axis=1, bitorder="little")                         # (n, 1, 32) over j
    return np.concatenate([dm, scales, qh.reshape(n, 32), qs], axis=1)


def quant_q6_k(x):
    """| ql[128] | qh[64] | scales[16] int8 | d f16 |: 16 sub-blocks of 16, w = d * sc * (q - 32)."""
    n = x.shape[0]
    xs = x.reshape(n, 16, 16)
    s = _signed_max(xs) / -32                                                   # (n, 16)
    for _ in range(2):  # round, then refit each sub-block's scale by least squares
        q = np.clip(np.rint(xs * _inv(s)[..., None]), -32, 31)
        qq = (q * q).sum(axis=-1)
        s = np.where(qq > 0, (q * xs).sum(axis=-1) / np.where(qq > 0, qq, 1), s).astype(np.float32)
    db, d = _f16(np.abs(s).max(axis=1) / 127)
    sc = np.clip(np.rint(s * _inv(d)[:, None]), -127, 127).astype(np.int8)       # (n, 16)
    scale = (d[:, None] * sc.astype(np.float32))[:, :, None]                    # (n, 16, 1), as dequant
    q = (np.clip(np.rint(xs * _inv(scale)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, 2, 4, 32)                                                  # weight 128h + 32t + l
    ql = (q[:, :, 0:2] & 0xF) | ((q[:, :, 2:4] & 0xF) << 4)                      # (n, h, t % 2, l)
    qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
    return np.concatenate([ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), db], axis=1)


QUANT: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "F32": quant_f32, "F16": quant_f16, "BF16": quant_bf16,
    "Q8_0": quant_q8_0, "Q4_0": quant_q4_0, "Q5_0": quant_q5_0, "MXFP4": quant_mxfp4,
    "Q4_K": quant_q4_k, "Q5_K": quant_q5_k, "Q6_K": quant_q6_k,
}

QUANTIZABLE = frozenset(QUANT)


def quantize(x: np.ndarray, ggml_type: str | GGMLType) -> np.ndarray:
    """Quantize x (..., n) to GGML blocks: uint8 of shape (..., row bytes); n a multiple of the block size."""
    name = ggml_type.name if isinstance(ggml_type, GGMLType) else ggml_type
    if name not in QUANT:
        raise UnsupportedTypeError(
            f"moert cannot quantize to {name!r}; it quantizes to {', '.join(sorted(QUANT))}. "
            f"Pick one of those, or write the tensor with gguf.quants.quantize."
        )
    t = TYPES[name]
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[-1] % t.block_size:
        raise ValueError(f"cannot quantize shape {x.shape} to {name}: the last dim must be a multiple of "
                         f"{t.block_size}; pick a 32-block type (Q8_0, Q5_0, Q4_0) or F16 for other lengths")
    blocks = x.reshape(-1, t.block_size)                                        # (n_blocks, block_size)
    out = np.empty((blocks.shape[0], t.type_size), dtype=np.uint8)
    step = max(1, CHUNK // t.block_size)
    for i in range(0, blocks.shape[0], step):
        out[i:i + step] = QUANT[name](blocks[i:i + step].astype(np.float32))
    return out.reshape(*x.shape[:-1], t.row_bytes(x.shape[-1]))
