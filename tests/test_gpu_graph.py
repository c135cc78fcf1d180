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

    def __init__(self, dev: SimDevice, position: str = "device", read_back: bool = False, upload: bool = False):
        self.dev, self.xp = dev, dev.xp
        self.w = {k: dev.put(a, k) for k, a in _weights().items()}
        self.tok, self.pos = dev.put(np.zeros(1, np.int64)), dev.put(np.zeros(1, np.int64))
        self.logits = dev.zeros((1, V), np.float32, "logits")
        self.kc, self.vc = dev.zeros((N, HK, DH), np.float32), dev.zeros((N, HK, DH), np.float32)
        self.keys = self.xp.arange(N)                                            # (N,) cache positions
        self.inv = dev.put(1.0 / BASE ** (np.arange(0, DH // 2, dtype=np.float64) * 2.0 / DH))
        self.host_pos = 0                                # what a step at Python-int positions reads instead
        self.position, self.read_back, self.upload = position, read_back, upload

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
    assert g.captured and len(g._tape) > 20
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
                                      (dict(upload=True), "uploads host data")])
def test_a_step_that_cannot_be_captured_runs_eagerly_and_says_why_once(dev, bad, why):
    want = _eager_reference(TOKENS)
    with pytest.warns(GraphWarning, match=why) as caught:
        got, g, _ = Step(dev, **bad).run(TOKENS)
    assert len([w for w in caught if issubclass(w.category, GraphWarning)]) == 1
    assert not g.captured and why in g.why_eager
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert dev.recording is None and dev.tape is None
