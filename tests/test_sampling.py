"""Samplers vs a plain reference of llama.cpp's chain; distribution checks with fixed seeds; every bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moert.errors import MoertError
from moert.text.sampling import Sampler, SamplingError, SamplingParams, candidates, min_p, penalize, top_k, top_p


def reference(logits, history, p: SamplingParams) -> dict[int, float]:
    """llama.cpp's chain written out plainly: penalties -> top_k -> top_p -> min_p -> temperature -> softmax."""
    l = [float(x) for x in logits]
    if p.repeat_penalty != 1 and p.repeat_last_n > 0:
        for t in set(history[-p.repeat_last_n:]):
            l[t] = l[t] * p.repeat_penalty if l[t] <= 0 else l[t] / p.repeat_penalty
    order = sorted(range(len(l)), key=lambda i: (-l[i], i))
    if p.temperature == 0:
        return {order[0]: 1.0}
    if p.top_k > 0:
        order = order[:p.top_k]
    if p.top_p < 1:
        m = l[order[0]]
        e = [math.exp(l[i] - m) for i in order]
        cum, keep = 0.0, []
        for i, ei in zip(order, e):
            keep.append(i)
            cum += ei / sum(e)
            if cum >= p.top_p:
                break
        order = keep
    if p.min_p > 0:
        best = max(l[i] for i in order)
        order = [i for i in order if l[i] >= best + math.log(p.min_p)]
    m = max(l[i] for i in order) / p.temperature
    e = {i: math.exp(l[i] / p.temperature - m) for i in order}
    return {i: v / sum(e.values()) for i, v in e.items()}


def dense(ids, probs, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[ids] = probs
    return out


@pytest.mark.parametrize("seed", range(40))
def test_chain_matches_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    logits = (rng.standard_normal(n) * rng.uniform(0.5, 4)).astype(np.float32)
    history = rng.integers(0, n, int(rng.integers(0, 100))).tolist()
    p = SamplingParams(temperature=float(rng.choice([0.0, 0.3, 0.8, 1.0, 1.7])), top_k=int(rng.choice([0, 1, 5, 40])),
                       top_p=float(rng.choice([1.0, 0.95, 0.5, 0.1])), min_p=float(rng.choice([0.0, 0.05, 0.3])),
                       repeat_penalty=float(rng.choice([1.0, 1.1, 1.5, 0.8])),
                       repeat_last_n=int(rng.choice([0, 8, 64])))
    ids, probs = candidates(logits, history, p)
    ref = reference(logits, history, p)
    np.testing.assert_allclose(dense(ids, probs, n), dense(list(ref), list(ref.values()), n), atol=1e-6)
    assert abs(probs.sum() - 1) < 1e-9


def draws(logits, params, n=3000, history=()):
    s = Sampler(params)
    return np.array([s(logits, history) for _ in range(n)])


def test_top_k_never_samples_outside_the_k_best():
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    best5 = set(np.argsort(-logits)[:5].tolist())
    got = draws(logits, SamplingParams(temperature=5.0, top_k=5, top_p=1, min_p=0, seed=3))
    assert set(got.tolist()) == best5  # all five show up at this temperature, nothing else does


def test_top_p_keeps_the_nucleus_only():
    logits = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04], np.float32))
    got = draws(logits, SamplingParams(temperature=1, top_k=0, top_p=0.85, min_p=0, seed=4))
    assert set(got.tolist()) == {0, 1, 2}  # 0.5 + 0.3 < 0.85 <= 0.9: the third token completes the nucleus


def test_min_p_drops_tokens_below_the_fraction_of_the_best():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.05, 0.05], np.float32))
    got = draws(logits, SamplingParams(temperature=1, top_k=0, top_p=1, min_p=0.25, seed=5))
    assert set(got.tolist()) == {0, 1, 2}  # 0.05 < 0.25 * 0.4


