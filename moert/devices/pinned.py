"""A GPU's crossing to the host and back for the CPU experts of a hybrid placement (-ngl all -cmoe): static pinned
host buffers, asynchronous copies on the device's stream, and an event the host waits on (not a device sync).

    cr = crossing(dev)                 one per GPU, its buffers reused by every layer (grown to the largest T seen)
    host = cr.down(packed)             packed (T, W) int32 on dev -> the host: copied into the static device buffer
                                       (stage), a device->host copy into pinned memory enqueued, an event recorded
                                       and waited on (fetch); returns a host copy (T, W): the pinned buffer is reused
    y_dev = cr.up(y)                   y (T, D) float32 on the host -> dev: written into the pinned up buffer (after
                                       its last copy out of it is known done), a host->device copy enqueued into a
                                       static device buffer (send); a fresh (T, D) array on dev copied from it (landed)

stage and landed are device operations, fetch and send the host's: a decode step captured as graph segments ends a
segment with stage and begins the next with landed (moert/devices/graph.py's hop).

On CUDA (CuPy): cupy.cuda.alloc_pinned_memory, ndarray.get(stream=, out=) / set(stream=), cupy.cuda.Event. The copies
are asynchronous only because the host side is pinned; the host then waits on the down copy's event alone, so work
queued on other streams is not waited for. This branch has never run on a GPU.

On the sim device the same order is simulated (SimLink): the stream numbers each enqueued copy, an event records the
number, a wait marks the stream done up to it (one host read, SimDevice.host_reads). A pinned buffer whose copy in
was not waited for holds garbage (0xFF bytes) and reading it raises CrossingError, as would writing into one whose
copy out is not known done: the bugs a real GPU shows as wrong numbers, not errors. `log` keeps the order of the
operations (tests/test_gpu_crossing.py). Counted as one d2h and one h2d per crossing, as before.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from moert.errors import MoertError

__all__ = ["Crossing", "CrossingError", "SimEvent", "SimLink", "SimPinned", "crossing"]


class CrossingError(MoertError, RuntimeError):
    """The host touched a pinned buffer before the copy into (or out of) it was waited for."""


def crossing(dev) -> Crossing | None:
    """dev's crossing (made on first use), or None for a device that has none (the CPU, a remote worker)."""
    if dev.kind not in ("sim", "cuda"):
        return None
    got = getattr(dev, "_crossing", None)
    if got is None:
        got = dev._crossing = Crossing(dev)
    return got


