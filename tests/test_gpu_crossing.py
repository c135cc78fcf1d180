"""The GPU<->CPU crossing of a hybrid placement (-ngl all -cmoe) through pinned host memory (moert/devices/pinned.py):
a static pinned buffer, a device->host copy enqueued on the stream, an event recorded and waited on (not a device
sync), the expert output copied back from a pinned buffer. Checked on the sim device, which numbers the stream's
copies, logs the order of operations, and refuses a host read of a pinned buffer whose copy was not waited for."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert.devices.graph import CaptureError
from moert.devices.pinned import CrossingError, crossing
from moert.devices.sim import SimDevice
from moert.testing import write_tiny

KW = dict(context_size=32, warmup=False, progress=False, kv=moert.KVConfig("f32", "f32"))
PROMPT, STEPS = [3, 17, 5, 9], [[7], [11], [2]]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpu_crossing")
    return {a: write_tiny(d / f"{a}.gguf", a, seed=5) for a in ["qwen3moe", "gpt-oss", "deepseek2"]}


@pytest.fixture
def kernels(monkeypatch):
    monkeypatch.setattr(SimDevice, "run_kernels", True)


def test_down_is_one_copy_into_pinned_memory_one_event_and_one_wait():
    dev = SimDevice(0, 1 << 26)
    rng = np.random.default_rng(0)
    packed = rng.integers(-2**31, 2**31 - 1, (3, 10), dtype=np.int64).astype(np.int32)
    cr = crossing(dev)
    reads, d2h = dev.host_reads, dev.stats.d2h_count
    got = cr.down(dev.put(packed))
    np.testing.assert_array_equal(got, packed)
    assert dev.host_reads == reads + 1 and dev.stats.d2h_count == d2h + 1
    assert cr.link.log == [("d2h", packed.nbytes), ("record", 1), ("wait", 1)]
    assert crossing(dev) is cr                                    # one per device, buffers kept


def test_reading_a_pinned_buffer_before_its_event_is_waited_on_is_refused():
    """The bug a GPU shows as garbage: the host reads the pinned buffer while the copy into it may still run."""
    dev = SimDevice(0, 1 << 26)
    link = crossing(dev).link
    host = link.pinned((2, 4), np.float32)
    src = dev.put(np.arange(8, dtype=np.float32).reshape(2, 4))
    link.copy_down(src, host, 2)
    assert (host.a.view(np.uint32) == 0xFFFFFFFF).all()           # nothing arrived yet: garbage, as on a GPU
    with pytest.raises(CrossingError, match="not known done"):
        link.read(host, 2)
    ev = link.event()
    ev.record()
    ev.synchronize()
    np.testing.assert_array_equal(link.read(host, 2), np.arange(8, dtype=np.float32).reshape(2, 4))


def test_writing_a_pinned_buffer_whose_copy_out_may_still_run_is_refused():
    dev = SimDevice(0, 1 << 26)
    link = crossing(dev).link
    host, dst = link.pinned((1, 3), np.float32), dev.zeros((1, 3))
    link.write(host, np.ones((1, 3), np.float32))
    link.copy_up(host, dst, 1)
    with pytest.raises(CrossingError, match="write into"):
        link.write(host, np.zeros((1, 3), np.float32))


def test_up_copies_from_pinned_memory_and_waits_only_when_the_stream_is_not_known_past_it():
    dev = SimDevice(0, 1 << 26)
    cr = crossing(dev)
    y1, y2 = np.full((2, 5), 1.5, np.float32), np.full((2, 5), -3.0, np.float32)
    reads, h2d = dev.host_reads, dev.stats.h2d_count
    a = cr.up(y1)
    assert dev.host_reads == reads and dev.stats.h2d_count == h2d + 1      # enqueued, nothing waited for
    b = cr.up(y2)                    # the pinned buffer is busy until the first copy is known done: one wait
    assert dev.host_reads == reads + 1
    cr.down(dev.zeros((1, 2), np.int32))                           # a later copy waited for: the stream is past
    c = cr.up(y1)
    cr.down(dev.zeros((1, 2), np.int32))
    assert dev.host_reads == reads + 3                             # the two downs' waits only, none for the up
    for arr, want in ((a, y1), (b, y2), (c, y1)):                  # each its own array, not the static buffer
        np.testing.assert_array_equal(dev.to_host(arr), want)


def test_a_crossing_cannot_be_captured_in_a_graph():
    dev = SimDevice(0, 1 << 26)
    cr = crossing(dev)
    x = dev.zeros((1, 4), np.int32)
    dev.recording = "a test capture"
    try:
        with pytest.raises(CaptureError, match="device->host"):
            cr.down(x)
        with pytest.raises(CaptureError, match="uploads host data"):
            cr.up(np.zeros((1, 4), np.float32))
    finally:
        dev.recording = None


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss", "deepseek2"])
def test_cpu_experts_cross_through_pinned_memory_token_after_token(paths, arch, kernels):
    """-ngl all -cmoe on the sim: per MoE layer one packed d2h, its event waited on, one h2d back (the logits come
    back as before, one read); the same buffers every step; the CPU run's logits."""
    cpu = moert.load(paths[arch], **KW, gpu_layers=0)
    m = moert.load(paths[arch], gpu_backend="sim", gpu_layers="all", cpu_moe=True, **KW)
    try:
        want = [cpu.forward(PROMPT)] + [cpu.forward(t) for t in STEPS]
        got = [m.forward(PROMPT)]
        dev = m.plan.devices[0]
        cr = crossing(dev)
        n_moe = sum(m.has(f"blk.{i}.ffn_gate_exps.weight") for i in range(m.config.n_layer))
        buffers = dict(cr._bufs)
        for t in STEPS:
            start, reads = len(cr.link.log), dev.host_reads
            got.append(m.forward(t))
            ops = [op[0] for op in cr.link.log[start:]]
            assert ops == ["d2h", "record", "wait", "h2d", "record"] * n_moe, arch
            assert dev.host_reads - reads == n_moe + 1                   # the waits and the logits' read
        assert n_moe >= 1 and {k: id(v[0]) for k, v in cr._bufs.items()} == {k: id(v[0]) for k, v in buffers.items()}
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)
    finally:
        m.close()
        cpu.close()


