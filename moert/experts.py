"""Routed experts, run where the plan put them: weights never move, activations do (counted).

    run_experts(m, il, x, ids, weights, names)   what Model.experts does for an architecture

Three layouts of a layer's gate/up/down (ExpertLayout):
  one device holds every expert         x, ids and weights go there, the output comes back;
  experts split over devices            each device runs the (token, slot) pairs of its experts, the other
                                        slots marked -1 (skipped by the kernels), partial outputs summed;
  an expert's three tensors apart       each matmul runs where its weight is, the activations move.
On the CPU the fused Numba kernel (kernels/moe_fused.py) reads the quantized bytes in place, on a GPU kernels/gpu.
Dimension legend: T tokens, D hidden, F expert hidden, E experts, K experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert import devices as _devices
from moert.activations import glu
from moert.devices import CPU, Device
from moert.devices.remote import RemoteDeviceError
from moert.errors import PlacementError
from moert.kernels.moe_fused import expert_layer
from moert.kernels.qtensor import QTensor
from moert.moe import dispatch, fused_moe, takes
from moert.weights import SplitWeight, Weight

OFFLOAD_MIN_BATCH = 32     # llama.cpp's GGML_OP_OFFLOAD_MIN_BATCH: a batch this big runs CPU weights on a GPU


def run_experts(m, il: int, x, ids, weights, names: tuple[str, str, str], logits=None, act: str = "swiglu",
                biases: tuple[str, str, str] | None = None):
    """Routed gated experts of layer il: x (T, D), ids/weights (T, K) on the attention device; returns
    (T, D) there. act: the gated activation (moert.activations.ACTS); biases: the names of the gate, up and down
    expert bias tensors ((E, F), (E, F), (E, D)), or None. Each expert runs where the plan put its weights (the
    three layouts above); only activations move. All on the attention's GPU with its fused kernel: no host read.
    logits: the router's (T, E), for traces with trace="full" (optional)."""
    ffn = (names, act, biases)
    src = _devices.device_of(x, m.plan.devices)
    layout = m.cached(("layout", ffn), lambda: ExpertLayout.of(m.weights, (*names, *(biases or ())),
                                                              m.config.n_expert))
    y = _on_device(m, il, layout, ffn, x, ids, weights, src)
    if y is not None:
        return y
    if src is not CPU and layout.home is CPU and m.expert_cache is None and offload_gpu(m, CPU, src, len(x)) is None:
        return m.cross((x, ids, weights), src, lambda *h: run_experts(m, il, *h, names, logits, act, biases))
    ids_h = ids if src is CPU else m.to(ids, CPU, "expert ids")          # (T, K) host: counts, masks
    counts = np.bincount(ids_h.reshape(-1), minlength=m.config.n_expert)
    m.record_routing(il, counts, ids_h, weights, logits)
    for dev in layout.devices:                                      # every worker's layer ready at the first call
        if dev.kind == "ray" and dev.lost is None:
            _remote_key(m, ffn, dev)
    cache = getattr(m, "expert_cache", None)
    if cache is not None:                                           # moert/dynamic/runtime.py: hits there
        return cache.run(m, il, ffn, x, ids_h, weights, counts, src,
                         lambda ids_m, counts_m: _placed(m, il, layout, ffn, x, ids_m, ids_m, weights, counts_m, src))
    return _placed(m, il, layout, ffn, x, ids, ids_h, weights, counts, src)


def cpu_layer(m, names: tuple[str, str, str], act: str = "swiglu"):
    """The CPU kernel object run_experts calls for a layer whose gate/up/down (names) are all whole on the CPU,
    without biases (a kernels.moe_fused.PreparedExperts where the fused kernel takes the types); None when they
    are elsewhere or split."""
    ffn = (names, act, None)
    layout = m.cached(("layout", ffn), lambda: ExpertLayout.of(m.weights, names, m.config.n_expert))
    return _cpu_layer(m, ffn) if layout.home is CPU else None


