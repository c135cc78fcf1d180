"""The kernel table: one entry per GGML type the fused matmul kernels read, as gguf-py's quants.py registers
one class per type. An entry names the type's block decoders (kernels/qblocks.py) and, optionally, its
quantized-activation row kernels (kernels/matmul_q.py); its block size and bytes come from moert.quants.types
and its reference dequantizer from moert.quants.dequant, so each fact lives once.

    TYPES[name]          the KernelType of a GGML type name ("Q4_K"): its dequantize kernel and its matmul
                         kernels; DEQUANT_TYPES and MATMUL_TYPES the types that have each
    entry.gpu            the same type's GPU kernels side by side (kernels/gpu/table.py, Triton): .matvec,
                         .moe_gate_up, .moe_down, .tiled, .dequant name them; None for a type without
    entry.rows           the type's serial row kernel, generated from the templates below:
                         rows(w, x, xs, out, r0, r1, b0, b1, f16): out[t, r] = row r's blocks [b0, b1) . x[t]
    variant(template, name, **bind)
                         a per-type compiled copy of a template function: its free names bound to `bind`

Adding a type is one entry: write its dequantize kernel (kernels/dequant.py) and its decoders (a `dot1` for one
token if it pays, a `deq` for batches, with the block drawn as bytes; signatures in kernels/qblocks.py), then, at
the end of this file,
    register(KernelType("Q5_1", decode=qb.deq_q5_1, layout="chunked", dequant=dk.q5_1, dot1=qb.dot1_q5_1))
(`table`: the 16-bit -> float32 table its kernels get as `f16`, any float32 array; `quant={127: rows8}`: an
int8-activation row kernel in matmul_q's signature, if it has one). Every driver (kernels/matmul.py), the
q/k/v group kernel and the fused MoE layer (kernels/moe_fused.py) then take the type; add it to
tests/test_kernels_matmul.py's TYPES_UNDER_TEST to check it against the reference twin.

Why templates bound through globals and not closures: Numba keys its disk cache by a function's bytecode
plus its closure cells, pickled. A Dispatcher pickles with a per-process uuid, so a closure over a kernel
would never hit the cache; names bound as globals are frozen as compile-time constants instead (as module
globals are). Each variant has a name of its own (type, mode, and a hash of kernels/*.py): variants sharing
one name collided when a third process loaded both from the disk cache ("NRT_adapt_ndarray_to_python:
descr is NULL", found by the semantic fuzzer), and the hash recompiles them when a kernel they inline
changes (Numba's cache only watches the template's own file).

Dimension legend: T tokens, R rows (output features), C columns (input features), B blocks per row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from moert.kernels import dequant as dk
from moert.kernels import matmul_q as mq
from moert.kernels import mxfp4, q8_0, repack, simd, simd_f32, simd_f32z, simd_z
from moert.kernels import qblocks as qb
from moert.kernels.blockdot import FM, PRANGE_ONLY, block_dot, block_dot2, no_sums, stack_f32, sums32
from moert.kernels.dequant import BF16_TO_F32, F16_TO_F32
from moert.kernels.gpu.table import GPU_TYPES, GpuType
from moert.kernels.jit import variant
from moert.quants.dequant import DEQUANT
from moert.quants.types import TYPES as GGML_TYPES

__all__ = ["DEQUANT_TYPES", "MATMUL_TYPES", "PRANGE_ONLY", "TYPES", "KernelType", "register", "variant"]

LAYOUTS = ("paired", "chunked", "direct")


@dataclass(frozen=True, eq=False)
class KernelType:
    """One GGML type's fused kernels: how its rows are decoded, for one token and for a batch."""

    name: str                               # the GGML type name
    decode: Callable | None                 # batch block decoder (qblocks.deq_<t>); None for "direct"
    layout: str | None                      # batch template: "paired" (256-weight blocks, two rows at a time),
    #                                         "chunked" (blocks of <= 256 weights, up to 256 per pass), "direct"
    #                                         (F32: the row is the weights); None: no matmul kernels, dequant only
    dequant: Callable | None = None         # the whole-tensor dequantize kernel (kernels/dequant.py: kernel(blocks,
    #                                         y, table), multi-threaded over blocks); None: none (F32 is a view)
    dot1: Callable | None = None            # fused one-token row dot (qblocks.dot1_<t>); None: the batch kernel
    sums: bool = False                      # its kernels read per-32 sums of x (the Q4_K/Q5_K min terms)
    table: np.ndarray = field(default_factory=lambda: F16_TO_F32)   # the 16-bit -> float32 table it reads
    quant: dict = field(default_factory=dict)   # act_quant qmax -> (quantized row kernel matmul_q.rows*_<t>, its
    #                                             x: x_<t>(xq, x8, xd, xb) -> what the rows read, once per matmul)
    # A type whose kernels do not fit the templates (MXFP4's AVX2 rows, kernels/mxfp4.py) gives them itself:
    row_kernel: Callable | None = None      # rows(w, x, xs, out, r0, r1, b0, b1, f16), instead of generated ones
    drivers: Callable | None = None         # aq -> (serial, parallel) as matmul.kernels_for returns them
    q8_32: tuple | None = None              # (quantize(x) -> (x8, xd per 32), rows_q8(w, x8, xd, out, r0, r1,
    #                                         b0, b1, f16)): act_quant="int8" rounds x per 32, as llama.cpp's Q8_0
    packed: tuple | None = None             # (repack(raw) -> raw, int8 row kernel over the repacked blocks, its
    #                                         x): a load-time layout for act_quant="int8" (kernels/repack.py)

    @property
    def block(self) -> int:
        """Weights per block (1 for F32/F16/BF16: a column)."""
        return GGML_TYPES[self.name].block_size

    @property
    def block_bytes(self) -> int:
        return GGML_TYPES[self.name].type_size

    @property
    def gpu(self) -> GpuType | None:
        """The type's GPU kernels (kernels/gpu/table.py: their names in kernels/gpu/src/ and launch configuration),
        or None; moert.kernels.gpu runs them."""
        return GPU_TYPES.get(self.name)

    @property
    def ref(self) -> Callable:
        """The reference block dequantizer (moert.quants.dequant): (n, block_bytes) uint8 -> (n, block)."""
        return DEQUANT[self.name]

    @functools.cached_property
    def rows(self):
        """The serial row kernel rows(w, x, xs, out, r0, r1, b0, b1, f16) (inlined into its callers); see
        `_rows`. Made on first use: a model compiles only the types it holds."""
        if self.row_kernel is not None:
            return self.row_kernel
        n, bound = self.name.lower(), dict(BLOCK=self.block, BYTES=self.block_bytes, fastmath=FM)
        if self.layout == "paired":
            batch = variant(_rows_paired, f"rowsb_{n}", decode=self.decode, **bound)
        elif self.layout == "chunked":
            batch = variant(_rows_chunked, f"rowsb_{n}", decode=self.decode, PER=max(1, 256 // self.block), **bound)
        else:
            batch = variant(_rows_direct, f"rowsb_{n}", fastmath=FM)
        _MADE.setdefault(self.name, []).append(batch)
        if self.dot1 is None:
            return variant(_rows_batch, f"rows_{n}", inline=True, batch=batch)
        one = variant(_rows_one, f"rows1_{n}", dot1=self.dot1, SUMS=8 if self.sums else 0, **bound)
        _MADE[self.name].append(one)
        return variant(_rows, f"rows_{n}", inline=True, one=one, batch=batch, FEW=FEW_TOKENS[self.layout])

    def quant_rows(self, qmax: int, packed: bool = False) -> tuple | None:
        """(rows, x) for act_quant's qmax (matmul_q.QMAX): the quantized row kernel, over kernels/repack.py's
        layout when packed, and the function that makes its x from quantize_rows' (xq, x8, xd, xb) once per
        matmul; None for a type without one."""
        return self.packed[1:] if packed else self.quant.get(qmax)

    @property
    def sums_of(self):
        """sums32 for types whose kernels read per-32 sums of x, else no_sums (a (T, 1) placeholder)."""
        return sums32 if self.sums else no_sums

    def made(self) -> list:
        """The row kernels generated for this type so far (rows1_<t>, rowsb_<t>): what `--asm` inspects."""
        return list(_MADE.get(self.name, ()))

    def compiled(self) -> list[str]:
        """Names of this type's kernels compiled in this process (tests check a type compiles only its own)."""
        fns = [self.decode, self.dot1, *(r for r, _ in self.quant.values()), *self.made(), self.row_kernel,
               *(self.q8_32 or ()), *(self.packed or ())[1:2]]
        return sorted(f.py_func.__name__ for f in fns if f is not None and f.signatures)


TYPES: dict[str, KernelType] = {}
_MADE: dict[str, list] = {}     # type name -> the row kernels generated for it so far


def register(entry: KernelType) -> KernelType:
    """Add a type to the table (checks the layout and that moert.quants knows the type)."""
    if (entry.layout not in LAYOUTS and not (entry.layout is None and entry.dequant is not None)
            or entry.name not in GGML_TYPES or entry.name not in DEQUANT):
        raise ValueError(f"bad kernel table entry {entry.name!r} ({entry.layout!r}); layouts: {', '.join(LAYOUTS)}")
    if entry.layout == "paired" and entry.block != 256:
        raise ValueError(f"{entry.name}: the paired layout takes 256-weight blocks, not {entry.block}")
    TYPES[entry.name] = entry
    return entry


# Up to how many tokens a matmul runs the one-token dot once per token instead of the batch kernel, per batch
# layout: one thread, a 1024 x 2048 weight, ms per call at T = 1 / 2 / 3 / 4 / 8 tokens (the batch kernel from 2):
#   Q8_0 (chunked) 0.089 / 0.654 / 0.687 / 0.670 / 1.020    per token wins to ~11: 8
#   Q4_K (paired)  0.087 / 0.291 / 0.370 / 0.315 / 0.399    per token wins at 2-3, ties at 4: 2
#   Q6_K (paired)  0.123 / 0.236 / 0.305 / 0.268 / 0.404    ties at 2: 2
FEW_TOKENS = {"chunked": 8, "paired": 2, "direct": 0}

# ------------------------------------------------------------------------------------------ templates
# Bound per type by KernelType.rows: BLOCK weights and BYTES bytes per block, decode, dot1, SUMS (per-32 sums
# per block the one-token dot reads: 8 or 0), PER (blocks per chunk), one, batch; the placeholders below only
# name them (a template is never compiled as it stands). Each batch template is compiled on its own: fused
# into one function with the one-token loop, LLVM gave up vectorizing it (5x).
BLOCK = BYTES = SUMS = PER = FEW = 0
decode = dot1 = one = batch = None

def _rows_one(w, x, xs, out, r0, r1, b0, b1, f16):
    """One token: out[0, r] = dot1 of row r's blocks [b0, b1) with x[0] (xs: per-32 sums of x[0])."""
    xv, sv = x[0, BLOCK * b0:BLOCK * b1], xs[0, SUMS * b0:SUMS * b1]
    for r in range(r0, r1):
        out[0, r] = dot1(w[r, BYTES * b0:BYTES * b1], xv, sv, b1 - b0, f16)


def _rows_paired(w, x, out, r0, r1, b0, b1, f16):
    """A batch, 256-weight blocks: two rows at a time, each block of both decoded into L1 (u, v), then
    block_dot2 multiplies them with 4 tokens per pass (each load of x feeds two FMAs: 1.2-1.4x on Q4_K)."""
    acc0 = np.empty(x.shape[0], dtype=np.float32)
    acc1 = np.empty(x.shape[0], dtype=np.float32)
    u = stack_f32(256)
    v = stack_f32(256)
    for r in range(r0, r1, 2):                          # rows in pairs; an odd last row pairs with itself
        r2 = min(r + 1, r1 - 1)
        acc0[:] = 0.0
        acc1[:] = 0.0
        w0, w1 = w[r, BYTES * b0:BYTES * b1], w[r2, BYTES * b0:BYTES * b1]
        for b in range(b1 - b0):
            decode(w0, b, u, f16)
            decode(w1, b, v, f16)
            block_dot2(u, v, 256, x, 256 * (b0 + b), acc0, acc1)
        for t in range(x.shape[0]):                     # element loops, not out[:, r] = acc0: a slice
            out[t, r] = acc0[t]                         # assignment from an array compiles numba's shape-
            out[t, r2] = acc1[t]                        # error formatting (~2.7 s cold, per signature)


def _rows_chunked(w, x, out, r0, r1, b0, b1, f16):
    """A batch, small blocks: PER blocks (<= 256 weights) of a row decoded into L1, times 4 tokens per pass."""
    acc = np.empty(x.shape[0], dtype=np.float32)
    buf = stack_f32(256)
    for r in range(r0, r1):
        acc[:] = 0.0
        wr = w[r, BYTES * b0:BYTES * b1]
        for b in range(0, b1 - b0, PER):
            n = min(PER, b1 - b0 - b)
            decode(wr, b, n, buf, f16)
            block_dot(buf, BLOCK * n, x, BLOCK * (b0 + b), acc)
        for t in range(x.shape[0]):
            out[t, r] = acc[t]


def _rows_direct(w, x, out, r0, r1, c0, c1, f16):
    """F32: each row's columns [c0, c1) are the weights; no decoding."""
    acc = np.empty(x.shape[0], dtype=np.float32)
    for r in range(r0, r1):
        acc[:] = 0.0
        block_dot(w[r].view(np.float32)[c0:c1], c1 - c0, x, c0, acc)
        for t in range(x.shape[0]):
            out[t, r] = acc[t]


def _rows(w, x, xs, out, r0, r1, b0, b1, f16):
    """out[t, r] = sum over blocks [b0, b1) of row r of w times x[t] (same columns), for r in [r0, r1).

    w (R, row_bytes) uint8 raw rows; x (T, C) float32 (only the columns of blocks b0..b1 are read); xs the
    type's sums_of(x); out (T, >= r1) float32. Serial: the parallel drivers (and the MoE kernel) call it
    on their share of rows. One token takes the fused one-token dot, a batch the block-decode kernel."""
    if x.shape[0] == 1:
        one(w, x, xs, out, r0, r1, b0, b1, f16)
    elif x.shape[0] <= FEW:         # a few tokens (the decode steps of -np slots, an expert's 2-3 rows): the
        for t in range(x.shape[0]):  # one-token dot per token beats decoding every block for them (see FEW)
            one(w, x[t:t + 1], xs[t:t + 1], out[t:t + 1], r0, r1, b0, b1, f16)
    else:
        batch(w, x, out, r0, r1, b0, b1, f16)


def _rows_batch(w, x, xs, out, r0, r1, b0, b1, f16):
    """As _rows, for a type without a one-token dot: every call takes the batch kernel."""
    batch(w, x, out, r0, r1, b0, b1, f16)


# --------------------------------------------------------------------------------------------- entries
# One entry per GGML type: its dequantize kernel (kernels/dequant.py, kernels/mxfp4.py) and its matmul kernels.

register(KernelType("F32", None, "direct"))
register(KernelType("F16", qb.deq_f16, "chunked", dequant=dk.table16))
register(KernelType("BF16", qb.deq_bf16, "chunked", dequant=dk.table16, table=BF16_TO_F32))
# One-token float dots: AVX2 ones (kernels/simd_f32.py, ~1.35-2x) where the CPU has it, Numba's loops elsewhere;
# Q4_K and Q6_K with 16 lanes (kernels/simd_f32z.py) where it has AVX-512F
_AVX2, _Z = simd.available(), simd_f32z.available()
_F32_DOTS = simd_f32z if _Z else simd_f32
register(KernelType("Q8_0", qb.deq_q8_0, "chunked", dequant=dk.q8_0,
                    dot1=simd_f32.dot1_q8_0 if _AVX2 else qb.dot1_q8_0,
                    q8_32=(mxfp4.quantize_q8, q8_0.rows_q8)))           # int8: x per 32, as llama.cpp's
register(KernelType("Q4_0", None, None, dequant=dk.q4_0))
register(KernelType("Q5_0", None, None, dequant=dk.q5_0))
register(KernelType("Q4_K", qb.deq_q4_k, "paired", dequant=dk.q4_k,
                    dot1=_F32_DOTS.dot1_q4_k if _AVX2 else qb.dot1_q4_k, sums=True,
                    quant={mq.QMAX[1]: (mq.rows16_q4_k, mq.x_as_is),
                           mq.QMAX[2]: (simd_z.rows8_q4_kz, simd_z.x_q4_kz) if simd_z.available() and _AVX2
                           else (mq.rows8_q4_k, mq.x_q4_k)},    # int8: 512-bit where the CPU has AVX-512BW
                    packed=(repack.repacked, variant(mq.rows8_q4_k.py_func, "rows8_q4_kr", inline=True, fastmath=FM,
                                                     Q4K_ROW=simd.q4kr_row, Q4K_BYTES=repack.PACKED_BYTES),
                            repack.x_q4_kr)))
register(KernelType("Q5_K", qb.deq_q5_k, "paired", dequant=dk.q5_k, dot1=qb.dot1_q5_k, sums=True))
register(KernelType("Q6_K", qb.deq_q6_k, "paired", dequant=dk.q6_k,
                    dot1=_F32_DOTS.dot1_q6_k if _AVX2 else qb.dot1_q6_k,
                    quant={mq.QMAX[1]: (mq.rows16_q6_k, mq.x_as_is),
                           mq.QMAX[2]: (simd_z.rows8_q6_kz if simd_z.available() and _AVX2 else mq.rows8_q6_k,
                                        mq.x_q6_k)}))
# MXFP4 (gpt-oss): hand-written AVX2 rows and drivers (kernels/mxfp4.py), int8 per 32 (llama.cpp's Q8_0);
# its table is E8M0 -> float32
register(KernelType("MXFP4", None, "chunked", dequant=mxfp4.dequant, table=mxfp4.E8M0_HALF,
                    row_kernel=mxfp4.rows_entry, drivers=mxfp4.make_drivers, q8_32=(mxfp4.quantize_q8, mxfp4.rows_q8)))

DEQUANT_TYPES: frozenset[str] = frozenset(n for n, t in TYPES.items() if t.dequant is not None)   # moert.kernels
MATMUL_TYPES: frozenset[str] = frozenset(n for n, t in TYPES.items() if t.layout is not None)     # kernels/matmul.py
