"""Triton prompt kernels (T > 8 tokens): dequantized tiles into tl.dot (tensor cores), and the generic pair
"dequantize once to f16, then one GEMM".

Dimension legend: T tokens, N rows (output features), K columns; BM x BN the (tokens, rows) tile of a program,
S x L a 256-weight chunk's sub-block shape (kernels/gpu/src/deq.py), BK = SK x L the columns of a k-step.

tiled_kernel: each program keeps a (BM, BN) float32 accumulator; per k-step it decodes a (BN, BK) weight tile (SK
sub-blocks of each row) in registers, casts it and the (BM, BK) x tile to f16, and adds tl.dot(x, w^T). The
weights are read once per BM tokens; float16 products with float32 accumulation, as cuBLAS's default GEMM.
"""

import triton
import triton.language as tl

from .deq import deq


@triton.jit
def tiled_kernel(w_ptr, x_ptr, out_ptr, N, K, T, row_bytes, stride_x, stride_o,
                 QT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, S: tl.constexpr, L: tl.constexpr,
                 SK: tl.constexpr):
    """out[t, n] = sum_k W[n, k] x[t, k]: W (N, row_bytes) raw rows, x (T, K), out (T, N) float32. A k-step is SK of
    a chunk's S sub-blocks (BK = SK * L columns), so the decoded tile stays in registers. Grid (cdiv(N, BN),
    cdiv(T, BM))."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)                             # (BN,)
    toks = tl.program_id(1) * BM + tl.arange(0, BM)                             # (BM,)
    r = tl.minimum(tl.program_id(0) * BN + tl.arange(0, BN * SK) // SK, N - 1)
    roff = r.to(tl.int64) * row_bytes                                           # (BN * SK,)
    l = tl.arange(0, L)
    kk = tl.arange(0, SK * L)[None, :]                                          # (1, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for j in range(0, tl.cdiv(K, S * L) * (S // SK)):                        # k-steps: SK sub-blocks each
        c, h = j // (S // SK), j % (S // SK)                                    # chunk c, its part h
        s = h * SK + tl.arange(0, BN * SK) % SK
        w = tl.reshape(deq(w_ptr, roff, c, K, s, l, QT), (BN, SK * L)).to(tl.float16)   # (BN, BK)
        k = c * (S * L) + h * (SK * L) + kk
        xt = tl.load(x_ptr + toks[:, None].to(tl.int64) * stride_x + k, mask=(toks[:, None] < T) & (k < K),
                     other=0.0).to(tl.float16)                                  # (BM, BK)
        acc += tl.dot(xt, tl.trans(w))                                          # (BM, BN)
    tl.store(out_ptr + toks[:, None].to(tl.int64) * stride_o + rows[None, :], acc,
             mask=(toks[:, None] < T) & (rows[None, :] < N))


@triton.jit
def dequant_kernel(w_ptr, y_ptr, N, K, row_bytes, QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr,
                   L: tl.constexpr, F16: tl.constexpr):
    """y (N, K) = W dequantized, as float16 if F16 else float32: W (N, row_bytes) raw rows.
    Grid (cdiv(N, R), cdiv(K, 256)): one chunk of R rows per program."""
    rows = tl.program_id(0) * R + tl.arange(0, R * S) // S                      # (R * S,): deq's tile rows
    c = tl.program_id(1)
    roff = tl.minimum(rows, N - 1).to(tl.int64) * row_bytes
    s = tl.arange(0, R * S) % S
    l = tl.arange(0, L)
    w = deq(w_ptr, roff, c, K, s, l, QT)                                        # (R * S, L)
    k = c * (S * L) + (s * L)[:, None] + l[None, :]
    rows = rows[:, None]
    if F16:
        w = w.to(tl.float16)
    tl.store(y_ptr + rows.to(tl.int64) * K + k, w, mask=(rows < N) & (k < K))


@triton.jit
def gemm_kernel(w_ptr, x_ptr, out_ptr, N, K, T, stride_x, stride_o, BM: tl.constexpr, BN: tl.constexpr,
                BK: tl.constexpr):
    """out (T, N) float32 = x (T, K) @ W.T for W (N, K) float16 (dequant_kernel's output): the generic prompt
    path's second half. Grid (cdiv(N, BN), cdiv(T, BM))."""
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    toks = tl.program_id(1) * BM + tl.arange(0, BM)
    kk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + kk
        xt = tl.load(x_ptr + toks[:, None].to(tl.int64) * stride_x + k[None, :],
                     mask=(toks[:, None] < T) & (k[None, :] < K), other=0.0).to(tl.float16)    # (BM, BK)
        wt = tl.load(w_ptr + rows[None, :].to(tl.int64) * K + k[:, None],
                     mask=(rows[None, :] < N) & (k[:, None] < K), other=0.0)                  # (BK, BN)
        acc += tl.dot(xt, wt)
    tl.store(out_ptr + toks[:, None].to(tl.int64) * stride_o + rows[None, :], acc,
             mask=(toks[:, None] < T) & (rows[None, :] < N))
