"""Ahead-of-time compilation: every kernel of a GGML type, as ops.py launches it, to a cubin for one GPU.

    specs(qtype, x="fp32", tokens=1)   [(kernel name, signature, constexprs, num_warps)] as ops.py would launch
    compile_type(qtype, capability)    {kernel name: launch.Compiled} for compute capability 80, 90, ...
    aligned(signature)                 the arguments a launch on aligned shapes marks divisible by 16

Needs Triton, not a GPU. ops.py compiles the same specs lazily on first use (its signature also marks the
arguments divisible by 16); this module is what tests and a warm-up step call.
"""

from __future__ import annotations

from . import launch
from .ops import gpu_type
from .table import DECODE_MAX_T

_DECODE = dict(w_ptr="*u8", out_ptr="*fp32", N="i32", K="i32", T="i32", row_bytes="i32", stride_x="i32",
               stride_o="i32")


def specs(qtype, x: str = "fp32", tokens: int = 1) -> list[tuple[str, dict, dict, int]]:
    """The kernels of qtype with the signatures and constexprs ops.py launches them with (x float32 or f16)."""
    g = gpu_type(qtype)
    xp = f"*{x}"
    tp = 1 << (min(tokens, DECODE_MAX_T) - 1).bit_length()
    blk = dict(QT=g.qt, R=g.rows * g.chunks, S=g.sub, L=g.lanes)
    moe = dict(g.decode_constexprs(), HAS_BIAS=False)
    return [
        (g.matvec, dict(_DECODE, x_ptr=xp), dict(g.decode_constexprs(), TP=tp), g.warps),
        (g.tiled, dict(_DECODE, x_ptr=xp), g.tiled_constexprs(), g.tile_warps),
        (g.dequant, dict(w_ptr="*u8", y_ptr="*fp16", N="i32", K="i32", row_bytes="i32"), dict(blk, F16=True),
         g.warps),
        (g.moe_gate_up, dict(gate_ptr="*u8", up_ptr="*u8", bg_ptr="*fp32", bu_ptr="*fp32", x_ptr=xp, ids_ptr="*i32",
                             act_ptr="*fp32", F="i32", K="i32", KS="i32", row_bytes="i32", stride_x="i32"),
         dict(moe, ACT=0), g.warps),
        (g.moe_down, dict(down_ptr="*u8", bd_ptr="*fp32", act_ptr="*fp32", ids_ptr="*i32", wts_ptr="*fp32",
                          out_ptr="*fp32", D="i32", F="i32", KS="i32", row_bytes="i32", stride_o="i32"), moe, g.warps),
    ]


def aligned(signature: dict) -> frozenset[str]:
    """The arguments ops.run marks divisible by 16 on a typical launch: every pointer (CuPy allocates at 256 bytes)
    and every size but the token and expert-slot counts (T, KS), never a float: what a model's aligned shapes
    compile to."""
    return frozenset(a for a in signature if a not in ("T", "KS") and signature[a] != "fp32")


GEMM_SPEC = ("gemm_kernel", dict(w_ptr="*fp16", x_ptr="*fp32", out_ptr="*fp32", N="i32", K="i32", T="i32",
                                 stride_x="i32", stride_o="i32"), dict(BM=32, BN=64, BK=64), 4)


def compile_type(qtype, capability: int, x: str = "fp32") -> dict[str, launch.Compiled]:
    """Every kernel of qtype compiled for `capability` (triton.compile; no GPU needed)."""
    return {name: launch.compile_cubin(name, sig, const, capability, warps, aligned=aligned(sig))
            for name, sig, const, warps in specs(qtype, x)}
