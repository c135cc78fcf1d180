"""One decoder layer for ONE token in two Numba calls: the per-token glue of a small model, gone.

    layer_kernels(mm, moe, f16_cache) -> (attention half, experts half)   made on first use per types
    layer_kernels_n(group, mm_o, moe, f16_cache)                           the same on several threads

A small model's decode step is mostly Python around microsecond kernels (bench/RESULTS.md, overhead.py;
bench/HISTORY.md, "The demo model's per-token glue"): ~10 kernel calls a layer, each with its wrapper, checks and
phase timer. These run the same kernels, in the same order, from two calls, with the router's one matmul between
them in NumPy (the block's own `h @ W.T`, so its BLAS sums are the same ones):

    h = rms_norm(x) * attn_norm                                      kernels/layers.py _rms_norm
    q, k, v = h @ Wq.T, h @ Wk.T, h @ Wv.T                           the weights' serial matmul drivers
    a = attention(rope(rms_norm(q)), rope(rms_norm(k)) -> cache, v)  kernels/layers.py _qk_attention1 (_f16 below;
                                                                     both attend with kernels/flash_decode.attend1)
    x = x + a @ Wo.T;  h = rms_norm(x) * ffn_norm                    (the attention half ends here)
    logits = h @ Wr.T                                                NumPy, between the calls (moert/fused.py)
    ids, w = softmax -> top-k (-> renormalize)                       kernels/layers.py _softmax_topk
    x = x + experts(h, ids, w)                                       the layer's serial kernels/moe_fused.py kernel

Its twin is the architecture's Python block (moert/models/qwen3moe.py `block`, through moert/fused.py), which
calls the same kernels one by one, so the logits are the same (bit for bit where it was written);
tests/test_fused.py compares logits, tokens, routing and KV cache. Serial only: a caller uses it where every one
of these calls would run on one thread anyway (small weights, short context). layer_kernels_n makes the same
halves for several threads where every matmul and the experts would each run as a parallel region (big weights,
short context): the same regions as the block's (q/k/v in one: kernels/matmul.py group_kernel; the output; the
expert layer), without the Python between them.

Dimension legend: D hidden, H query heads, Hk KV heads, Dh head dim, Dv value head dim, E experts, K used.
"""

from __future__ import annotations

import hashlib

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from moert.kernels.blockdot import FM, Z0
from moert.kernels.flash_decode import attend1
from moert.kernels.jit import variant
from moert.kernels.layers import _no_sinks, _qk_attention1, _rms_norm, _rope, _softmax_topk

__all__ = ["DIMS", "f16_bits", "layer_kernels", "layer_kernels_n"]

# Bound per layer kernel by layer_kernel: mm_q, mm_k, mm_v, mm_o (the weights' serial matmul drivers, signature
# (w, x, out, r0, r1, b0, b1, f16): kernels/matmul.py kernels_for) and moe (the serial expert layer kernel,
# kernels/moe_fused.py serial_kernel), attend (kernels/layers.py _qk_attention1 over float32 caches,
# _qk_attention1_f16 below over f16 ones: uint16 bits). The placeholders only name them.
mm_q = mm_k = mm_v = mm_o = moe = attend = None
# layer_kernels_n binds group (kernels/matmul.py group_kernel: q, k, v in one parallel region) and par_o (the
# output's parallel driver, signature (w, x, out, nb, f16, chunk)), moe to the parallel expert layer kernel.
group = par_o = None


@intrinsic
def f16_bits(typingctx, x):
    """A float32 rounded to IEEE half (to nearest even, as NumPy's astype(float16)), as its uint16 bits."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(x), codegen


@njit(cache=True, fastmath=FM)
def _qk_attention1_f16(q, k, v, qn, kn, eps, cos, sin, neox, k_cache, v_cache, pos0, s0, scale, out):
    """_qk_attention1 over f16 caches (uint16 bits), in the steps the Python path takes for them (moert.layers
    rms_norm, rope, then attention -> attention_decode): q, k normed, rotated, k and v rounded to f16 into the
    caches at pos0, attention of the rotated q. The fused decode layer's attention over an f16 cache."""
    H, Dh = q.shape
    Hk = k.shape[0]
    qn_ = np.empty_like(q)
    kn_ = np.empty_like(k)
    _rms_norm(q, qn, eps, qn_)
    _rms_norm(k, kn, eps, kn_)
    qr = np.empty((1, H, Dh), dtype=np.float32)
    kr = np.empty((1, Hk, Dh), dtype=np.float32)
    _rope(qn_.reshape(1, H, Dh), cos.reshape(1, -1), sin.reshape(1, -1), neox, qr)
    _rope(kn_.reshape(1, Hk, Dh), cos.reshape(1, -1), sin.reshape(1, -1), neox, kr)
    for h in range(Hk):
        for i in range(Dh):
            k_cache[pos0, h, i] = f16_bits(kr[0, h, i])
        for i in range(v.shape[1]):
            v_cache[pos0, h, i] = f16_bits(v[h, i])
    attend1(qr[0], k_cache, v_cache, s0, pos0 + 1, scale, _no_sinks(H), out)


