"""The CPU glue kernels (kernels/layers.py) against their reference twins (moert/layers.py, moert/moe.py with
fast=False) on random inputs of odd sizes."""

from __future__ import annotations

import numpy as np
import pytest

from moert import layers, moe
from moert.kernels import layers as kl
from moert.kernels.flash_decode import PARALLEL_MIN_WORK

rng = np.random.default_rng(11)


def rand(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 7), (5, 96), (3, 4, 33)])
def test_rms_norm(shape):
    x, w = rand(*shape, scale=3.0), rand(shape[-1])
    want = layers.rms_norm(x, w, 1e-6, fast=False)
    got = kl.rms_norm(x, w, 1e-6)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 * np.abs(want).max())
    assert np.array_equal(layers.rms_norm(x, w, 1e-6), got)               # the xp function takes the kernel


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("T,h,Dh", [(1, 3, 8), (6, 2, 34)])
def test_rope(neox, T, h, Dh):
    x = rand(T, h, Dh)
    cos, sin = layers.rope_angles(17, T, Dh, 10000.0)
    want = layers.rope(x, cos, sin, neox, fast=False)
    np.testing.assert_allclose(kl.rope(x, cos, sin, neox), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("H,Hk,Dh,pos0", [(4, 2, 16, 0), (6, 3, 24, 40), (8, 1, 64, 9000)])
def test_attention_decode(window, H, Hk, Dh, pos0, sinks):
    """One query token against a cache of pos0 earlier positions; big caches take the parallel kernel;
    with sinks, gpt-oss's per-head logit in the denominator."""
    n_ctx = pos0 + 3
    kc, vc = rand(n_ctx, Hk, Dh), rand(n_ctx, Hk, Dh)
    q, k, v = rand(1, H, Dh, scale=2.0), rand(1, Hk, Dh), rand(1, Hk, Dh)
    s = rand(H, scale=3.0) if sinks else None
    kc2, vc2 = kc.copy(), vc.copy()
    want = layers.attention(q, k, v, kc, vc, pos0, window=window, sinks=s, fast=False)
    got = kl.attention_decode(q, k, v, kc2, vc2, pos0, 1 / np.sqrt(Dh), window, s)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.array_equal(kc2, kc) and np.array_equal(vc2, vc)          # both wrote k, v at pos0 and only there


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("H,Hk,Dh,pos0,window", [(6, 2, 16, 12, 4), (8, 2, 64, 1100, None)])   # serial, parallel
def test_qk_norm_rope_attention_is_the_three_in_a_row(neox, H, Hk, Dh, pos0, window):
    assert ((pos0 + 1) * Hk * 2 * Dh >= PARALLEL_MIN_WORK) == (pos0 > 1000)
    kc, vc = rand(pos0 + 8, Hk, Dh), rand(pos0 + 8, Hk, Dh)
    kc2, vc2 = kc.copy(), vc.copy()
    q, k, v = rand(1, H, Dh, scale=4.0), rand(1, Hk, Dh, scale=4.0), rand(1, Hk, Dh)
    qn, kn = rand(Dh), rand(Dh)
    cos, sin = layers.rope_angles(pos0, 1, Dh, 1e6)
    qr = layers.rope(layers.rms_norm(q, qn, 1e-6, fast=False), cos, sin, neox, fast=False)
    kr = layers.rope(layers.rms_norm(k, kn, 1e-6, fast=False), cos, sin, neox, fast=False)
    want = layers.attention(qr, kr, v, kc, vc, pos0, scale=0.3, window=window, fast=False)
    got = kl.qk_norm_rope_attention(q, k, v, qn, kn, 1e-6, cos, sin, neox, kc2, vc2, pos0, 0.3, window)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(kc2, kc, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("renorm", [True, False])
@pytest.mark.parametrize("T,E,K", [(1, 8, 2), (7, 128, 8), (3, 5, 5)])
def test_softmax_topk(renorm, T, E, K):
    logits = rand(T, E, scale=3.0)
    logits[0, 1] = logits[0, 3] = logits[0].max() + 1                     # a tie: the lower index goes first
    want_ids, want_w = moe.softmax_topk(logits, K, renorm=renorm, fast=False)
    ids, w = kl.softmax_topk(logits, K, renorm)
    assert ids.dtype == np.int32 and w.dtype == np.float32
    np.testing.assert_array_equal(ids, want_ids)
    assert ids[0, 0] == 1 and ids[0, 1] == 3
    np.testing.assert_allclose(w, want_w, rtol=1e-6, atol=1e-7)


def test_exp_neg_is_np_exp_within_two_ulps():
    """The softmax's vectorizable exp (x <= 0) against np.exp, on a grid down to -87 and on random logits."""
    from numba import njit

    @njit
    def each(x, out):
        for i in range(x.shape[0]):
            out[i] = kl.exp_neg(x[i])

    x = np.concatenate([np.linspace(-87, 0, 100001), -np.abs(np.random.default_rng(1).standard_normal(1000)) * 20])
    x = x.astype(np.float32)
    got, want = np.empty_like(x), np.exp(x)
    each(x, got)
    ulps = np.abs(got - want) / np.spacing(want)
    assert ulps.max() <= 2
    tiny = np.array([-88.0, -100.0, -1e30], dtype=np.float32)
    each(tiny, got[:3])
    assert np.all(got[:3] <= 2e-38)                                  # e**-87 at most: nothing against a sum >= 1


def test_f16_bits_round_as_numpy():
    """kernels.decode.f16_bits (the fused decode layer's f16 KV writes) against NumPy's astype(float16)."""
    from numba import njit

    from moert.kernels.decode import f16_bits

    @njit
    def each(x, out):
        for i in range(x.shape[0]):
            out[i] = f16_bits(x[i])

    r = np.random.default_rng(4)
    x = np.concatenate([r.standard_normal(20000) * 10.0 ** r.integers(-9, 6, 20000), [0.0, -0.0, 65504.0, 7e4, 6e-8,
                                                                                     3e-8, 1e-9]]).astype(np.float32)
    got = np.empty(x.shape, dtype=np.uint16)
    each(x, got)
    with np.errstate(over="ignore"):                                        # 7e4: inf in both
        np.testing.assert_array_equal(got, x.astype(np.float16).view(np.uint16))
