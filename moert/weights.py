"""The weight store: every tensor of a plan on its device, as its raw GGUF bytes (no dequantization at load).

    with gguf.open(path) as g:
        p = plan(g, [TensorOverride.cpu(r"\\.ffn_.*_exps")], gpu_backend="sim")
        w = load_weights(g, p)                  # name -> Weight(name, type, shape, device, data)
        wq = w["blk.0.attn_q.weight"].dequantize()           # float32 on sim:0
        e3 = w["blk.0.ffn_up_exps.weight"].dequantize_expert(3)  # one expert, float32 on the cpu

Layout of `Weight.data` (the same on every device):
    F32 tensors      float32, shaped like the tensor
    everything else  uint8 GGUF bytes shaped (*shape[:-1], row_bytes): data[e] is expert e of an
                     *_exps tensor, data[..., r, :] row r; quantized blocks never straddle a row.
On the cpu `data` is a zero-copy view of the memory-mapped file; on a GPU it is one upload of those bytes; on a
Ray worker (ray:N) the host keeps the view (never read, unless the worker is lost and the host runs its experts)
and the worker maps its own copy (moert/cluster/actors.py).

A tensor the plan split over experts is a `SplitWeight`: one `Weight` piece per device, each holding only
its experts' bytes on a GPU (data[i] is expert experts[i]), and on the cpu the zero-copy view of the whole
tensor (so the fused kernel reads its experts in place; pages of experts placed elsewhere are never read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from moert.devices import CPU, Device, format_size
from moert.errors import DeviceOutOfMemory, MoertError, PlacementError
from moert.kernels import matmul as kmatmul
from moert.kernels.qtensor import QTensor
from moert.placement import Plan
from moert.placement.memory import DEQUANT_CHUNK_ELEMENTS as _CHUNK_ELEMENTS  # bigger: row chunks on a GPU
from moert.placement.rules import format_experts

DENSE_CACHE_BYTES = 2 << 30  # default WeightStore.dense_cache_bytes: float32 copies of CPU dense weights kept


class LoadCancelled(MoertError):
    """The progress callback returned False: the load stopped and everything it placed was freed."""


@dataclass(eq=False)
class Weight:
    """One tensor on its device: raw GGUF bytes (or float32 for F32), dequantized on demand."""

    name: str
    type: str                        # GGML type name
    shape: tuple[int, ...]           # NumPy order: (n_expert, n_ff, n_embd) for blk.N.ffn_up_exps.weight
    device: Device
    data: Any                        # see the module docstring for the layout
    experts: tuple[int, ...] | None = None   # None: all experts; else the experts this piece holds
    tied_to: str | None = None       # output.weight loaded from token_embd.weight

    @property
    def nbytes(self) -> int:
        """Bytes this piece holds (its experts' share of a whole-tensor cpu view)."""
        if self.experts is None:
            return int(self.data.nbytes)
        return int(self.data.nbytes) // int(self.data.shape[0]) * len(self.experts)

    def dequantize_raw(self, raw: Any, shape: tuple[int, ...]) -> Any:
        """Raw GGUF rows of this tensor, on its device (a slice of `data`), as float32 `shape` there."""
        from moert import quants

        if self.type == "F32":
            return raw.reshape(shape)
        if self.device.kind == "cpu":
            return quants.dequantize_fast(raw.reshape(-1), self.type, shape)
        with self.device:
            return quants.dequantize(raw.reshape(-1), self.type, shape, xp=self.device.xp)

    def dequantize(self) -> Any:
        """The whole tensor as float32 on its own device (xp array); a sim device memoizes it (SimDevice.memo)."""
        if self.device.kind == "sim" and self.type != "F32":                # F32: a view, nothing to keep
            return self.device.memo(self, lambda: self.dequantize_raw(self.data, self.shape))
        return self.dequantize_raw(self.data, self.shape)

    def raw_expert(self, e: int) -> Any:
        """The bytes (or float32 rows) of expert e of an *_exps tensor, on this device: a view."""
        held = range(self.shape[0]) if self.experts is None else self.experts
        if len(self.shape) < 2 or e not in held:
            raise IndexError(f"{self.name} {self.shape}: no expert {e} here (holds experts "
                             f"{format_experts(held)})")
        if self.data.shape[0] == self.shape[0]:                         # the whole tensor's view
            return self.data[e]
        return self.data[self.experts.index(e)]

    def dequantize_expert(self, e: int) -> Any:
        """Expert e of an *_exps tensor as float32 (shape[1:]) on this device."""
        return self.dequantize_raw(self.raw_expert(e), self.shape[1:])

    def matmul(self, x, e: int | None = None) -> Any:
        """x (T, in) @ W.T (expert e's W of an *_exps tensor) on this weight's device: read from its blocks where it
        has kernels for the type (Device.block_kernels: kernels/gpu), else dequantized (big 2-D ones in row chunks)."""
        k = self.device.block_kernels(self.type) if self.type != "F32" else None
        if k is not None:
            raw, shape = (self.data, self.shape) if e is None else (self.raw_expert(e), self.shape[1:])
            with self.device:
                return k.matmul(raw, self.type, shape, x)               # (T, out)
        if e is not None:
            return x @ self.dequantize_expert(e).T
        rows = max(1, _CHUNK_ELEMENTS // self.shape[-1])
        if rows >= self.shape[0]:
            return x @ self.dequantize().T
        return self.device.xp.concatenate([x @ self.dequantize_rows(r, min(r + rows, self.shape[0])).T
                                           for r in range(0, self.shape[0], rows)], axis=1)   # (T, rows) each

    def dequantize_rows(self, start: int, stop: int) -> Any:
        """Rows [start, stop) of a 2-D tensor as float32 (stop - start, shape[-1]) on this device."""
        if len(self.shape) != 2:
            raise ValueError(f"{self.name} {self.shape}: dequantize_rows needs a 2-D tensor")
        return self.dequantize_raw(self.data[start:stop], (stop - start, self.shape[-1]))

    def __repr__(self) -> str:
        return f"Weight({self.name!r}, {self.type}, {self.shape}, {self.device.name}, {format_size(self.nbytes)})"


@dataclass(eq=False)
class SplitWeight:
    """A tensor split over experts: its pieces, one per (device, deciding rule)."""

    name: str
    type: str
    shape: tuple[int, ...]
    pieces: list[Weight]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    def piece_of(self, e: int) -> Weight:
        """The piece holding expert e."""
        for p in self.pieces:
            if e in p.experts:
                return p
        raise IndexError(f"{self.name} {self.shape}: no expert {e}")

    def device_of(self, e: int) -> Device:
        return self.piece_of(e).device

    def matmul(self, x, e: int) -> Any:
        return self.piece_of(e).matmul(x, e)                            # on the device holding expert e

    def dequantize_expert(self, e: int) -> Any:
        """Expert e as float32 on the device that holds it."""
        return self.piece_of(e).dequantize_expert(e)

    def __repr__(self) -> str:
        where = ", ".join(f"{format_experts(p.experts)} on {p.device.name}" for p in self.pieces)
        return f"SplitWeight({self.name!r}, {self.type}, {self.shape}: {where})"


class WeightStore(dict):
    """name -> Weight, with the plan that placed them and the open GGUF file their cpu views come from."""

    def __init__(self, plan: Plan, gguf: Any):
        super().__init__()
        self.plan = plan
        self.gguf = gguf  # kept open: cpu weights are views of its memory map
        # how the forward reads them (bind): the move across devices, CPU kernels' x rounding and layout
        self.move: Callable[..., Any] = lambda x, dev, what="": x
        self.act_quant: str | None = None
        self.repack = False
        # caches that make a token cheap: CPU dense weights dequantized once (float32, within the budget),
        # 1-D weights kept as float32 on the device that asked, prepared CPU kernels and expert layouts
        self.dense_cache_bytes = DENSE_CACHE_BYTES   # the budget; 0 turns the cache off
        self.dense: dict[str, np.ndarray] = {}
        self.small: dict[tuple, Any] = {}
        self.prepared: dict[Any, Any] = {}

    def bind(self, move: Callable[..., Any], act_quant: str | None = None, repack: bool = False) -> None:
        """How the forward reads the store: `move(x, dev, what)` (the model's counted transfer), CPU matmuls'
        act_quant and repack (moert.load's)."""
        self.move, self.act_quant, self.repack = move, act_quant, bool(repack)

    def pieces(self):
        """Every placed Weight: whole tensors and the pieces of split ones."""
        for w in self.values():
            yield from (w.pieces if isinstance(w, SplitWeight) else (w,))

    def bytes_by_device(self) -> dict[str, int]:
        out = dict.fromkeys(self.plan.device_names(), 0)
        for w in self.pieces():
            out[w.device.name] += w.nbytes
        return out

    def free(self) -> None:
        """Give every device allocation back (cpu views just drop) and empty the store and its caches."""
        self.dense.clear()
        self.small.clear()
        self.prepared.clear()
        for w in self.pieces():
            if w.device.kind not in ("cpu", "ray"):
                w.device.free(w.data)
        self.clear()

    # -- how the forward reads the store (Model.w / linear / linears call these)
    def tensor_name(self, name: str) -> str:
        """`name`, or the embedding output.weight is tied to; a KeyError naming a tensor the model lacks."""
        if name not in self and name == "output.weight":   # tied to the embedding
            return "token_embd.weight"
        if name not in self:
            raise KeyError(f"the model has no tensor {name!r}; `moert inspect MODEL` lists its tensors")
        return name

    def w(self, name: str, dev: Device | None = None):
        """Weight `name` as float32 on dev (default: where it lives), dequantized on its own device. 1-D
        weights (norms, biases: kilobytes) are kept as float32 on the device that asked, not redone per call;
        quantized CPU weights used on the CPU (MLA's attn_k_b / attn_v_b) share `linear`'s dense cache."""
        key = (name, dev)
        a = self.small.get(key)
        if a is not None:
            return a
        name = self.tensor_name(name)
        t = self[name]
        if getattr(t, "device", None) is CPU and dev in (None, CPU) and len(t.shape) > 1 and t.type != "F32":
            a = self.dense.get(name)
            if a is None:
                a = t.dequantize()
                if self.dense_bytes() + a.nbytes <= self.dense_cache_bytes:
                    self.dense[name] = a
            return a
        a = t.dequantize()
        a = a if dev is None else self.move(a, dev, name)
        if len(t.shape) == 1:
            self.small[key] = a
        return a

    def linear(self, x, name: str, dev: Device | None = None):
        """x (T, in) @ W.T for the 2-D weight `name` (out, in), on dev (default: where W lives): (T, out).

        On the CPU a type with a fused kernel (moert.kernels.matmul: Q8_0, Q4_K, Q6_K, ...) is read straight
        from its quantized bytes; any other type is dequantized once and kept as float32 (up to
        `dense_cache_bytes` in all), not once per token. On a GPU, Weight.matmul: its blocks read in place by a kernel,
        else dequantized per call in row chunks. A weight used elsewhere is dequantized at home and moved (counted)."""
        mm = self.prepared.get(name)                                   # the per-token path: a CPU kernel
        if mm is not None and (dev is None or dev is CPU):
            return mm(x)                                                # (T, out)
        asked, name = name, self.tensor_name(name)
        t = self[name]
        dev = t.device if dev is None else dev
        if t.device is not dev:
            return x @ self.w(name, dev).T
        if dev is CPU and _has_kernel(t):
            return self.cpu_matmul(asked)(x)                            # (T, out)
        if dev is CPU:
            w = self.dense.get(name)
            if w is None and t.type == "F32":
                w = t.data                                              # the file's own floats
            if w is None and self.dense_bytes() + 4 * t.shape[0] * t.shape[1] <= self.dense_cache_bytes:
                w = self.dense[name] = t.dequantize()                  # (out, in) float32, kept
            if w is not None:
                return x @ w.T
        return t.matmul(x)                          # a GPU kernel reads the blocks in place, or dequantized in chunks

    def linears(self, x, names: tuple[str, ...], dev: Device | None = None) -> tuple:
        """linear(x, name, dev) for each of names, weights that read the same x (q, k, v): on the CPU, three
        with fused kernels run as one parallel region (kernels.matmul.PreparedGroup), else one by one."""
        g = self.prepared.get(names)
        if g is None:
            g = self._group(names)
        if g and (dev is None or dev is CPU):
            return g(x)
        return tuple(self.linear(x, n, dev) for n in names)

    def _group(self, names: tuple[str, ...]):
        """The PreparedGroup of three CPU weights with kernels reading one x (made once), or False."""
        ts = [self[self.tensor_name(n)] for n in names]
        ok = len(ts) == 3 and all(_has_kernel(t) and len(t.shape) == 2 for t in ts) \
            and len({t.shape[1] for t in ts}) == 1
        g = self.prepared[names] = kmatmul.PreparedGroup(
            [QTensor(t.data, t.type, tuple(t.shape)) for t in ts], self.act_quant, self.repack) if ok else False
        return g

    def cpu_matmul(self, name: str) -> kmatmul.Prepared | None:
        """The CPU kernel of x @ W.T for the 2-D weight `name` (kernels.matmul.Prepared, made once; what `linear`
        runs on the CPU), or None when W is not on the CPU or its type has no fused kernel (F32: NumPy's `@`)."""
        mm = self.prepared.get(name)
        if mm is None:
            t = self[self.tensor_name(name)]
            if not _has_kernel(t) or len(t.shape) != 2:
                return None
            mm = self.prepared[name] = kmatmul.Prepared(QTensor(t.data, t.type, tuple(t.shape)), self.act_quant,
                                                        self.repack)
        return mm

    def cpu_matmuls(self, names: tuple[str, ...]) -> list | None:
        """cpu_matmul of each of names; of q, k, v the PreparedGroup's own parts where `linears` groups them (one
        copy of a repacked weight). None when one of them has no CPU kernel."""
        g = self.prepared.get(names)
        if g is None:
            g = self._group(names)
        mms = g.parts if g else [self.cpu_matmul(n) for n in names]
        return None if any(mm is None for mm in mms) else list(mms)

    def dense_bytes(self) -> int:
        return sum(a.nbytes for a in self.dense.values())

    def cached(self, key, make):
        """A value made once per store (prepared CPU kernels, expert layouts); freed by free()."""
        v = self.prepared.get(key)
        if v is None:
            v = self.prepared[key] = make()
        return v

    @property
    def repacked_bytes(self) -> int:
        """Bytes of the CPU weights copied into kernels/repack.py's layout so far."""
        return sum(getattr(v, "packed_bytes", 0) for v in self.prepared.values())


def _has_kernel(t) -> bool:
    """Whether `linear` reads t (a Weight, or a SplitWeight) with a CPU kernel: on the CPU, a type with one, not F32."""
    return getattr(t, "device", None) is CPU and t.type in kmatmul.MATMUL_TYPES and t.type != "F32"


def _host_view(g: Any, src: str, typ: str, shape: tuple[int, ...]) -> np.ndarray:
    raw = g.raw(src)                                                    # uint8, 1-D, zero-copy
    if typ == "F32":
        return raw.view(np.float32).reshape(shape)
    return raw.reshape(*shape[:-1], -1) if len(shape) > 1 else raw      # (*shape[:-1], row_bytes)


def _progress_bar(total: int) -> Callable[[float], bool]:
    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="loading weights", leave=False,
               delay=0.5)   # a load that maps the file takes milliseconds: no bar at all

    def update(fraction: float) -> bool:
        bar.update(int(fraction * total) - bar.n)
        if fraction >= 1.0:
            bar.close()
        return True

    update.close = bar.close  # type: ignore[attr-defined]
    return update


def load_weights(gguf: Any, plan: Plan, progress: Callable[[float], bool] | bool | None = None) -> WeightStore:
    """Place every tensor of `plan` on its device; `progress(fraction) -> False` cancels (LoadCancelled).

    `gguf` is an open GGUFFile (or a path, opened and kept open by the store). progress=None shows a tqdm
    bar, False shows nothing. A DeviceOutOfMemory frees what was placed and names the tensor and its bytes.
    """
    if not hasattr(gguf, "raw"):
        from moert import gguf as gguf_module

        gguf = gguf_module.open(gguf)
    for e in plan:
        src = e.tied_to or e.name
        t = gguf.tensors.get(src)
        if t is None or t.type != e.type or tuple(t.shape) != tuple(e.shape):
            found = "missing" if t is None else f"{t.type} {tuple(t.shape)}"
            raise PlacementError(f"the plan does not match {gguf.path}: tensor {src!r} is {found} in the file but "
                                 f"{e.type} {e.shape} in the plan; make the plan from this file")
    total = sum(e.nbytes for e in plan) or 1
    report = _progress_bar(total) if progress is None else (progress or None)
    store = WeightStore(plan, gguf)
    done = 0
    try:
        for e in plan:
            dev = plan.device(e.device)
            host = _host_view(gguf, e.tied_to or e.name, e.type, e.shape)
            on_host = dev is CPU or dev.kind == "ray"     # a Ray worker's experts: the host keeps the mapped view
            if e.experts is not None and not on_host:                   # a GPU gets only its experts' bytes
                lo, hi = e.experts[0], e.experts[-1] + 1
                host = host[lo:hi] if hi - lo == len(e.experts) else host[list(e.experts)]
            data = host if on_host else dev.put(host, what=e.label)
            w = Weight(e.name, e.type, tuple(e.shape), dev, data, e.experts, e.tied_to)
            if e.experts is None:
                store[e.name] = w
            else:
                store.setdefault(e.name, SplitWeight(e.name, e.type, tuple(e.shape), [])).pieces.append(w)
            done += e.nbytes
            if report is not None and report(done / total) is False:
                raise LoadCancelled(f"loading {gguf.path} was cancelled by the progress callback after "
                                    f"{len(store)} of {len(plan)} tensors; everything placed so far was freed")
    except DeviceOutOfMemory as err:
        store.free()
        raise _named(err) from None
    except BaseException:
        store.free()
        raise
    finally:
        if progress is None and report is not None:
            report.close()  # type: ignore[attr-defined]
    return store


def _named(err: DeviceOutOfMemory) -> DeviceOutOfMemory:
    """The same error, naming the tensor and its size (strategies.with_fit_suggestion adds a plan that fits)."""
    return DeviceOutOfMemory(err.device, err.requested, err.used, err.capacity,
                             f"tensor {err.what} ({format_size(err.requested)})")


__all__ = ["LoadCancelled", "SplitWeight", "Weight", "WeightStore", "load_weights"]
