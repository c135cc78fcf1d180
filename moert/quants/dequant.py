"""Reference dequantizers: one function per GGML type, each with its block layout drawn above it.

Every function is written against an array module `xp` (numpy or cupy) and uses only what both
provide, so the very same code runs on a GPU. No Python loop ever runs over blocks: a function takes
all blocks of a chunk at once, `(n, type_size)` uint8 -> `(n, block_size)` float32, and reproduces
ggml's float32 arithmetic operation for operation, so the results are bit-exact with ggml-quants.c
and gguf-py. The Numba fast paths in kernels/dequant.py are checked against these.

Layouts are little-endian byte offsets within one block; `f16` is an IEEE half, `d` a scale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from moert.errors import GGUFError, UnsupportedTypeError
from moert.quants.types import TYPES, GGMLType

# The chunk the public entry hands to a dequantizer, in weights: bounds the temporaries
# (a few float32 arrays of this size) and keeps them in cache.
CHUNK = 1 << 18


# --- helpers: scales and bit fields -----------------------------------------------------------

def _f16(xp, b):
    """(n, 2) uint8 little-endian halves -> (n, 1) float32."""
    return xp.ascontiguousarray(b).view(xp.float16).astype(xp.float32)


def _fields(xp, b, width: int, axis: int = -2):
    """Split every byte of b into its 8/width bit fields, lowest first, stacked on a new axis."""
    mask = (1 << width) - 1
    return xp.stack([(b >> s) & mask for s in range(0, 8, width)], axis=axis)


def _f32(x):
    return x.astype("float32")


# --- plain types ------------------------------------------------------------------------------

# F32: | f32 |      BF16: | bf16 |  (the top half of an f32)      F16: | f16 |
#      0     4            0      2                                     0     2

def dequant_f32(blocks, xp):
    """F32 (n, 4) bytes -> (n, 1); a view, no copy."""
    return xp.ascontiguousarray(blocks).view(xp.float32)


def dequant_f16(blocks, xp):
    """F16 (n, 2) bytes -> (n, 1)."""
    return _f16(xp, blocks)


def dequant_bf16(blocks, xp):
    """BF16 (n, 2) bytes -> (n, 1): the 16 bits become the high half of an f32."""
    bits = xp.ascontiguousarray(blocks).view(xp.uint16).astype(xp.uint32) << 16
    return bits.view(xp.float32)


# --- 32-weight blocks -------------------------------------------------------------------------

# Q4_0: 18 bytes, 32 weights; w = d * (q - 8)
#   | d f16 | qs[16]: q[j] in the low nibble of qs[j], q[j+16] in the high nibble |
#   0       2                                                                    18

def dequant_q4_0(blocks, xp):
    n = blocks.shape[0]
    d = _f16(xp, blocks[:, 0:2])                                     # (n, 1)
    q = _fields(xp, blocks[:, 2:18], 4).reshape(n, 32)               # (n, 32)
    return d * (_f32(q) - 8)


# Q4_1: 20 bytes, 32 weights; w = d * q + m
#   | d f16 | m f16 | qs[16]: nibbles as Q4_0 |
#   0       2       4                         20

def dequant_q4_1(blocks, xp):
    n = blocks.shape[0]
    d, m = _f16(xp, blocks[:, 0:2]), _f16(xp, blocks[:, 2:4])         # (n, 1)
    q = _fields(xp, blocks[:, 4:20], 4).reshape(n, 32)
    return d * _f32(q) + m


def _q5_high(xp, qh):
    """(n, 4) bytes of a little-endian u32 -> (n, 32): bit j of the u32 at position j."""
    return _fields(xp, qh, 1, axis=-1).reshape(qh.shape[0], 32)


# Q5_0: 22 bytes, 32 weights; w = d * (q - 16), q = 4 low bits from qs | 5th bit from qh
#   | d f16 | qh u32: bit j = bit 4 of q[j] | qs[16]: low nibbles as Q4_0 |
#   0       2                               6                            22

def dequant_q5_0(blocks, xp):
    n = blocks.shape[0]
    d = _f16(xp, blocks[:, 0:2])
    qh = _q5_high(xp, blocks[:, 2:6])
    q = _fields(xp, blocks[:, 6:22], 4).reshape(n, 32) | (qh << 4)
    return d * (_f32(q) - 16)


# Q5_1: 24 bytes, 32 weights; w = d * q + m
#   | d f16 | m f16 | qh u32 | qs[16] |   (qh and qs as Q5_0)
#   0       2       4        8        24

def dequant_q5_1(blocks, xp):
    n = blocks.shape[0]
    d, m = _f16(xp, blocks[:, 0:2]), _f16(xp, blocks[:, 2:4])
    qh = _q5_high(xp, blocks[:, 4:8])
    q = _fields(xp, blocks[:, 8:24], 4).reshape(n, 32) | (qh << 4)
    return d * _f32(q) + m


# Q8_0: 34 bytes, 32 weights; w = d * q
#   | d f16 | qs[32] int8 |
#   0       2             34

def dequant_q8_0(blocks, xp):
    d = _f16(xp, blocks[:, 0:2])
    return _f32(blocks[:, 2:34].view(xp.int8)) * d


# MXFP4 (gpt-oss, OCP microscaling): 17 bytes, 32 weights; w = 2^(e-127) * e2m1(q)
#   | e u8 (E8M0 exponent) | qs[16]: 4-bit E2M1 codes, nibbles as Q4_0 |
#   0                      1                                          17
# ggml keeps the E2M1 values doubled (integers) and halves the scale instead.
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # 2 * e2m1(code)


def e8m0_half(xp, e):
    """E8M0 byte -> 2^(e-128) as float32, exactly as ggml_e8m0_to_fp32_half (e < 2: subnormal)."""
    e = e.astype(xp.uint32)
    bits = xp.where(e < 2, 0x00200000 << e, (e - 1) << 23)  # (e - 1) wraps at e = 0: not selected
    return bits.view(xp.float32)


def dequant_mxfp4(blocks, xp):
    n = blocks.shape[0]
    d = e8m0_half(xp, xp.ascontiguousarray(blocks[:, 0:1]))             # (n, 1)
    q = _fields(xp, blocks[:, 1:17], 4).reshape(n, 32)
    return d * xp.asarray(MXFP4_VALUES, dtype=xp.float32)[q]


# --- k-quants: 256-weight super-blocks --------------------------------------------------------

# Q2_K: 84 bytes; 16 sub-blocks of 16; w = d * sc * q - dmin * m, q 2 bits, sc/m 4 bits each
#   | scales[16]: sc low nibble, m high | qs[64] | d f16 | dmin f16 |
#   0                                   16       80      82         84
#   q of weight 128h + 32s + l (h < 2, s < 4, l < 32): bits 2s..2s+1 of qs[32h + l]

def dequant_q2_k(blocks, xp):
    n = blocks.shape[0]
    sc = blocks[:, 0:16]
    d, dmin = _f16(xp, blocks[:, 80:82]), _f16(xp, blocks[:, 82:84])
    dl = (d * _f32(sc & 0xF))[:, :, None]                             # (n, 16, 1)
    ml = (dmin * _f32(sc >> 4))[:, :, None]
    q = _fields(xp, blocks[:, 16:80].reshape(n, 2, 32), 2)           # (n, 2, 4, 32)
    return (dl * _f32(q.reshape(n, 16, 16)) - ml).reshape(n, 256)


# Q3_K: 110 bytes; 16 sub-blocks of 16; w = d * (sc - 32) * (q - 4 * !hbit), q 2 bits
#   | hmask[32] | qs[64] | scales[12]: 16 x 6-bit | d f16 |
#   0           32       96                       108     110
#   weight 32k + l (k < 8, l < 32): 2 low bits as Q2_K, high bit = bit k of hmask[l]
#   scale i: low 4 bits from scales[i % 8] (nibble i // 8), high 2 bits from
#   scales[8 + i % 4] (bits 2(i // 4)..)

def dequant_q3_k(blocks, xp):
    n = blocks.shape[0]
    s = blocks[:, 96:108]
    lo = xp.concatenate([s[:, 0:8] & 0xF, s[:, 0:8] >> 4], axis=1)           # (n, 16)
    hi = _fields(xp, s[:, 8:12], 2).reshape(n, 16)                           # (n, 16)
    sc = _f32((lo | (hi << 4)).astype(xp.int8) - 32)
    dl = (_f16(xp, blocks[:, 108:110]) * sc)[:, :, None]                     # (n, 16, 1)
    ql = _fields(xp, blocks[:, 32:96].reshape(n, 2, 32), 2).reshape(n, 8, 32)
    hb = _fields(xp, blocks[:, 0:32], 1)                                     # (n, 8, 32)
    q = ql.astype(xp.int8) - ((hb ^ 1) << 2).astype(xp.int8)
    return (dl * _f32(q.reshape(n, 16, 16))).reshape(n, 256)


def _scale_min_k4(xp, s):
    """The 12 scale bytes of Q4_K/Q5_K -> (sc, m), each (n, 8) uint8 of 6 bits.

    byte 0-3: sc[0-3] low 6 bits, top 2 bits = sc[4-7] >> 4
    byte 4-7: m[0-3]  low 6 bits, top 2 bits = m[4-7] >> 4
    byte 8-11: sc[4-7] & 0xF in the low nibble, m[4-7] & 0xF in the high nibble
    """
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = xp.concatenate([a & 63, (c & 0xF) | ((a >> 6) << 4)], axis=1)
    m = xp.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, m


# Q4_K: 144 bytes; 8 sub-blocks of 32; w = d * sc * q - dmin * m, q 4 bits, sc/m 6 bits
#   | d f16 | dmin f16 | scales[12] (see _scale_min_k4) | qs[128] |
#   0       2          4                                16        144
#   sub-block j, weight l: nibble j % 2 of qs[32 (j // 2) + l]

def dequant_q4_k(blocks, xp):
    n = blocks.shape[0]
    d, dmin = _f16(xp, blocks[:, 0:2]), _f16(xp, blocks[:, 2:4])
    sc, m = _scale_min_k4(xp, blocks[:, 4:16])
    dl = (d * _f32(sc))[:, :, None]                                          # (n, 8, 1)
    ml = (dmin * _f32(m))[:, :, None]
    q = _fields(xp, blocks[:, 16:144].reshape(n, 4, 32), 4).reshape(n, 8, 32)
    return (dl * _f32(q) - ml).reshape(n, 256)


# Q5_K: 176 bytes; as Q4_K plus a 5th bit per weight
#   | d f16 | dmin f16 | scales[12] | qh[32]: bit j of qh[l] -> sub-block j | qs[128] |
#   0       2          4            16                                      48        176

def dequant_q5_k(blocks, xp):
    n = blocks.shape[0]
    d, dmin = _f16(xp, blocks[:, 0:2]), _f16(xp, blocks[:, 2:4])
    sc, m = _scale_min_k4(xp, blocks[:, 4:16])
    dl = (d * _f32(sc))[:, :, None]                                          # (n, 8, 1)
    ml = (dmin * _f32(m))[:, :, None]
    qh = _fields(xp, blocks[:, 16:48], 1)                                    # (n, 8, 32)
    ql = _fields(xp, blocks[:, 48:176].reshape(n, 4, 32), 4).reshape(n, 8, 32)
    return (dl * _f32(ql | (qh << 4)) - ml).reshape(n, 256)


# Q6_K: 210 bytes; 16 sub-blocks of 16; w = d * sc * (q - 32), q 6 bits, sc int8
#   | ql[128]: low 4 bits | qh[64]: high 2 bits | scales[16] int8 | d f16 |
#   0                     128                   192               208     210
#   weight 128h + 32t + l (h < 2, t < 4, l < 32):
#     low bits  = nibble t // 2 of ql[64h + 32 (t % 2) + l]
#     high bits = bits 2t..2t+1 of qh[32h + l]

def dequant_q6_k(blocks, xp):
    n = blocks.shape[0]
    d = _f16(xp, blocks[:, 208:210])
    dl = (d * _f32(blocks[:, 192:208].view(xp.int8)))[:, :, None]           # (n, 16, 1)
    ql = _fields(xp, blocks[:, 0:128].reshape(n, 2, 2, 32), 4, axis=2)      # (n, h, t//2, t%2, l)
    qh = _fields(xp, blocks[:, 128:192].reshape(n, 2, 32), 2)               # (n, h, t, l)
    q = (ql.reshape(n, 2, 4, 32) | (qh << 4)).astype(xp.int8) - 32
    return (dl * _f32(q.reshape(n, 16, 16))).reshape(n, 256)


DEQUANT: dict[str, Callable] = {
    "F32": dequant_f32, "F16": dequant_f16, "BF16": dequant_bf16,
    "Q4_0": dequant_q4_0, "Q4_1": dequant_q4_1, "Q5_0": dequant_q5_0, "Q5_1": dequant_q5_1,
    "Q8_0": dequant_q8_0, "MXFP4": dequant_mxfp4,
    "Q2_K": dequant_q2_k, "Q3_K": dequant_q3_k, "Q4_K": dequant_q4_k, "Q5_K": dequant_q5_k,
    "Q6_K": dequant_q6_k,
}

SUPPORTED = frozenset(DEQUANT)
_KNOWN = frozenset(TYPES)


# --- the public entry: checks, slices ---------------------------------------------------------

def lookup(ggml_type: str | GGMLType, supported: frozenset[str] = SUPPORTED, by: str = "moert") -> GGMLType:
    """The GGMLType for a name (or GGMLType), or UnsupportedTypeError if `by` cannot handle it."""
    name = ggml_type.name if isinstance(ggml_type, GGMLType) else ggml_type
    if name not in supported:
        known = "a GGML type" if name in TYPES else "an unknown GGML type"
        raise UnsupportedTypeError(
            f"{by} cannot dequantize {name!r} ({known}); supported: {', '.join(sorted(supported))}. "
            f"Use a model quantized to one of those (llama-quantize --allow-requantize ...)."
        )
    return TYPES[name]


def as_blocks(raw, ggml_type: str | GGMLType, shape: Sequence[int], xp=np):
    """Check raw's bytes against (type, shape); return (shape, raw as (n_blocks, type_size) uint8).

    The blocks are a view of raw when raw is contiguous; other dtypes are read as their bytes.
    """
    t = lookup(ggml_type, _KNOWN)
    shape = tuple(int(s) for s in shape)
    row = shape[-1] if shape else 1
    if any(s < 0 for s in shape):
        raise GGUFError(f"{t.name} tensor of shape {shape}: dims must be >= 0")
    if row % t.block_size:
        raise GGUFError(
            f"{t.name} tensor of shape {shape}: the row length (last dim, {row}) must be a multiple of "
            f"the block size {t.block_size}; pass the shape in NumPy order (GGUF `ne` reversed)."
        )
    n = 1
    for s in shape:
        n *= s
    expected = n // t.block_size * t.type_size
    if raw.nbytes != expected:
        raise GGUFError(
            f"{t.name} tensor of shape {shape}: expected {expected:,} bytes, got {raw.nbytes:,}; "
            f"pass exactly the tensor's bytes (GGUFFile.raw(name))."
        )
    raw = xp.ascontiguousarray(raw)
    if raw.dtype != xp.uint8:
        raw = raw.reshape(-1).view(xp.uint8)
    return shape, raw.reshape(n // t.block_size, t.type_size)


def dequantize(raw, ggml_type: str | GGMLType, shape: Sequence[int], xp=np):
    """Dequantize a tensor's raw bytes to float32 of `shape` (NumPy order), with array module xp.

    F32 comes back as a view of raw. Unknown or unsupported types raise UnsupportedTypeError; a
    byte count that does not match the shape raises GGUFError.
    """
    t = lookup(ggml_type)
    shape, blocks = as_blocks(raw, t, shape, xp)
    fn = DEQUANT[t.name]
    if t.block_size == 1:  # plain types: one pass, no temporaries worth chunking
        return fn(blocks, xp).reshape(shape)
    n = blocks.shape[0]
    out = xp.empty((n, t.block_size), dtype=xp.float32)
    step = max(1, CHUNK // t.block_size)
    for i in range(0, n, step):  # chunks of blocks, not blocks: bounds the temporaries
        out[i:i + step] = fn(blocks[i:i + step], xp)
    return out.reshape(shape)


def slice_rows(raw, ggml_type: str | GGMLType, shape: Sequence[int], start: int, stop: int):
    """(bytes, shape) of rows [start, stop) of the tensor seen as (rows, row length): a view of raw.

    Rows are the tensor's shape[:-1] flattened, so a row range never splits a block and any
    dequantizer (reference, Numba, CuPy) can be applied to the slice.
    """
    t = lookup(ggml_type, _KNOWN)
    shape, blocks = as_blocks(raw, t, shape, _xp_of(raw))
    row = shape[-1] if shape else 1
    n_rows = 1
    for s in shape[:-1]:
        n_rows *= s
    if not 0 <= start <= stop <= n_rows:
        raise IndexError(f"rows [{start}, {stop}) out of range for a tensor of shape {shape} ({n_rows} rows)")
    per_row = row // t.block_size
    return blocks[start * per_row:stop * per_row].reshape(-1), (stop - start, row)


def slice_expert(raw, ggml_type: str | GGMLType, shape: Sequence[int], e: int):
    """(bytes, shape[1:]) of expert e of a stacked expert tensor (n_expert, rows, cols): a view of raw."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise ValueError(f"slice_expert needs a stacked tensor (n_expert, ..., cols), got shape {shape}")
    if not 0 <= e < shape[0]:
        raise IndexError(f"expert {e} out of range for a tensor of shape {shape} ({shape[0]} experts)")
    rows = 1
    for s in shape[1:-1]:
        rows *= s
    data, _ = slice_rows(raw, ggml_type, shape, e * rows, (e + 1) * rows)
    return data, shape[1:]


def dequantize_rows(raw, ggml_type: str | GGMLType, shape: Sequence[int], start: int, stop: int, xp=np):
    """Rows [start, stop) of the tensor seen as (rows, row length), dequantized: (stop - start, row)."""
    lookup(ggml_type)
    data, shape = slice_rows(raw, ggml_type, shape, start, stop)
    return dequantize(data, ggml_type, shape, xp=xp)


def dequantize_expert(raw, ggml_type: str | GGMLType, shape: Sequence[int], e: int, xp=np):
    """Expert e of a stacked expert tensor (n_expert, rows, cols), dequantized: shape[1:]."""
    lookup(ggml_type)
    data, shape = slice_expert(raw, ggml_type, shape, e)
    return dequantize(data, ggml_type, shape, xp=xp)


def _xp_of(a):
    """The array module of a (cupy for a cupy array), without importing cupy ourselves."""
    mod = type(a).__module__.split(".")[0]
    return __import__(mod) if mod == "cupy" else np
