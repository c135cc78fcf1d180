"""kernels/matmul_tiles.py (a float prompt's matmul: W's rows dequantized a tile at a time, then sgemm) against its
twin (the reference dequantizer, then x @ W.T) and against the batch kernels it replaces for big batches
(kernels/matmul.py), to float rounding; and that a prepared weight takes it from MIN_TOKENS tokens on."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_matmul import assert_close, weight

from moert.kernels import matmul as mm
from moert.kernels import matmul_tiles as mt

pytest.importorskip("scipy", reason="Numba's np.dot (the tiles' sgemm) needs SciPy")


@pytest.mark.parametrize("name,rows,cols", [("Q4_K", 37, 512), ("Q6_K", 20, 256), ("Q8_0", 9, 96), ("BF16", 11, 300)])
def test_tiles_are_the_twin_and_the_batch_kernels(name, rows, cols):
    w = weight(name, rows, cols, seed=5)
    x = np.random.default_rng(6).standard_normal((mt.MIN_TOKENS + 3, cols)).astype(np.float32)
    p = mm.Prepared(w)
    assert p.tiled is not None
    p.tiled.rows = 8                                                    # several tiles, the last one short
    got = p(x)                                                          # T >= MIN_TOKENS: the tiles
    assert_close(got, mt.tiled_ref(x, w), x, w)
    p.tiled = None
    assert_close(got, p(x), x, w)                                       # the batch kernels, as before


def test_prepared_takes_the_tiles_for_big_float_batches_only(monkeypatch):
    w = weight("Q4_K", 16, 256)
    calls = []
    real = mt.Tiled.__call__
    monkeypatch.setattr(mt.Tiled, "__call__", lambda self, x, out: calls.append(x.shape[0]) or real(self, x, out))
    p = mm.Prepared(w)
    for T in (1, mt.MIN_TOKENS - 1, mt.MIN_TOKENS):
        p(np.ones((T, 256), np.float32))
    assert calls == [mt.MIN_TOKENS]
    assert mm.Prepared(w, act_quant="int8").tiled is None              # int8 prompts keep their own kernels
    g = mm.PreparedGroup([w, weight("Q6_K", 8, 256), weight("Q8_0", 4, 256)])
    x = np.random.default_rng(1).standard_normal((mt.MIN_TOKENS, 256)).astype(np.float32)
    for got, p in zip(g(x), g.parts):
        assert_close(got, mt.tiled_ref(x, p_w := weight_of(p)), x, p_w)
    assert calls[1:] == [mt.MIN_TOKENS] * 3


def weight_of(p: mm.Prepared):
    """The QTensor a Prepared was made from (its raw rows, type and shape)."""
    from moert.kernels.qtensor import QTensor

    return QTensor(p.raw.reshape(-1), p.type, p.shape)