def _segmented(path, graph: bool, **placement):
    """Logits of a prompt and decode steps with -ngl all -cmoe on the sim (graph: replayed as captured segments),
    each step's host reads, the expert counts, and the DecodeGraph."""
    from moert.graphs.decode import DecodeGraph

    m = moert.load(path, gpu_backend="sim", gpu_layers="all", **(placement or {"cpu_moe": True}), **KW)
    try:
        out = [m.forward(PROMPT)]
        if graph:
            m.decode_graph = DecodeGraph(m)
        dev, reads, counts = m.plan.devices[0], [], 0
        for t in [*STEPS, [4], [13]]:
            before = dev.host_reads
            out.append(m.forward(t))
            reads.append(dev.host_reads - before)
            counts = counts + m.stats.last.expert_counts
        return out, reads, counts, m.decode_graph
    finally:
        m.close()


@pytest.mark.parametrize("arch, placement", [("qwen3moe", {}), ("gpt-oss", {}), ("deepseek2", {}),
                                             ("qwen3moe", {"n_cpu_moe": 1})])
def test_cpu_experts_decode_replays_as_graph_segments_with_the_eager_logits(paths, arch, placement, kernels):
    """One segment per stretch of GPU work between two crossings (n MoE layers with experts on the CPU: n + 1
    segments), captured once and replayed token after token at the position in device memory; the CPU experts run
    between them (-ncmoe 1: one layer's experts on the CPU, the others' on the GPU in the segments)."""
    import warnings

    from moert.devices.graph import GraphWarning

    want, eager_reads, want_counts, _ = _segmented(paths[arch], graph=False, **placement)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphWarning)
        got, reads, counts, g = _segmented(paths[arch], graph=True, **placement)
    n_moe = eager_reads[0] - 1                                  # the crossings of a step: its reads but the logits
    assert n_moe == (1 if placement else {"qwen3moe": 2, "gpt-oss": 3, "deepseek2": 1}[arch])   # the tiny files
    assert g.why_eager is None and g.graph.captured
    assert g.graph.segments == n_moe + 1 and len(g.graph.tape) > 50
    for step, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=f"{arch} step {step}")
    np.testing.assert_array_equal(counts, want_counts)
    assert eager_reads == [n_moe + 1] * len(reads)              # a wait per crossing and the logits' read
    assert reads == [2 * n_moe + 1] + eager_reads[1:]          # the first step runs twice (warm-up, capture)