# What `dims` (int64) holds, by index: the layer's sizes and codes that are not array shapes.
DIMS = ("n_head", "nb_q", "nb_k", "nb_v", "nb_o", "nb_in", "nb_down", "block_down", "parts", "act", "neox", "renorm")


def _attention_half(x, pos0, cos, sin, k_cache, v_cache, h, wq, wk, wv, wo, f16, norms, dims, eps, scale):
    """x (1, D) -> x + attention (1, D); writes k, v at pos0 of the caches and the FFN's input rms_norm(x) * ffn_norm
    into h (1, D). cos, sin (1, Dh/2): this position's RoPE angles. Weights: q, k, v, output (R, row_bytes) raw
    bytes read through the 16-bit table f16; norms (2 D + 2 Dh,) float32: attn_norm, attn_q_norm, attn_k_norm,
    ffn_norm in a row; dims as DIMS says. (Few arguments: a Numba call costs ~0.1 us an argument.)"""
    D = x.shape[1]
    Hk, Dh, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[2]
    H = dims[0]
    attn_norm, q_norm, k_norm = norms[:D], norms[D:D + Dh], norms[D + Dh:D + 2 * Dh]
    ffn_norm = norms[D + 2 * Dh:2 * D + 2 * Dh]
    _rms_norm(x, attn_norm, eps, h)                                     # (1, D)
    q = np.empty((1, H * Dh), dtype=np.float32)
    k = np.empty((1, Hk * Dh), dtype=np.float32)
    v = np.empty((1, Hk * Dv), dtype=np.float32)
    mm_q(wq, h, q, Z0, H * Dh, Z0, dims[1], f16)                        # (1, H*Dh)
    mm_k(wk, h, k, Z0, Hk * Dh, Z0, dims[2], f16)                       # (1, Hk*Dh)
    mm_v(wv, h, v, Z0, Hk * Dv, Z0, dims[3], f16)                       # (1, Hk*Dv)
    a = np.empty((H, Dv), dtype=np.float32)
    attend(q.reshape(H, Dh), k.reshape(Hk, Dh), v.reshape(Hk, Dv), q_norm, k_norm, eps, cos[0], sin[0], dims[10] != 0,
           k_cache, v_cache, pos0, Z0, scale, a)                        # (H, Dv)
    o = np.empty((1, D), dtype=np.float32)
    mm_o(wo, a.reshape(1, H * Dv), o, Z0, D, Z0, dims[4], f16)          # (1, D)
    x1 = np.empty((1, D), dtype=np.float32)
    for i in range(D):
        x1[0, i] = x[0, i] + o[0, i]
    _rms_norm(x1, ffn_norm, eps, h)                                     # (1, D)
    return x1


