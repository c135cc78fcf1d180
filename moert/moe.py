"""Mixture-of-experts routing functions and the shared expert dispatch.

Routing *semantics* belong to an architecture, which picks one of the functions below (softmax ->
top-k -> renormalize for Qwen3-MoE; top-k -> softmax for Mixtral; softmax or sigmoid, then a selection
bias and expert groups (grouped_topk) for DeepSeek-V2/V3 and GLM-4.7-Flash).
Dispatch *mechanics* are shared: group the (token, slot) pairs by expert so each selected expert's
weights are read once per batch, run each expert on its tokens, scatter-add the weighted results.

Dimension legend: T tokens, E experts, K experts used per token, D hidden, F expert hidden.
Routing functions take logits (T, E) float32 and return ids (T, K) int32 and weights (T, K) float32,
on the device of the logits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moert.layers import softmax


def _topk(scores, k: int, xp=np):
    """Indices and values of the k largest scores per row, largest first (ties: lowest index). On a device, k
    rounds of argmax (which picks the lowest index of equal maxima, as the stable sort): no sort, because CuPy's
    (thrust) may synchronize, which a CUDA graph's capture cannot hold."""
    if xp is np:
        ids = np.argsort(-scores, axis=-1, kind="stable")[:, :k]        # (T, K)
        return ids.astype(np.int32), np.take_along_axis(scores, ids, axis=-1)
    s = xp.where(scores == -np.inf, np.finfo(scores.dtype).min, scores)   # a taken score (-inf) ranks below all
    cols = xp.arange(scores.shape[-1])[None, :]                         # (1, E)
    ids = []
    for _ in range(k):
        i = s.argmax(axis=-1)                                           # (T,)
        ids.append(i)
        s = xp.where(cols == i[:, None], -np.inf, s)
    ids = xp.stack(ids, axis=-1)                                        # (T, K)
    return ids.astype(xp.int32), xp.take_along_axis(scores, ids, axis=-1)


def softmax_topk(logits, k: int, xp=np, renorm: bool = True, fast: bool = True):
    """Softmax over all E experts, keep the top k, optionally renormalize them to sum to 1 (Qwen3-MoE).
    On the CPU a Numba kernel (kernels/layers.py; this is its twin, `fast=False`)."""
    if fast and xp is np and type(logits) is np.ndarray and logits.dtype == np.float32 and logits.ndim == 2:
        from moert.kernels import layers

        return layers.softmax_topk(logits, k, renorm)
    ids, w = _topk(softmax(logits, xp), k, xp)                          # (T, K), (T, K)
    if renorm:
        w = w / xp.sum(w, axis=-1, keepdims=True)
    return ids, w.astype(xp.float32)


def topk_softmax(logits, k: int, xp=np):
    """Top k logits, then softmax over those k only (Mixtral, gpt-oss; equal to softmax -> top-k ->
    renormalize)."""
    ids, top = _topk(logits, k, xp)
    return ids, softmax(top, xp).astype(xp.float32)


def sigmoid_topk(logits, k: int, bias, xp=np, renorm: bool = True, scale: float = 1.0, n_group: int = 1,
                 topk_group: int = 1):
    """DeepSeek-V3 / GLM-4.7-Flash: sigmoid scores, then grouped_topk (selection bias `exp_probs_b`, groups,
    weights from the unbiased scores, renormalized if `renorm`, times `scale`)."""
    s = np.float32(0.5) * (np.float32(1.0) + xp.tanh(np.float32(0.5) * logits))   # (T, E) sigmoid, no overflow
    return grouped_topk(s, k, bias, xp, renorm, scale, n_group, topk_group)


