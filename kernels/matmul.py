"""Fused dequantize-and-dot: y = x @ W.T straight from a GGUF tensor's bytes, never a dequantized W.

    matvec(x, w)           x (C,)   -> (R,)     one token (decode)
    matmul(x, w)           x (T, C) -> (T, R)   a small batch (prefill, or one expert's tokens)
    matvec_ref, matmul_ref the NumPy reference twins: dequantize with moert/quants/dequant.py, then `@`
    Prepared(w, act_quant) a weight made ready for repeated calls (what a model keeps per CPU weight)

w is a QTensor (raw GGUF bytes, type, NumPy shape (R, C)). The types with kernels, and each type's block
decoders, are the kernel table (kernels/ktypes.py, one entry per type: F32, F16, BF16, Q8_0, Q4_K, Q5_K,
Q6_K); this file holds the drivers every type shares. Rows run in parallel (numba.get_num_threads() threads,
one parallel region per call); small matrices run serially, as a parallel region costs more than they do.

How the kernels read (all float32, summed in a different order from the reference; see the tests):
  - one token: each type has a fused row dot that decodes a block's quants straight into FMAs
    (kernels/qblocks.py dot1_<t>); the Q4_K/Q5_K minimum terms use per-32 sums of x computed once per call.
  - a batch: each type dequantizes a block of a row into a 256-float stack buffer (L1), and the shared
    block dots (kernels/blockdot.py) multiply it with 4 tokens at a time (one load of the weight, 4 FMAs).
  - a float prompt (>= matmul_tiles.MIN_TOKENS tokens): W's rows a tile at a time dequantized, then sgemm.
  - act_quant "int16" / "int8" (opt-in, kernels/matmul_q.py): x rounded per 256-block, exact int32 sums.
The drivers are generated per (type, act_quant mode) from the templates below (jit.variant), so each
compiles only its own type's row kernels (cold start: Numba re-optimizes every kernel a function links).

Dimension legend: T tokens, R rows (output features), C columns (input features), B blocks per row.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from moert.kernels import matmul_q, matmul_q32, matmul_tiles
from moert.kernels.blockdot import PRANGE_ONLY, Z0
from moert.kernels.jit import threads, variant
from moert.kernels.ktypes import MATMUL_TYPES, TYPES, KernelType
from moert.kernels.matmul_q import quantize_rows, quantized
from moert.kernels.qtensor import QTensor
from moert.quants.dequant import dequantize as _ref_dequantize
from moert.quants.dequant import lookup

__all__ = ["MATMUL_TYPES", "matvec_q", "matvec_q_ref", "TYPES", "Prepared", "PreparedGroup", "group_kernel",
           "kernels_for", "matmul", "matmul_ref", "matvec", "matvec_ref", "packs", "threads_for", "weight_bytes"]

# Below this many weight bytes per call, run on the calling thread: a 512 KB Q4_K matvec takes ~40 us on one
# thread (float), ~22 (int8), a parallel region's start and end ~5 us on a quiet machine, and on a busy one a
# region waits for a worker the OS took off its core (milliseconds: bench/busy.py, moert/omp_wait.py).
_PARALLEL_MIN_BYTES = 1 << 19


# --------------------------------------------------------------------------------------- the drivers
# Bound per (type, mode) by kernels_for: rows (the type's row kernel), sums (its sums_of), and for the
# quantized modes QMAX, rows_q and x_q (the type's quantized row kernel and the function making the x it reads,
# ktypes.KernelType.quant_rows); the group templates further down take rows0..2, sums0..2, rows_q0..2, x_q0..2
# likewise. The placeholders only name them.
QMAX = 0
rows = sums = rows_q = rows0 = rows1 = rows2 = sums0 = sums1 = sums2 = rows_q0 = rows_q1 = rows_q2 = None
x_q = x_q0 = x_q1 = x_q2 = None


def _serial(w, x, out, r0, r1, b0, b1, f16):
    """rows on the calling thread: rows [r0, r1), blocks [b0, b1)."""
    rows(w, x, sums(x), out, r0, r1, b0, b1, f16)


def _parallel(w, x, out, nb, f16, chunk):
    """All rows, `chunk` rows per task, one parallel region."""
    xs = sums(x)
    R = w.shape[0]
    n = (R + chunk - 1) // chunk
    for i in prange(n):
        rows(w, x, xs, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, f16)


def _serial_q(w, x, out, r0, r1, b0, b1, f16):
    """_serial with x quantized where matmul_q.quantized says so (int8: always; int16: one token)."""
    if quantized(QMAX, x.shape[0]):
        xq, x8, xd, xb = quantize_rows(x, QMAX)
        yq, y8, yd, yb = x_q(xq, x8, xd, xb)
        rows_q(w, yq, y8, yd, yb, out, r0, r1, b0, b1, f16)
    else:
        rows(w, x, sums(x), out, r0, r1, b0, b1, f16)


def _parallel_q(w, x, out, nb, f16, chunk):
    """_parallel with x quantized as _serial_q."""
    R = w.shape[0]
    n = (R + chunk - 1) // chunk
    if quantized(QMAX, x.shape[0]):
        xq, x8, xd, xb = quantize_rows(x, QMAX)
        yq, y8, yd, yb = x_q(xq, x8, xd, xb)
        for i in prange(n):
            rows_q(w, yq, y8, yd, yb, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, f16)
    else:
        xs = sums(x)
        for i in prange(n):
            rows(w, x, xs, out, i * chunk, min(R, (i + 1) * chunk), Z0, nb, f16)


# Three weights that read the same x (q, k, v) in ONE parallel region: a region waits for its slowest
# thread, so three in a row pay that three times (on 2 shared cores the median q/k/v time halved, measured).
# Bound per (types, mode) by group_kernel: rows0..2, sums0..2, and QMAX, rows_q0..2 for the quantized modes.

def _group3(x, w0, o0, nb0, f0, w1, o1, nb1, f1, w2, o2, nb2, f2, chunk):
    """o_k = x @ W_k.T for k < 3: chunks of `chunk` rows of all three weights as one prange."""
    xs0, xs1, xs2 = sums0(x), sums1(x), sums2(x)
    R0, R1, R2 = w0.shape[0], w1.shape[0], w2.shape[0]
    n0, n1, n2 = (R0 + chunk - 1) // chunk, (R1 + chunk - 1) // chunk, (R2 + chunk - 1) // chunk
    for i in prange(n0 + n1 + n2):
        if i < n0:
            rows0(w0, x, xs0, o0, i * chunk, min(R0, (i + 1) * chunk), Z0, nb0, f0)
        elif i < n0 + n1:
            j = i - n0
            rows1(w1, x, xs1, o1, j * chunk, min(R1, (j + 1) * chunk), Z0, nb1, f1)
        else:
            j = i - n0 - n1
            rows2(w2, x, xs2, o2, j * chunk, min(R2, (j + 1) * chunk), Z0, nb2, f2)


def _group3_q(x, w0, o0, nb0, f0, w1, o1, nb1, f1, w2, o2, nb2, f2, chunk):
    """_group3 with x quantized once for all three where matmul_q.quantized says so."""
    R0, R1, R2 = w0.shape[0], w1.shape[0], w2.shape[0]
    n0, n1, n2 = (R0 + chunk - 1) // chunk, (R1 + chunk - 1) // chunk, (R2 + chunk - 1) // chunk
    if quantized(QMAX, x.shape[0]):
        xq, x8, xd, xb = quantize_rows(x, QMAX)
        aq, a8, ad, ab = x_q0(xq, x8, xd, xb)
        bq, b8, bd, bb = x_q1(xq, x8, xd, xb)
        cq, c8, cd, cb = x_q2(xq, x8, xd, xb)
        for i in prange(n0 + n1 + n2):
            if i < n0:
                rows_q0(w0, aq, a8, ad, ab, o0, i * chunk, min(R0, (i + 1) * chunk), Z0, nb0, f0)
            elif i < n0 + n1:
                j = i - n0
                rows_q1(w1, bq, b8, bd, bb, o1, j * chunk, min(R1, (j + 1) * chunk), Z0, nb1, f1)
            else:
                j = i - n0 - n1
                rows_q2(w2, cq, c8, cd, cb, o2, j * chunk, min(R2, (j + 1) * chunk), Z0, nb2, f2)
    else:
        xs0, xs1, xs2 = sums0(x), sums1(x), sums2(x)
        for i in prange(n0 + n1 + n2):
            if i < n0:
                rows0(w0, x, xs0, o0, i * chunk, min(R0, (i + 1) * chunk), Z0, nb0, f0)
            elif i < n0 + n1:
                j = i - n0
                rows1(w1, x, xs1, o1, j * chunk, min(R1, (j + 1) * chunk), Z0, nb1, f1)
            else:
                j = i - n0 - n1
                rows2(w2, x, xs2, o2, j * chunk, min(R2, (j + 1) * chunk), Z0, nb2, f2)


_DRIVERS: dict[tuple[str, int, bool], tuple] = {}
_GROUPS: dict[tuple[tuple[str, ...], int, tuple[bool, ...]], object] = {}


def group_kernel(type_names: tuple[str, str, str], aq: int = 0, packed: tuple[bool, ...] = (False,) * 3):
    """The one-region kernel of three weights of these types (made on first use), or None when mode aq has
    quantized kernels for some of the types and not others (their calls would quantize x differently).
    packed[i]: weight i is repacked (kernels/repack.py; int8 mode only)."""
    kts = [TYPES[t] for t in type_names]
    qmax = matmul_q.QMAX[aq] if aq else 0
    has = [qmax in kt.quant for kt in kts]
    q32 = [kt.q8_32 is not None and qmax == 127 and not h for kt, h in zip(kts, has)]
    if aq and any(q32):                                                 # x rounded per 32 (Q8_0): all or none
        key = (tuple(type_names), aq, (False,) * 3)
        if key not in _GROUPS:
            _GROUPS[key] = matmul_q32.group(type_names, tuple(kt.q8_32[0] for kt in kts),
                                            tuple(kt.q8_32[1] for kt in kts)) if all(q32) else None
        return _GROUPS[key]
    if aq and any(has) and not all(has):
        return None
    aq = aq if all(has) else 0
    packed = tuple(bool(p) for p in packed)
    key = (tuple(type_names), aq, packed)
    if key not in _GROUPS:
        name = "group_" + "_".join(t.lower() + ("r" if p else "") for t, p in zip(type_names, packed)) \
            + (f"_aq{aq}" if aq else "")
        bound = {f"{k}{i}": v for i, kt in enumerate(kts) for k, v in (("rows", kt.rows), ("sums", kt.sums_of))}
        if aq:
            for i, (kt, p) in enumerate(zip(kts, packed)):
                bound[f"rows_q{i}"], bound[f"x_q{i}"] = kt.quant_rows(qmax, p)
            bound.update(QMAX=qmax)
        _GROUPS[key] = variant(_group3_q if aq else _group3, name, parallel=PRANGE_ONLY, **bound)
    return _GROUPS[key]


def kernels_for(type_name: str, aq: int = 0, packed: bool = False) -> tuple:
    """(serial, parallel) drivers of one type, made on first use:
    serial(w, x, out, r0, r1, b0, b1, f16): the type's rows on the calling thread (xs computed inside);
    parallel(w, x, out, nb, f16, chunk): all rows, `chunk` rows per task, one parallel region.
    aq != 0 (matmul_q.ACT_QUANT): the quantized-activation kernels, for the types that have them; aq = 0
    (default) compiles exactly the float drivers. packed: the weight is repacked (kernels/repack.py; only
    with aq = 2, int8, for a type with a packed layout)."""
    kt = TYPES[type_name]
    qmax = matmul_q.QMAX[aq] if aq else 0
    aq = aq if qmax in kt.quant or (kt.q8_32 and qmax == 127) else 0
    key = (type_name, aq, packed)
    if key not in _DRIVERS and kt.drivers is not None:                  # a type with its own (MXFP4)
        _DRIVERS[key] = kt.drivers(aq)
    if key not in _DRIVERS and aq == 2 and qmax not in kt.quant:        # int8 per 32 (Q8_0)
        _DRIVERS[key] = matmul_q32.drivers(type_name, *kt.q8_32)
    if key not in _DRIVERS:
        n, bound = type_name.lower() + ("r" if packed else ""), dict(rows=kt.rows, sums=kt.sums_of)
        if aq:
            bound["rows_q"], bound["x_q"] = kt.quant_rows(qmax, packed)
            bound.update(QMAX=qmax)
            _DRIVERS[key] = (variant(_serial_q, f"serial_{n}_aq{aq}", **bound),
                             variant(_parallel_q, f"parallel_{n}_aq{aq}", parallel=PRANGE_ONLY, **bound))
        else:
            _DRIVERS[key] = (variant(_serial, f"serial_{n}", **bound),
                             variant(_parallel, f"parallel_{n}", parallel=PRANGE_ONLY, **bound))
    return _DRIVERS[key]


def packs(w: QTensor, act_quant: str | None, repack: bool) -> bool:
    """Whether a weight is repacked at load (kernels/repack.py): asked for, act_quant "int8", and a type
    with a packed layout (Q4_K); every other weight stays a zero-copy view whatever `repack` says."""
    return bool(repack) and matmul_q.mode(act_quant) == 2 and w.type in TYPES and TYPES[w.type].packed is not None


def raw_rows(w: QTensor) -> np.ndarray:
    """The tensor's bytes as a read-only (R, row_bytes) uint8 view (one compiled variant for every caller).
    A file's (R, row_bytes) bytes, as moert's weight store holds them, come back as they are."""
    raw = w.raw
    if raw.ndim == 2 and raw.dtype == np.uint8 and not raw.flags.writeable and raw.flags.c_contiguous:
        return raw                                                      # the per-token fast path
    if raw.dtype != np.uint8:
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    a = np.ascontiguousarray(raw).reshape(math.prod(w.shape[:-1]), -1)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def table(type_name: str) -> np.ndarray:
    """The 16-bit -> float32 table the kernels of this type read (fp16, or bf16 for BF16)."""
    return TYPES[type_name].table


def weight_bytes(w: QTensor) -> int:
    """Bytes of the weight a matmul streams."""
    return int(w.raw.nbytes)


def _check_weight(w: QTensor) -> KernelType:
    """The weight's table entry, after checking it is a 2-D tensor of whole blocks of a type with kernels."""
    kt = TYPES.get(w.type) if w.type in MATMUL_TYPES else None
    if kt is None:
        lookup(w.type, MATMUL_TYPES, "moert.kernels.matmul")             # raises UnsupportedTypeError
    if len(w.shape) != 2:
        raise ValueError(f"matmul needs a 2-D weight (R, C), got shape {w.shape}; pass one expert "
                         f"(QTensor of raw[e]) of a stacked tensor")
    if w.shape[1] % kt.block:
        raise ValueError(f"{w.type} rows of {w.shape[1]} columns are not whole blocks of {kt.block}")
    return kt