def _placed(m, il: int, layout: ExpertLayout, ffn, x, ids, ids_h, weights, counts: np.ndarray, src: Device):
    """The selected experts of layer il (ids (T, K), -1: skipped; ids_h their host copy, counts (E,) of them) run
    where the plan put them; (T, D) on src."""
    if layout.home is not None and layout.home.kind != "ray":
        return _on(m, layout.home, ffn, x, ids_h if layout.home is CPU else ids, weights, counts, src)
    if layout.home is None and layout.owner is None:                # tensors of one expert apart
        with m.phase("experts", src):
            return dispatch(x, ids, weights, counts, _by_matmul(m, ffn, src), src.xp)
    if layout.home is not None:                                     # every expert on one Ray worker
        parts = [(layout.home, ids_h, counts)]
    else:
        owner = layout.owner[ids_h]                                 # (T, K) device index of each slot
        parts = [(dev, np.where(owner == j, ids_h, -1).astype(np.int32),   # (T, K): -1 = another device's slot
                  np.where(layout.owner == j, counts, 0)) for j, dev in enumerate(layout.devices) if (owner == j).any()]
    # Ray workers first, all at once; local devices meanwhile; then the workers' partial sums (moert/cluster/actors.py)
    if any(dev.kind == "ray" for dev, _, _ in parts):
        x_h = x if src is CPU else m.to(x, CPU, "hidden")                # (T, D) host: what the workers get
        w_h = weights if src is CPU else m.to(weights, CPU, "expert weights")
    sent = [(dev, ids_d, _remote_start(m, ffn, dev, x_h, ids_d, w_h))
            for dev, ids_d, _ in parts if dev.kind == "ray"]
    if any(h is not None for _, _, h in sent):                      # a compiled graph runs them all now
        type(sent[0][0]).start([h for _, _, h in sent if h is not None])
    y = None
    for dev, ids_d, counts_d in parts:
        if dev.kind != "ray":
            part = _on(m, dev, ffn, x, ids_d, weights, counts_d, src)
            y = part if y is None else y + part
    got = _remote_wait(m, il, sent)                                  # one wait for all of them
    for dev, ids_d, handle in sent:
        part = got.get(dev.name)
        if part is None:                                            # lost, or the wait failed: one by one
            part = _remote_finish(m, il, ffn, dev, handle, (x_h, ids_d, w_h))
        part = part if src is CPU else m.to(part, src, "expert output")
        y = part if y is None else y + part
    return y


def _on(m, dev: Device, ffn, x, ids, weights, counts: np.ndarray, src: Device):
    """The experts that `ids` selects (-1: skipped), all held by dev, run on dev (a big batch's CPU experts: on a
    GPU, `offload_gpu`); (T, D) on src."""
    names, act, biases = ffn
    gpu = offload_gpu(m, dev, src, ids.shape[0])
    if gpu is not None and _offload_fits(m, gpu, ffn, counts, x):
        return _offloaded(m, gpu, ffn, x, ids, weights, counts, src)
    if src is not dev:
        ids, weights, x = m.to(ids, dev, "expert ids"), m.to(weights, dev, "expert weights"), \
            m.to(x, dev, "hidden")
    with m.phase("experts", dev):
        if dev is CPU:                          # the quantized bytes, read by the Numba kernels
            y = _cpu_layer(m, ffn)(x, ids, weights)
        else:
            ts = [m.weights[n] for n in names]
            bs = [m.weights[n] for n in biases] if biases else None
            y = fused_moe(dev, ts, bs, act, x, ids, weights) if int(counts.sum()) == ids.size else None   # no -1
            if y is None:
                y = dispatch(x, ids, weights, counts, _expert_ffn(ts, bs, act, dev.xp), dev.xp)
    return y if src is dev else m.to(y, src, "expert output", pinned=True)    # the pinned crossing back


def _expert_ffn(ts: list, bs: list | None, act: str, xp):
    """run(e, xs) for dispatch: expert e's gated FFN on xs (n, D) (activations.glu_ffn's, each matmul a Weight.matmul:
    blocks read in place where the device has kernels for the type, else dequantized), biases (F32 rows) added."""
    gate, up, down = ts

    def run(e: int, xs):
        b = None if bs is None else tuple(t.dequantize_expert(e) for t in bs)
        g, u = gate.matmul(xs, e), up.matmul(xs, e)                     # (n, F) each
        if b is not None:
            g, u = g + b[0], u + b[1]
        y = down.matmul(glu(g, u, act, xp), e)                          # (n, D)
        return y if b is None else y + b[2]
    return run


def _on_device(m, il: int, layout: ExpertLayout, ffn, x, ids, weights, src: Device):
    """Layer il's experts, all whole on the GPU src whose fused MoE kernel takes them, when nothing needs the ids on
    the host (no expert cache, trace, virtual clock: m.record_routing_on_device counts them on src): (T, D) on src,
    nothing read back. Else None: the ids go to the host."""
    names, act, biases = ffn
    ts = [m.weights[n] for n in names] if src.is_gpu and layout.home is src and m.expert_cache is None else None
    if ts is None or not takes(src, ts) or not m.record_routing_on_device(il, ids, src):
        return None
    with m.phase("experts", src):
        return fused_moe(src, ts, [m.weights[n] for n in biases] if biases else None, act, x, ids, weights)


