"""Quantized-activation one-token kernels (kernels/matmul_q.py, kernels/simd.py) against their NumPy twins
and the float path, in both modes: int16 (qmax 32767, portable Numba) and int8 (qmax 127, AVX2 vpmaddubsw).

Twin: both see the same quantized x (quantize_x equals its NumPy twin exactly, checked); the kernel sums each
sub-block exactly in int32 and then in float32 (~16 sub-block terms per block), the twin in float64, so
|kernel - twin| <= 1e-5 * sum|w x| (as tests/test_kernels_matmul.py).
Float path: x_j is replaced by xq_j * step_b with |x_j - xq_j step_b| <= step_b / 2 (rint) plus the
rounding of x * (1/step) (<= |x/step| 2^-23 <= 32767 * 1.2e-7 = 0.004 steps), so
|y_q - y_float| <= sum_j |w_j| * 0.505 step_b(j), plus float rounding (1e-5 * sum|w x|). step = max|x| / qmax
per block, so the bound is ~1/qmax of sum|w| max|x|: int16 stays within 1e-4 of sum|w x| here, int8 within
2e-2 (llama.cpp's Q8_K precision).

The int8 mode needs AVX2: on a CPU without it the int8 cases cannot compile, so they are skipped there, and
test_int8_refused_without_avx2 checks the error a user gets instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_matmul import weight

from moert.kernels import matmul as mm
from moert.kernels import matmul_q as mq
from moert.kernels import simd
from moert.quants import dequantize

MODES = [("int16", 32767, 1e-4),
         pytest.param("int8", 127, 2e-2, marks=pytest.mark.skipif(not simd.available(), reason="no AVX2"))]


@pytest.mark.parametrize("mode,qmax,tol", MODES)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows,cols", [(37, 768), (5, 256), (130, 1280)])
def test_kernel_matches_twin_and_float_bound(name, rows, cols, mode, qmax, tol):
    w = weight(name, rows, cols, seed=rows)
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal(cols) * rng.uniform(0.01, 10, cols)).astype(np.float32)
    x[:256] *= 100                                                      # blocks of different steps
    got = mm.matvec_q(x, w, mode)
    W = dequantize(w.raw, w.type, w.shape).astype(np.float64)           # (R, C)
    mag = np.abs(W) @ np.abs(x.astype(np.float64))                      # (R,) sum |w x|
    assert np.all(np.abs(got - mm.matvec_q_ref(x, w, mode)) <= 1e-5 * mag)
    _, _, xd, _ = mq.quantize_x_ref(x, qmax)
    bound = np.abs(W) @ np.repeat(xd.astype(np.float64), 256) * 0.505 + 1e-5 * mag
    err = np.abs(got - mm.matvec_ref(x, w))
    assert np.all(err <= bound), f"max err / bound {np.max(err / bound):.3g}"
    assert np.max(err / mag) < tol                                      # and the bound is small: ~1/qmax
    if mode == "int8":                  # batches: up to 7 tokens in one simd call, else 4 a call, then 1-3
        X = np.stack([x, -0.5 * x, np.roll(x, 3), x * 1e-3, x, np.roll(x, -7), 2 * x, -x, np.roll(x, 1)])
        for T in (2, 3, 4, 5, 6, 7, 9):
            got = mm.matvec_q(X[:T], w, mode)
            for t in range(T):                                          # the same int32 sums; float order
                one = mm.matvec_q(X[t], w, mode)                        # may differ (fastmath)
                assert np.all(np.abs(got[t] - one) <= 1e-6 * (np.abs(W) @ np.abs(X[t].astype(np.float64))))


@pytest.mark.parametrize("mode,qmax,tol", MODES)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_extreme_weights_and_x(name, mode, qmax, tol):
    """The int8 sums' worst case: every Q4_K scale 63 and nibble 15, Q6_K scales +-127 and q at 0 and 63,
    x at +-qmax; exact int32 sums cannot overflow (simd.py's bound), so the kernel equals the twin."""
    rng = np.random.default_rng(5)
    w = weight(name, 8, 512, seed=1)
    raw = np.array(w.raw, copy=True).reshape(8, -1)
    if name == "Q4_K":                                                  # (d, dmin) f16, 12 scale bytes, 128 qs
        for b in range(2):
            raw[:, 144 * b + 4:144 * b + 16] = 0xFF                     # every 6-bit sc and m = 63
            raw[:4, 144 * b + 16:144 * b + 144] = 0xFF                  # nibbles 15
    else:                                                               # ql 128, qh 64, scales 16 (int8), d
        for b in range(2):
            raw[:4, 210 * b:210 * b + 192] = 0xFF                       # q = 63
            raw[4:, 210 * b:210 * b + 192] = 0                          # q = 0 -> -32
            raw[:, 210 * b + 192:210 * b + 208] = rng.choice([0x7F, 0x81], (8, 16))  # +127, -127
    w = type(w)(raw, w.type, w.shape)
    x = np.where(rng.random(512) < 0.5, -1.0, 1.0).astype(np.float32) * 3
    got = mm.matvec_q(x, w, mode)
    ref = mm.matvec_q_ref(x, w, mode)
    W = dequantize(w.raw, w.type, w.shape).astype(np.float64)
    assert np.all(np.abs(got - ref) <= 1e-5 * (np.abs(W) @ np.abs(x)))
    xq = mq.quantize_x_ref(x, qmax)[0]
    assert np.abs(xq).min() == qmax                                     # x really at the extremes


@pytest.mark.parametrize("qmax", [32767, 127])
def test_quantize_x_matches_twin(qmax):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1024).astype(np.float32)
    x[256:512] = 0                                                      # an all-zero block: step 0
    for a, b in zip(mq.quantize_x(x, qmax), mq.quantize_x_ref(x, qmax)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    xq, x8, xd, xb = mq.quantize_x(x, qmax)
    assert np.abs(xq).max() == qmax and xd[1] == 0 and np.all(xq[256:512] == 0)
    assert np.array_equal(x8, xq.astype(np.int8)) if qmax == 127 else x8.size == 0
    step = np.repeat(xd.astype(np.float64), 256)
    assert np.all(np.abs(xq * step - x) <= 0.505 * step)
    assert np.array_equal(xb, xq.reshape(-1, 32).sum(axis=1))


def test_int8_refused_without_avx2(monkeypatch):
    """On a CPU without AVX2, asking for int8 is a clear error at load, before any weight is read."""
    from moert import load
    from moert.errors import KernelOptionError
    monkeypatch.setattr(simd, "available", lambda: False)
    with pytest.raises(KernelOptionError, match="AVX2"):
        mq.mode("int8")
    with pytest.raises(KernelOptionError, match="AVX2"):
        load("/nonexistent.gguf", act_quant="int8")
    assert mq.mode("int16") == 1 and mq.mode(None) == 0


@pytest.mark.parametrize("mode,qmax,tol", MODES)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_prepared_opt_in(name, mode, qmax, tol):
    """Prepared(act_quant=mode): T = 1 takes the quantized kernels (serial and parallel), T > 1 the float ones."""
    w = weight(name, 300, 512)
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    p, f = mm.Prepared(w, act_quant=mode), mm.Prepared(w)
    mag = np.abs(dequantize(w.raw, w.type, w.shape)) @ np.abs(x.T)      # (R, T)
    if mode == "int16":                 # batch: the float row kernels, compiled into another driver, so
        assert np.all(np.abs(p(x) - f(x)).T <= 1e-5 * mag)              # LLVM may order float sums differently
        assert np.any(p(x[:1]) != f(x[:1]))                             # while one token is quantized
        with pytest.raises(ValueError, match="one-token"):
            mm.matvec_q(x, w, mode)
    else:                                                               # int8: batches quantized too
        assert np.all(np.abs(p(x) - mm.matvec_q_ref(x, w, mode)).T <= 1e-5 * mag)
        assert np.all(np.abs(p(x) - f(x)).T <= tol * mag)
    q1 = mm.matvec_q(x[0], w, mode)
    # the same exact int32 sums per row; LLVM may order the float sums differently in each caller (fastmath)
    assert np.all(np.abs(p(x[:1])[0] - q1) <= 1e-5 * mag[:, 0])
    y = np.empty((1, 300), np.float32)
    p.parallel(p.raw, x[:1], y, p.nb, p.f16, 7)
    assert np.all(np.abs(y[0] - q1) <= 1e-5 * mag[:, 0])                # any split of the rows
    with pytest.raises(ValueError, match="act_quant"):
        mm.Prepared(w, act_quant="int4")


@pytest.mark.parametrize("mode,qmax,tol", MODES)
def test_model_decode_close_to_float(tmp_path, mode, qmax, tol):
    """moert.load(act_quant=mode) on a synthetic Q4_K/Q6_K qwen3moe: decode (T = 1, the quantized
    kernels) stays close to the float path. Each matvec moves by <= 0.505 step * sum|w| per block, i.e.
    ~0.5/qmax of max|x| sum|w| (1.5e-5 at int16, 4e-3 at int8); two layers of attention, norms and experts
    amplify that by a small factor, so we ask |dlogit| <= 70 * 0.5/qmax * max|logit| (1e-3 at int16,
    0.28 at int8), and that the paths differ (it really ran). A batched prefill is the float path at int16
    (rounding apart) and within the same bound at int8."""
    from moert import load
    from moert.testing import write_qwen3moe

    p = write_qwen3moe(tmp_path / "q.gguf", n_embd=256, head_dim=64, n_ff_exp=256, qtype="Q4_K",
                       types={r"ffn_down": "Q6_K", r"output\.": "Q6_K"}, seed=3)
    tokens = [5, 17, 99, 3, 250, 42]
    ys = []
    for aq in (None, mode):
        m = load(p, gpu_layers=0, progress=False, warmup=False, act_quant=aq)
        ys.append(np.concatenate([m.forward([t]) for t in tokens]))     # (6, n_vocab), one token a call
    diff = np.abs(ys[1] - ys[0])
    assert 0 < diff.max() <= 35 / qmax * np.abs(ys[0]).max(), diff.max() / np.abs(ys[0]).max()
    assert np.argmax(ys[1][-1]) == np.argmax(ys[0][-1])
    pre = load(p, gpu_layers=0, progress=False, warmup=False, act_quant=mode).forward(tokens)
    atol = (1e-4 if mode == "int16" else 35 / qmax) * np.abs(ys[0]).max()   # int16 batches: float kernels
    np.testing.assert_allclose(pre, ys[0], rtol=0, atol=atol)


@pytest.mark.parametrize("mode,qmax,tol", MODES)
def test_fused_moe_quantized(mode, qmax, tol):
    """PreparedExperts(act_quant=mode): one token through the quantized gate/up/down, close to the twin.
    gate/up each move by <= ~0.5/qmax of the scale of their partial sums, h = silu(g) u by about twice
    that, down adds its own: ~1.5/qmax of test_kernels_moe_fused's output scale (5e-5 at int16, 1.2e-2 at
    int8); we allow 20x that. Batches (T = 3): int16 runs the float kernels, equal to the default path bit
    for bit; int8 quantizes them too, within the same bound."""
    from test_kernels_moe_fused import experts, routing, scale

    from moert.kernels import moe_fused as mf
    gate, up, down = experts("Q4_K", "Q6_K", 5, 512, 256, seed=4)
    for T in (1, 3):
        x = np.random.default_rng(T).standard_normal((T, 256), dtype=np.float32)
        ids, w = routing(T, 5, 3, seed=T)
        got = mf.PreparedExperts(gate, up, down, act_quant=mode)(x, ids, w)
        if T == 1 or mode == "int8":
            want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)
            err = np.abs(got - want)
            assert 0 < err.max() and np.all(err <= 30 / qmax * scale(x, ids, w, gate, up, down))
        else:                           # int16 batch: the float kernels (float sums may be ordered differently)
            err = np.abs(got - mf.PreparedExperts(gate, up, down)(x, ids, w))
            assert np.all(err <= 1e-5 * scale(x, ids, w, gate, up, down))
