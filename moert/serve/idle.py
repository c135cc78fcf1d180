"""An idle server's Ray workers stop spinning: their compiled graph is released after `seconds` without a request.

    idle = IdleRelease(model, seconds, lock)   # a thread, only when the model's experts run on a compiled graph
    idle.busy(+1) / idle.busy(-1)              # a request starts / ends (the caller holds `lock`)
    idle.close()

A Ray Compiled Graph's workers wait for the next layer by polling their shared-memory channel: an idle loaded
model's workers each use a third of a core on a loaded box, nearly a whole one on a quiet one (bench/RESULTS.md,
"Experts on Ray workers"; bench/HISTORY.md, 2026-11-24 23:29-23:54). So once no request has run for `seconds`,
the graph is torn down (moert/cluster/graph.py CompiledCalls.release) and the workers sleep; the next
request's first MoE layer compiles it again (0.1-0.2 s on that request's first token here, 0.5-1 s
with other jobs on the cores: bench/bench_cluster_idle.py).

Safe with concurrent requests and -np slots: every forward runs inside a request (between busy(+1) and busy(-1)),
and the release happens holding the server's lock with no request running, so a request that starts meanwhile
waits for the teardown to finish and then compiles the graph in its own forward (only forwards compile).
"""

from __future__ import annotations

import threading
import time


def graphs(model) -> list:
    """The compiled graphs (cluster_graph.CompiledCalls) of the model's Ray workers: one per cluster, or none."""
    found: dict[int, object] = {}
    for d in getattr(getattr(model, "plan", None), "remote", ()) or ():
        g = getattr(d, "group", None)
        if g is not None:
            found[id(g)] = g
    return list(found.values())


class IdleRelease:
    """Releases `model`'s compiled Ray graphs once no request has run for `seconds` (< 0: never)."""

    def __init__(self, model, seconds: float, lock: threading.Lock):
        self.seconds = float(seconds)
        self.graphs = graphs(model) if self.seconds >= 0 else []
        self.running = 0                     # requests between busy(+1) and busy(-1)
        self.last = time.monotonic()         # when the last one ended
        self.releases = 0                    # graphs this server released
        self._wake = threading.Condition(lock)
        self._closed = False
        self._thread = None
        if self.graphs:                      # nothing to release without a compiled graph: no thread
            self._thread = threading.Thread(target=self._run, name="moert-serve-ray-idle", daemon=True)
            self._thread.start()

    @property
    def released(self) -> bool:
        """Whether no graph is compiled now (the next request compiles it again)."""
        return all(g.dag is None for g in self.graphs)

    def busy(self, change: int) -> None:
        """A request starts (+1) or ends (-1); the caller holds the lock given to __init__."""
        self.running += change
        if self.running == 0:
            self.last = time.monotonic()
            self._wake.notify_all()

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        with self._wake:
            while not self._closed:
                if self.running or self.released:
                    self._wake.wait()              # until a request ends (or close)
                    continue
                left = self.last + self.seconds - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                for g in self.graphs:              # no request runs, and none can start until this is done
                    if g.dag is not None:
                        g.release()
                        self.releases += 1


__all__ = ["IdleRelease", "graphs"]
