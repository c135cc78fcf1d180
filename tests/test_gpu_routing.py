"""MoE routing on a GPU without a host sync: every architecture's router (softmax / sigmoid, top-k, DeepSeek's selection
bias and expert groups, renormalization, scaling) runs on the device, and its ids and weights feed the fused MoE
kernel (kernels/gpu moe reads them in device memory). Checked on the sim device, which counts every read of device
values by the host (SimDevice.host_reads: to_host, int()/float()/bool(), .item(), and what CuPy syncs on: bincount)."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert import moe
from moert.devices.sim import SimDevice
from moert.model_runtime import ModelRuntime
from moert.testing import write_tiny

KW = dict(context_size=32, warmup=False, progress=False, kv=moert.KVConfig("f32", "f32"))
MOE_ARCHS = ["qwen3moe", "qwen2moe", "olmoe", "llama", "gpt-oss", "deepseek2", "deepseek2-lite"]
PROMPT, STEP = [3, 17, 5, 9], [7]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_routing")
    return {a: write_tiny(d / f"{a}.gguf", a, seed=3) for a in [*MOE_ARCHS, "gemma3"]}


@pytest.fixture
def kernels(monkeypatch):
    """The sim GPU reads weights through the GPU kernels' interface (their NumPy twins), as a CUDA GPU does."""
    monkeypatch.setattr(SimDevice, "run_kernels", True)


def _routing(path, monkeypatch, **placement):
    """(ids, weights) of every m.experts call of a prompt and a decode step, as host arrays; the step's logits and
    expert counts."""
    seen = []
    real = ModelRuntime.experts

    def spy(m, il, x, ids, weights, *a, **k):
        host = [w if isinstance(w, np.ndarray) else w.device.to_host(w) for w in (ids, weights)]
        seen.append((il, *host))
        return real(m, il, x, ids, weights, *a, **k)

    with monkeypatch.context() as mp:
        mp.setattr(ModelRuntime, "experts", spy)
        m = moert.load(path, **KW, **placement)
        m.fused_decode = False                       # the CPU's architecture blocks, so m.experts sees each layer
        try:
            m.forward(PROMPT)
            logits = m.forward(STEP)
            return seen, logits, m.stats.last.expert_counts.copy()
        finally:
            m.close()


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_routing_on_the_sim_gpu_equals_the_cpus_ids_and_weights(paths, arch, kernels, monkeypatch):
    cpu, want, counts_cpu = _routing(paths[arch], monkeypatch, gpu_layers=0)
    gpu, got, counts_gpu = _routing(paths[arch], monkeypatch, gpu_backend="sim", gpu_layers="all")
    assert len(cpu) == len(gpu) > 0
    for (il, ids_c, w_c), (jl, ids_g, w_g) in zip(cpu, gpu):
        assert il == jl and ids_g.dtype == np.int32
        np.testing.assert_array_equal(ids_g, ids_c.astype(np.int32), err_msg=f"{arch} layer {il}")
        np.testing.assert_allclose(w_g, w_c, rtol=2e-5, atol=1e-6, err_msg=f"{arch} layer {il}")
    np.testing.assert_array_equal(counts_gpu, counts_cpu)      # counted on the device, read once per step
    assert counts_gpu.sum() > 0
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def _decode_reads(path, **placement) -> tuple[int, int, int]:
    """Host reads of sim:0 during one decode step (after a prompt), its d2h count, and the model's MoE layers."""
    m = moert.load(path, gpu_backend="sim", **KW, **placement)
    try:
        m.forward(PROMPT)
        dev = m.plan.devices[0]
        reads, d2h = dev.host_reads, dev.stats.d2h_count
        m.forward(STEP)
        return dev.host_reads - reads, dev.stats.d2h_count - d2h, sum(
            m.has(f"blk.{i}.ffn_gate_exps.weight") for i in range(m.config.n_layer))
    finally:
        m.close()


@pytest.mark.parametrize("arch", [*MOE_ARCHS, "gemma3"])
def test_an_all_gpu_decode_step_reads_the_device_once(paths, arch, kernels):
    """Before: one read of the ids per MoE layer, plus the logits. Now: the logits, with the step's expert counts
    in the same transfer, after the last launch: nothing inside the step waits for the host."""
    reads, d2h, _ = _decode_reads(paths[arch], gpu_layers="all")
    assert reads == d2h == 1, (arch, reads, d2h)


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "deepseek2"])
def test_cpu_experts_cross_once_each_way_per_layer(paths, arch, kernels):
    """-cmoe: per MoE layer the hidden state, ids and weights go down in one transfer (Model.to_together), the
    experts' output comes up; plus the logits."""
    reads, d2h, n_moe = _decode_reads(paths[arch], gpu_layers="all", cpu_moe=True)
    assert n_moe >= 1
    assert reads == d2h == 1 + n_moe, (arch, reads, n_moe)


