"""CUDA graphs for decode (moert/devices/graph.py) on the sim device: a reduced decode step (embedding, RMSNorm, q/k/v,
RoPE, a KV cache write, attention over the whole cache masked at the current length, the output projection) whose
token id and position live in device memory is captured once and replayed token after token, giving the logits of an
eager reference that runs moert.layers.attention at Python-int positions. The sim's capture records the operations and
replays them with every Python value of the capture baked in, as a CUDA graph does: so a step that keeps its position
as a Python int replays the wrong positions, and one that reads a value back cannot be captured. This checks the
contract (no host reads, static buffers, positions in device memory), not CuPy's graph API, which needs a GPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from moert.devices import CPU as CPU_DEV
from moert.devices.graph import GraphWarning, StepGraph
from moert.devices.sim import SimDevice
from moert.layers import attention, rms_norm, rope, rope_angles, softmax

D, H, HK, DH, V, N, EPS, BASE = 32, 4, 2, 8, 40, 12, 1e-6, 10000.0
TOKENS = [5, 17, 3, 29, 11, 0]


def _weights():
    rng = np.random.default_rng(7)
    shapes = dict(emb=(V, D), nw=(D,), wq=(H * DH, D), wk=(HK * DH, D), wv=(HK * DH, D), wo=(D, H * DH),
                  onw=(D,), out=(V, D))
    return {k: (rng.standard_normal(s) * (1.0 if k in ("nw", "onw") else 0.3)).astype(np.float32)
            for k, s in shapes.items()}


def _eager_reference(tokens) -> np.ndarray:
    """The step on the host at Python-int positions, through moert.layers (cache written at pos0, keys [0, pos0])."""
    w = _weights()
    kc, vc = np.zeros((N, HK, DH), np.float32), np.zeros((N, HK, DH), np.float32)
    out = []
    for p, t in enumerate(tokens):
        x = w["emb"][[t]]                                                        # (1, D)
        h = rms_norm(x, w["nw"], EPS, fast=False)
        q, k, v = (h @ w[n].T for n in ("wq", "wk", "wv"))
        cos, sin = rope_angles(p, 1, DH, BASE)
        q = rope(q.reshape(1, H, DH), cos, sin, True, fast=False)
        k = rope(k.reshape(1, HK, DH), cos, sin, True, fast=False)
        a = attention(q, k, v.reshape(1, HK, DH), kc, vc, p, fast=False)      # (1, H*DH)
        y = x + a @ w["wo"].T
        out.append(rms_norm(y, w["onw"], EPS, fast=False) @ w["out"].T)         # (1, V)
    return np.concatenate(out)


class Step:
    """The reduced decode step on a sim device: static buffers tok (1,), pos (1,), logits (1, V), the KV cache."""

    def __init__(self, dev: SimDevice, position: str = "device", read_back: bool = False, upload: bool = False,
                 sort: bool = False):
        self.dev, self.xp = dev, dev.xp
        self.w = {k: dev.put(a, k) for k, a in _weights().items()}
        self.tok, self.pos = dev.put(np.zeros(1, np.int64)), dev.put(np.zeros(1, np.int64))
        self.logits = dev.zeros((1, V), np.float32, "logits")
        self.kc, self.vc = dev.zeros((N, HK, DH), np.float32), dev.zeros((N, HK, DH), np.float32)
        self.keys = self.xp.arange(N)                                            # (N,) cache positions
        self.inv = dev.put(1.0 / BASE ** (np.arange(0, DH // 2, dtype=np.float64) * 2.0 / DH))
        self.host_pos = 0                                # what a step at Python-int positions reads instead
        self.position, self.read_back, self.upload, self.sort = position, read_back, upload, sort

    def __call__(self) -> None:
        xp, w = self.xp, self.w
        x = w["emb"][self.tok]                                                   # (1, D): gathered at a device id
        h = rms_norm(x, w["nw"], EPS, xp)
        q, k, v = (h @ w[n].T for n in ("wq", "wk", "wv"))
        if self.position == "device":
            p = self.pos                                                         # (1,) in device memory
            ang = p.astype(np.float64)[:, None] * self.inv[None, :]             # (1, DH/2)
        else:                                                                    # a Python int: baked by a capture
            p = self.host_pos
            ang = xp.arange(p, p + 1, dtype=np.float64)[:, None] * self.inv[None, :]
        if self.read_back:
            int(self.pos[0])
        if self.upload:
            self.dev.put(np.ones(1, np.float32))
        if self.sort:
            xp.argsort(ang, axis=-1)
        cos, sin = xp.cos(ang).astype(np.float32), xp.sin(ang).astype(np.float32)
        q = rope(q.reshape(1, H, DH), cos, sin, True, xp)
        k = rope(k.reshape(1, HK, DH), cos, sin, True, xp)
        self.kc[p] = k                                                           # row p of the cache
        self.vc[p] = v.reshape(1, HK, DH)
        s = (q.reshape(HK, H // HK, DH) @ self.kc.transpose(1, 2, 0)) * np.float32(1 / np.sqrt(DH))   # (HK, G, N)
        s = xp.where(self.keys > p, np.float32(-np.inf), s)                      # keys past the position: masked
        a = (softmax(s, xp) @ self.vc.transpose(1, 0, 2)).reshape(1, H * DH)    # (1, H*DH)
        y = x + a @ w["wo"].T
        self.logits[...] = rms_norm(y, w["onw"], EPS, xp) @ w["out"].T
        if self.position == "device":
            self.pos += 1                                                        # last: the next step's position
        else:
            self.host_pos += 1

    def run(self, tokens, graph: bool = True) -> tuple[np.ndarray, StepGraph | None, int]:
        """Logits per token (the first step makes the graph), the graph, and the host reads of the replays."""
        out, g, reads = [], None, 0
        for t in tokens:
            self.tok[...] = t                                                    # the sampled token, uploaded
            if g is None and graph:
                g = StepGraph(self.dev, self)
            elif g is not None:
                before = self.dev.host_reads
                g.replay()
                reads += self.dev.host_reads - before
            else:
                self()
            out.append(self.dev.to_host(self.logits))
        return np.concatenate(out), g, reads


@pytest.fixture
def dev():
    return SimDevice(0, 1 << 26)


def test_replayed_steps_give_the_eager_logits_as_positions_advance(dev):
    want = _eager_reference(TOKENS)
    eager, _, _ = Step(dev).run(TOKENS, graph=False)
    np.testing.assert_allclose(eager, want, rtol=1e-5, atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphWarning)
        got, g, reads = Step(dev).run(TOKENS)
    assert g.captured and len(g.tape) > 20
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert reads == 0                                  # the replays read nothing back; the logits after, one a token


def test_a_position_kept_as_a_python_int_replays_the_captures_position(dev):
    """Eagerly the Python-int step is right; replayed, its RoPE angle, cache row and mask stay those of the capture:
    the sim's replay bakes Python values as a graph does, so this mistake cannot pass the test above."""
    want = _eager_reference(TOKENS)
    eager, _, _ = Step(dev, position="host").run(TOKENS, graph=False)
    np.testing.assert_allclose(eager, want, rtol=1e-5, atol=1e-5)
    got, g, _ = Step(dev, position="host").run(TOKENS)
    assert g.captured
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)      # the captured step itself
    assert not np.allclose(got[1:], want[1:], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("bad, why", [(dict(read_back=True), "reads a device array back"),
                                      (dict(upload=True), "uploads host data"), (dict(sort=True), "sorts")])
def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_why_once(dev, bad, why):
    want = _eager_reference(TOKENS)
    with pytest.warns(GraphWarning, match=why) as caught:
        got, g, _ = Step(dev, **bad).run(TOKENS)
    assert len([w for w in caught if issubclass(w.category, GraphWarning)]) == 1
    assert not g.captured and why in g.why_eager
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert dev.recording is None and dev.tape is None


# ------------------------------------------------------------------ the pieces at a device position, against layers

@pytest.mark.parametrize("window, sinks, typed", [(None, False, False), (3, True, False), (None, False, True)])
def test_attention_at_a_device_position_equals_layers_attention(window, sinks, typed):
    from moert.kvcache import DevicePos, TypedKV
    from moert.layers import latent_attention

    rng = np.random.default_rng(5)
    dev = SimDevice(0, 1 << 26)
    s = rng.standard_normal(H).astype(np.float32) if sinks else None
    for p in (0, 4, N - 1):
        q, k, v = (rng.standard_normal((1, h, DH)).astype(np.float32) for h in (H, HK, HK))
        hist = rng.standard_normal((2, N, HK, DH)).astype(np.float32)
        if typed:                                                      # f16 caches, written as the runtime writes
            kc, vc, kd, vd = (TypedKV(d, "f16", (N, HK, DH), "kv") for d in (CPU_DEV, CPU_DEV, dev, dev))
            for c, h_ in ((kc, hist[0]), (vc, hist[1])):
                c.write(0, h_)
            kd.write(0, dev.put(hist[0]))
            vd.write(0, dev.put(hist[1]))
        else:
            kc, vc, kd, vd = hist[0].copy(), hist[1].copy(), dev.put(hist[0]), dev.put(hist[1])
        want = attention(q, k, v, kc, vc, p, window=window, sinks=s, fast=False)
        before = dev.host_reads
        got = attention(dev.put(q), dev.put(k), dev.put(v), kd, vd, DevicePos(dev.put(np.array([p], np.int32))),
                        dev.xp, window=window, sinks=None if s is None else dev.put(s))
        assert dev.host_reads == before
        np.testing.assert_allclose(dev.to_host(got), want, rtol=1e-5, atol=1e-6)
    lat = rng.standard_normal((N, 1, 24)).astype(np.float32)           # MLA: R 16 + P 8
    ql, qp, c, kp = (rng.standard_normal(sh).astype(np.float32) for sh in ((H, 1, 16), (H, 1, 8), (1, 16), (1, 8)))
    want = latent_attention(ql, qp, c, kp, lat.copy(), 5, 0.3, fast=False)
    got = latent_attention(*(dev.put(a) for a in (ql, qp, c, kp, lat)), DevicePos(dev.put(np.array([5], np.int32))),
                           0.3, dev.xp)
    np.testing.assert_allclose(dev.to_host(got), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------- a model's decode step as a graph

ARCHS = ["qwen3moe", "qwen2moe", "olmoe", "llama", "gpt-oss", "deepseek2", "gemma3"]
MODEL_KW = dict(gpu_backend="sim", context_size=32, warmup=False, progress=False)
STEPS = [7, 1, 9, 4, 12]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    from moert.testing import write_tiny

    d = tmp_path_factory.mktemp("gpu_graph")
    return {a: write_tiny(d / f"{a}.gguf", a, seed=3) for a in ARCHS}


def _decode(path, graph=None, rewind: int | None = None, **placement):
    """Logits of a prompt's decode steps, each step's host reads, the expert counts, and the model's DecodeGraph."""
    import moert
    from moert.graphs.decode import DecodeGraph

    m = moert.load(path, **MODEL_KW, **{"gpu_layers": "all", **placement})
    try:
        m.forward([3, 17, 5])
        if graph is not None:
            m.decode_graph = (graph or DecodeGraph)(m)
        dev, out, reads, counts = m.plan.devices[0], [], [], 0
        for i, t in enumerate(STEPS):
            if rewind is not None and i == 3:
                m.position = rewind                              # generate() reusing a cached prefix does this
            before = dev.host_reads
            out.append(m.forward([t]))
            reads.append(dev.host_reads - before)
            counts = counts + m.stats.last.expert_counts
        return np.concatenate(out), reads, counts, m.decode_graph
    finally:
        m.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architectures_decode_replays_as_a_graph_with_the_eager_logits(paths, arch, monkeypatch):
    monkeypatch.setattr(SimDevice, "run_kernels", True)     # kernels/gpu's matmul, moe and attention (their twins)
    want, eager_reads, want_counts, _ = _decode(paths[arch])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphWarning)
        got, reads, counts, g = _decode(paths[arch], graph=False)
    assert g.why_eager is None and g.graph.captured and len(g.graph.tape) > 50
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(counts, want_counts)     # routing counted inside the replays
    assert reads == eager_reads == [1] * len(STEPS)         # the logits, with the step's expert counts


def test_a_rewound_position_replays_at_the_new_position(paths, monkeypatch):
    monkeypatch.setattr(SimDevice, "run_kernels", True)
    want, *_ = _decode(paths["qwen3moe"], rewind=4)
    got, _, _, g = _decode(paths["qwen3moe"], graph=False, rewind=4)
    assert g.graph.captured
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_position_baked_into_the_models_step_is_caught(paths, monkeypatch):
    """The same model with RoPE angles from the Python-int position (what moert's rope did before DevicePos):
    eagerly right, replayed wrong. The model-level check above would fail on such a step."""
    from moert.graphs.decode import DecodeGraph

    class Baked(DecodeGraph):
        def forward(self, tokens):
            self.host_position = self.m.position
            return super().forward(tokens)

        def rope(self, dev, n, head_dim, base, yarn):
            return rope_angles(self.host_position, n, head_dim, base, dev.xp, yarn)

    monkeypatch.setattr(SimDevice, "run_kernels", True)
    want, *_ = _decode(paths["qwen3moe"])
    got, _, _, g = _decode(paths["qwen3moe"], graph=Baked)
    assert g.graph.captured
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)      # the captured step
    assert not np.allclose(got[1:], want[1:], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("case, why", [("no GPU kernels", "reads a device array back"),
                                       ("-ngl 1", "not all on one GPU")])
def test_a_model_whose_step_cannot_be_captured_decodes_eagerly_and_says_why_once(paths, case, why, monkeypatch):
    """Without the fused MoE kernel the sim groups tokens by expert on the host; with -ngl 1 a layer is on the CPU
    (-cmoe is captured, as segments: tests/test_gpu_crossing.py). Either way one GraphWarning, and the eager logits."""
    monkeypatch.setattr(SimDevice, "run_kernels", case != "no GPU kernels")
    placement = dict(gpu_layers=1) if case == "-ngl 1" else {}
    want, *_ = _decode(paths["qwen3moe"], **placement)
    with pytest.warns(GraphWarning, match=why) as caught:
        got, _, _, g = _decode(paths["qwen3moe"], graph=False, **placement)
    assert len([w for w in caught if issubclass(w.category, GraphWarning)]) == 1
    assert why in g.why_eager
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_bench_script_runs_dry(capsys):
    """bench/bench_decode_graph.py --dry: the check a first GPU run needs, here on the sim (every row captured)."""
    from bench_scripts import bench_module

    assert bench_module("bench_decode_graph").main(["--dry", "--arch", "qwen3moe,gemma3", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("| yes |") == 2 and not SimDevice.run_kernels