def test_frequencies_follow_softmax_over_temperature():
    logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0], np.float32)
    for temp in (0.5, 1.0, 2.0):
        n = 6000
        got = np.bincount(draws(logits, SamplingParams(temperature=temp, top_k=0, top_p=1, min_p=0, seed=6), n),
                          minlength=5) / n
        want = np.exp(logits / temp) / np.exp(logits / temp).sum()
        sigma = np.sqrt(want * (1 - want) / n)
        assert np.all(np.abs(got - want) < 5 * sigma + 1e-4), (temp, got, want)


def test_greedy_is_the_argmax_after_the_penalty_whatever_the_seed():
    logits = np.array([1.0, 3.0, 2.9, -1.0], np.float32)
    for seed in range(5):
        assert Sampler(SamplingParams(temperature=0, seed=seed))(logits) == 1
    # 3.0 / 1.5 = 2.0 < 2.9: the repeated token loses its lead
    assert Sampler(SamplingParams(temperature=0, repeat_penalty=1.5))(logits, [1]) == 2


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = np.random.default_rng(7).standard_normal(500).astype(np.float32)
    p = dict(temperature=1.5, top_k=0, top_p=1, min_p=0)
    a = draws(logits, SamplingParams(**p, seed=11), 50)
    b = draws(logits, SamplingParams(**p, seed=11), 50)
    c = draws(logits, SamplingParams(**p, seed=12), 50)
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()


def test_repetition_penalty_semantics():
    logits = np.array([2.0, -2.0, 1.0, 0.0], np.float32)
    out = penalize(logits, [0, 1, 0, 3], 2.0, 64)
    np.testing.assert_array_equal(out, [1.0, -4.0, 1.0, 0.0])  # positive / 2, negative * 2, untouched, 0 * 2
    np.testing.assert_array_equal(penalize(logits, [0, 1, 2], 2.0, 1), [2.0, -2.0, 0.5, 0.0])  # last 1 token only
    assert penalize(logits, [0], 1.0, 64) is logits  # off: no copy


def test_step_functions_on_ties_and_edges():
    ids = np.arange(6)
    x = np.array([1, 3, 3, 2, 3, 0], np.float32)
    assert top_k(ids, x, 2)[0].tolist() == [1, 2]  # ties broken by lower id
    assert top_k(ids, x, 0)[0].tolist() == [1, 2, 4, 3, 0, 5]
    assert top_k(ids, x, 99)[0].tolist() == [1, 2, 4, 3, 0, 5]
    s_ids, s_x = top_k(ids, x, 0)
    assert top_p(s_ids, s_x, 0.0)[0].tolist() == [1]  # at least one token survives
    assert min_p(s_ids, s_x, 1.0)[0].tolist() == [1, 2, 4]


@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature="hot"), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
    (dict(top_p=1.5), "top_p"), (dict(top_p=-0.1), "top_p"), (dict(min_p=2.0), "min_p"),
    (dict(repeat_penalty=0.0), "repeat_penalty"), (dict(repeat_penalty=float("inf")), "repeat_penalty"),
    (dict(repeat_last_n=-1), "repeat_last_n"), (dict(seed=-3), "seed"), (dict(seed=1.5), "seed"),
    (dict(top_k=True), "top_k"),
])
def test_out_of_range_parameters_are_typed_errors(kwargs, word):
    with pytest.raises(SamplingError, match=word) as e:
        SamplingParams(**kwargs)
    assert isinstance(e.value, MoertError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits_are_typed_errors(bad):
    logits = np.zeros(10, np.float32)
    logits[7] = bad
    with pytest.raises(SamplingError, match=r"non-finite.*\[7\]"):
        Sampler(SamplingParams(temperature=0))(logits)


def test_logits_must_be_one_row():
    with pytest.raises(SamplingError, match="one row"):
        Sampler()(np.zeros((2, 10), np.float32))
    with pytest.raises(SamplingError, match="one row"):
        Sampler()(np.zeros(0, np.float32))
