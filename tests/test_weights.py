"""The weight store: raw bytes on their devices, zero-copy on the cpu, cancel and out-of-memory cleanly."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert.devices import CPU
from moert.devices.sim import SimArray
from moert.errors import DeviceOutOfMemory, PlacementError
from moert.placement import plan
from moert.weights import LoadCancelled, Weight, load_weights


@pytest.fixture(scope="module")
def gg(tmp_path_factory):
    from moert import gguf
    from moert.testing import write_qwen3moe

    d = tmp_path_factory.mktemp("weights")
    # Q8_0 rows of 64; attention in Q4_K (rows of 256) so that two block layouts are exercised
    path = write_qwen3moe(d / "m.gguf", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=8,
                          n_ff_exp=256, qtype="Q8_0", types={r"attn_(q|k|v)\.": "Q4_K"})
    with gguf.open(path) as g:
        yield g


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    from moert import gguf
    from moert.testing import write_qwen3moe

    path = write_qwen3moe(tmp_path_factory.mktemp("tied") / "t.gguf", n_layer=1, tied_output=True)
    with gguf.open(path) as g:
        yield g


def test_cpu_weights_are_zero_copy_views_of_the_file(gg):
    p = plan(gg, gpu_layers=0)
    w = load_weights(gg, p, progress=False)
    assert set(w) == set(gg.tensors) and moert.load_weights is load_weights
    for name, t in gg.tensors.items():
        x = w[name]
        assert isinstance(x, Weight) and x.device is CPU and (x.type, x.shape) == (t.type, t.shape)
        assert np.shares_memory(x.data, gg.raw(name)), name  # no copy
        if t.type == "F32":
            assert x.data.dtype == np.float32 and x.data.shape == t.shape
        else:
            assert x.data.dtype == np.uint8 and x.data.shape[:-1] == t.shape[:-1] and x.nbytes == t.nbytes
    assert w.bytes_by_device() == p.bytes_by_device() and CPU.stats.h2d_count == 0


def test_dequantize_on_cpu_and_sim_agree_with_the_file(gg):
    p = plan(gg, [r"\.ffn_(up|down)_exps=CPU"], gpu_backend="sim")
    w = load_weights(gg, p, progress=False)
    dev = p.devices[0]
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight",
                 "blk.0.ffn_up_exps.weight", "output.weight", "blk.0.attn_norm.weight"):
        x, ref = w[name], gg.dequantize(name)
        full = x.dequantize()
        if x.device is dev:
            assert isinstance(full, SimArray) and full.device is dev and full.dtype == np.float32
            full = dev.to_host(full)
        np.testing.assert_array_equal(full, ref)
        if len(x.shape) == 3:
            for e in (0, x.shape[0] - 1):
                one = x.dequantize_expert(e)
                np.testing.assert_array_equal(dev.to_host(one) if x.device is dev else one, ref[e])
        if len(x.shape) == 2:
            rows = x.dequantize_rows(1, 3)
            np.testing.assert_array_equal(dev.to_host(rows) if x.device is dev else rows, ref[1:3])
    with pytest.raises(IndexError, match="no expert 8"):
        w["blk.0.ffn_up_exps.weight"].raw_expert(8)


def test_sim_weights_are_uploaded_counted_and_accounted(gg):
    p = plan(gg, [r"\.ffn_.*_exps=CPU"], gpu_backend="sim")
    dev = p.devices[0]
    w = load_weights(gg, p, progress=False)
    on_gpu = [e for e in p if e.device == "sim:0"]
    assert dev.used == sum(e.nbytes for e in on_gpu) == p.bytes_by_device()["sim:0"]
    assert dev.stats.h2d_count == len(on_gpu) and dev.stats.h2d_bytes == dev.used
    assert sorted(a for a, _ in dev.allocations()) == sorted(e.name for e in on_gpu)
    q = w["blk.0.attn_q.weight"]
    assert isinstance(q.data, SimArray) and q.data.device is dev and "sim:0" in repr(q)
    w.free()
    assert dev.used == 0 and len(w) == 0


def test_tied_output_is_loaded_from_token_embd(tied):
    p = plan(tied, gpu_backend="sim")
    w = load_weights(tied, p, progress=False)
    out = w["output.weight"]
    assert out.tied_to == "token_embd.weight" and out.device.name == "sim:0"
    np.testing.assert_array_equal(p.devices[0].to_host(out.dequantize()), tied.dequantize("token_embd.weight"))
    assert w["token_embd.weight"].device is CPU


def test_progress_reports_and_cancels_cleanly(gg):
    p = plan(gg, gpu_backend="sim")
    seen = []
    load_weights(gg, p, progress=lambda f: seen.append(f) or True)
    assert seen == sorted(seen) and seen[-1] == 1.0 and len(seen) == len(p)

    calls = []

    def stop_after_three(f):
        calls.append(f)
        return len(calls) < 3

    with pytest.raises(LoadCancelled, match="cancelled by the progress callback after 3 of"):
        load_weights(gg, p, progress=stop_after_three)
    assert p.devices[0].used == 0 and len(calls) == 3
    load_weights(gg, p)  # the default tqdm bar


def test_out_of_memory_during_load_frees_and_suggests_a_fit(gg):
    from moert.placement.memory import estimate

    full = plan(gg, gpu_backend="sim").bytes_by_device()["sim:0"]
    cap = estimate(plan(gg, gpu_backend="sim", cpu_moe=True), 64).devices["sim:0"].total  # fits, experts on cpu
    assert cap < full
    p = plan(gg, gpu_backend="sim", gpu_memory=cap)
    with pytest.raises(DeviceOutOfMemory) as e:
        load_weights(gg, p, progress=False)
    err = e.value
    msg = str(err)
    assert err.device == "sim:0" and err.capacity == cap and err.requested > 0
    assert err.what.startswith("tensor blk.") and str(err.requested) not in ("0",)
    assert f"{err.requested:,} bytes" in msg
    assert p.devices[0].used == 0  # everything placed before the failure was freed
    with pytest.raises(DeviceOutOfMemory) as e:                     # moert.load adds what fit finds
        moert.load(gg.path, gpu_backend="sim", gpu_memory=cap, context_size=64, warmup=False, progress=False)
    msg = str(e.value)
    assert e.value.what.startswith("tensor blk.") and f"{e.value.requested:,} bytes" in msg
    assert "A plan that fits (context 64): -ot " in msg and "exps=CPU" in msg and "-ngl 3" in msg


def test_plan_must_match_the_file(gg, tied):
    with pytest.raises(PlacementError, match="does not match"):
        load_weights(gg, plan(tied, gpu_layers=0), progress=False)


def test_load_from_a_path(gg):
    w = load_weights(gg.path, plan(gg, gpu_layers=0), progress=False)
    assert w.gguf is not gg and w["blk.0.attn_q.weight"].data.shape[0] == 256
