"""Triton decode kernels (T <= 8 tokens): fused dequantize-matvec, and the MoE pair with expert ids on the device.

Dimension legend: T tokens, N rows (output features), K columns (input features), E experts, KS experts per
token (ids (T, KS) int32), F expert hidden, D model width; R rows per program, TP tokens rounded up to a power of 2.

Each program owns R rows and walks them in 256-weight chunks (kernels/gpu/src/deq.py): a chunk of R rows is
read once, as whole blocks, and multiplied by every token's 256 columns of x while it sits in registers, so the
weights cross memory once whatever T is. Accumulation is float32; x may be float32 or float16.
"""

import triton
import triton.language as tl

from .deq import deq


@triton.jit
def _rows_dot(wp, roff, xp, stride_x, T, K, QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr,
              TP: tl.constexpr):
    """(R, TP) float32: rows wp + roff (R, 1, 1) times x rows xp + t * stride_x, t < T (columns >= T stay 0)."""
    s = tl.arange(0, S)[None, :, None]
    l = tl.arange(0, L)[None, None, :]
    k_in = s * L + l                                                         # (1, S, L)
    tcol = tl.arange(0, TP)[None, :]                                         # (1, TP)
    acc = tl.zeros((R, TP), dtype=tl.float32)
    for c in range(0, tl.cdiv(K, S * L)):
        w = deq(wp, roff, c, K, s, l, QT)                                    # (R, S, L)
        k = c * (S * L) + k_in
        for t in tl.static_range(TP):
            # tokens t >= T read nothing: their columns end at 0 (a block & scalar mask would do, but Triton's
            # interpreter makes it int32, which Triton 3.9's tl.load refuses)
            xt = tl.load(xp + t * stride_x + k, mask=k < tl.where(t < T, K, 0), other=0.0).to(tl.float32)
            dot = tl.sum(tl.sum(w * xt, axis=2), axis=1)                     # (R,)
            acc += tl.where(tcol == t, dot[:, None], 0.0)
    return acc


@triton.jit
def matvec_kernel(w_ptr, x_ptr, out_ptr, N, K, T, row_bytes, stride_x, stride_o,
                  QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr, TP: tl.constexpr):
    """out[t, n] = sum_k W[n, k] x[t, k] for t < T: W (N, row_bytes) raw rows, x (T, K), out (T, N) float32.
    Grid (cdiv(N, R),)."""
    rows = tl.program_id(0) * R + tl.arange(0, R)                            # (R,)
    roff = tl.minimum(rows, N - 1).to(tl.int64) * row_bytes                  # a last partial tile rereads row N-1
    acc = _rows_dot(w_ptr, roff[:, None, None], x_ptr, stride_x, T, K, QT, R, S, L, TP)   # (R, TP)
    t = tl.arange(0, TP)[None, :]
    tl.store(out_ptr + t * stride_o + rows[:, None], acc, mask=(rows[:, None] < N) & (t < T))


@triton.jit
def _glu(g, u, ACT: tl.constexpr):
    """moert/activations.py's gated activations by code: 0 swiglu, 1 geglu, 2 swiglu_oai (gpt-oss)."""
    if ACT == 2:
        g = tl.minimum(g, 7.0)
        u = tl.minimum(tl.maximum(u, -7.0), 7.0) + 1.0
        a = 1.702 * g
        return g * (0.5 * (1.0 + _tanh(0.5 * a))) * u
    elif ACT == 1:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return 0.5 * g * (1.0 + _tanh(z)) * u
    else:
        return g * (0.5 * (1.0 + _tanh(0.5 * g))) * u


@triton.jit
def _tanh(x):
    """tanh through exp of a non-positive argument: never overflows (the reference's sigmoid form)."""
    e = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -y, y)


@triton.jit
def moe_gate_up_kernel(gate_ptr, up_ptr, bg_ptr, bu_ptr, x_ptr, ids_ptr, act_ptr, F, K, KS, row_bytes, stride_x,
                       QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr, ACT: tl.constexpr,
                       HAS_BIAS: tl.constexpr):
    """act[p, f] = glu(W_gate[e] x[t] + bg[e], W_up[e] x[t] + bu[e])[f] for pair p = t * KS + k, e = ids[p]:
    gate, up (E, F, row_bytes) raw; biases (E, F) float32 if HAS_BIAS; x (T, K); act (T * KS, F) float32.
    Grid (cdiv(F, R), T * KS): the expert id is read here, so a captured graph replays with new ids."""
    p = tl.program_id(1)
    e = tl.load(ids_ptr + p).to(tl.int64)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rc = tl.minimum(rows, F - 1)
    roff = ((e * F + rc) * row_bytes)[:, None, None]
    xp = x_ptr + (p // KS) * stride_x
    g = tl.sum(_rows_dot(gate_ptr, roff, xp, 0, 1, K, QT, R, S, L, 1), axis=1)    # (R,)
    u = tl.sum(_rows_dot(up_ptr, roff, xp, 0, 1, K, QT, R, S, L, 1), axis=1)
    if HAS_BIAS:
        g += tl.load(bg_ptr + e * F + rc)
        u += tl.load(bu_ptr + e * F + rc)
    tl.store(act_ptr + p.to(tl.int64) * F + rows, _glu(g, u, ACT), mask=rows < F)


@triton.jit
def moe_down_kernel(down_ptr, bd_ptr, act_ptr, ids_ptr, wts_ptr, out_ptr, D, F, KS, row_bytes, stride_o,
                    QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr, HAS_BIAS: tl.constexpr):
    """out[t, d] = sum_k wts[t, k] (W_down[e] act[t * KS + k] + bd[e])[d], e = ids[t, k]: down (E, D, row_bytes)
    raw, bd (E, D) float32 if HAS_BIAS, act (T * KS, F) float32, wts (T, KS) float32, out (T, D) float32.
    Grid (cdiv(D, R), T): each program sums its token's KS experts itself, so no atomics and no second pass."""
    t = tl.program_id(1)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rc = tl.minimum(rows, D - 1)
    acc = tl.zeros((R,), dtype=tl.float32)
    for k in range(0, KS):
        p = t * KS + k
        e = tl.load(ids_ptr + p).to(tl.int64)
        roff = ((e * D + rc) * row_bytes)[:, None, None]
        y = tl.sum(_rows_dot(down_ptr, roff, act_ptr + p.to(tl.int64) * F, 0, 1, F, QT, R, S, L, 1), axis=1)
        if HAS_BIAS:
            y += tl.load(bd_ptr + e * D + rc)
        acc += tl.load(wts_ptr + p) * y
    tl.store(out_ptr + t.to(tl.int64) * stride_o + rows, acc, mask=rows < D)
