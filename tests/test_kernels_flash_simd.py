"""kernels/flash_simd.py (flash_decode's register-blocked score and P.V tiles) against NumPy's products, at both
lane widths (16: AVX-512F, 8: AVX2; LLVM splits the wider vectors where the CPU lacks them), every tile shape
the kernel uses; and flash_decode's plain loops (head dims that are not whole vectors) against its twin."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from moert.kernels import flash_decode as fd
from moert.kernels import flash_simd as fs

rng = np.random.default_rng(31)


def rand(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def rows(src: str, x: np.ndarray, kh: int):
    """x (n, D) as the tiles read it: a float32 tile, or KV head kh of a 3-KV-head cache (n, 3, D) stored as src
    (f32, f16 or bf16 bits), with the values it holds as float64."""
    if src == "tile":
        return x, False, x.astype(np.float64)
    c = rand(x.shape[0], 3, x.shape[1])
    c[:, kh] = x
    if src == "f16":
        c = c.astype(np.float16)
        return c.view(np.uint16), False, c[:, kh].astype(np.float64)
    if src == "bf16":
        b = (c.view(np.uint32) >> 16).astype(np.uint16)                  # truncated: the bits kept
        return b, True, (b[:, kh].astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return c, False, x.astype(np.float64)


def _runner(tile):
    @njit
    def run(*args):
        tile(*args)
    return run


SRCS = ["tile", "f32", "f16", "bf16"]


@pytest.mark.parametrize("W,HB,KB,src", [(W, HB, KB, "tile") for W in (8, 16)
                                         for HB, KB in ((1, 1), (1, 4), (2, 4), (4, 1), (4, 4))
                                         if HB * KB <= W]               # one lane an accumulator at the end
                         + [(W, HB, 4, src) for W, HB in ((8, 2), (16, 4)) for src in SRCS[1:]])
def test_score_tile_is_q_dot_k(W, HB, KB, src):
    """sc[g0 + h, c0 + k] = qs[g0 + h] . kt[r0 + k] for the tile's heads and keys, nothing else written."""
    G, Dh, g0, r0, c0, kh = 6, 3 * W, 1, 5, 2, 2
    qs = rand(G, Dh)
    kt, bf16, k64 = rows(src, rand(16, Dh), kh)
    sc = np.full((G, 16), 7.0, np.float32)
    _runner(fs.qk_tile(HB, KB, W))(qs, g0, kt, r0, kh, bf16, sc, c0)
    want = np.full((G, 16), 7.0, np.float32)
    want[g0:g0 + HB, c0:c0 + KB] = qs[g0:g0 + HB].astype(np.float64) @ k64[r0:r0 + KB].T
    np.testing.assert_allclose(sc, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("W,HB,DB,src", [(W, HB, DB, "tile") for W in (8, 16)
                                         for HB, DB in ((1, 1), (1, 4), (2, 4), (4, 1), (4, 4))]
                         + [(W, HB, 4, src) for W, HB in ((8, 2), (16, 4)) for src in SRCS[1:]])
def test_value_tile_adds_p_times_v(W, HB, DB, src):
    """acc[a0 + h, d0:d0 + DB W] += sc[g0 + h, c0:c0 + n] @ vt[r0:r0 + n, d0:d0 + DB W]; the rest untouched."""
    G, Dv, g0, c0, r0, n, a0, d0, kh = 5, 6 * W, 1, 3, 2, 11, 4, W, 1
    sc, acc = rand(G, 16), rand(12, Dv)
    vt, bf16, v64 = rows(src, rand(16, Dv), kh)
    want = acc.astype(np.float64)
    want[a0:a0 + HB, d0:d0 + DB * W] += sc[g0:g0 + HB, c0:c0 + n].astype(np.float64) @ v64[r0:r0 + n, d0:d0 + DB * W]
    _runner(fs.pv_tile(HB, DB, W))(sc, g0, c0, vt, r0, kh, bf16, n, acc, a0, d0)
    np.testing.assert_allclose(acc, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("G,Dh,Dv,nj", [(8, 128, 128, 64), (3, 64, 32, 7), (5, 96, 64, 61), (1, 32, 512, 2)])
def test_the_tile_loops_cover_any_heads_and_keys(G, Dh, Dv, nj):
    """scores / weighted_values over G heads and nj keys from row j0: the remainders take the small tiles."""
    @njit
    def run(qs, kt, j0, nj, sc, vt, acc, a0, Dv):
        fs.scores(qs, kt, j0, 0, False, nj, sc)
        fs.weighted_values(sc, vt, j0, 0, False, nj, acc, a0, Dv)
    j0, a0 = 64 - nj, 2
    qs, kt, vt = rand(G, Dh), rand(64, Dh), rand(64, Dv + 16)
    sc, acc = np.zeros((G, 64), np.float32), rand(G + 4, Dv + 16)
    want_sc = qs.astype(np.float64) @ kt[j0:].T.astype(np.float64)
    want = acc.astype(np.float64)
    want[a0:a0 + G, :Dv] += want_sc @ vt[j0:, :Dv].astype(np.float64)
    run(qs, kt, j0, nj, sc, vt, acc, a0, Dv)
    np.testing.assert_allclose(sc[:, :nj], want_sc, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(acc, want, rtol=1e-4, atol=2e-3)


@pytest.mark.parametrize("Dh,dv", [(20, 20), (40, 12)])
def test_dims_that_are_not_whole_vectors_take_the_plain_loops(Dh, dv):
    """Head dims off the vector width (20, 40 with dv 12): the kernel's plain loops, equal to the twin."""
    H, Hk, T, pos0 = 6, 2, 2, 150
    k, v = fd.Cache(rand(pos0 + T, Hk, Dh)), fd.Cache(rand(pos0 + T, Hk, Dh))
    q = rand(T, H, Dh)
    got = fd.split_attention(q, k, v, pos0, 0.3, None, dv=dv)
    want = fd.split_attention_ref(q, k, v, pos0, 0.3, None, dv=dv)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
