"""Q8_0 with int8 activations per 32 (kernels/q8_0.py, act_quant="int8", llama.cpp's Q8_0 x Q8_0): both row
kernels against the NumPy twin, the drivers (serial, parallel, the q/k/v group) against it, the rounding bound
against the float reference, and the fused MoE layer on Q8_0 experts. Tolerances as in test_kernels_matmul.py."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from test_kernels_matmul import assert_close
from test_quants import random_tensor

from moert.kernels import matmul as mm
from moert.kernels import moe_fused as mf
from moert.kernels import mxfp4 as mx
from moert.kernels import q8_0, simd
from moert.kernels.dequant import F16_TO_F32
from moert.kernels.qtensor import QTensor
from moert.quants import dequantize, quantize

pytestmark = pytest.mark.skipif(not simd.available(), reason="act_quant='int8' needs AVX2")
VARIANTS = ["table", "avx2"]


def weight(rows: int, cols: int, seed: int = 0) -> QTensor:
    """Random Q8_0 bytes: any int8 weight (-128 included), scales 2^-8 .. 2^2."""
    rng = np.random.default_rng(seed)
    raw = random_tensor("Q8_0", (rows, cols), rng)
    d = (2.0 ** rng.uniform(-8, 2, raw.size // 34)).astype(np.float16)
    raw.reshape(-1, 34)[:, :2] = d.view(np.uint8).reshape(-1, 2)
    raw.reshape(-1, 34)[0, 2] = 0x80                                    # -128: |q| is 128 as u8
    return QTensor(raw, "Q8_0", (rows, cols))


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("T", [1, 2, 3, 4, 6])
def test_rows_match_the_twin(T, kind):
    """Rows [3, 20), blocks [1, 10) of 11 (odd: the AVX2 loop's pair and its last block), 1-6 tokens (4, 3, 2, 1
    at a time): the exact dot of the rounded values, nothing written outside the rows asked for."""
    w = weight(23, 352, seed=T)
    x = np.random.default_rng(T).standard_normal((T, 352), dtype=np.float32)
    x8, xd = mx.quantize_q8(x)
    got = np.full((T, 23), np.nan, np.float32)
    want = got.copy()
    getattr(q8_0, f"rows_q8_{kind}")(w.raw, x8, xd, got, 3, 20, 1, 10, F16_TO_F32)
    q8_0.rows_q8_ref(w.raw, x8, xd, want, 3, 20, 1, 10)
    assert np.isnan(got[:, :3]).all() and np.isnan(got[:, 20:]).all()
    xf = (x8.astype(np.float32) * np.repeat(xd, 32, axis=1))[:, 32:320]  # the values the kernels see
    assert_close(got[:, 3:20], want[:, 3:20], xf, QTensor(w.raw[3:20, 34:340], "Q8_0", (17, 288)))


@pytest.mark.parametrize("T", [1, 5])
def test_int8_within_the_rounding_bound(T):
    """matmul.Prepared(act_quant="int8") on Q8_0: each x moves by at most its step / 2 from the float result."""
    w = weight(41, 256, seed=7)
    x = np.random.default_rng(8).standard_normal((T, 256), dtype=np.float32)
    got = mm.Prepared(w, act_quant="int8")(x)
    _, xd = mx.quantize_q8_ref(x)
    W = np.abs(dequantize(w.raw, "Q8_0", w.shape))
    bound = (np.repeat(xd, 32, axis=1) / 2) @ W.T
    assert np.all(np.abs(got - mm.matmul_ref(x, w)) <= bound * 1.001 + 1e-6 * (np.abs(x) @ W.T))
    assert not np.array_equal(got, mm.Prepared(w)(x))                  # it did round x


def test_parallel_and_group_equal_serial():
    """The parallel driver and the one-region q/k/v group kernel give the serial driver's bits, one thread or two."""
    ws = [weight(1000, 1024, seed=s) for s in (1, 2, 3)]               # 1 MB each: the parallel drivers
    assert ws[0].raw.nbytes >= mm._PARALLEL_MIN_BYTES
    x = np.random.default_rng(1).standard_normal((2, 1024), dtype=np.float32)
    p = mm.Prepared(ws[0], "int8")
    serial = np.empty((2, 1000), np.float32)
    p.serial(p.raw, x, serial, 0, 1000, 0, p.nb, p.f16)
    g = mm.PreparedGroup(ws, act_quant="int8")
    assert g.kernel is not None
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        np.testing.assert_array_equal(p(x), serial)
        grouped = g(x)
    finally:
        numba.set_num_threads(before)
    for got, w in zip(grouped, ws):
        alone = mm.Prepared(w, "int8")
        want = np.empty((2, 1000), np.float32)
        alone.serial(alone.raw, x, want, 0, 1000, 0, alone.nb, alone.f16)
        np.testing.assert_array_equal(got, want)
    want = np.empty_like(serial)
    q8_0.rows_q8_ref(ws[0].raw, *mx.quantize_q8_ref(x), want, 0, 1000, 0, 32)
    assert_close(serial, want, x, ws[0])


def test_group_of_mixed_rounding_is_refused():
    """q/k/v where one type rounds x per 256 (Q4_K) and the others per 32: no shared region (None), so each
    weight's own call rounds x its own way."""
    assert mm.group_kernel(("Q8_0", "Q4_K", "Q8_0"), 2) is None
    assert mm.group_kernel(("Q8_0", "Q8_0", "Q8_0"), 2) is not None


@pytest.mark.parametrize("T", [1, 6])
def test_fused_moe_layer_on_q8_0_experts(T):
    """Q8_0 gate/up/down in the int8 mode: x and the hidden units rounded per 32, within a few per cent of the
    float twin (and not equal to it)."""
    E, F, D, K = 4, 96, 64, 2
    rng = np.random.default_rng(T)

    def one(shape):
        return QTensor(quantize(rng.standard_normal(shape, dtype=np.float32) * 0.1, "Q8_0"), "Q8_0", shape)
    gate, up, down = one((E, F, D)), one((E, F, D)), one((E, D, F))
    x = rng.standard_normal((T, D), dtype=np.float32)
    ids = np.stack([rng.choice(E, K, replace=False) for _ in range(T)]).astype(np.int32)
    w = rng.random((T, K), dtype=np.float32)
    want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)
    got = mf.PreparedExperts(gate, up, down, act_quant="int8")(x, ids, w)
    err = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 1e-5 < err < 3e-2, err