def grouped_topk(probs, k: int, bias=None, xp=np, renorm: bool = True, scale: float = 1.0, n_group: int = 1,
                 topk_group: int = 1):
    """llama.cpp's build_moe_ffn selection on gating scores `probs` (T, E) (softmax: DeepSeek-V2; sigmoid:
    V3, GLM-4.7-Flash): select by probs + bias (`exp_probs_b`, None: none) among the best `topk_group` of
    `n_group` expert groups (a group's merit: the sum of its two best biased scores), weight by the unbiased
    probs, divided by their sum if `renorm` (clamped at 2^-14, as llama.cpp), times `scale`."""
    sel = probs if bias is None else probs + bias                       # (T, E) selection scores
    if n_group > 1:
        T, E = sel.shape
        g = sel.reshape(T, n_group, E // n_group)                       # (T, G, E/G)
        first = g.argmax(axis=-1)[:, :, None]                           # (T, G, 1) no sort (see _topk)
        rest = xp.where(xp.arange(E // n_group)[None, None, :] == first, -np.inf, g)
        top2 = g.max(axis=-1) + rest.max(axis=-1)                       # (T, G) the two best of each group
        keep, _ = _topk(top2, topk_group, xp)                           # (T, topk_group) best groups
        mask = (keep[:, :, None] == xp.arange(n_group)[None, None, :]).any(axis=1)     # (T, G) kept groups
        sel = xp.where(xp.repeat(mask, E // n_group, axis=-1), sel, -xp.inf)
    ids, _ = _topk(sel, k, xp)
    w = xp.take_along_axis(probs, ids.astype(xp.int64), axis=-1)        # (T, K)
    if renorm:
        w = w / xp.maximum(xp.sum(w, axis=-1, keepdims=True), np.float32(6.103515625e-5))
    return ids, (w * np.float32(scale)).astype(xp.float32)


def expert_counts(ids, n_expert: int, xp=np):
    """How many (token, slot) pairs picked each expert: (E,) int64 on the device of ids, by comparison, not
    bincount (CuPy's bincount reads the ids' maximum back to the host: a sync)."""
    hits = ids.reshape(-1, 1) == xp.arange(n_expert, dtype=ids.dtype)[None, :]        # (T*K, E)
    return hits.sum(axis=0, dtype=xp.int64)


def fused_moe(dev, ts: list, bs: list | None, act: str, x, ids, weights):
    """The selected experts in dev's fused MoE kernel (kernels/gpu moe: ids and weights read on the device, nothing
    read back for up to DECODE_MAX_T tokens) where it takes them: gate/up/down `ts` (moert.weights.Weight) of one
    type, all whole on dev; biases `bs` F32 (E, n) or None. The kernel reads ids unchecked: the caller passes no -1
    slot. (T, D) on dev, or None where the kernel does not take them."""
    k = takes(dev, ts)
    if k is None:
        return None
    b = None if bs is None else tuple(t.data.reshape(t.shape) for t in bs)
    with dev:
        return k.moe(x, ids.astype(np.int32), weights.astype(np.float32), *(t.data for t in ts), ts[0].type,
                     tuple(t.shape for t in ts), act=act, biases=b)


def dispatch(x, ids, weights, counts: np.ndarray, run_expert: Callable, xp=np):
    """Grouped expert dispatch: out[t] = sum_k weights[t, k] * run_expert(ids[t, k], x[t]).

    x (T, D), ids (T, K), weights (T, K) on one device; counts (E,) host ints of the ids >= 0 (moved to
    the host by the caller, who also records them); run_expert(e, xs (n, D)) -> (n, D) on that device.
    Each expert with tokens runs once, on all of its tokens together. Slots with id -1 are skipped (their
    expert runs on another device).
    """
    T, K = ids.shape
    order = xp.argsort(ids.reshape(-1), kind="stable")                  # (T*K,) slots grouped by expert
    tok = order // K                                                    # (T*K,) token of each slot
    w = weights.reshape(-1)[order][:, None]                             # (T*K, 1)
    out = xp.zeros(x.shape, dtype=xp.float32)                           # (T, D)
    start = T * K - int(sum(counts.tolist()))                           # the -1 slots sort first
    for e, n in enumerate(counts.tolist()):
        if n:
            t = tok[start:start + n]                                    # (n,) distinct: a token picks e once
            out[t] += run_expert(e, x[t]) * w[start:start + n]
            start += n
    return out


def takes(dev, ts: list):
    """dev's kernels (Device.block_kernels) when its fused MoE kernel takes gate/up/down `ts`: one type, each a whole
    moert.weights.Weight on dev; else None."""
    from moert.weights import Weight

    types = {t.type for t in ts}
    k = dev.block_kernels(*types) if len(types) == 1 else None
    if k is None or any(not isinstance(t, Weight) or t.experts is not None or t.device is not dev for t in ts):
        return None
    return k
