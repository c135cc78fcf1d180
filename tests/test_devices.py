"""Devices: sizes, the sim GPU's rules (one device per array, explicit counted transfers, capacity)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from moert.devices import (
    CPU,
    DeviceMismatchError,
    TransferStats,
    format_size,
    parse_size,
    parse_sizes,
    transfer,
)
from moert.devices.gpus import get_devices
from moert.devices.sim import SimArray
from moert.errors import DeviceOutOfMemory, PlacementError

MiB = 1 << 20


@pytest.fixture
def sims():
    return get_devices("sim", ["1MiB", "2MiB"])


def test_parse_size():
    assert parse_size("6GiB") == 6 << 30
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5G") == 3 << 29
    assert parse_size("6GB") == 6 * 10**9
    assert parse_size(" 24 gib ") == 24 << 30
    assert parse_size(123) == 123
    assert parse_size("4096") == 4096
    assert parse_sizes("24GiB,8GiB") == [24 << 30, 8 << 30]
    assert parse_sizes(["1MiB", 5]) == [MiB, 5]
    assert parse_sizes(None) == []
    for bad in ("6 parsecs", "", "-1GiB", "GiB", True):
        with pytest.raises(PlacementError, match="size"):
            parse_size(bad)
    assert format_size(3 << 29) == "1.50 GiB" and format_size(12) == "12 B"


def test_get_devices_sim_and_backends():
    (d,) = get_devices("sim")
    assert (d.name, d.kind, d.index, d.capacity, d.used) == ("sim:0", "sim", 0, 24 << 30, 0)
    two = get_devices("sim", "1MiB,2MiB")
    assert [g.name for g in two] == ["sim:0", "sim:1"] and [g.capacity for g in two] == [MiB, 2 * MiB]
    assert get_devices("none") == []
    with pytest.raises(PlacementError, match="auto, cupy, sim"):
        get_devices("vulkan")
    assert CPU.name == "cpu" and CPU.kind == "cpu" and CPU.capacity is None and CPU.xp is np


def test_cupy_backend_without_cupy_is_an_error():
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed")
    except ImportError:
        pass
    with pytest.raises(PlacementError, match="CuPy is not installed.*gpu_backend='sim'"):
        get_devices("cupy")
    assert get_devices("auto") == []


def test_sim_ops_keep_the_tag(sims):
    d, _ = sims
    xp = d.xp
    x = d.put(np.arange(12, dtype=np.float32).reshape(3, 4), what="x")
    w = d.zeros((4, 2), what="w")
    y = xp.exp(x @ w + 1.0)                                         # ufuncs, operators
    assert isinstance(y, SimArray) and y.device is d and y.shape == (3, 2)
    assert xp.einsum("ij,jk->ik", x, w).device is d                 # __array_function__
    assert xp.concatenate([x, x]).shape == (6, 4)
    assert xp.zeros(3).device is d and xp.arange(4).device is d     # creation makes device arrays
    assert x.sum().device is d and float(x.sum()) == 66.0           # reductions: 0-d device arrays
    assert int(x.argmax()) == 11 and x.T.device is d and x.reshape(-1)[:3].device is d
    assert x[np.array([0, 2])].shape == (2, 4)                      # host index arrays are fine
    x[0] = 5.0
    x[1, 1:] = x[2, 1:]
    np.add.at(x, (np.array([0, 0]), np.array([1, 1])), 1.0)
    assert d.to_host(x)[0].tolist() == [5.0, 7.0, 5.0, 5.0]
    raw = d.put(np.zeros(34 * 2, np.uint8)).reshape(-1, 34)         # the dequantizers' byte views
    assert raw[:, :2].view(np.float16).astype(np.float32).device is d


@pytest.mark.parametrize("op", [
    lambda x, h, o: x + h,                  # sim with host
    lambda x, h, o: h @ x.T,                # host with sim
    lambda x, h, o: np.asarray(x),          # implicit device -> host
    lambda x, h, o: np.array(x),
    lambda x, h, o: h.__setitem__(slice(None), x[0]),
    lambda x, h, o: x.__setitem__(0, h),    # implicit host -> device
    lambda x, h, o: x + o,                  # two devices
    lambda x, h, o: np.concatenate([x, o]),
    lambda x, h, o: x.get(),
    lambda x, h, o: np.maximum(x, h, out=x),
])
def test_sim_rejects_mixing_devices(sims, op):
    d, other = sims
    x = d.put(np.ones((2, 4), np.float32))
    o = other.put(np.ones((2, 4), np.float32))
    with pytest.raises(DeviceMismatchError):
        op(x, np.ones(4, np.float32), o)


def test_scalars_and_0d_constants_mix(sims):
    d, _ = sims
    x = d.put(np.ones(3, np.float32))
    assert float((x * 2 + np.float32(1) + np.array(1.0)).sum()) == 12.0


def test_transfers_are_counted(sims):
    d0, d1 = sims
    h = np.ones((4, 8), np.float32)
    a = transfer(h, CPU, d0)
    b = transfer(a, d0, d1)
    c = transfer(b, d1, CPU)
    assert isinstance(c, np.ndarray) and c.tolist() == h.tolist()
    assert (d0.stats.h2d_count, d0.stats.h2d_bytes) == (1, 128)
    s1 = d1.stats
    assert (s1.d2d_count, s1.d2d_bytes, s1.d2h_count, s1.d2h_bytes) == (1, 128, 1, 128)
    assert transfer(a, d0, d0) is a and CPU.put(h) is h and CPU.to_host(h) is h
    snap = d0.stats.copy()
    d0.to_host(a)
    assert (d0.stats - snap).d2h_bytes == 128 and (d0.stats - snap).count == 1
    d0.reset_stats()
    assert d0.stats == TransferStats()
    with pytest.raises(DeviceMismatchError, match="not on sim:1"):
        transfer(a, d1, CPU)
    with pytest.raises(DeviceMismatchError):
        CPU.put(a)
    d0.xp.asarray(h)  # an implicit upload, as CuPy allows: still counted
    assert d0.stats.h2d_count == 1


def test_capacity_and_out_of_memory(sims):
    d, _ = sims
    held = d.put(np.zeros(MiB // 2, np.uint8), what="blk.0.attn_q.weight")  # noqa: F841 (kept alive)
    with pytest.raises(DeviceOutOfMemory) as e:
        d.empty((MiB // 4 + 1,), np.float32, what="KV cache")
    err = e.value
    assert (err.device, err.requested, err.used, err.capacity, err.what) == ("sim:0", MiB + 4, MiB // 2, MiB,
                                                                             "KV cache")
    assert "KV cache" in str(err) and "1,048,580" in str(err)
    assert d.used == MiB // 2  # a failed allocation reserves nothing


def test_free_and_garbage_collection(sims):
    d, _ = sims
    a = d.empty((100,), np.float32, what="a")
    b = d.zeros((10,), np.float64, what="b")
    assert d.used == 480 and d.allocations() == [("a", 400), ("b", 80)] and d.peak == 480
    d.free(a.reshape(10, 10))  # a view frees the allocation it belongs to
    assert d.used == 80
    view = b[2:]
    del b
    gc.collect()
    assert d.used == 80  # a live view keeps its buffer
    del view
    gc.collect()
    assert d.used == 0 and d.peak == 480
    c = d.empty((4,), what="c")
    d.free_all()
    assert d.used == 0 and c.shape == (4,)
    cpu_before = CPU.used
    k = CPU.zeros((256,), np.float32, what="kv")
    assert CPU.used == cpu_before + 1024 and isinstance(k, np.ndarray)
    CPU.free(k)
    assert CPU.used == cpu_before


def test_array_namespace_of_sim_arrays(sims):
    from moert.devices import xp_of

    d, _ = sims
    x = d.put(np.ones((2, 32), np.float32))
    assert xp_of(x) is d.xp and x.__array_namespace__() is d.xp and xp_of(np.ones(2)) is np
    assert xp_of(x).ascontiguousarray(x[:, ::2]).device is d  # what a dequantizer does with its input
    with pytest.raises(DeviceMismatchError):
        np.ascontiguousarray(x)  # numpy's own: an implicit device -> host conversion


def test_sim_memo_of_dequantized_weights_keeps_accounting(sims):
    """SimDevice.memo: make() runs once per owner; every call returns a fresh, counted, equal array; the memo
    stays under MEMO_BYTES and forgets an owner that is collected."""
    d, _ = sims

    class Owner:                                        # any weak-referenceable object (a Weight)
        pass

    made = []

    def make():
        made.append(1)
        return d.put(np.arange(64, dtype=np.float32))

    w = Owner()
    a = d.memo(w, make)
    used = d.used
    b = d.memo(w, make)
    assert len(made) == 1 and np.array_equal(d.to_host(a), d.to_host(b))
    assert d.used == used + b.nbytes                   # the copy counts, as a GPU's output would
    b[0] = 5.0                                          # callers own their copy; the memo is unchanged
    assert d.to_host(d.memo(w, make))[0] == 0.0 and len(made) == 1
    del a, b
    gc.collect()
    assert d.used == 0
    del w
    gc.collect()
    assert len(d._memo) == 0
    d.MEMO_BYTES = 100                                  # under the budget only: 256 bytes do not fit
    w2 = Owner()
    d.memo(w2, make), d.memo(w2, make)
    assert len(made) == 3