def _remote_start(m, ffn, dev, x, ids, weights):
    """Send a Ray worker its (token, expert, weight) pairs of this layer (x, ids, weights on the host); returns at
    once with a handle (None when the worker is lost and the host runs its experts, `dev.fallback`)."""
    if dev.lost is not None:
        if dev.fallback != "cpu":
            raise dev.lost
        return None
    return dev.submit(_remote_key(m, ffn, dev), x, ids, weights)


def _remote_key(m, ffn, dev) -> int:
    """The worker's key for this layer, which it prepared (and compiled the kernels of) when first asked."""
    names, act, biases = ffn
    return m.cached(("remote layer", ffn, dev.name), lambda: dev.prepare(names, act, biases))


def _remote_wait(m, il: int, sent) -> dict:
    """Every live worker's partial sum, waited for together (device name -> (T, D)); {} when one of them failed
    (then `_remote_finish` asks each, to say which, or to fall back)."""
    live = [(dev, h) for dev, _, h in sent if h is not None]
    if not live:
        return {}
    try:
        with m.phase("experts", "+".join(dev.name for dev, _ in live)):
            return dict(zip((dev.name for dev, _ in live), type(live[0][0]).collect_many(live, il)))
    except RemoteDeviceError:
        return {}


def _remote_finish(m, il: int, ffn, dev, handle, args) -> np.ndarray:
    """The worker's (T, D) partial sum on the host. A worker that died or hung is a RemoteDeviceError naming it
    and the layer, or with dev.fallback == "cpu" the host runs its experts from the mapped file from then on."""
    if handle is not None:
        try:
            with m.phase("experts", dev):
                return dev.collect(handle, il)
        except RemoteDeviceError as e:
            dev.lose(e)                     # no more calls to it; with fallback "cpu" a warning, and the host runs it
            if dev.fallback != "cpu":
                raise
    with m.phase("experts", CPU):
        dev.remote.fallback_calls += 1
        return _cpu_layer(m, ffn, dev)(*args)


def op_offload_gpu(m, n_tokens: int, prefer: Device | None = None) -> Device | None:
    """The GPU a batch of n_tokens runs CPU weights' matmuls on (llama.cpp's op offload: n_tokens >=
    m.offload_min_batch, GGML_OP_OFFLOAD_MIN_BATCH = 32, 0 never; `prefer` if a GPU, else the first), or None."""
    n = getattr(m, "offload_min_batch", OFFLOAD_MIN_BATCH)
    gpus = [d for d in m.plan.devices if d.kind in ("cuda", "sim")] if n and n_tokens >= n else []
    return (prefer if prefer in gpus else gpus[0]) if gpus else None


def offload_gpu(m, dev: Device, src: Device, n_tokens: int) -> Device | None:
    """op_offload_gpu for dev's experts (src, the attention's GPU, first) when dev is the CPU and no expert cache
    moves them instead; None: they run on dev."""
    return None if dev is not CPU or getattr(m, "expert_cache", None) is not None else op_offload_gpu(m, n_tokens, src)


def _offload_fits(m, gpu: Device, ffn, counts: np.ndarray, x) -> bool:
    """Whether the selected experts' copies, one expert's float32 gate/up/down and the batch's activations fit what
    is free on gpu now (the memory estimate reserves no room for op offload: where they do not fit, the CPU runs
    them, as without it)."""
    names, _, biases = ffn
    ws = [m.weights[n] for n in (*names, *(biases or ()))]
    copies = int(np.count_nonzero(counts)) * sum(_cpu_view(w)[0].nbytes for w in ws)
    scratch = 4 * sum(int(np.prod(w.shape[1:])) for w in ws) + 4 * int(x.size) * 8
    return gpu.free_bytes is None or copies + scratch <= gpu.free_bytes