def threads_for(work_bytes: int) -> int:
    """Threads for one kernel call that streams `work_bytes` of weights: 1 below _PARALLEL_MIN_BYTES (a parallel
    region costs more than such work on an idle machine, and on a busy one it waits for a worker thread the OS
    took off its core: bench/busy.py), else threads()."""
    n = threads()
    return 1 if n == 1 or work_bytes < _PARALLEL_MIN_BYTES else n


class Prepared:
    """A weight made ready for repeated matmuls (a model keeps one per CPU weight): its raw rows, type code,
    table and drivers looked up once, so a call costs one Numba dispatch plus a few checks."""

    __slots__ = ("shape", "type", "raw", "nb", "f16", "serial", "parallel", "packed", "tiled")

    def __init__(self, w: QTensor, act_quant: str | None = None, repack: bool = False):
        """act_quant: None (float, default), "int16" (one-token calls round x per 256-block) or "int8" (every
        call does); see matmul_q.py. repack: with "int8", a Q4_K weight is copied into kernels/repack.py's
        layout (same results, fewer instructions; `packs` says which weights)."""
        aq = matmul_q.mode(act_quant)
        kt = _check_weight(w)
        self.packed = packs(w, act_quant, repack)
        self.shape, self.type, self.raw = tuple(w.shape), w.type, raw_rows(w)
        if self.packed:
            self.raw = kt.packed[0](self.raw)
        self.nb = w.shape[1] // kt.block
        self.f16 = kt.table
        self.serial, self.parallel = kernels_for(w.type, aq, self.packed)
        self.tiled = None if aq else matmul_tiles.Tiled.make(w, self.raw)   # a float prompt: tiles, then sgemm

    @property
    def packed_bytes(self) -> int:
        """Bytes of the repacked copy this weight holds (0: a zero-copy view)."""
        return self.raw.nbytes if self.packed else 0

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """x (T, C) @ W.T -> (T, R) float32."""
        R, C = self.shape
        if x.ndim != 2 or x.shape[1] != C:
            raise ValueError(f"x {x.shape} does not match the weight {self.shape}: need (T, {C})")
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        T = x.shape[0]
        if out is None:
            out = np.empty((T, R), dtype=np.float32)
        if T == 0 or R == 0:
            return out
        if T >= matmul_tiles.MIN_TOKENS and self.tiled is not None:
            return self.tiled(x, out)
        n = threads_for(self.raw.nbytes * max(1, T // 4))
        if n == 1:
            self.serial(self.raw, x, out, 0, R, 0, self.nb, self.f16)
        else:
            chunk = max(1, min(64, -(-R // (4 * n))))  # >= 4 chunks a thread, so no thread idles long
            self.parallel(self.raw, x, out, self.nb, self.f16, chunk)
        return out


class PreparedGroup:
    """Three weights that read the same x (q, k, v), each Prepared, called as one: one parallel region for all
    their rows (group_kernel) when a call is big enough to go parallel, else each on the calling thread."""

    __slots__ = ("parts", "kernel", "bytes")

    def __init__(self, ws: list[QTensor], act_quant: str | None = None, repack: bool = False):
        if len(ws) != 3 or len({w.shape[1] for w in ws}) != 1:
            raise ValueError(f"PreparedGroup takes three weights of one input width, got {[w.shape for w in ws]}")
        self.parts = [Prepared(w, act_quant, repack) for w in ws]
        self.kernel = group_kernel(tuple(p.type for p in self.parts), matmul_q.mode(act_quant),
                                   tuple(p.packed for p in self.parts))
        self.bytes = sum(p.raw.nbytes for p in self.parts)

    @property
    def packed_bytes(self) -> int:
        return sum(p.packed_bytes for p in self.parts)

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        """x (T, C) -> (x @ W_0.T, x @ W_1.T, x @ W_2.T), each (T, R_k) float32."""
        p0, p1, p2 = self.parts
        T = x.shape[0] if x.ndim == 2 else 0
        n = threads_for(self.bytes * max(1, T // 4))
        if self.kernel is None or n == 1 or T == 0 or T >= matmul_tiles.MIN_TOKENS and p0.tiled is not None:
            return p0(x), p1(x), p2(x)
        if x.shape[1] != p0.shape[1]:
            raise ValueError(f"x {x.shape} does not match the weights: need (T, {p0.shape[1]})")
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        out = tuple(np.empty((T, p.shape[0]), dtype=np.float32) for p in self.parts)
        chunk = max(1, min(64, -(-(p0.shape[0] + p1.shape[0] + p2.shape[0]) // (4 * n))))
        self.kernel(x, p0.raw, out[0], p0.nb, p0.f16, p1.raw, out[1], p1.nb, p1.f16, p2.raw, out[2], p2.nb, p2.f16,
                    chunk)
        return out


def matmul(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """x (T, C) @ W.T -> (T, R) float32, W read from its quantized bytes (parallel over rows)."""
    return Prepared(w)(np.asarray(x), out)


def matvec(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """x (C,) @ W.T -> (R,) float32, W read from its quantized bytes (parallel over rows)."""
    y = matmul(np.asarray(x).reshape(1, -1), w, None if out is None else out.reshape(1, -1))
    return y.reshape(-1) if out is None else out


def matmul_ref(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """Reference twin of matmul: the NumPy reference dequantizer, then x @ W.T."""
    y = np.asarray(x, dtype=np.float32) @ _ref_dequantize(w.raw, w.type, w.shape).T
    if out is not None:
        out[...] = y
        return out
    return y


def matvec_ref(x: np.ndarray, w: QTensor, out: np.ndarray | None = None) -> np.ndarray:
    """Reference twin of matvec."""
    y = matmul_ref(np.asarray(x).reshape(1, -1), w).reshape(-1)
    if out is not None:
        out[...] = y
        return out
    return y


def matvec_q(x: np.ndarray, w: QTensor, act_quant: str = "int16") -> np.ndarray:
    """x (C,) or (T, C) @ W.T -> (R,) or (T, R) with x quantized (mode act_quant), serial; W Q4_K or Q6_K.
    int16 takes one token; int8 any number."""
    x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, w.shape[1])
    if not quantized(matmul_q.QMAX[matmul_q.mode(act_quant)], x2.shape[0]):
        raise ValueError(f"act_quant={act_quant!r} has one-token kernels only; x has {x2.shape[0]} rows")
    out = np.empty((x2.shape[0], w.shape[0]), dtype=np.float32)
    p = Prepared(w, act_quant=act_quant)
    p.serial(p.raw, x2, out, 0, w.shape[0], 0, p.nb, p.f16)
    return out.reshape(*np.shape(x)[:-1], w.shape[0])


def matvec_q_ref(x: np.ndarray, w: QTensor, act_quant: str = "int16") -> np.ndarray:
    """Reference twin of matvec_q: quantize_x_ref (per row), then (xq * step) @ W.T exactly (float64)."""
    xq, _, xd, _ = matmul_q.quantize_x_ref(np.reshape(x, -1), matmul_q.QMAX[matmul_q.mode(act_quant)])
    xf = xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 256)  # the values the kernel sees
    W = _ref_dequantize(w.raw, w.type, w.shape).astype(np.float64)       # (R, C)
    return (xf.reshape(np.shape(x)) @ W.T).astype(np.float32)
