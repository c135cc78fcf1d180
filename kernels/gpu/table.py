"""The GPU half of the kernel table (kernels/ktypes.py reads it as `ktypes.TYPES[name].gpu`): per GGML type, the
code its Triton kernels branch on and the fixed launch configuration chosen for it. Pure data: importing this
module imports neither Triton nor CuPy.

Every kernel walks a weight row in chunks of 256 weights (one k-quant super-block, eight 32-weight blocks, or 256
plain values) seen as a (S, L) tile: S sub-blocks of L weights, so a sub-block's scale is a (S, 1) column that
broadcasts over its L weights instead of being loaded once per weight.

Why these configurations (none is autotuned; each is a reasoned guess to be timed on a GPU):
  rows    R rows per program for the decode kernels (T <= 8). One chunk of R rows is R x 256 weights: 8 rows of
          Q4_K are 1152 bytes per loop step, 16 per thread at 4 warps, so registers stay low enough for ~12
          programs per SM (~14 KB of loads in flight per SM, what Little's law asks of an H100: 3.35 TB/s x
          ~600 ns over 132 SMs). 4096 rows make 512 programs, ~4 per SM on an H100. The plain types carry 2-4x
          the bytes per weight, so they take half the rows for the same bytes per step.
  warps   4 for decode: a chunk row is 256 weights, 2 per lane per row; more warps would only split the reductions.
  tiled   BM x BN tokens x rows per program for prompts (T > 8), BK = 256 (one chunk), f16 operands into tl.dot,
          8 warps: a (64, 256) dequantized tile is 64 floats per thread before its f16 cast.
"""

from __future__ import annotations

from dataclasses import dataclass

# Kernel codes (the `QT` constexpr of kernels/gpu/src/deq.py): the order is the kernels' code, never reorder.
QT_CODES = {"F32": 0, "F16": 1, "BF16": 2, "Q8_0": 3, "Q4_0": 4, "Q5_0": 5, "MXFP4": 6, "Q4_K": 7, "Q5_K": 8,
            "Q6_K": 9}
CHUNK = 256         # weights per loop step of every kernel, every type
DECODE_MAX_T = 8    # up to this many tokens a matmul takes the matvec kernel; more take the tiled one


@dataclass(frozen=True)
class GpuType:
    """One GGML type's GPU kernels: its code in the Triton sources, its chunk tile and launch configuration."""

    name: str            # the GGML type name
    qt: int              # QT constexpr: which decoder kernels/gpu/src/deq.py compiles in
    sub: int             # S: sub-blocks per 256-weight chunk (their scales broadcast over L)
    lanes: int           # L: weights per sub-block; S * L == CHUNK
    rows: int = 8        # R: rows per program of the matvec and MoE kernels
    warps: int = 4       # num_warps of the matvec and MoE kernels
    tile_m: int = 32     # BM: tokens per program of the tiled kernel
    tile_n: int = 64     # BN: rows per program of the tiled kernel
    tile_warps: int = 8  # num_warps of the tiled kernel

    # The kernels, by name (kernels/gpu/src/*.py); every type has all of them.
    matvec: str = "matvec_kernel"           # out (T, N) = x (T, K) @ W.T, T <= 8
    moe_gate_up: str = "moe_gate_up_kernel"  # act (T*k, F) = glu(W_gate[id] x, W_up[id] x), ids read on the device
    moe_down: str = "moe_down_kernel"       # out (T, D) = sum_k weight * W_down[id] act
    tiled: str = "tiled_kernel"             # out (T, N) = x @ W.T for prompts: dequantized tiles into tl.dot
    dequant: str = "dequant_kernel"         # W -> f16/f32 (N, K): the generic prompt path's first half

    @property
    def plain(self) -> bool:
        """F32/F16/BF16: the row is the weights, no blocks."""
        return self.qt <= 2


def _entry(name: str, sub: int = 8, lanes: int = 32, **kw) -> GpuType:
    assert sub * lanes == CHUNK
    return GpuType(name, QT_CODES[name], sub, lanes, **kw)


GPU_TYPES: dict[str, GpuType] = {t.name: t for t in (
    _entry("F32", rows=2),
    _entry("F16", rows=4),
    _entry("BF16", rows=4),
    _entry("Q8_0", rows=4),                   # 34 bytes per 32: close to F16 per weight
    _entry("Q4_0"),
    _entry("Q5_0"),
    _entry("MXFP4"),
    _entry("Q4_K"),
    _entry("Q5_K"),
    _entry("Q6_K", sub=16, lanes=16),         # 16 sub-blocks of 16, each with its int8 scale
)}
