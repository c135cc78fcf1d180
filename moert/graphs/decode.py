"""A model's decode step as a CUDA graph (moert/devices/graph.py), for a model whose weights and KV cache are all on
one GPU (the token embedding may stay on the CPU, as llama.cpp keeps it):

    m.decode_graph = DecodeGraph(m)      every one-token forward call after this replays one captured step

Per token the host does three things around the graph: the token's embedding row goes into a static input buffer
(one upload), the position into a static int32 buffer (a kernel's argument, not a baked Python int), and after the
replay the logits come back from a static output buffer, the step's expert counts (added up on the GPU inside the
step) in the same transfer (Model.host_logits): one read. Inside the step the architecture's own forward runs
unchanged, at a kvcache.DevicePos: the KV cache is written and attended at the position in device memory
(moert/graphs/static.py, or kernels/gpu's attention with a device position), RoPE angles come from it, and routing
and the fused MoE kernel read nothing back (moert/experts.py). The first step is run eagerly once (kernels compile
and load, RoPE frequencies upload), then captured at the same token and position (the same values written twice).

Routed experts on the CPU (-ngl all -cmoe) cut the step into segments at each layer's crossing (Model.cross,
moert/devices/pinned.py): the GPU work between two crossings is one captured segment, and on replay the host runs
the CPU experts between them. Where a step cannot be captured (another weight on the CPU, a layer whose experts need
the host, a trace or an expert cache asking for ids on the host), one-token steps run eagerly and a GraphWarning
says why once. Prompts always run
eagerly. On the sim device the capture is simulated (operations recorded and replayed, host reads refused); on a
CUDA GPU this has not run yet (see docs/running.md).
"""

from __future__ import annotations

import re
import warnings

import numpy as np

from moert.devices import CPU
from moert.devices.graph import CaptureError, GraphWarning, StepGraph
from moert.graphs.static import rope_angles_at
from moert.kvcache import DevicePos
from moert.placement.rules import EXPERT_REGEX

EMBEDDING = "token_embd.weight"
_EXPERTS = re.compile(EXPERT_REGEX)       # a layer's routed experts: the CPU may hold them (-cmoe), the step is cut


class DecodeGraph:
    """The static buffers and the captured step of one model's decode (moert/model.py calls `forward`)."""

    def __init__(self, m):
        self.m, self.graph = m, None
        self.dev, self.why_eager = self._one_gpu(m)
        self._said = False
        if self.dev is None:
            self._say()
            return
        c, dev = m.config, self.dev
        self.x = dev.zeros((1, c.n_embd), np.float32, "graph: the step's hidden input")        # (1, D)
        self.pos = DevicePos(dev.zeros((1,), np.int32, "graph: the step's position"))
        self.logits = dev.zeros((1, c.n_vocab), np.float32, "graph: the step's logits")       # (1, V)
        self.freqs: dict = {}                  # RoPE frequencies on the device, per (head dim, base, yarn)
        self._host_counts = None               # the call's expert counts before its first step ran (warm-up, capture)

    @staticmethod
    def _one_gpu(m):
        """(the GPU holding every weight but the embedding and the CPU's routed experts, and every layer's KV cache,
        None) or (None, why not). Routed experts on the CPU (-cmoe) cut the step into segments at their crossing."""
        devs = set(m.kv.devices) | {d for n, w in m.weights.items() for d in [getattr(w, "device", None)]
                                    if n != EMBEDDING and not (d is CPU and _EXPERTS.search(n))}
        if len(devs) != 1 or None in devs or not next(iter(devs)).is_gpu:
            names = sorted(getattr(d, "name", "split over devices") for d in devs)
            return None, f"the weights and KV cache are on {', '.join(names)}, not all on one GPU"
        dev = next(iter(devs))
        return (dev, None) if dev.kind in ("sim", "cuda") else (None, f"{dev.name} has no graphs")

    def forward(self, tokens: np.ndarray) -> np.ndarray:
        """Logits (T, V) on the host for this chunk: a one-token step replayed (captured the first time), anything
        else eagerly (the architecture's forward)."""
        m = self.m
        if len(tokens) != 1 or self.why_eager is not None or m._trace is not None or m.clock is not None \
                or m.expert_cache is not None:
            return m.arch.forward(m, tokens)
        self.x[...] = m.to(m.embed(EMBEDDING, tokens), self.dev, "token row")    # (1, D) into the static buffer
        self.pos.p[...] = m.position
        try:
            if self.graph is None:
                self._host_counts = None
                self.graph = StepGraph(self.dev, self._step, "a decode step", warmup=True)
                if not self.graph.captured:
                    self.why_eager = self.graph.why_eager                          # it said why
                    self._said = True
            else:
                self.graph.replay()
        except CaptureError as e:                    # a replay refused (never expected: the capture ran the same)
            self.why_eager = str(e)
            self._say()
            return m.arch.forward(m, tokens)
        return m.host_logits(self.logits, self.dev)               # (1, V), with the step's expert counts: one read

    def rope(self, dev, n: int, head_dim: int, base: float, yarn):
        """cos, sin (n, Dh/2) at the step's device position (Model.rope asks while the step runs)."""
        return rope_angles_at(self.pos, n, head_dim, base, dev.xp, yarn, self.freqs)

    def _step(self) -> None:
        """The architecture's forward at the device position, input and output in the static buffers."""
        m = self.m
        for acc, _ in m._device_counts.values():          # this step's routing only: the warm-up's, or a failed
            acc[...] = 0                                  # capture's, is not counted twice (a forward call is a step)
        if m._call is not None:                           # the same for counts the CPU experts' hops record (-cmoe)
            if self._host_counts is None:
                self._host_counts = m._call.expert_counts.copy()
            m._call.expert_counts[...] = self._host_counts
        saved = m._position, m._n, m._rope
        m._position, m._n, m._rope, m._static = self.pos, 1, {}, self
        try:
            m.arch.forward(m, np.zeros(1, np.int64))      # the tokens are not read: Model.embed gives self.x
        finally:
            (m._position, m._n, m._rope), m._static = saved, None

    def _say(self) -> None:
        if not self._said:
            self._said = True
            warnings.warn(f"decode steps of {self.m.config.arch} run eagerly, not as a CUDA graph: {self.why_eager}",
                          GraphWarning, stacklevel=3)
