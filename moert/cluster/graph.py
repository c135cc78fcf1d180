"""The per-layer calls of a cluster's workers as one Ray Compiled Graph (moert/cluster/actors.py uses it by default).

    g = CompiledCalls(devices)          all RayDevices of one cluster; compiled at its first layer call
    b = g.submit(dev, key, payload)     a worker's part of this layer (one message each way, as the plain call)
    g.flush()                           one `execute` for the layer: every worker's part at once (one bytes object
                                        each, its layer key inside: cluster_worker.keyed), b"" for a worker the
                                        layer gives nothing
    g.reply(dev, b, timeout)            its reply; None when the graph failed (the caller resends it as a plain call)

Why: a plain actor call goes through Ray's scheduler and object store, ~1 ms per call ("System overhead of ~1 ms
per task launch"); a compiled graph's actors loop over shared-memory channels instead ("Less than 50us system
overhead for workloads that repeatedly execute the same task graph"), Ray Compiled Graph (beta),
https://docs.ray.io/en/latest/ray-core/compiled-graph/ray-compiled-graph.html. An actor runs one compiled graph at
a time, so a cluster has one graph whose input is every worker's part of a layer, its layer key inside.

Faults: the graph's outputs are read together, so a timeout or a dead actor does not say which worker failed.
Then the graph is given up: past a timeout, a worker still inside its step (`busy`, asked by a plain call, which
its main thread answers) is the hung one; the others' calls are resent as plain actor calls, which say whether
they died. At the next layer the graph is torn down (the actors of lost workers killed first, so teardown does
not wait on a hung one) and compiled again over the workers still live; if that fails, plain calls from then on
(`off` says why).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from moert.cluster.worker import keyed


def enabled(calls: str | None = None) -> bool:
    """Whether a cluster's layer calls go through a compiled graph: `calls` ("compiled", the default, or "plain":
    one Ray actor call per worker and layer; load's ray_calls=, --ray-calls), else MOERT_RAY_CALLS, else compiled."""
    given = calls is not None
    calls = (calls if given else os.environ.get("MOERT_RAY_CALLS", "compiled")).strip().lower()
    if calls not in ("compiled", "plain"):
        from moert.errors import ArgumentError

        what = "ray_calls" if given else "MOERT_RAY_CALLS"
        raise ArgumentError(f"{what}={calls!r}: give 'compiled' (Ray Compiled Graphs, the default) or "
                            f"'plain' (one Ray actor call per worker and layer)")
    return calls == "compiled"


class Batch:
    """One layer's calls: worker index -> (key, payload) until flushed, then the execution's refs and replies."""

    def __init__(self, group: CompiledCalls):
        self.group = group
        self.calls: dict[int, tuple[int, bytes]] = {}
        self.refs: list | None = None
        self.replies: dict[int, bytes] | None = None
        self.failed: BaseException | None = None

    @property
    def timed_out(self) -> bool:
        """The graph's outputs did not all come within the timeout (some worker hung, or is slow)."""
        from ray.exceptions import RayChannelTimeoutError

        return isinstance(self.failed, RayChannelTimeoutError)


