"""kernels/moe_tiles.py (a float prompt's experts: their weights dequantized a tile at a time, then sgemm) against
the reference twin (moe_fused_ref) and against moe_fused's row kernels, with the tolerance of
tests/test_kernels_moe_fused.py; experts with few tokens keep the row kernels."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_moe_fused import experts, routing, scale

from moert.kernels import moe_fused as mf
from moert.kernels import moe_tiles as mt

pytest.importorskip("scipy", reason="Numba's np.dot (the tiles' sgemm) needs SciPy")


@pytest.mark.parametrize("types", [("Q4_K", "Q6_K"), ("Q8_0", "Q8_0")])
def test_tiles_are_the_twin_and_the_row_kernels(types):
    E, F, D, K, T = 4, 768, 256, 2, mt.MIN_TOKENS                      # F: two full tiles and a short one
    gate, up, down = experts(*types, E, F, D, seed=3)
    x = np.random.default_rng(3).standard_normal((T, D), dtype=np.float32)
    ids, w = routing(T, E, K, seed=3)
    ids[:, 0] = np.where(ids[:, 0] == 3, 0, ids[:, 0])                 # expert 3: only as second choice ...
    ids[:, 1] = np.where(ids[:, 1] == 3, 1, ids[:, 1])
    ids[ids[:, 0] == ids[:, 1], 1] = 2
    ids[:5, 1] = np.where(ids[:5, 0] == 3, 1, 3)                        # ... of 5 tokens: fewer than FEW
    assert 0 < (ids == 3).sum() < mt.FEW and max((ids == e).sum() for e in range(3)) >= mt.FEW   # both kinds
    p = mf.PreparedExperts(gate, up, down)
    assert p.tiled is not None
    got = p(x, ids, w)
    tol = 1e-4 * scale(x, ids, w, gate, up, down)
    assert np.all(np.abs(got - mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)) <= tol)
    p.tiled = None
    assert np.all(np.abs(got - p(x, ids, w)) <= tol)                   # moe_fused's row kernels, as before


def test_small_batches_and_int8_keep_the_row_kernels(monkeypatch):
    gate, up, down = experts("Q4_K", "Q6_K", 3, 256, 256)
    calls = []
    p = mf.PreparedExperts(gate, up, down)
    real = p.tiled
    p.tiled = lambda *a: calls.append(a[0].shape[0]) or real(*a)
    for T in (1, mt.MIN_TOKENS - 1, mt.MIN_TOKENS):
        x = np.ones((T, 256), np.float32)
        ids, w = routing(T, 3, 2)
        p(x, ids, w)
    assert calls == [mt.MIN_TOKENS]
    assert mf.PreparedExperts(gate, up, down, act_quant="int8").tiled is None