class Crossing:
    """Static pinned host buffers, static device buffers and an event: the GPU<->CPU crossing of one device."""

    def __init__(self, dev):
        self.dev = dev
        self.link = SimLink(dev) if dev.kind == "sim" else CudaLink(dev)
        self._bufs: dict = {}               # (direction, width, dtype) -> (pinned host buffer, static device buffer)
        self._up_event = None               # the last up copy's event (its pinned buffer is read until it is done)
        self._landed = None                 # the static device rows the last up copy writes
        self._down_event = self.link.event()

    def _buffers(self, which: str, T: int, W: int, dtype) -> tuple:
        """The pinned and device buffers (rows >= T, W) of dtype for one direction and width (the experts' packed
        rows, the logits with the expert counts: each its own, none reallocated per call), made again for more rows
        when too small."""
        key = (which, W, np.dtype(dtype).str)
        got = self._bufs.get(key)
        if got is None or got[0].shape[0] < T:
            rows = T                                             # a chunk is at most n_batch rows: few sizes
            if got is not None and which == "up" and self._up_event is not None:
                self._up_event.synchronize()                     # the old pinned buffer is read until then
            got = self._bufs[key] = (self.link.pinned((rows, W), dtype),
                                     self.dev.empty((rows, W), dtype, f"crossing: static device buffer ({which})"))
        return got

    def down(self, packed) -> np.ndarray:
        """packed (T, W) on the device -> a (T, W) host array: one device->host copy into pinned memory, one wait."""
        self.stage(packed)
        return self.fetch(*packed.shape, packed.dtype)

    def stage(self, packed) -> None:
        """packed (T, W) into the static device buffer the copy down reads: a device operation, which a captured
        segment may end with (moert/devices/graph.py's hop)."""
        T, W = packed.shape
        self._buffers("down", T, W, packed.dtype)[1][:T] = packed

    def fetch(self, T: int, W: int, dtype=np.int32) -> np.ndarray:
        """The staged (T, W) rows to the host: the copy enqueued, an event recorded, the host waiting on it alone."""
        host, dbuf = self._buffers("down", T, W, dtype)
        t0 = time.perf_counter()
        self.link.copy_down(dbuf[:T], host, T)                    # enqueued; asynchronous on CUDA (pinned host side)
        self._down_event.record()
        self._down_event.synchronize()                            # the host waits for this copy, not the device
        out = np.array(self.link.read(host, T), copy=True)        # the pinned buffer is reused by the next layer
        self.dev._count("d2h", out.nbytes, time.perf_counter() - t0)
        return out

    def up(self, y: np.ndarray):
        """y (T, D) on the host -> a (T, D) array on the device: written into pinned memory, one host->device copy."""
        self.send(y)
        return self.landed()

    def send(self, y: np.ndarray) -> None:
        """y (T, D) on the host into the pinned up buffer, and a host->device copy of it into the static device
        buffer enqueued (landed() gives the device's copy of it)."""
        y = np.ascontiguousarray(y)
        T, D = y.shape
        host, dbuf = self._buffers("up", T, D, y.dtype)
        self.link.no_upload("a crossing's host->device copy")
        t0 = time.perf_counter()
        if self._up_event is not None:
            self._up_event.synchronize()    # done already when a later down copy was waited for (one stream): free
        self.link.write(host, y)
        self.link.copy_up(host, dbuf[:T], T)                      # enqueued; ordered before what reads it
        if self._up_event is None:
            self._up_event = self.link.event()
        self._up_event.record()
        self._landed = dbuf[:T]
        self.dev._count("h2d", y.nbytes, time.perf_counter() - t0)

    def landed(self):
        """The last send()'s rows on the device, as an array of their own (the static buffer is the next layer's): a
        device operation, which a captured segment may begin with."""
        return self._landed.copy()


# ------------------------------------------------------------------------------------------------ the sim device

class SimLink:
    """The sim device's stream as the crossing sees it: copies numbered in order, events, pinned buffers, a log."""

    def __init__(self, dev):
        self.dev = dev
        self.enqueued = 0                   # copies put on the stream so far
        self.done = 0                       # the stream is known finished up to here (an event was waited on)
        self.log: list[tuple] = []          # ("d2h" | "h2d", nbytes), ("record", n), ("wait", n)

    def event(self) -> SimEvent:
        return SimEvent(self)

    def pinned(self, shape: tuple, dtype) -> SimPinned:
        return SimPinned(self, shape, dtype)

    def no_upload(self, what: str) -> None:
        self.dev._no_upload(what)

    def copy_down(self, src, host: SimPinned, T: int) -> None:
        """Enqueue src (T, W) on the device -> host[:T]: its bytes arrive when the stream is known done past it."""
        self.dev.refuse("a crossing's device->host copy", "feeds the host, which waits for it: end the capture before")
        host.check_free("copy into")
        self.enqueued += 1
        host.incoming, host.pending = (T, np.array(src._a, copy=True)), self.enqueued
        self.log.append(("d2h", host.incoming[1].nbytes))

    def read(self, host: SimPinned, T: int) -> np.ndarray:
        host.check_free("read")
        return host.a[:T]

    def write(self, host: SimPinned, y: np.ndarray) -> None:
        host.check_free("write into")
        host.a[:y.shape[0]] = y

    def copy_up(self, host: SimPinned, dst, T: int) -> None:
        """Enqueue host[:T] -> dst on the device: the device's later work sees it (stream order); the host may not
        write the pinned buffer again until the stream is known done past this copy."""
        self.enqueued += 1
        np.copyto(dst._a, host.a[:T])
        host.pending = self.enqueued
        self.log.append(("h2d", dst._a.nbytes))