class CompiledCalls:
    """One Ray Compiled Graph over a cluster's live workers: `step` of each, bound to its part of the input."""

    def __init__(self, devices: list):
        self.devices = devices
        self.members: list = []          # the workers in the compiled graph, in the order of its input
        self.dag: Any = None
        self.batch: Batch | None = None  # the layer being submitted
        self.broken: BaseException | None = None   # the last fault: the graph is rebuilt before the next layer
        self.off: str | None = None      # why compiled calls are off for good (plain actor calls from then on)
        self.compiles = 0                # graphs compiled (1 when nothing failed)
        self.executions = 0              # layers run through a graph
        self.releases = 0                # graphs torn down by release() (an idle server's: moert/serve/idle.py)
        _quiet.log.addFilter(_LOSS_REPORTED)   # once per process (the same filter is not added twice)

    def submit(self, dev: Any, key: int, payload: bytes) -> Batch | None:
        """Queue dev's part of this layer; None when compiled calls are off (then the caller makes a plain call)."""
        if self.off is not None:
            return None
        if self.batch is None or dev.index in self.batch.calls:   # (a layer that failed before `flush`: left)
            self.batch = Batch(self)
        self.batch.calls[dev.index] = (key, payload)
        return self.batch

    def flush(self) -> None:
        """Run the queued layer: one `execute` with every member's part (compiling the graph first if needed)."""
        b, self.batch = self.batch, None
        if b is None:
            return
        try:
            if self.dag is None or self.broken is not None:
                self._build()
            if self.off is not None:
                raise RuntimeError(self.off)
            b.refs = self.dag.execute(*(keyed(*b.calls[d.index]) if d.index in b.calls else b""
                                        for d in self.members))
            self.executions += 1
        except Exception as e:        # compiling or writing the input failed: this layer goes by plain calls
            self._fail(b, e)

    def reply(self, dev: Any, b: Batch, timeout: float) -> bytes | None:
        """dev's reply from the flushed layer b, waiting at most `timeout` s; None when the graph failed."""
        if b.replies is None and b.failed is None:
            try:
                got = _ray().get(b.refs, timeout=timeout)                   # the outputs come back together
                b.replies = {d.index: r for d, r in zip(self.members, got)}
            except Exception as e:    # timeout, a dead actor, an error raised in a worker: resent as plain calls
                self._fail(b, e)
        return None if b.replies is None else b.replies.get(dev.index)

    def release(self) -> None:
        """Tear the graph down until the next layer compiles it again (~0.2 s): a compiled graph's workers poll
        their channels while they wait, so an idle model's workers use CPU until released. Call it only when no
        layer is being submitted or awaited (the server calls it idle, holding the lock a request takes to start)."""
        if self.dag is not None:
            self.releases += 1
        for d in self.devices:      # a worker given up (dead, or hung in its step) first: teardown would wait on it
            if d.lost is not None:
                d.kill()
        self._teardown()

    def close(self) -> None:
        """Let the workers go: the graph torn down, then their actors killed (a worker known lost or hung first, so
        that teardown does not wait on it)."""
        self.off = self.off or "closed"
        for d in self.devices:
            if d.lost is not None or self.broken is not None:
                d.kill()
        self._teardown()
        for d in self.devices:
            d.kill()

    def _fail(self, b: Batch, e: BaseException) -> None:
        b.failed, b.refs, self.broken = e, None, e

    def _build(self) -> None:
        """Tear down a failed graph (killing the actors of lost workers first) and compile one over the live."""
        try:
            from ray.dag import InputNode, MultiOutputNode
        except ImportError as e:     # a Ray older than its compiled graphs (2.32): plain calls
            self.off = f"this Ray has no compiled graphs ({e})"
            return
        for d in self.devices:
            if d.lost is not None:
                d.kill()
        self._teardown()
        # a worker whose actor died since (not lost yet: its resent call says so next) stays out of the graph
        self.members = [d for d in self.devices if d.lost is None and _answers(d)]
        self.broken = None
        if not self.members:
            self.off = "no live workers"
            return
        try:
            with InputNode() as inp:
                outputs = [d.actor.step.bind(inp[i]) for i, d in enumerate(self.members)]
                dag = MultiOutputNode(outputs)
            with _quiet():
                self.dag = dag.experimental_compile()
            self.compiles += 1
        except Exception as e:       # an older Ray, a cluster that cannot: the plain calls still work
            self.off = f"Ray could not compile the graph ({type(e).__name__}: {e})"

    def _teardown(self) -> None:
        dag, self.dag = self.dag, None
        if dag is not None:
            with _quiet():
                try:
                    dag.teardown()
                except Exception:    # actors already dead or the cluster gone: nothing is left to stop
                    pass


class _quiet:
    """Ray logs every compile and teardown at INFO, and a dead actor's teardown at ERROR: moert reports faults."""

    log = logging.getLogger("ray.dag.compiled_dag_node")

    def __enter__(self):
        self.level = self.log.level
        self.log.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        self.log.setLevel(self.level)


class _LossReported(logging.Filter):
    """Drops what Ray's own thread logs when a graph's worker dies: each compiled graph has a monitor thread
    (CompiledGraphMonitorThread, ray/dag/compiled_dag_node.py) that waits on the workers' loops and, when one
    ends, tears the graph down itself, logging each step at INFO and the dead actor's cancel as
    `logger.exception("Error cancelling worker task")`: a traceback of ActorDiedError on stderr, from a thread
    moert does not run, before moert's own RemoteDeviceError (or fallback warning) names the lost worker. Dropped:
    this logger's INFO records and the ERROR records whose exception is a dead actor (RayActorError); any other
    error or warning of Ray's is still printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return False
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, _ray().exceptions.RayActorError)


_LOSS_REPORTED = _LossReported()


def _answers(dev: Any, timeout: float = 5.0) -> bool:
    """Whether a worker's actor answers a plain call (one that died does not)."""
    try:
        _ray().get(dev.actor.ping.remote(), timeout=timeout)
        return True
    except Exception:        # dead, or not answering: compiling a graph over it would fail or hang
        return False


def _ray():
    import ray

    return ray


__all__ = ["Batch", "CompiledCalls", "enabled"]
