"""The GPU half of the kernel table (kernels/ktypes.py reads it as `ktypes.TYPES[name].gpu`): per GGML type, the
code its Triton kernels branch on and the fixed launch configuration chosen for it. Pure data: importing this
module imports neither Triton nor CuPy.

Every kernel walks a weight row in chunks of 256 weights (one k-quant super-block, eight 32-weight blocks, or 256
plain values) and holds them as a tile with one sub-block per tile row, so a sub-block's scale is loaded once per
thread (kernels/gpu/src/deq.py says why this shape). The nibble types' decode kernels read a tile row as a run of
bytes whose two nibbles are two weights (deq2: one byte load and unpack feeds both), Q6_K's as byte positions
that hold four weights (deq4).

Why these configurations (none is autotuned; each is reasoned from the compiled code, to be timed on a GPU with
bench/bench_gpu_kernels.py --rows 1,2,4, which also checks the twin):
  rows, chunks  R = 2 rows per program, C = 4 chunks of each per step (1024 weights of a row): 2 x 1024 weights
          over 128 threads is 16 weights per thread per step, so every thread loads its scales once per step and
          its quant bytes as vectors. A 4096-row matrix makes 2048 programs (8192 warps for an H100's 132 SMs), and
          ptxas (-v, sm_90a) gives the T = 1 kernels of Q4_K, Q8_0 and MXFP4 56 registers, no spills: up to 36
          warps resident per SM (T = 8: ~90 registers, 20). One row-block of 8 rows per program would leave ~15
          warps per SM for 4096 rows: a matvec is bound by the bytes in flight, and it is the warps waiting on
          loads that put them there (llama.cpp's mmvq spreads each row over a 4-warp block for the same reason).
          For Q4_K a step is ~200 PTX instructions per thread (10 byte loads of header and scales, 1 vector load
          of quants, 4 of x, 24 FMAs): ~1.15 KB of weights per ~820 warp-instructions, so if issue-bound ~1.3 TB/s
          (~40% of an H100's 3.35 TB/s). R = 4 makes it 10 instructions per weight instead of 12.9 but 88 registers
          (20 warps per SM): which wins is for bench/bench_gpu_kernels.py to say. The step after that for the
          k-quants is an int8 path (q8_1 activations, dp4a: llama.cpp's vecdotq.cuh), four weights an instruction.
          Q6_K's 2-byte-aligned blocks allow no vector loads; reading four weights per byte position (deq4) took
          its step from 24.6 to 16.6 PTX instructions per weight and 90 to 48 registers. MXFP4's E2M1 codes are
          looked up in a packed 32-bit table (22.1 -> 17.2 per weight).
  warps   4 for decode: 128 threads for one step's 2 x 1024 weights.
  tiled   BM x BN = 32 tokens x 64 rows per program for prompts (T > 8), k-steps of BK = 64 columns (two 32-weight
          sub-blocks, four of Q6_K's), f16 operands into tl.dot (mma.sync m16n8k16 on sm_80 and sm_90), 8 warps,
          2 stages: ptxas gives every type 158-255 registers and no spills, 12-24 KB of shared memory. A whole
          256-weight chunk per k-step spilled (up to 1 KB) and took 98 KB of shared memory (196 KB for F32).
"""

from __future__ import annotations

from dataclasses import dataclass

# Kernel codes (the `QT` constexpr of kernels/gpu/src/deq.py): the order is the kernels' code, never reorder.
QT_CODES = {"F32": 0, "F16": 1, "BF16": 2, "Q8_0": 3, "Q4_0": 4, "Q5_0": 5, "MXFP4": 6, "Q4_K": 7, "Q5_K": 8,
            "Q6_K": 9}
CHUNK = 256         # weights per chunk, every type (a decode step reads C chunks of each of its rows)
DECODE_MAX_T = 8    # up to this many tokens a matmul takes the matvec kernel; more take the tiled one


@dataclass(frozen=True)
class GpuType:
    """One GGML type's GPU kernels: its code in the Triton sources, its chunk tile and launch configuration."""

    name: str            # the GGML type name
    qt: int              # QT constexpr: which decoder kernels/gpu/src/deq.py compiles in
    sub: int             # S: sub-blocks per 256-weight chunk (their scales broadcast over L)
    lanes: int           # L: weights per sub-block; S * L == CHUNK
    rows: int = 2        # R: rows per program of the matvec and MoE kernels
    chunks: int = 4      # C: 256-weight chunks of each row a decode step reads at once (a split of K in the program)
    warps: int = 4       # num_warps of the matvec and MoE kernels
    tile_m: int = 32     # BM: tokens per program of the tiled kernel
    tile_n: int = 64     # BN: rows per program of the tiled kernel
    tile_warps: int = 8  # num_warps of the tiled kernel
    per_byte: int = 1    # NW: weights the decode kernels take from one byte position of a tile row (src/deq.py):
    #                      1 (deq), 2 (deq2: a byte's two nibbles), 4 (deq4: Q6_K's two ql bytes and a qh byte)

    @property
    def decode_tile(self) -> tuple[int, int]:
        """(S, L) of the decode kernels' tile rows per chunk: sub-blocks, or byte runs for NW > 1."""
        if self.per_byte == 4:
            return 4, 16                            # Q6_K: two halves x two runs of 16 bytes
        if self.per_byte == 2:
            return (4, 32) if self.qt in (7, 8) else (8, 16)    # Q4_K/Q5_K: 4 runs of 32; 32-blocks: 16 bytes each
        return self.sub, self.lanes

    def tiled_constexprs(self) -> dict:
        """The tiled kernel's constexprs: a k-step of SK sub-blocks, 64 columns (see the module docstring)."""
        return dict(QT=self.qt, BM=self.tile_m, BN=self.tile_n, S=self.sub, L=self.lanes, SK=64 // self.lanes)

    def decode_constexprs(self) -> dict:
        """The constexprs the decode kernels (matvec, MoE) are compiled with (TP, ACT, HAS_BIAS aside)."""
        s, l = self.decode_tile
        return dict(QT=self.qt, R=self.rows, S=s, L=l, C=self.chunks, NW=self.per_byte)

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
    _entry("F32"),
    _entry("F16"),
    _entry("BF16"),
    _entry("Q8_0"),
    _entry("Q4_0", per_byte=2),
    _entry("Q5_0", per_byte=2),
    _entry("MXFP4", per_byte=2),
    _entry("Q4_K", per_byte=2),
    _entry("Q5_K", per_byte=2),
    _entry("Q6_K", sub=16, lanes=16, per_byte=4),     # 16 sub-blocks of 16, each with its int8 scale
)}
