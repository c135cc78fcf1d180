"""Triton decode kernels (T <= 8 tokens): fused dequantize-matvec, and the MoE pair with expert ids on the device.

Dimension legend: T tokens, N rows (output features), K columns (input features), E experts, KS experts per
token (ids (T, KS) int32), F expert hidden, D model width; R rows per program, TP tokens rounded up to a power of 2.

Each program owns R rows and walks them C chunks of 256 weights at a time (kernels/gpu/src/deq.py): a step's
weights are read once, as whole blocks, and multiplied by every token's x while they sit in registers, so the
weights cross memory once whatever T is. Accumulation is float32; x may be float32 or float16.

Models: llama.cpp's ggml-cuda mmvq.cu (a row spread over a block's threads, up to 8 tokens per launch) and, for
the MoE pair, its mul_mat_id and vLLM's ggml_moe_a8_vec (csrc/quantization/gguf): one program per (row block,
token-expert pair) reads the expert id from device memory, so the launch shape depends on T and KS only. Both
quantize x to q8_1 and multiply with dp4a; these kernels decode to float32 and use FMAs (simpler, and the
interpreter runs them; kernels/gpu/table.py says what that costs).
"""

import triton
import triton.language as tl

from .deq import deq, deq2, deq4


@triton.jit
def _row_offsets(row0, n_rows, base_row, row_bytes, R: tl.constexpr, CS: tl.constexpr):
    """(R * CS,) int64 byte offsets of rows row0 .. row0 + R, each repeated for its CS tile rows (C chunks of S);
    rows past n_rows reread row n_rows - 1 (their results are never stored). base_row: an expert's first row."""
    r = tl.minimum(row0 + tl.arange(0, R * CS) // CS, n_rows - 1)
    return (base_row + r.to(tl.int64)) * row_bytes


@triton.jit
def _decode(wp, roff, c, K, s, l, NW: tl.constexpr, QT: tl.constexpr):
    """Chunk c's weights as NW tiles: deq's one (1), deq2's two nibble tiles (2) or deq4's four Q6_K parts (4); the
    tiles past NW repeat the first (never read)."""
    if NW == 4:
        w0, w1, w2, w3 = deq4(wp, roff, c, K, s, l, QT)
    elif NW == 2:
        w0, w1 = deq2(wp, roff, c, K, s, l, QT)
        w2, w3 = w0, w0
    else:
        w0 = deq(wp, roff, c, K, s, l, QT)
        w1, w2, w3 = w0, w0, w0
    return w0, w1, w2, w3


@triton.jit
def _times_x(w0, w1, w2, w3, c, s, l, xp, kx, NW: tl.constexpr, L: tl.constexpr):
    """The (R * S, L) products of a decoded chunk with the x row at xp, summed over its NW tiles (columns >= kx
    read as 0). Tile t's weight at (s, l) is column k + t D: deq2's lo/hi D = L apart, deq4's parts D = 32."""
    if NW == 4:
        k = (c * 256 + 128 * (s // 2) + 16 * (s % 2))[:, None] + l[None, :]
        p = w0 * tl.load(xp + k, mask=k < kx, other=0.0).to(tl.float32)
        p += w1 * tl.load(xp + k + 32, mask=k + 32 < kx, other=0.0).to(tl.float32)
        p += w2 * tl.load(xp + k + 64, mask=k + 64 < kx, other=0.0).to(tl.float32)
        p += w3 * tl.load(xp + k + 96, mask=k + 96 < kx, other=0.0).to(tl.float32)
    elif NW == 2:
        k = (c * 256 + s * (2 * L))[:, None] + l[None, :]
        p = w0 * tl.load(xp + k, mask=k < kx, other=0.0).to(tl.float32)
        p += w1 * tl.load(xp + k + L, mask=k + L < kx, other=0.0).to(tl.float32)
    else:
        k = (c * 256 + s * L)[:, None] + l[None, :]
        p = w0 * tl.load(xp + k, mask=k < kx, other=0.0).to(tl.float32)
    return p


@triton.jit
def _rows_dot(wp, roff, xp, stride_x, T, K, QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr,
              C: tl.constexpr, TP: tl.constexpr, NW: tl.constexpr):
    """(R, TP) float32: the R rows at wp + roff (_row_offsets) times x rows xp + t * stride_x for t < T (columns
    t >= T stay 0). A step decodes C consecutive chunks of each row at once (a split of K within the program, as
    llama.cpp's mmvq spreads a row over a block's threads), then multiplies them by every token's x. One token
    accumulates the products elementwise and reduces once after the loop; more tokens reduce each step's products
    per tile row (mostly within a thread) into an (R * C * S, TP) accumulator."""
    i = tl.arange(0, R * C * S)
    s = i % S                                                                # (R * C * S,) sub-block of a tile row
    cc = (i // S) % C                                                        # its chunk within the step
    l = tl.arange(0, L)                                                      # (L,)
    if TP == 1:
        acc = tl.zeros((R * C * S, L), dtype=tl.float32)
        for c0 in range(0, tl.cdiv(K, 256 * C)):
            c = c0 * C + cc
            w0, w1, w2, w3 = _decode(wp, roff, c, K, s, l, NW, QT)
            acc += _times_x(w0, w1, w2, w3, c, s, l, xp, K, NW, L)
        return tl.sum(tl.reshape(tl.sum(acc, axis=1), (R, C * S)), axis=1)[:, None]             # (R, 1)
    else:
        tcol = tl.arange(0, TP)[None, :]                                     # (1, TP)
        acc = tl.zeros((R * C * S, TP), dtype=tl.float32)
        for c0 in range(0, tl.cdiv(K, 256 * C)):
            c = c0 * C + cc
            w0, w1, w2, w3 = _decode(wp, roff, c, K, s, l, NW, QT)
            for t in tl.static_range(TP):
                # tokens t >= T read no x: their columns end at 0 (a block & scalar mask would do, but Triton's
                # interpreter makes it int32, which Triton 3.9's tl.load refuses)
                p = _times_x(w0, w1, w2, w3, c, s, l, xp + t * stride_x, tl.where(t < T, K, 0), NW, L)
                acc += tl.where(tcol == t, tl.sum(p, axis=1)[:, None], 0.0)
        return tl.sum(tl.reshape(acc, (R, C * S, TP)), axis=1)                                 # (R, TP)


@triton.jit
def _rows_dot2(wa, wb, roff, xp, K, QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr,
               C: tl.constexpr, NW: tl.constexpr):
    """Two matrices of the same shape and type (an expert's gate and up) times one x row in one pass: (R,), (R,).
    Each step's x is loaded once for both."""
    i = tl.arange(0, R * C * S)
    s = i % S
    cc = (i // S) % C
    l = tl.arange(0, L)
    acc_a = tl.zeros((R * C * S, L), dtype=tl.float32)
    acc_b = tl.zeros((R * C * S, L), dtype=tl.float32)
    for c0 in range(0, tl.cdiv(K, 256 * C)):
        c = c0 * C + cc
        a0, a1, a2, a3 = _decode(wa, roff, c, K, s, l, NW, QT)
        b0, b1, b2, b3 = _decode(wb, roff, c, K, s, l, NW, QT)
        if NW == 4:
            k = (c * 256 + 128 * (s // 2) + 16 * (s % 2))[:, None] + l[None, :]
            x0 = tl.load(xp + k, mask=k < K, other=0.0).to(tl.float32)
            x1 = tl.load(xp + k + 32, mask=k + 32 < K, other=0.0).to(tl.float32)
            x2 = tl.load(xp + k + 64, mask=k + 64 < K, other=0.0).to(tl.float32)
            x3 = tl.load(xp + k + 96, mask=k + 96 < K, other=0.0).to(tl.float32)
            acc_a += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
            acc_b += b0 * x0 + b1 * x1 + b2 * x2 + b3 * x3
        elif NW == 2:
            k = (c * 256 + s * (2 * L))[:, None] + l[None, :]
            x0 = tl.load(xp + k, mask=k < K, other=0.0).to(tl.float32)
            x1 = tl.load(xp + k + L, mask=k + L < K, other=0.0).to(tl.float32)
            acc_a += a0 * x0 + a1 * x1
            acc_b += b0 * x0 + b1 * x1
        else:
            k = (c * 256 + s * L)[:, None] + l[None, :]
            x0 = tl.load(xp + k, mask=k < K, other=0.0).to(tl.float32)
            acc_a += a0 * x0
            acc_b += b0 * x0
    a = tl.sum(tl.reshape(tl.sum(acc_a, axis=1), (R, C * S)), axis=1)
    b = tl.sum(tl.reshape(tl.sum(acc_b, axis=1), (R, C * S)), axis=1)
    return a, b


@triton.jit
def matvec_kernel(w_ptr, x_ptr, out_ptr, N, K, T, row_bytes, stride_x, stride_o,
                  QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr, C: tl.constexpr,
                  TP: tl.constexpr, NW: tl.constexpr):
    """out[t, n] = sum_k W[n, k] x[t, k] for t < T: W (N, row_bytes) raw rows, x (T, K), out (T, N) float32.
    Grid (cdiv(N, R),)."""
    row0 = tl.program_id(0) * R
    roff = _row_offsets(row0, N, 0, row_bytes, R, C * S)
    acc = _rows_dot(w_ptr, roff, x_ptr, stride_x, T, K, QT, R, S, L, C, TP, NW)                        # (R, TP)
    rows = (row0 + tl.arange(0, R))[:, None]
    t = tl.arange(0, TP)[None, :]
    tl.store(out_ptr + t * stride_o + rows, acc, mask=(rows < N) & (t < T))


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
                       QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr, C: tl.constexpr,
                       ACT: tl.constexpr, HAS_BIAS: tl.constexpr, NW: tl.constexpr):
    """act[p, f] = glu(W_gate[e] x[t] + bg[e], W_up[e] x[t] + bu[e])[f] for pair p = t * KS + k, e = ids[p]:
    gate, up (E, F, row_bytes) raw; biases (E, F) float32 if HAS_BIAS; x (T, K); act (T * KS, F) float32.
    Grid (cdiv(F, R), T * KS): the expert id is read here, so a captured graph replays with new ids. Gate and up go
    in one pass (_rows_dot2: x loaded once; Q4_K's sm_90 step 379 PTX instructions for both, 412 apart, at 96
    registers instead of 72)."""
    p = tl.program_id(1)
    e = tl.load(ids_ptr + p).to(tl.int64)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    rc = tl.minimum(rows, F - 1)
    roff = _row_offsets(tl.program_id(0) * R, F, e * F, row_bytes, R, C * S)
    xp = x_ptr + (p // KS) * stride_x
    g, u = _rows_dot2(gate_ptr, up_ptr, roff, xp, K, QT, R, S, L, C, NW)                     # (R,) each
    if HAS_BIAS:
        g += tl.load(bg_ptr + e * F + rc)
        u += tl.load(bu_ptr + e * F + rc)
    tl.store(act_ptr + p.to(tl.int64) * F + rows, _glu(g, u, ACT), mask=rows < F)


@triton.jit
def moe_down_kernel(down_ptr, bd_ptr, act_ptr, ids_ptr, wts_ptr, out_ptr, D, F, KS, row_bytes, stride_o,
                    QT: tl.constexpr, R: tl.constexpr, S: tl.constexpr, L: tl.constexpr, C: tl.constexpr,
                    HAS_BIAS: tl.constexpr, NW: tl.constexpr):
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
        roff = _row_offsets(tl.program_id(0) * R, D, e * D, row_bytes, R, C * S)
        y = tl.sum(_rows_dot(down_ptr, roff, act_ptr + p.to(tl.int64) * F, 0, 1, F, QT, R, S, L, C, 1, NW), axis=1)
        if HAS_BIAS:
            y += tl.load(bd_ptr + e * D + rc)
        acc += tl.load(wts_ptr + p) * y
    tl.store(out_ptr + t.to(tl.int64) * stride_o + rows, acc, mask=rows < D)