class SimEvent:
    """cupy.cuda.Event on the sim: record() marks the stream's position, synchronize() waits for it (a host read)."""

    def __init__(self, link: SimLink):
        self.link, self.at = link, None

    def record(self) -> None:
        self.at = self.link.enqueued
        self.link.log.append(("record", self.at))

    @property
    def done(self) -> bool:
        return self.at is not None and self.at <= self.link.done

    def synchronize(self) -> None:
        """Wait until the stream has done what was enqueued before record(): free when it is known done already."""
        if self.at is None or self.done:
            return
        self.link.dev.host_read("a crossing's event wait")
        self.link.done = self.at
        self.link.log.append(("wait", self.at))


class SimPinned:
    """A pinned host buffer on the sim: garbage until its copy in is waited for; untouchable while a copy is pending."""

    def __init__(self, link: SimLink, shape: tuple, dtype):
        self.link = link
        self.a = np.empty(shape, dtype)
        self.a.reshape(-1).view(np.uint8)[:] = 0xFF                # garbage until a copy in is waited for
        self.pending: int | None = None     # the stream number of the copy into or out of it, not yet known done
        self.incoming: tuple | None = None  # (T, bytes) a device->host copy delivers once it is known done

    @property
    def shape(self) -> tuple:
        return self.a.shape

    @property
    def dtype(self):
        return self.a.dtype

    def check_free(self, how: str) -> None:
        """CrossingError when a copy into or out of this buffer is not known done; else deliver what arrived."""
        if self.pending is not None and self.pending > self.link.done:
            raise CrossingError(
                f"the host would {how} a pinned buffer of {self.link.dev.name} while copy {self.pending} on its stream "
                f"is not known done (the stream is known done up to {self.link.done}): on a GPU this reads garbage "
                f"or overwrites data in flight; record an event after the copy and synchronize() it first")
        if self.incoming is not None:
            T, data = self.incoming
            self.a[:T] = data
            self.incoming = None
        self.pending = None


# ------------------------------------------------------------------------------------------------------ CUDA

class CudaLink:
    """The same on a CUDA device (CuPy): pinned memory, async copies on the current stream, cupy.cuda.Event."""

    def __init__(self, dev):
        self.dev, self.cp = dev, dev.xp

    def event(self) -> Any:
        cp = self.cp

        class _Event:                       # record() on the stream of now, as SimEvent.record
            def __init__(self):
                self.ev = cp.cuda.Event(block=False, disable_timing=True)

            def record(self):
                self.ev.record(cp.cuda.get_current_stream())

            @property
            def done(self):
                return self.ev.done

            def synchronize(self):
                self.ev.synchronize()
        return _Event()

    def pinned(self, shape: tuple, dtype) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = self.cp.cuda.alloc_pinned_memory(n)                  # page-locked: copies to and from it are async
        return np.frombuffer(mem, np.uint8, n).view(dtype).reshape(shape)

    def no_upload(self, what: str) -> None:
        return None

    def copy_down(self, src, host: np.ndarray, T: int) -> None:
        stream = self.cp.cuda.get_current_stream()
        try:                                # CuPy 13+: a copy with a stream blocks unless blocking=False
            src.get(stream=stream, out=host[:T], blocking=False)
        except TypeError:                   # older CuPy: a stream given makes it asynchronous already
            src.get(stream=stream, out=host[:T])

    def read(self, host: np.ndarray, T: int) -> np.ndarray:
        return host[:T]

    def write(self, host: np.ndarray, y: np.ndarray) -> None:
        host[:y.shape[0]] = y

    def copy_up(self, host: np.ndarray, dst, T: int) -> None:
        dst.set(host[:T], stream=self.cp.cuda.get_current_stream())