@njit(cache=True, inline="always")
def _chunk(rows, n):
    """Rows per task of a parallel matmul of `rows` rows on n threads, as kernels/matmul.py's Prepared and
    PreparedGroup pick it: >= 4 tasks a thread, at most 64 rows a task."""
    return max(1, min(64, -(-rows // (4 * n))))


def _attention_half_n(x, pos0, cos, sin, k_cache, v_cache, h, wq, wk, wv, wo, f16, norms, dims, eps, scale, n):
    """_attention_half on n threads: q, k, v in one parallel region (the q/k/v group kernel), the output in another,
    as the block runs them (the same kernels; the rest is _attention_half's)."""
    D = x.shape[1]
    Hk, Dh, Dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[2]
    H = dims[0]
    attn_norm, q_norm, k_norm = norms[:D], norms[D:D + Dh], norms[D + Dh:D + 2 * Dh]
    ffn_norm = norms[D + 2 * Dh:2 * D + 2 * Dh]
    _rms_norm(x, attn_norm, eps, h)                                     # (1, D)
    q = np.empty((1, H * Dh), dtype=np.float32)
    k = np.empty((1, Hk * Dh), dtype=np.float32)
    v = np.empty((1, Hk * Dv), dtype=np.float32)
    group(h, wq, q, dims[1], f16, wk, k, dims[2], f16, wv, v, dims[3], f16, _chunk(H * Dh + Hk * (Dh + Dv), n))
    a = np.empty((H, Dv), dtype=np.float32)
    attend(q.reshape(H, Dh), k.reshape(Hk, Dh), v.reshape(Hk, Dv), q_norm, k_norm, eps, cos[0], sin[0], dims[10] != 0,
           k_cache, v_cache, pos0, Z0, scale, a)                        # (H, Dv)
    o = np.empty((1, D), dtype=np.float32)
    par_o(wo, a.reshape(1, H * Dv), o, dims[4], f16, _chunk(D, n))      # (1, D)
    x1 = np.empty((1, D), dtype=np.float32)
    for i in range(D):
        x1[0, i] = x[0, i] + o[0, i]
    _rms_norm(x1, ffn_norm, eps, h)                                     # (1, D)
    return x1


def _experts_half(x, h, logits, ids, wts, counts, il, g_raw, u_raw, d_raw, f16, dims, n):
    """x (1, D) + the experts of h (1, D) that the router's logits (1, E) choose: softmax, top-k into ids, wts (1, K),
    added to counts[il] (counts (n_layer, E): the forward call's stats); gate, up, down (E, R, row_bytes) raw; n the
    expert kernel's threads (1 for the serial one)."""
    _softmax_topk(logits, ids.shape[1], dims[11] != 0, ids, wts)        # (1, K) each
    for j in range(ids.shape[1]):
        counts[il, ids[0, j]] += 1
    none = np.zeros((0, 0), dtype=np.float32)                           # no expert biases
    y = moe(h, ids, wts, g_raw, f16, u_raw, f16, d_raw, f16, dims[5], dims[6], dims[7], dims[8], dims[9], none, none,
            none, n)                                                    # (1, D)
    out = np.empty_like(x)
    for i in range(x.shape[1]):
        out[0, i] = x[0, i] + y[0, i]
    return out


_KERNELS: dict[tuple, object] = {}


def _made(template, prefix: str, **bound):
    """variant(template) with these bindings, made once; its name carries a hash of the bound kernels' names."""
    key = (template, *bound.values())
    if key not in _KERNELS:
        tag = hashlib.sha1("/".join(f.py_func.__name__ for f in bound.values()).encode()).hexdigest()[:10]
        _KERNELS[key] = variant(template, f"{prefix}_{tag}", **bound)
    return _KERNELS[key]


def layer_kernels(mm: tuple, moe_kernel, f16_cache: bool = False) -> tuple:
    """The compiled halves of a one-token layer, made on first use: attention (for matmul drivers mm = (q, k, v,
    output), over float32 KV caches or, f16_cache, f16 ones) and experts (for the serial expert layer kernel
    moe_kernel). One cached compilation per combination of types; the experts half, which links the big MoE
    kernel, per expert types only."""
    attend = _qk_attention1_f16 if f16_cache else _qk_attention1
    return (_made(_attention_half, "decode_attention", mm_q=mm[0], mm_k=mm[1], mm_v=mm[2], mm_o=mm[3], attend=attend),
            _made(_experts_half, "decode_experts", moe=moe_kernel))


def layer_kernels_n(group_kernel, mm_o, moe_kernel, f16_cache: bool = False) -> tuple:
    """layer_kernels for several threads: attention over q/k/v's group kernel (kernels/matmul.py group_kernel) and
    the output's parallel driver, experts over the parallel expert layer kernel (kernels/moe_fused.py layer_kernel);
    the halves take the thread count as their last argument."""
    attend = _qk_attention1_f16 if f16_cache else _qk_attention1
    return (_made(_attention_half_n, "decode_attention_n", group=group_kernel, par_o=mm_o, attend=attend),
            _made(_experts_half, "decode_experts_n", moe=moe_kernel))
