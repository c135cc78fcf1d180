"""The device part on a GPU: the same contracts on cuda:N (CuPy) as on sim:N, one test body for both
(tests/gpu_backends.py: "sim" always, "cupy" where CuPy sees a CUDA device). On a GPU box:
pytest tests/test_cuda*.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_backends import BACKENDS, GPU


@pytest.fixture(scope="module")
def gg(tmp_path_factory):
    from moert import gguf
    from moert.testing import write_qwen3moe

    path = write_qwen3moe(tmp_path_factory.mktemp("cuda") / "m.gguf", n_layer=2, n_embd=256, head_dim=64,
                          n_ff_exp=256, qtype="Q8_0", types={r"attn_(q|k|v)\.": "Q4_K"})
    with gguf.open(path) as g:
        yield g


@pytest.mark.parametrize("backend", BACKENDS)
def test_devices_put_to_host_and_capacity(backend):
    from moert.devices import CPU, transfer
    from moert.devices.gpus import get_devices
    from moert.errors import DeviceOutOfMemory

    (d, *_) = get_devices(backend, "64MiB")
    assert d.name == GPU[backend] and d.kind == GPU[backend][:-2] and d.capacity <= 64 << 20
    h = np.arange(1024, dtype=np.float32)
    a = transfer(h, CPU, d)
    assert d.owns(a) and d.stats.h2d_count == 1 and d.stats.h2d_bytes == h.nbytes
    with d:
        b = d.xp.exp(a * 0)
    np.testing.assert_array_equal(transfer(b, d, CPU), np.ones(1024, np.float32))
    assert d.stats.d2h_count == 1
    with pytest.raises(DeviceOutOfMemory, match=f"{d.name}: out of memory for big"):
        d.empty((65 << 20) // 4, np.float32, what="big")
    used = d.used
    k = d.zeros((256, 2, 64), what="kv")
    assert d.used == used + k.nbytes
    d.free(k)
    assert d.used == used


@pytest.mark.parametrize("backend", BACKENDS)
def test_plan_load_and_dequantize_on_the_gpu(gg, backend):
    from moert.kvcache import allocate_kv_cache
    from moert.placement import plan
    from moert.placement.memory import estimate
    from moert.weights import load_weights

    p = plan(gg, [r"\.ffn_.*_exps=CPU"], gpu_backend=backend)
    assert p.gpu_backend == backend and p.device_of("blk.0.attn_q.weight") == GPU[backend]
    dev = p.devices[0]
    est = estimate(p, 128)
    w = load_weights(gg, p, progress=False)
    kv = allocate_kv_cache(p, 128)
    assert dev.used <= est.devices[GPU[backend]].total
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_gate_inp.weight", "output.weight"):
        x = w[name].dequantize()
        assert dev.owns(x)
        np.testing.assert_allclose(dev.to_host(x), gg.dequantize(name), rtol=1e-6, atol=1e-6)
    del x                                       # the sim counts a live temporary against its capacity, as a pool would
    kv.free()
    w.free()
    assert dev.used == 0
