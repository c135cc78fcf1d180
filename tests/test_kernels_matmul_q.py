"""Quantized-activation one-token kernels (kernels/matmul_q.py) against their NumPy twins and the float path.

Twin: both see the same int16 x (quantize_x equals its NumPy twin exactly, checked); the kernel sums each
sub-block exactly in int32 and then in float32 (~16 sub-block terms per block), the twin in float64, so
|kernel - twin| <= 1e-5 * sum|w x| (as tests/test_kernels_matmul.py).
Float path: x_j is replaced by xq_j * step_b with |x_j - xq_j step_b| <= step_b / 2 (rint) plus the
rounding of x * (1/step) (<= |x/step| 2^-23 <= 32767 * 1.2e-7 = 0.004 steps), so
|y_q - y_float| <= sum_j |w_j| * 0.505 step_b(j), plus float rounding (1e-5 * sum|w x|).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_matmul import weight

from moert.kernels import matmul as mm
from moert.kernels import matmul_q as mq
from moert.quants import dequantize


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows,cols", [(37, 768), (5, 256), (130, 1280)])
def test_kernel_matches_twin_and_float_bound(name, rows, cols):
    w = weight(name, rows, cols, seed=rows)
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal(cols) * rng.uniform(0.01, 10, cols)).astype(np.float32)
    x[:256] *= 100                                                      # blocks of different steps
    got = mq.matvec_q(x, w)
    W = dequantize(w.raw, w.type, w.shape).astype(np.float64)           # (R, C)
    mag = np.abs(W) @ np.abs(x.astype(np.float64))                      # (R,) sum |w x|
    assert np.all(np.abs(got - mq.matvec_q_ref(x, w)) <= 1e-5 * mag)
    _, xd, _ = mq.quantize_x_ref(x, 32767)
    bound = np.abs(W) @ np.repeat(xd.astype(np.float64), 256) * 0.505 + 1e-5 * mag
    err = np.abs(got - mm.matvec_ref(x, w))
    assert np.all(err <= bound), f"max err / bound {np.max(err / bound):.3g}"
    assert np.max(err / mag) < 1e-4                                     # and the bound is small: ~1/32767


def test_quantize_x_matches_twin():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1024).astype(np.float32)
    x[256:512] = 0                                                      # an all-zero block: step 0
    for a, b in zip(mq.quantize_x(x, 32767), mq.quantize_x_ref(x, 32767)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    xq, xd, xb = mq.quantize_x(x, 32767)
    assert np.abs(xq).max() == 32767 and xd[1] == 0 and np.all(xq[256:512] == 0)
    step = np.repeat(xd.astype(np.float64), 256)
    assert np.all(np.abs(xq * step - x) <= 0.505 * step)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_prepared_opt_in(name):
    """Prepared(act_quant="int16"): T = 1 takes the quantized kernels (serial and parallel), T > 1 the float ones."""
    w = weight(name, 300, 512)
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    p, f = mm.Prepared(w, act_quant="int16"), mm.Prepared(w)
    np.testing.assert_array_equal(p(x), f(x))                           # batch: the float path, same code
    q1 = mq.matvec_q(x[0], w)
    np.testing.assert_array_equal(p(x[:1])[0], q1)
    y = np.empty((1, 300), np.float32)
    p.parallel(p.raw, x[:1], y, p.nb, p.f16, 7)
    np.testing.assert_array_equal(y[0], q1)                             # same sums per row, any split
    with pytest.raises(ValueError, match="act_quant"):
        mm.Prepared(w, act_quant="int4")


def test_model_int16_decode_close_to_float(tmp_path):
    """moert.load(act_quant="int16") on a synthetic Q4_K/Q6_K qwen3moe: decode (T = 1, the quantized
    kernels) stays close to the float path. Each matvec moves by <= 0.505 step * sum|w| per block, i.e.
    ~1.5e-5 of max|x| sum|w|; two layers of attention, norms and experts amplify that by a small factor,
    so we ask |dlogit| <= 1e-3 * max|logit| (70x margin), and that the paths differ (it really ran)."""
    from moert import load
    from moert.testing import write_qwen3moe

    p = write_qwen3moe(tmp_path / "q.gguf", n_embd=256, head_dim=64, n_ff_exp=256, qtype="Q4_K",
                       types={r"ffn_down": "Q6_K", r"output\.": "Q6_K"}, seed=3)
    tokens = [5, 17, 99, 3, 250, 42]
    ys = []
    for aq in (None, "int16"):
        m = load(p, gpu_layers=0, progress=False, warmup=False, act_quant=aq)
        ys.append(np.concatenate([m.forward([t]) for t in tokens]))     # (6, n_vocab), one token a call
    diff = np.abs(ys[1] - ys[0])
    assert 0 < diff.max() <= 1e-3 * np.abs(ys[0]).max(), diff.max() / np.abs(ys[0]).max()
    pre = load(p, gpu_layers=0, progress=False, warmup=False, act_quant="int16").forward(tokens)
    np.testing.assert_allclose(pre[0], ys[0][0], rtol=0, atol=1e-4 * np.abs(ys[0]).max())  # batches: float


def test_fused_moe_int16():
    """PreparedExperts(act_quant="int16"): one token through the quantized gate/up/down, close to the twin.
    gate/up each move by <= ~1.5e-5 of the scale of their partial sums, h = silu(g) u by about twice
    that, down adds its own 1.5e-5: ~5e-5 of test_kernels_moe_fused's output scale; we allow 1e-3.
    Batches (T = 3) run the float kernels: equal to the default path bit for bit."""
    from test_kernels_moe_fused import experts, routing, scale

    from moert.kernels import moe_fused as mf
    gate, up, down = experts("Q4_K", "Q6_K", 5, 512, 256, seed=4)
    for T in (1, 3):
        x = np.random.default_rng(T).standard_normal((T, 256), dtype=np.float32)
        ids, w = routing(T, 5, 3, seed=T)
        got = mf.PreparedExperts(gate, up, down, act_quant="int16")(x, ids, w)
        if T == 1:
            want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)
            err = np.abs(got - want)
            assert 0 < err.max() and np.all(err <= 1e-3 * scale(x, ids, w, gate, up, down))
        else:
            np.testing.assert_array_equal(got, mf.PreparedExperts(gate, up, down)(x, ids, w))