def _offloaded(m, gpu: Device, ffn, x, ids, weights, counts: np.ndarray, src: Device):
    """The CPU experts that `ids` selects, run on gpu: the blocks of each selected expert's tensors copied there for
    this call only (counted as TransferStats.offload_bytes), the activations moved; (T, D) on src."""
    names, act, biases = ffn
    sel = np.flatnonzero(counts)                                    # (n,) the experts with tokens here

    def copy(name: str) -> Weight:                                  # expert e of the copy is data[sel.index(e)]
        w = m.weights[name]
        host = np.ascontiguousarray(_cpu_view(w)[sel])              # (n, rows, row bytes) or (n, F) floats
        data = m.copy_weights(host, gpu, f"{name} (offload)", kind="offload")
        return Weight(name, w.type, tuple(w.shape), gpu, data, experts=tuple(sel.tolist()))

    ts = [copy(n) for n in names]
    bs = [copy(n) for n in biases] if biases else None
    try:
        x, ids, weights = m.to(x, gpu, "hidden"), m.to(ids, gpu, "expert ids"), m.to(weights, gpu, "expert weights")
        with m.phase("experts", gpu):
            y = dispatch(x, ids, weights, counts, _expert_ffn(ts, bs, act, gpu.xp), gpu.xp)
    finally:
        for t in ts + (bs or []):
            gpu.free(t.data)
    return y if src is gpu else m.to(y, src, "expert output")


def _by_matmul(m, ffn, src: Device):
    """run(e, xs) for dispatch on src when expert e's gate, up and down live on different devices: each
    matmul runs where its weight is (its bias row joins it there); xs, the hidden units and the output move
    (counted)."""
    names, act, biases = ffn
    gate, up, down = (m.weights[n] for n in names)
    bg, bu, bd = (m.weights[n] for n in biases) if biases else (None, None, None)

    def at(t, e: int) -> Device:
        return t.device_of(e) if isinstance(t, SplitWeight) else t.device

    def matmul(xs, t, b, e: int):
        dev = at(t, e)
        y = m.to(xs, dev, "hidden") @ t.dequantize_expert(e).T                  # (n, out) on dev
        return y if b is None else y + m.to(b.dequantize_expert(e), dev, "expert bias")

    def run(e: int, xs):
        dd = at(down, e)
        g = m.to(matmul(xs, gate, bg, e), dd, "expert hidden")                  # (n, F) on dd
        u = m.to(matmul(xs, up, bu, e), dd, "expert hidden")
        return m.to(matmul(glu(g, u, act, dd.xp), down, bd, e), src, "expert output")   # (n, D) on src
    return run


def _cpu_layer(m, ffn, dev: Device = CPU):
    """f(x, ids, weights) for a CPU expert layer: one parallel region for the layer
    (kernels/moe_fused.py), or kernels/moe.py for types the fused kernel does not take. Ids of -1 are
    skipped. A tensor split over experts is read through its `dev` piece's view of the whole tensor (dev: the
    CPU, or a lost remote worker whose experts the host runs from the mapped file)."""
    names, act, biases = ffn

    def make():
        ws = [m.weights[n] for n in names]
        qs = [QTensor(_cpu_view(w, dev), w.type, tuple(w.shape)) for w in ws]
        b = None if not biases else tuple(_cpu_floats(m.weights[n], dev) for n in biases)
        fused = all(_readable(q.type) for q in qs) and qs[0].type == qs[1].type       # moe_fused.supports
        if not fused and _floats_fit(m):
            qs = _as_floats(m, names, qs)
        return expert_layer(qs, b, act, m.act_quant, m.repack)
    return m.cached(("cpu experts", ffn, dev.name), make)


# A model whose CPU expert tensors of types without a fused kernel (Q5_0, Q4_0, Q4_1, ...: kernels/ktypes.py
# lists the types with one) take at most this many bytes as a readable copy keeps them so, made once: the fused
# kernel then reads the copy, instead of kernels/moe.py dequantizing each selected expert on every call (the demo
# model's Q5_0 ffn_down: half its layers, a third of its decode step). Q4_0 and Q5_0 become Q8_0 exactly (a
# block keeps its scale d, each weight q - 8 or q - 16 as int8: 34 bytes a block); other types float32.
FLOAT_EXPERTS_BYTES = 256 << 20
_AS_Q8_0 = {"Q4_0": 18, "Q5_0": 22}            # bytes a 32-weight block: f16 d first, then the quants


def _readable(type_name: str) -> bool:
    """Whether the fused kernel reads tensors of this type."""
    from moert.kernels.moe_fused import supports as fused_supports

    q = QTensor(np.zeros(0, np.uint8), type_name, (0, 0, 0))
    return fused_supports(q, q, q)


def _copy_bytes(w) -> int:
    n = int(np.prod(w.shape))
    return n // 32 * 34 if w.type in _AS_Q8_0 else 4 * n


def _floats_fit(m) -> bool:
    """Whether readable copies of the model's CPU expert tensors of types the fused kernel cannot read fit
    FLOAT_EXPERTS_BYTES (worked out once per model)."""
    def total() -> int:
        return sum(_copy_bytes(w) for n, w in m.weights.items() if "_exps." in n and len(w.shape) == 3
                   and not isinstance(w, SplitWeight) and w.device is CPU and not _readable(w.type))
    return m.cached(("float experts bytes",), total) <= FLOAT_EXPERTS_BYTES


