"""kernels/flash_decode.py (attention with the keys split over the threads, the cache read in its own type) against
its NumPy twin (a plain softmax per query row), its one-token serial form (attend1, the fused decode layer's) and
moert.layers.attention's reference path, per cache type, window, sinks, depth; MLA's latent cache too."""

from __future__ import annotations

import numpy as np
import pytest

from moert import layers
from moert.devices import CPU
from moert.errors import ShapeError
from moert.kernels import flash_decode as fd
from moert.kvcache import TypedKV

rng = np.random.default_rng(29)


def rand(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def typed(kind: str, x: np.ndarray):
    """x (n, Hk, D) stored as -ctk kind: a float32 array or a TypedKV (rounded as ggml rounds)."""
    if kind == "f32":
        return x.copy()
    c = TypedKV(CPU, kind, x.shape, "k")
    c.write(0, x)
    return c


def as_kernel_cache(c) -> fd.Cache:
    return layers._split_cache(c)


@pytest.fixture(params=["serial", "split"])
def threads_mode(request, monkeypatch):
    """serial: the kernel as it runs small work; split: every depth in chunks of >= 16 keys, planned for 4 threads
    (the parallel kernel runs on however many there are)."""
    if request.param == "split":
        monkeypatch.setattr(fd, "PARALLEL_MIN_WORK", 1)
        monkeypatch.setattr(fd, "MIN_CHUNK", 16)
        monkeypatch.setattr(fd, "threads", lambda: 4)
    return request.param


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("T,depth,window,sinks", [(1, 1, None, False), (1, 300, None, True), (1, 299, 37, False),
                                                  (3, 130, 64, True), (5, 0, None, False), (2, 77, 3, True)])
def test_split_attention_is_its_twin(threads_mode, kind, T, depth, window, sinks):
    """T query tokens at positions depth .. depth+T-1: the kernel's output equals the twin's softmax (float64)."""
    H, Hk, Dh = 6, 2, 32
    n = depth + T + 3
    k, v = typed(kind, rand(n, Hk, Dh, scale=2.0)), typed(kind, rand(n, Hk, Dh))
    q = rand(T, H, Dh, scale=2.0)
    s = rand(H, scale=3.0) if sinks else None
    kc, vc = as_kernel_cache(k), as_kernel_cache(v)
    got = fd.split_attention(q, kc, vc, depth, 0.3, window, s)
    want = fd.split_attention_ref(q, kc, vc, depth, 0.3, window, s)
    assert got.shape == (T, H * Dh) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("T,pos0,window,sinks", [(40, 150, None, True), (9, 1, None, False), (70, 20, 33, True)])
def test_prompt_kernel_is_the_twin(kind, T, pos0, window, sinks):
    """kernels/flash_prompt.py (many query tokens, sgemm over tiles of keys: several token blocks and key tiles,
    the last ones short) gives the twin's softmax, per cache type, window and sinks."""
    fp = pytest.importorskip("moert.kernels.flash_prompt")
    if not fp.available():
        pytest.skip("Numba's np.dot needs SciPy")
    H, Hk, Dh, Dv = 6, 2, 64, 32
    k, v = typed(kind, rand(pos0 + T + 2, Hk, Dh, scale=2.0)), typed(kind, rand(pos0 + T + 2, Hk, Dv))
    q = rand(T, H, Dh, scale=2.0)
    s = rand(H, scale=3.0) if sinks else None
    kc, vc = as_kernel_cache(k), as_kernel_cache(v)
    got = fp.prompt_attention(q, kc, vc, pos0, 0.2, window, s)
    # logits up to ~25 (|q|, |k| ~ 2, 64 dims): a float32 score is off by ~25 * 2^-24 * 8 relative, so a weight
    # by ~1e-5 of itself, however the sums are ordered (sgemm's blocks here, a row at a time in the twin)
    np.testing.assert_allclose(got, fd.split_attention_ref(q, kc, vc, pos0, 0.2, window, s), rtol=2e-5, atol=1e-5)


def test_twin_reads_the_caches_as_the_cache_reads_them():
    """The twin's own read of an f16/bf16/q8_0 cache equals kvcache.TypedKV.read (so it does not grade itself)."""
    x = rand(40, 2, 64, scale=3.0)
    for kind in ("f16", "bf16", "q8_0"):
        c = typed(kind, x)
        np.testing.assert_array_equal(fd._as_f32(as_kernel_cache(c)), c.read(0, 40))


@pytest.mark.parametrize("kind", ["f32", "f16"])
@pytest.mark.parametrize("depth,window", [(5, None), (700, None), (5000, None), (5000, 300)])
def test_the_serial_one_token_kernel_is_the_twin_and_the_split(kind, depth, window):
    """attend1 (one token on the calling thread: the fused decode layer's attention) over an f32 or f16 cache equals
    the twin, and split_attention (split over the threads from depth 700 on) equals it to float rounding."""
    H, Hk, Dh = 8, 2, 64
    k, v = typed(kind, rand(depth + 1, Hk, Dh)), typed(kind, rand(depth + 1, Hk, Dh))
    kc, vc = as_kernel_cache(k), as_kernel_cache(v)
    q = rand(1, H, Dh, scale=2.0)
    s = rand(H)
    s0 = 0 if window is None else depth - window + 1
    got = np.empty((H, Dh), np.float32)
    fd.attend1(q[0], kc.values, vc.values, s0, depth + 1, np.float32(0.125), s, got)
    np.testing.assert_allclose(got.reshape(1, -1), fd.split_attention_ref(q, kc, vc, depth, 0.125, window, s),
                               rtol=2e-5, atol=2e-6)
    split = fd.split_attention(q, kc, vc, depth, 0.125, window, s)
    np.testing.assert_allclose(split, got.reshape(1, -1), rtol=1e-5, atol=1e-6)


def test_plan_splits_deep_decode_over_two_threads_and_keeps_small_work_on_one():
    """Qwen3-30B-A3B's attention (32 query / 4 KV heads of 128): one thread at depth 100, both from depth 512 on,
    and a single KV head (MLA) split into chunks."""
    assert fd.split_plan(1, 32, 4, 100, 128, 128, 2)[0] == 1
    n, tb, chunk = fd.split_plan(1, 32, 4, 512, 128, 128, 2)
    assert n == 2 and tb >= 1 and chunk == 512                          # 4 items (one per KV head) for 2 threads
    n, _, chunk = fd.split_plan(1, 16, 1, 4096, 576, 512, 2)
    assert n == 2 and -(-4096 // chunk) >= 4                            # one KV head: 4 chunks for 2 threads
    assert fd.split_plan(1, 32, 4, 100_000, 128, 128, 1)[0] == 1


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
@pytest.mark.parametrize("T", [1, 3])
def test_layers_attention_takes_it_for_every_cache_type(kind, T):
    """moert.layers.attention with a few query tokens over a typed cache (window and sinks, as gpt-oss) equals its
    reference path, and both wrote the same cache rows."""
    H, Hk, Dh, pos0 = 4, 2, 32, 40
    base = rand(pos0 + T, Hk, Dh)
    kf, vf = typed(kind, base), typed(kind, base[::-1].copy())
    kr, vr = typed(kind, base), typed(kind, base[::-1].copy())
    q, k, v = rand(T, H, Dh), rand(T, Hk, Dh), rand(T, Hk, Dh)
    s = rand(H)
    got = layers.attention(q, k, v, kf, vf, pos0, window=16, sinks=s)
    want = layers.attention(q, k, v, kr, vr, pos0, window=16, sinks=s, fast=False)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for a, b in ((kf, kr), (vf, vr)):
        for pa, pb in zip(getattr(a, "parts", [a]), getattr(b, "parts", [b])):
            np.testing.assert_array_equal(pa, pb)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_latent_attention(threads_mode, kind):
    """MLA's one-head latent cache: keys are [latent, rotated key] rows, values their first R dims."""
    H, T, R, P, pos0 = 4, 2, 64, 32, 90
    cache, ref = (typed(kind, rand(pos0 + T, 1, R + P)) for _ in range(2))
    if kind == "f32":
        ref = cache.copy()
    else:
        ref.parts = [p.copy() for p in cache.parts]
    args = (rand(H, T, R), rand(H, T, P), rand(T, R), rand(T, P))
    got = layers.latent_attention(*args, cache, pos0, 0.1)
    want = layers.latent_attention(*args, ref, pos0, 0.1, fast=False)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_shapes_that_do_not_fit_are_refused():
    kc = fd.Cache(rand(10, 2, 32))
    with pytest.raises(ShapeError, match="do not fit"):
        fd.split_attention(rand(1, 3, 32), kc, kc, 5, 1.0, None)        # 3 heads on 2 KV heads
    with pytest.raises(ShapeError, match="do not fit"):
        fd.split_attention(rand(1, 4, 32), kc, kc, 10, 1.0, None)       # position past the cache
    with pytest.raises(ShapeError, match="scales"):
        q8 = fd.Cache(np.zeros((10, 2, 32), np.int8))
        fd.split_attention(rand(1, 4, 32), q8, q8, 5, 1.0, None)
