"""Routing functions (moert/moe.py), one per semantics, against loops written from their definitions."""

from __future__ import annotations

import numpy as np
import pytest

from moert.moe import sigmoid_topk, softmax_topk, topk_softmax

rng = np.random.default_rng(0)
LOGITS = rng.standard_normal((7, 16)).astype(np.float32)


def softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


def best(scores, k):
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]


@pytest.mark.parametrize("renorm", [True, False])
@pytest.mark.parametrize("fast", [True, False])
def test_softmax_then_topk(renorm, fast):
    """Qwen3-MoE (renormalized), Qwen2-MoE and OLMoE (not)."""
    ids, w = softmax_topk(LOGITS, 4, renorm=renorm, fast=fast)
    for t, row in enumerate(LOGITS):
        p = softmax(row.astype(np.float64))
        want = best(p, 4)
        assert ids[t].tolist() == want
        ww = p[want] / (p[want].sum() if renorm else 1)
        np.testing.assert_allclose(w[t], ww, rtol=1e-5)


def test_topk_then_softmax():
    """Mixtral, gpt-oss: the same as softmax -> top-k -> renormalize."""
    ids, w = topk_softmax(LOGITS, 2)
    ids2, w2 = softmax_topk(LOGITS, 2, renorm=True, fast=False)
    np.testing.assert_array_equal(ids, ids2)
    np.testing.assert_allclose(w, w2, rtol=1e-5)
    for t, row in enumerate(LOGITS):
        np.testing.assert_allclose(w[t], softmax(row[best(row, 2)].astype(np.float64)), rtol=1e-5)


@pytest.mark.parametrize("groups", [(1, 1), (4, 2), (8, 3)])
def test_sigmoid_with_bias_and_groups(groups):
    """DeepSeek-V3 / GLM-4.7-Flash: selection by sigmoid + bias within the best groups (by the sum of each
    group's two best biased scores), weights from the unbiased sigmoid, renormalized, scaled."""
    n_group, topk_group = groups
    bias = rng.standard_normal(16).astype(np.float32) * 0.5
    ids, w = sigmoid_topk(LOGITS, 4, bias, renorm=True, scale=2.5, n_group=n_group, topk_group=topk_group)
    size = 16 // n_group
    for t, row in enumerate(LOGITS.astype(np.float64)):
        s = 1 / (1 + np.exp(-row))
        sel = s + bias
        merit = [sorted(sel[g * size:(g + 1) * size])[-2:] for g in range(n_group)]
        groups_kept = best([sum(m) for m in merit], topk_group)
        allowed = [e for e in range(16) if e // size in groups_kept]
        want = sorted(allowed, key=lambda e: (-sel[e], e))[:4]
        assert ids[t].tolist() == want
        np.testing.assert_allclose(w[t], 2.5 * s[want] / s[want].sum(), rtol=1e-5)
