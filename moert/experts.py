"""Routed experts, run where the plan put them: weights never move, activations do (counted).

    run_experts(m, il, x, ids, weights, names)   what Model.experts does for an architecture

Three layouts of a layer's gate/up/down (ExpertLayout):
  one device holds every expert         x, ids and weights go there, the output comes back;
  experts split over devices            each device runs the (token, slot) pairs of its experts, the other
                                        slots marked -1 (skipped by the kernels), partial outputs summed;
  an expert's three tensors apart       each matmul runs where its weight is, the activations move.
On the CPU the fused Numba kernel (kernels/moe_fused.py) reads the quantized bytes in place.

Dimension legend: T tokens, D hidden, F expert hidden, E experts, K experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moert import devices as _devices
from moert.devices import CPU, Device
from moert.kernels.moe import QTensor, moe_ffn
from moert.kernels.moe_fused import PreparedExperts
from moert.kernels.moe_fused import supports as fused_supports
from moert.layers import silu, swiglu
from moert.moe import dispatch
from moert.weights import SplitWeight


def run_experts(m, il: int, x, ids, weights, names: tuple[str, str, str], logits=None):
    """Routed SwiGLU experts of layer il: x (T, D), ids/weights (T, K) on the attention device; returns
    (T, D) there. Each expert runs where the plan put its weights; only activations move:
      one device holds the layer's experts   x, ids, weights go there, the output comes back;
      experts split over devices             each device runs the (token, slot) pairs of its experts
                                             (the others marked -1), partial outputs summed here;
      gate/up/down of an expert apart        each matmul runs where its weight is, activations move.
    logits: the router's (T, E), for traces with trace="full" (optional)."""
    src = _devices.device_of(x, m.plan.devices)
    layout = m.cached(("layout", names), lambda: ExpertLayout.of(m.weights, names, m.config.n_expert))
    ids_h = ids if src is CPU else m.to(ids, CPU, "expert ids")          # (T, K) host: counts, masks
    counts = np.bincount(ids_h.reshape(-1), minlength=m.config.n_expert)
    m.record_routing(il, counts, ids_h, weights, logits)
    if layout.home is not None:
        return _on(m, layout.home, names, x, ids_h if layout.home is CPU else ids, weights, counts, src)
    if layout.owner is None:                                        # tensors of one expert apart
        with m.phase("experts", src):
            return dispatch(x, ids, weights, counts, _by_matmul(m, names, src), src.xp)
    owner = layout.owner[ids_h]                                     # (T, K) device index of each slot
    y = None
    for j, dev in enumerate(layout.devices):
        mask = owner == j
        if not mask.any():
            continue
        ids_d = np.where(mask, ids_h, -1).astype(np.int32)          # (T, K): -1 = another device's slot
        part = _on(m, dev, names, x, ids_d, weights, np.where(layout.owner == j, counts, 0), src)
        y = part if y is None else y + part
    return y

def _on(m, dev: Device, names, x, ids, weights, counts: np.ndarray, src: Device):
    """The experts of `names` that `ids` selects (-1: skipped), all held by dev, run on dev; (T, D) on src."""
    if src is not dev:
        ids, weights, x = m.to(ids, dev, "expert ids"), m.to(weights, dev, "expert weights"), \
            m.to(x, dev, "hidden")
    with m.phase("experts", dev):
        if dev is CPU:                          # the quantized bytes, read by the Numba kernels
            y = _cpu_layer(m, names)(x, ids, weights)
        else:
            ts = [m.weights[n] for n in names]

            def run(e: int, xs):
                return swiglu(xs, *(t.dequantize_expert(e) for t in ts), dev.xp)
            y = dispatch(x, ids, weights, counts, run, dev.xp)
    return y if src is dev else m.to(y, src, "expert output")

def _by_matmul(m, names, src: Device):
    """run(e, xs) for dispatch on src when expert e's gate, up and down live on different devices: each
    matmul runs where its weight is; xs, the hidden units and the output move (counted)."""
    gate, up, down = (m.weights[n] for n in names)

    def at(t, e: int) -> Device:
        return t.device_of(e) if isinstance(t, SplitWeight) else t.device

    def run(e: int, xs):
        dg, du, dd = at(gate, e), at(up, e), at(down, e)
        g = m.to(xs, dg, "hidden") @ gate.dequantize_expert(e).T                # (n, F) on dg
        u = m.to(xs, du, "hidden") @ up.dequantize_expert(e).T                  # (n, F) on du
        h = silu(m.to(g, dd, "expert hidden"), dd.xp) * m.to(u, dd, "expert hidden")
        return m.to(h @ down.dequantize_expert(e).T, src, "expert output")     # (n, D) on src
    return run

def _cpu_layer(m, names: tuple[str, str, str]):
    """f(x, ids, weights) for a CPU expert layer: one parallel region for the layer
    (kernels/moe_fused.py), or kernels/moe.py for types the fused kernel does not take. Ids of -1 are
    skipped. A tensor split over experts is read through its CPU piece's view of the whole tensor."""
    def make():
        qs = [QTensor(_cpu_view(m.weights[n]), m.weights[n].type, tuple(m.weights[n].shape)) for n in names]
        if fused_supports(*qs):
            return PreparedExperts(*qs, act_quant=m.act_quant)
        return lambda x, ids, weights: moe_ffn(x, ids, weights, *qs)
    return m.cached(("cpu experts", names), make)


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
            return cls(None, [], None)
        devices = list(dict.fromkeys(per[0]))
        if len(devices) == 1:
            return cls(devices[0], devices, None)
        return cls(None, devices, np.array([devices.index(d) for d in per[0]], dtype=np.int64))


def _cpu_view(w) -> np.ndarray:
    """The CPU bytes of a weight for the fused kernels: its data, or a split tensor's CPU piece (a view of the
    whole tensor, experts of other devices included and never read)."""
    if isinstance(w, SplitWeight):
        return next(p.data for p in w.pieces if p.device is CPU)
    return w.data