def test_without_the_fused_kernel_the_ids_still_come_back_per_layer(paths):
    """The dequantizing sim path (no GPU kernels) groups tokens by expert on the host: a read per MoE layer. The
    count above is the fused kernel's doing, not a counter that never counts."""
    reads, _, n_moe = _decode_reads(paths["qwen3moe"], gpu_layers="all")
    assert n_moe >= 1 and reads == 1 + n_moe


@pytest.mark.parametrize("case", ["softmax_topk", "renorm=False", "topk_softmax", "sigmoid+bias+groups",
                                  "softmax+groups, scale"])
def test_each_routing_function_on_the_device_equals_the_host_without_a_read(case):
    rng = np.random.default_rng(4)
    dev = SimDevice(0, 1 << 26)
    T, E, K = 5, 16, 4
    logits = rng.standard_normal((T, E)).astype(np.float32) * 3
    bias = rng.standard_normal(E).astype(np.float32) * 0.5
    fns = {"softmax_topk": lambda lg, b, xp: moe.softmax_topk(lg, K, xp, fast=False),
           "renorm=False": lambda lg, b, xp: moe.softmax_topk(lg, K, xp, renorm=False, fast=False),
           "topk_softmax": lambda lg, b, xp: moe.topk_softmax(lg, K, xp),
           "sigmoid+bias+groups": lambda lg, b, xp: moe.sigmoid_topk(lg, K, b, xp, True, 2.5, 4, 2),
           "softmax+groups, scale": lambda lg, b, xp: moe.grouped_topk(moe.softmax(lg, xp), K, None, xp, False,
                                                                       1.5, 4, 3)}
    ids_h, w_h = fns[case](logits, bias, np)
    before = dev.host_reads
    ids_d, w_d = fns[case](dev.put(logits), dev.put(bias), dev.xp)
    counts = moe.expert_counts(ids_d, E, dev.xp)
    assert dev.host_reads == before                 # routing and counting stay on the device
    np.testing.assert_array_equal(dev.to_host(ids_d), ids_h)
    np.testing.assert_allclose(dev.to_host(w_d), w_h, rtol=1e-6)
    np.testing.assert_array_equal(dev.to_host(counts), np.bincount(ids_h.reshape(-1), minlength=E))
    if "groups" in case:                            # every pick from the kept groups only
        g = ids_h // (E // 4)
        assert all(len(set(row)) <= (2 if "sigmoid" in case else 3) for row in g)


def test_the_sim_counts_what_cupy_syncs_on():
    dev = SimDevice(0, 1 << 26)
    a = dev.put(np.array([[1, 0, 3]], dtype=np.int32))
    for read in (lambda: int(a[0, 0]), lambda: float(a.sum()), lambda: bool(a[0, 1]), lambda: a.tolist(),
                 lambda: a[0, 2].item(), lambda: dev.xp.bincount(a.reshape(-1)), lambda: dev.xp.nonzero(a),
                 lambda: a[a > 0], lambda: dev.to_host(a), lambda: dev.xp.array_equal(a, a)):
        before = dev.host_reads
        read()
        assert dev.host_reads == before + 1
    before = dev.host_reads
    _ = dev.xp.where(a > 0, a, 0), a.argsort(axis=-1), dev.xp.take_along_axis(a, a.argsort(axis=-1), axis=-1)
    assert dev.host_reads == before


def test_to_together_moves_floats_and_ints_bit_for_bit_in_one_transfer(paths):
    m = moert.load(paths["qwen3moe"], gpu_backend="sim", gpu_layers="all", **KW)
    try:
        dev = m.plan.devices[0]
        x = np.array([[1.5, -0.0, np.float32(1e-45), np.nan], [3.0, np.inf, -2.0, 7.0]], np.float32)   # (T, D)
        ids = np.array([[0, 7], [2**31 - 1, 5]], np.int32)
        w = np.array([[0.25, 0.75], [1.0, 0.0]], np.float32)
        before = dev.stats.d2h_count
        got = m.to_together(tuple(dev.put(a) for a in (x, ids, w)), moert.devices.CPU, "test")
        assert dev.stats.d2h_count == before + 1
        for g, want in zip(got, (x, ids, w)):
            assert g.dtype == want.dtype and g.shape == want.shape and g.flags.c_contiguous
            np.testing.assert_array_equal(g.view(np.uint32), want.view(np.uint32))
    finally:
        m.close()
