"""CUDA graphs for decode (gpt-fast's "reduce-overhead", llama.cpp's CUDA graphs): a step captured once, replayed.

    g = StepGraph(dev, step, "a decode step")   step() reads its inputs from static device buffers and writes its
                                                outputs into static ones; capturing it runs it once
    g.replay()                                  the captured launches again: the next step
    hop(dev, fn)                                inside a step: fn (no arguments) is host work between two device
                                                segments (the CPU experts of -cmoe); a capture ends its segment
                                                here, runs fn, and begins the next; a replay runs each segment's
                                                launches and then its fn again (eagerly: fn() now)

A graph replays the kernels it recorded with the arguments they had: a Python int baked into a launch (a position,
a KV length, a slice bound) keeps its value of the capture, and a read of device values by the host (int(x), .get(),
a CuPy call that syncs) cannot be captured at all. So what changes per token must live in device memory (the token
id, the position), and the step must not read anything back.

On a CUDA device (CuPy) StepGraph captures the step on a stream (Stream.begin_capture / end_capture) and launches
the graph once, so making it is one step, as on the sim; replay is Graph.launch. Every kernel must have run once
before the capture (it compiles and loads then: the prompt does that, or warmup=True runs the step eagerly first,
one more step). On the sim device the same contract is simulated: while the step is recorded every operation goes
on the device's tape, and a host read or an upload of host data raises CaptureError; replay runs the tape again on
the buffers' data of now, every Python value as it was at the capture (what a real graph does). A step that cannot
be captured runs eagerly, and StepGraph says why once (a GraphWarning).

A step with hops is captured as segments: the device work up to the first hop, then up to the next, ... (llama.cpp
splits its CUDA graph the same way where a tensor's backend changes). What crosses a hop lives in static buffers (the
crossing's, moert/devices/pinned.py), so each segment's launches address the same memory every token. On CUDA a
segment is launched as soon as it is captured (the host work after it needs its results), so making the graph is
still one step.

The CUDA branch has never run on a GPU; tests/test_gpu_graph.py checks the contract on the sim device (no host
reads, static buffers, positions in device memory), not CuPy's graph API. A model's decode step is captured by
moert/graphs/decode.py (docs/running.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

from moert.errors import MoertError


class CaptureError(MoertError, RuntimeError):
    """A step did what a CUDA graph cannot hold: a read back to the host, an upload of host data."""


class GraphWarning(UserWarning):
    """A step runs eagerly because it could not be captured (the message says why)."""


class StepGraph:
    """step (no arguments; static device buffers in and out) captured on dev, or run eagerly where it cannot be."""

    def __init__(self, dev, step: Callable[[], object], what: str = "a decode step", warmup: bool = False):
        self.dev, self.step, self.what = dev, step, what
        self.why_eager: str | None = None      # why the step is not captured (None: it is)
        self._stream = self._pool = None
        self._segments: list = []              # (a segment's tape or graph, the host work after it or None)
        if warmup:                             # kernels compile and load outside the capture: one more step
            self._on_side(step) if dev.kind == "cuda" else step()
        try:
            self._capture()
        except CaptureError as e:
            self._eager(str(e))
        except Exception as e:                 # CuPy's capture errors (cudaErrorStreamCapture*) and the like
            if dev.kind != "cuda":
                raise
            self._eager(f"{type(e).__name__}: {e}")
        if not self.captured:                  # then the step runs as it is (a sim capture that failed ran up to the
            step()                             # refused read: a step moves its position last)

    @property
    def captured(self) -> bool:
        return self.why_eager is None

    @property
    def tape(self) -> list:
        """The sim's recorded operations, every segment's in order ([] on CUDA or where the step runs eagerly)."""
        return [op for tape, _ in self._segments if isinstance(tape, list) for op in tape]

    @property
    def segments(self) -> int:
        """How many captured segments a replay runs (1 without hops; 0 where the step runs eagerly)."""
        return len(self._segments) if self.captured else 0

    def replay(self) -> None:
        """The step once more: the graph's launches (sim: the tape), or the step itself where it runs eagerly."""
        if not self.captured:
            self.step()                        # (the fallback, said once)
        elif self.dev.kind == "sim":
            for tape, between in self._segments:
                self.dev.recording = self.what
                try:
                    self.dev.replay(tape)
                finally:
                    self.dev.recording = None
                if between is not None:
                    between()
        else:
            for graph, between in self._segments:
                self._launch(graph)
                if between is not None:
                    between()

    def _capture(self) -> None:
        dev = self.dev
        self._segments = []
        _CAPTURING[id(dev)] = self
        try:
            if dev.kind == "sim":
                dev.recording, dev.tape = self.what, []
                try:
                    self.step()
                    self._segments.append((dev.tape, None))
                finally:
                    dev.recording, dev.tape = None, None
            elif dev.kind == "cuda":
                def capture():
                    self._stream.begin_capture()
                    try:
                        self.step()
                    finally:
                        self._segments.append((self._stream.end_capture(), None))
                self._on_side(capture)
                self._launch(self._segments[-1][0])         # a capture runs nothing: this is the last segment's run
            else:
                raise CaptureError(f"{dev.name} has no graphs (a CUDA or sim device has)")
        finally:
            _CAPTURING.pop(id(dev), None)

    def _cut(self, between: Callable[[], object]) -> None:
        """A hop while capturing: the segment so far ends (and on CUDA runs), between() runs, the next one begins."""
        dev = self.dev
        if dev.kind == "sim":
            self._segments.append((dev.tape, between))
            dev.recording, dev.tape = None, None
            try:
                between()
            finally:
                dev.recording, dev.tape = self.what, []
        else:
            graph = self._stream.end_capture()
            self._segments.append((graph, between))
            graph.launch(self._stream)                      # between() reads what this segment computes
            between()
            self._stream.begin_capture()

    def _launch(self, graph) -> None:
        """A graph on the current stream: after the writes into its input buffers there, before the reads of its
        outputs (the capture stream is a side stream, which the default stream does not wait for)."""
        import cupy

        with cupy.cuda.Device(self.dev.index):
            graph.launch(cupy.cuda.get_current_stream())

    def _on_side(self, fn: Callable[[], object]) -> None:
        """fn on the capture stream (a side stream: the default one cannot be captured), after the current stream's
        work and before its next, CuPy allocating from this graph's own pool (PyTorch's private graph pool: the
        temporaries the graph's kernels address stay reserved while it lives; the warm-up fills it on the same
        stream, so the capture allocates from blocks it holds)."""
        import cupy

        with cupy.cuda.Device(self.dev.index):
            current = cupy.cuda.get_current_stream()
            if self._stream is None:
                self._stream, self._pool = cupy.cuda.Stream(non_blocking=True), cupy.cuda.MemoryPool()
            self._stream.wait_event(current.record())
            with self._stream, cupy.cuda.using_allocator(self._pool.malloc):
                fn()
            current.wait_event(self._stream.record())

    def _eager(self, why: str) -> None:
        self.why_eager = why
        warnings.warn(f"{self.what} on {self.dev.name} runs eagerly, not as a CUDA graph: {why}", GraphWarning,
                      stacklevel=3)


_CAPTURING: dict = {}                          # id(device) -> the StepGraph capturing a step there now


def hop(dev, between: Callable[[], object]) -> None:
    """Host work inside a step (between: no arguments), between two segments of device work on dev: run now, and
    while a StepGraph captures on dev, the segment boundary (replay runs between() again after the segment)."""
    graph = _CAPTURING.get(id(dev))
    if graph is None:
        between()
    else:
        graph._cut(between)