def as_q8_0(raw: np.ndarray, type_name: str, shape: tuple) -> np.ndarray | None:
    """A Q4_0 / Q5_0 tensor's bytes as Q8_0 blocks holding the same values (each block's d, int8 q - 8 or q - 16),
    (..., row_bytes * 34 / block bytes); None when a value does not come back exactly (never for GGUF's blocks)."""
    from moert.quants import dequantize

    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, _AS_Q8_0[type_name])
    v = dequantize(blocks, type_name, (blocks.shape[0], 32))                        # (nb, 32) float32
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)                     # (nb, 1)
    q = np.rint(np.divide(v, d, out=np.zeros_like(v), where=d != 0)).astype(np.int8)
    out = np.concatenate([blocks[:, :2], q.view(np.uint8)], axis=1)                 # (nb, 34) Q8_0
    if not np.array_equal(dequantize(out, "Q8_0", (blocks.shape[0], 32)), v):
        return None
    return out.reshape(*shape[:-1], shape[-1] // 32 * 34)


def _readable_copy(w, q: QTensor, as_float: bool) -> QTensor:
    """w's values in a type the fused kernel reads: Q8_0 for Q4_0 / Q5_0 (exact), else (or as_float) float32."""
    if w.type in _AS_Q8_0 and not as_float:
        raw = as_q8_0(w.data, w.type, q.shape)
        if raw is not None:
            return QTensor(raw, "Q8_0", q.shape)
    return QTensor(w.dequantize(), "F32", q.shape)                                  # (E, R, C)


def _as_floats(m, names, qs: list[QTensor]) -> list[QTensor]:
    """qs with each tensor of a type the fused kernel cannot read replaced by a readable copy, made once (gate and
    up both, unless both are of one readable type, and of one type); a tensor split over devices stays."""
    bad = [not _readable(q.type) for q in qs]
    bad[0] = bad[1] = bad[0] or bad[1] or qs[0].type != qs[1].type
    same = qs[0].type == qs[1].type                                 # else gate and up both as float32
    ws = [m.weights[n] for n in names]
    return [_readable_copy(w, q, i < 2 and not same) if b and not isinstance(w, SplitWeight) else q
            for i, (w, q, b) in enumerate(zip(ws, qs, bad))]


@dataclass
class ExpertLayout:
    """Where a layer's experts live: one device (`home`), or a device per expert the same for gate, up and
    down (`owner[e]` indexes `devices`), or neither (each expert's tensors apart: both None)."""

    home: Device | None
    devices: list[Device]
    owner: np.ndarray | None

    @classmethod
    def of(cls, store, names, n_expert: int) -> ExpertLayout:
        per = []
        for n in names:
            w = store[n]
            per.append([w.device_of(e) for e in range(n_expert)] if isinstance(w, SplitWeight)
                       else [w.device] * n_expert)
        if any(p != per[0] for p in per[1:]):
            remote = sorted({d.name for p in per for d in p if d.kind == "ray"})
            if remote:   # a worker runs whole experts: gate, up and down (and biases) of each together
                raise PlacementError(f"{', '.join(names)}: an expert's tensors are on different devices and some on "
                                     f"{', '.join(remote)}; a Ray worker needs all of an expert's tensors, so match "
                                     f"them with one rule, e.g. r'blk\\.3\\.ffn_.*_exps=RAY0'")
            return cls(None, [], None)
        devices = list(dict.fromkeys(per[0]))
        if len(devices) == 1:
            return cls(devices[0], devices, None)
        return cls(None, devices, np.array([devices.index(d) for d in per[0]], dtype=np.int64))


def _cpu_floats(w, dev: Device = CPU) -> np.ndarray:
    """A bias tensor (E, n) as float32 on the CPU: its CPU data (a split one's CPU piece views it whole)."""
    v = _cpu_view(w, dev)
    return v if w.type == "F32" else np.stack([w.dequantize_expert(e) for e in range(w.shape[0])])


def _cpu_view(w, dev: Device = CPU) -> np.ndarray:
    """The CPU bytes of a weight for the fused kernels: its data, or a split tensor's piece on dev (the CPU, or a
    remote worker: both keep a view of the whole mapped tensor, experts of other devices included, never read)."""
    if isinstance(w, SplitWeight):
        return next(p.data for p in w.pieces if p.device is dev)
    return w.data
