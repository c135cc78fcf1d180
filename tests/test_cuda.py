"""Real-GPU checks (CuPy + a CUDA device); skipped otherwise. Run on a GPU box: pytest tests/test_cuda.py.

Placement and device part: the same contracts the sim device is tested for, on cuda:N.
"""

from __future__ import annotations

import numpy as np
import pytest

from moert.devices import cuda as _cuda

pytestmark = pytest.mark.skipif(_cuda.device_count() == 0, reason="needs CuPy and a CUDA device")


@pytest.fixture(scope="module")
def gg(tmp_path_factory):
    from moert import gguf
    from moert.testing import write_qwen3moe

    path = write_qwen3moe(tmp_path_factory.mktemp("cuda") / "m.gguf", n_layer=2, n_embd=256, head_dim=64,
                          n_ff_exp=256, qtype="Q8_0", types={r"attn_(q|k|v)\.": "Q4_K"})
    with gguf.open(path) as g:
        yield g


def test_cuda_devices_put_to_host_and_capacity():
    from moert.devices import CPU, transfer
    from moert.devices.gpus import get_devices
    from moert.errors import DeviceOutOfMemory

    (d, *_) = get_devices("cupy", "64MiB")
    assert d.name == "cuda:0" and d.kind == "cuda" and d.capacity <= 64 << 20
    h = np.arange(1024, dtype=np.float32)
    a = transfer(h, CPU, d)
    assert d.owns(a) and d.stats.h2d_count == 1 and d.stats.h2d_bytes == h.nbytes
    with d:
        b = d.xp.exp(a * 0)
    np.testing.assert_array_equal(transfer(b, d, CPU), np.ones(1024, np.float32))
    assert d.stats.d2h_count == 1
    with pytest.raises(DeviceOutOfMemory, match="cuda:0: out of memory for big"):
        d.empty((65 << 20) // 4, np.float32, what="big")
    used = d.used
    k = d.zeros((256, 2, 64), what="kv")
    assert d.used == used + k.nbytes
    d.free(k)
    assert d.used == used


def test_plan_load_and_dequantize_on_cuda(gg):
    from moert.kvcache import allocate_kv_cache
    from moert.placement import plan
    from moert.placement.memory import estimate
    from moert.weights import load_weights

    p = plan(gg, [r"\.ffn_.*_exps=CPU"], gpu_backend="cupy")
    assert p.gpu_backend == "cupy" and p.device_of("blk.0.attn_q.weight") == "cuda:0"
    dev = p.devices[0]
    est = estimate(p, 128)
    w = load_weights(gg, p, progress=False)
    kv = allocate_kv_cache(p, 128)
    assert dev.used <= est.devices["cuda:0"].total
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_gate_inp.weight", "output.weight"):
        x = w[name].dequantize()
        assert dev.owns(x)
        np.testing.assert_allclose(dev.to_host(x), gg.dequantize(name), rtol=1e-6, atol=1e-6)
    kv.free()
    w.free()
    assert dev.used == 0
