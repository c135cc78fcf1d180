"""What an architecture file calls on the model (the contract in moert/models/runtime.py, implemented): where a layer's
attention and KV cache are, explicit counted moves (`to`), time attribution (`phase`), weights and matmuls (the
weight store's), RoPE angles, the embedding, the output, and the routed experts wherever the plan put them.
moert.Model (moert/model.py: the session, forward and context) builds on it."""

from __future__ import annotations

import time

import numpy as np

from moert import devices as _devices
from moert.devices import CPU, Device
from moert.devices.graph import hop as graph_hop
from moert.devices.pinned import crossing
from moert.experts import op_offload_gpu, run_experts
from moert.kernels import DEQUANT_TYPES, dequantize_block_rows
from moert.layers import rms_norm, rope_angles
from moert.stats import Phase


class ModelRuntime:
    """The runtime contract's implementation; its state (plan, weights, kv, stats, clock, the chunk's position
    and size) is Model's."""

    def attention_device(self, il: int) -> Device:
        """Where layer il's attention (and KV cache, router) runs. Every block asks this first, so the time
        measured from here to the next block (or the output) is counted as layer il's (Stats.layer_time)."""
        self._layer = il
        return self.kv.devices[il]

    def kv_cache(self, il: int):
        """Layer il's K and V caches, (n_ctx, Hk, Dh) each, on its attention device (a batch's: kvcache.Rows)."""
        if self._batch is not None:
            return self._batch.kv(il)
        return self.kv.k[il], self.kv.v[il]

    def device_of(self, name: str) -> Device:
        return self.plan.device(self.weights.tensor_name(name))

    def has(self, name: str) -> bool:
        """Whether the model holds the (optional) tensor `name` (output.weight: also when tied)."""
        return name in self.weights or (name == "output.weight" and "token_embd.weight" in self.weights)

    def to(self, x, dev: Device, what: str = "", pinned: bool = False):
        """x moved to dev (explicit, counted, timed as a transfer); x itself when it is there already. pinned: a 2-D
        array between a GPU and the host goes through the GPU's pinned crossing (moert/devices/pinned.py: async
        copies and an event, not a device sync): the CPU experts' activations."""
        src = _devices.device_of(x, self.plan.devices)
        if src is dev:
            return x
        cr = None if not pinned or x.ndim != 2 else crossing(src) if dev is CPU else crossing(dev) if src is CPU \
            else None
        with self._moving(src, dev, x.nbytes, what):
            if cr is not None:
                return cr.down(x) if dev is CPU else cr.up(x)
            return _devices.transfer(x, src, dev, what)

    def _moving(self, src: Device, dev: Device, nbytes: int, what: str = "") -> Phase:
        """The timer of a transfer of nbytes (`what`) from src to dev (on a virtual clock: the link's time for
        nbytes); every transfer of a forward pass, plain or through a pinned crossing, is timed here."""
        clock = self.clock
        predicted = (clock.transfer_seconds(nbytes) if clock is not None and (clock.covers(src) or clock.covers(dev))
                     else None)
        return Phase(self, "transfers", f"{src.name}->{dev.name}", predicted)

    def to_together(self, arrays: tuple, dev: Device, what: str = "") -> tuple:
        """Arrays of one device, each (T, ...) float or int, moved to dev as ONE transfer (a GPU's expert layer on
        the CPU: hidden state, ids and weights in one crossing, not three syncs): packed side by side as int32
        columns (a float32's bits, as integers: no kernel may flush them as denormals) where they are, split on dev.
        Floats come back float32, ints int32."""
        src = _devices.device_of(arrays[0], self.plan.devices)
        if src is dev:
            return tuple(arrays)
        packed, parts = _pack(arrays, src.xp)                                             # (T, sum of widths)
        return _unpack(self.to(packed, dev, what, pinned=True), parts, dev.xp)

    def cross(self, arrays: tuple, src: Device, hop):
        """The host's part of a layer on the GPU src (its routed experts on the CPU): arrays (x, ids, weights) down in
        one packed crossing, y = hop(*their host copies) (T, D) on the host, y back up through the pinned buffers;
        y on src. A decode step captured as a graph is cut here into two segments (moert/devices/graph.py hop):
        packing and the device copy of y are device work, the crossing and hop the host's, run again each token."""
        cr = crossing(src)
        if cr is None:
            return self.to(hop(*self.to_together(arrays, CPU, "hidden, expert ids, weights")), src, "expert output")
        packed, parts = _pack(arrays, src.xp)                                             # (T, W) int32
        cr.stage(packed)                                                                  # the static device rows

        def between():
            with self._moving(src, CPU, packed.nbytes, "hidden, expert ids, weights"):
                host = cr.fetch(*packed.shape)
            y = hop(*_unpack(host, parts, np))                                            # (T, D) on the host
            with self._moving(CPU, src, y.nbytes, "expert output"):
                cr.send(y)
        graph_hop(src, between)
        return cr.landed()                                                                # (T, D) on src

    def copy_weights(self, host: np.ndarray, dev: Device, what: str = "", kind: str = "weight"):
        """Weight bytes from the host onto dev at run time (an expert cache admitting an expert; kind="offload": a
        big batch's CPU experts): counted as weights, apart from activations (TransferStats.weight_bytes /
        offload_bytes), timed as a transfer (on a virtual clock: the link's time)."""
        clock = self.clock
        predicted = clock.transfer_seconds(host.nbytes) if clock is not None and clock.covers(dev) else None
        with Phase(self, "transfers", f"cpu->{dev.name} {'weights' if kind == 'weight' else kind}", predicted):
            return dev.put_weights(host, what, kind)

    def use_expert_cache(self, cache) -> None:
        """Run with an expert cache (a moert.ExpertCache; None: none): moert/dynamic/runtime.py."""
        from moert.dynamic.runtime import RuntimeCache

        if self.expert_cache is not None:
            self.expert_cache.close()
        self.expert_cache = None if cache is None else RuntimeCache(self, cache)

    def phase(self, name: str, dev: Device | str) -> Phase:
        """`with m.phase(name, dev):` attributes the time inside to (phase, device); nested phases pause
        the outer one. On a sim GPU with a virtual clock the time is the cost model's (moert/cost/vclock.py)."""
        clock = self.clock
        if clock is not None and clock.covers(dev):
            rows = 1 if self._last_only else self._n
            predicted = clock.phase_seconds(name, dev.name, self._layer, self._n, self.position, rows)
            return Phase(self, name, dev, predicted)
        return Phase(self, name, dev)

    def fused_layer(self, il: int, x, fused):
        """Layer il of a one-token step as two CPU kernel calls (moert/fused.py: `fused` says which layer the
        architecture has), or None where that does not apply: then the architecture's block runs."""
        if not self.fused_decode or self._n != 1 or self._batch is not None or self.clock is not None \
                or self.expert_cache is not None or self._trace is not None and self._trace.full:
            return None
        steps = self._fused.get(fused)
        if steps is None:
            steps = self._fused[fused] = [fused.prepare(self, i) for i in range(self.config.n_layer)]
        step = steps[il]
        n = 0 if step is None or type(x) is not np.ndarray else step.threads(self.position)
        if n == 0:
            return None
        self._layer, t0 = il, time.perf_counter()
        cos, sin = self.rope(CPU, *step.rope)
        x = step(x, self.position, cos, sin, self._call.expert_counts, il, n)  # (1, D); the routing counted
        if self._trace is not None:
            self._trace.layer(il, step.ids.copy(), step.wts.copy(), None)
        self._add_time("layer", "cpu", time.perf_counter() - t0)
        return x

    def _add_time(self, phase: str, dev: str, s: float, replaced: bool = False) -> None:
        """Measured seconds of (phase, device); replaced: measured inside a predicted phase, so left out."""
        if replaced:
            self._replaced += s
        elif self._call is not None:
            self._call.add_time(phase, dev, s, self._layer)

    def _add_predicted(self, phase: str, dev: str, s: float) -> None:
        if self._call is not None:
            self._call.add_predicted(phase, dev, s, self._layer)

    def w(self, name: str, dev: Device | None = None):
        """Weight `name` as float32 on dev (default: where it lives): moert.weights.Linears.w."""
        return self.weights.w(name, dev)

    def linear(self, x, name: str, dev: Device | None = None):
        """x (T, in) @ W.T for the 2-D weight `name` on dev (default: where W lives): (T, out); Linears.linear. A CPU
        weight and a batch of at least offload_min_batch tokens with a GPU present: on the GPU (op offload)."""
        gpu = self._offload_gpu(x, (name,), dev)
        if gpu is not None:
            return self._offloaded_linear(x, name, gpu)
        return self.weights.linear(x, name, dev)

    def linears(self, x, names: tuple[str, ...], dev: Device | None = None) -> tuple:
        """linear(x, name, dev) for each of names that read the same x (q, k, v): Linears.linears."""
        if self._offload_gpu(x, names, dev) is not None:
            return tuple(self.linear(x, n, dev) for n in names)
        return self.weights.linears(x, names, dev)

    def _offload_gpu(self, x, names: tuple[str, ...], dev: Device | None) -> Device | None:
        """The GPU that runs x @ W.T for CPU weights `names` (llama.cpp's op offload: a batch of at least
        offload_min_batch tokens, a GPU present, the weights' bytes and the batch fitting what is free there; the
        first GPU), or None: where they live."""
        if x.ndim != 2 or dev not in (None, CPU) or type(x) is not np.ndarray \
                or self.clock is not None:           # a virtual clock prices a stage, not one of its matmuls
            return None
        gpu = op_offload_gpu(self, x.shape[0])
        ws = [self.weights[self.weights.tensor_name(k)] for k in names]
        if gpu is None or any(getattr(w, "device", None) is not CPU or len(w.shape) != 2 for w in ws):
            return None
        need = max(w.data.nbytes + 4 * w.shape[0] * min(w.shape[1], 4096) for w in ws) + 8 * x.nbytes
        return gpu if gpu.free_bytes is None or need <= gpu.free_bytes else None

    def _offloaded_linear(self, x, name: str, gpu: Device):
        """x @ W.T on gpu for the CPU weight `name`: its bytes copied there for this call (TransferStats.offload_bytes),
        x moved there and the result back; (T, out) on the CPU."""
        from moert.weights import Weight

        w = self.weights[self.weights.tensor_name(name)]
        data = self.copy_weights(np.ascontiguousarray(w.data), gpu, f"{w.name} (offload)", kind="offload")
        try:
            t = Weight(w.name, w.type, tuple(w.shape), gpu, data)
            xg = self.to(x, gpu, "hidden")
            with self.phase(self._phases[-1][0] if self._phases else "ffn", gpu):    # the caller's phase, on gpu
                y = t.matmul(xg)                                            # (T, out)
        finally:
            gpu.free(data)
        return self.to(y, CPU, "offload output")

    def rope(self, dev: Device, head_dim: int, base: float, yarn=None):
        """cos, sin (T, Dh/2) for this chunk's positions, computed once per device, head dim, base and
        scaling (a layers.Yarn, or None)."""
        k = (id(dev), head_dim, base, yarn)
        got = self._rope.get(k)
        if got is None and self._static is not None:          # a captured step's, at its position in device memory
            got = self._rope[k] = self._static.rope(dev, self._n, head_dim, base, yarn)
        if got is None:
            if self._batch is not None or dev is not CPU:     # a GPU's memory holds this chunk's angles only
                got = rope_angles(self.position, self._n, head_dim, base, dev.xp, yarn,
                                  None if self._batch is None else self._batch.positions)
            else:
                cos, sin = self._rope_table(dev, head_dim, base, yarn, self.position + self._n)
                got = cos[self.position:self.position + self._n], sin[self.position:self.position + self._n]
            self._rope[k] = got
        return got

    def _rope_table(self, dev: Device, head_dim: int, base: float, yarn, n: int):
        """cos, sin (>= n, Dh/2) of positions 0, 1, ... on the CPU: rope_angles once per head dim, base and
        scaling, grown 1024 positions at a time as the context fills (row p is what rope_angles gives position p;
        ~13 us a step saved on the demo model)."""
        k = (id(dev), head_dim, base, yarn)
        t = self._rope_tables.get(k)
        if t is None or t[0].shape[0] < n:
            t = self._rope_tables[k] = rope_angles(0, -(-n // 1024) * 1024, head_dim, base, dev.xp, yarn)
        return t

    def embed(self, name: str, tokens: np.ndarray):
        """Rows `tokens` of the embedding, dequantized on its device: (T, D) there."""
        t, dev = self.weights[name], self.plan.device(name)
        if self._static is not None:                          # a captured step: its input buffer (graphs/decode.py)
            return self._static.x
        with self.phase("embed", dev):
            ids = tokens if dev is CPU else self.to(tokens, dev, "token ids")
            if dev is CPU and t.type in DEQUANT_TYPES:                  # the per-token lookup, without checks
                return dequantize_block_rows(t.data[ids], t.type)                     # (T, D)
            return t.dequantize_raw(t.data[ids], (len(tokens), t.shape[1]))           # (T, D)

    def output(self, norm_name: str, name: str, x) -> np.ndarray:
        """Final norm and output projection on the output weight's device; logits (T, V) on the host
        ((1, V): the last position, when the forward call asked for last_only)."""
        name = self.weights.tensor_name(name)
        dev = self.plan.device(name)
        self._layer = None                                              # not a layer's time from here on
        if self._batch is not None:
            x = x[self._batch.last]                                     # (sequences, D): each one's last row
        elif self._last_only:
            x = x[-1:]                                                  # (1, D)
        x = self.to(x, dev, "hidden")
        with self.phase("output", dev):
            h = rms_norm(x, self.w(norm_name, dev), self.config.rms_eps, dev.xp)     # (T, D)
            logits = self.linear(h, name, dev)                                         # (T, V)
        if self._static is not None:                          # a captured step: into its output buffer, no read
            self._static.logits[...] = logits
            return self._static.logits
        return self.host_logits(logits, dev)

    def experts(self, il: int, x, ids, weights, names: tuple[str, str, str], logits=None, act: str = "swiglu",
                biases: tuple[str, str, str] | None = None):
        """Routed gated experts of layer il: x (T, D), ids/weights (T, K) on the attention device -> (T, D)
        there; each expert runs where the plan put it and only activations move (moert/experts.py). act: the
        gated activation (moert.activations.ACTS); biases: names of per-expert gate/up/down bias tensors; logits:
        the router's (T, E), recorded by traces with trace="full"."""
        return run_experts(self, il, x, ids, weights, names, logits, act, biases)


def _pack(arrays: tuple, xp) -> tuple:
    """arrays each (T, ...) float or int -> (T, W) int32 side by side (a float32's bits as integers) and how to
    split it again (_unpack)."""
    T = arrays[0].shape[0]
    cols = [a.reshape(T, -1).astype(np.float32).view(np.int32) if a.dtype.kind == "f" else
            a.reshape(T, -1).astype(np.int32) for a in arrays]
    return xp.concatenate(cols, axis=1), [(a.dtype.kind == "f", a.shape, c.shape[1]) for a, c in zip(arrays, cols)]


def _unpack(buf, parts: list, xp) -> tuple:
    """_pack's arrays back from its (T, W) int32 rows: floats float32, ints int32, each contiguous."""
    out, at = [], 0
    for is_float, shape, width in parts:
        part = xp.ascontiguousarray(buf[:, at:at + width])
        out.append((part.view(np.float32) if is_float else part).reshape(shape))
        at += width
    return tuple(out)
