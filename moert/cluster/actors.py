"""Experts on Ray workers: `moert.load(path, rules naming RAY<N>, ray="local:2" | "HOST:PORT" | "auto")`.

    devs = connect("local:2", 2)               start a local cluster (or join one) and one actor per ray:N
    attach(weights, devs, path)                each worker maps its own copy of the GGUF (or is sent its experts'
                                               bytes once) and keeps views of exactly its experts
    moert/experts.py                           per MoE layer: one call per worker with all its (token, expert,
                                               weight) pairs, all workers at once, partial sums added on the host
    moert/cluster/graph.py                     those calls as one Ray Compiled Graph (shared-memory channels, no
                                               scheduler per call); MOERT_RAY_CALLS=plain: plain actor calls

Workers are Ray actors (moert/cluster/worker.py) running the host's own kernels: results equal the all-CPU
run's up to the order of a sum. With "local:N" the N workers run on this machine (how the tests run); with an
address or "auto" moert joins a cluster started with `ray start` and puts worker N on the N-th node (sorted by
address, this host's own node last), so each other host serves the experts its rules give it.
"""

from __future__ import annotations

import copy
import os
import re
import socket
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moert.cluster.graph import Batch, CompiledCalls
from moert.cluster.graph import enabled as compiled_graphs
from moert.cluster.worker import ExpertWorker, pack, unreply
from moert.devices.remote import RemoteDevice, RemoteDeviceError
from moert.errors import ArgumentError

EXTRA = "pip install 'moert[cluster]' (or pip install ray)"
SETUP_TIMEOUT_S = 120.0        # workers start, import moert and map their file within this
DEFAULT_TIMEOUT_S = 20.0       # one layer call answers within this, or the worker counts as hung
_ADDRESS_RE = re.compile(r"^(?:ray://)?([A-Za-z0-9_.\-]+|\[[0-9A-Fa-f:]+\]):(\d{1,5})$")


def _ray():
    try:
        import ray
    except ImportError:
        raise RemoteDeviceError(f"ray= (a RAY<N> device) needs Ray, which is not installed: {EXTRA}") from None
    return ray


def parse_address(spec: str) -> tuple[str, Any]:
    """("local", N) from "local:N", ("auto", None) from "auto", ("address", "HOST:PORT") from "HOST:PORT"."""
    s = str(spec).strip()
    if s.lower().startswith("local"):
        n = s[5:].lstrip(":")
        if not n.isdigit() or not 1 <= int(n) <= 64:
            raise ArgumentError(f"ray={spec!r}: write local:N with N the number of workers, 1 to 64 (e.g. local:2)")
        return "local", int(n)
    if s.lower() == "auto":
        return "auto", None
    m = _ADDRESS_RE.match(s)
    if not m or not 0 < int(m.group(2)) < 65536:
        raise ArgumentError(f"ray={spec!r} is not local:N, auto or HOST:PORT; give the head node's address as "
                            f"`ray start --head` printed it, e.g. 192.168.1.10:6379")
    return "address", s


def start(ray, kind: str, value, spec: str) -> None:
    """ray.init for a parsed --ray: a real local cluster (separate worker processes, not Ray's deprecated
    local_mode) whose notices (its token-auth note, "Started a local Ray instance") are not shown, since moert
    started it; or a join of the cluster at `value`, showing Ray's warnings but not its INFO lines. Set
    MOERT_RAY_LOG=info to see all of Ray's own logging."""
    import logging

    shown = os.environ.get("MOERT_RAY_LOG", "").lower() == "info"
    if kind == "local":
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level=logging.INFO if shown else logging.ERROR)
        return
    try:
        ray.init(address=value or "auto", log_to_driver=False, logging_level=logging.INFO if shown else logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RemoteDeviceError(f"ray={spec!r}: could not join the cluster ({e}); is `ray start` running "
                                f"there?") from None


def _reachable(address: str, timeout: float = 5.0) -> None:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise RemoteDeviceError(f"ray={address!r}: cannot reach the cluster's head node ({e}); start it there with "
                                f"`ray start --head --port {port}`, check the address and the firewall, or use "
                                f"ray='local:2' for workers on this machine") from None


def connect(spec: str, n_workers: int, threads: int | None = None, timeout: float = DEFAULT_TIMEOUT_S,
            fallback: str | None = None, calls: str | None = None) -> list[RayDevice]:
    """n_workers RayDevices (ray:0 .. ray:n-1), each an actor started and answering; errors before any load.
    calls: "compiled" or "plain" (cluster_graph.enabled)."""
    use_graph = compiled_graphs(calls)          # a bad value fails before any worker starts
    if fallback not in (None, "cpu", "none"):
        raise ArgumentError(f"ray_fallback={fallback!r}: give 'cpu' (a lost worker's experts run on this host) or "
                            f"None (a lost worker is an error)")
    kind, value = parse_address(spec)
    ray = _ray()
    if kind == "address":
        joined = ray.get_runtime_context().gcs_address if ray.is_initialized() else None
        if joined is not None and joined != value.removeprefix("ray://"):
            raise RemoteDeviceError(f"ray={spec!r}: this process is already connected to the Ray cluster at {joined}; "
                                    f"pass ray={joined!r} (or 'auto'), or call ray.shutdown() first")
        _reachable(value)
    if not ray.is_initialized():
        start(ray, kind, value, spec)
    if kind == "local":
        nodes: list[str | None] = [None] * value
        have = f"ray={spec!r} starts {value} worker(s)"
    else:
        here = ray.get_runtime_context().get_node_id()      # this host runs the attention: its node comes last
        alive = sorted((n for n in ray.nodes() if n.get("Alive")),
                       key=lambda n: (n["NodeID"] == here, n.get("NodeManagerAddress", "")))
        nodes = [n["NodeID"] for n in alive]
        have = f"the cluster at {spec!r} has {len(nodes)} node(s), one worker each"
    if n_workers > len(nodes):
        fix = f"use ray='local:{n_workers}'" if kind == "local" else "add nodes with `ray start --address ...`"
        raise RemoteDeviceError(f"the rules use ray:0 .. ray:{n_workers - 1} ({n_workers} workers) but {have}; {fix} "
                                f"or name fewer RAY<N> devices in the rules")
    if threads is None and kind == "local":     # workers share this machine's cores with the host: one each
        threads = 1
    devices = [RayDevice(i, _actor(ray, node, threads, kind == "local"), timeout, fallback) for i, node in
               enumerate(nodes[:n_workers])]
    if use_graph:               # one compiled graph for the cluster's layer calls (compiled at the first layer)
        group = CompiledCalls(devices)
        for d in devices:
            d.group = group
    _started.update(devices)
    try:
        where = ray.get([d.actor.ping.remote() for d in devices], timeout=SETUP_TIMEOUT_S)
    except Exception as e:
        for d in devices:
            d.close()
        raise RemoteDeviceError(f"ray={spec!r}: the workers did not start within {SETUP_TIMEOUT_S:.0f} s ({e}); "
                                f"check `ray status` and that moert is installed on every node") from None
    for d, (host, pid) in zip(devices, where):
        d.host, d.pid = host, pid
    return devices


HUNG = object()        # RayDevice._get: the call is known to have hung (a compiled graph's step past its timeout)
_started: weakref.WeakSet = weakref.WeakSet()        # every RayDevice connect() made in this process


def started() -> list[RayDevice]:
    """The workers connect() started in this process that are still referenced."""
    return list(_started)


def close_all(keep: set = frozenset()) -> None:
    """Let the workers this process started go, but those in `keep` (the CLI calls it when a command ends: a
    compiled graph's idle workers would poll their channels until the process exits)."""
    for d in list(_started):
        if d not in keep:
            d.close()


@dataclass(frozen=True)
class RayConfig:
    """Where the experts that RAY<N> rules place run, one value: `moert.load(path, ray=RayConfig("local:2"))`
    (or ray="local:2" for the defaults; the CLI's --ray, --ray-model, --ray-fallback, --ray-threads, ...).

    address: "local:N" (N workers on this machine), "HOST:PORT" or "auto" (a cluster started with `ray start`).
    model: the file's path on the workers (default: the same path; a worker without it is sent its experts' bytes).
    fallback="cpu": a lost worker's experts run on this host. threads: kernel threads per worker. timeout: seconds a
    layer call may take before its worker counts as hung. calls: "compiled" (default: one Ray Compiled Graph execute
    a layer, moert/cluster/graph.py) or "plain" (one actor call per worker and layer; MOERT_RAY_CALLS)."""

    address: str
    model: str | None = None
    fallback: str | None = None
    threads: int | None = None
    timeout: float | None = None
    calls: str | None = None

    @classmethod
    def of(cls, value: Any) -> RayConfig | None:
        """A RayConfig from a RayConfig, an address string, or None (no cluster)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        raise ArgumentError(f"ray= takes a moert.RayConfig or an address ('local:N', 'HOST:PORT', 'auto'), "
                            f"not {type(value).__name__}")


def use_cluster(plan: Any, ray: str | None, threads: int | None = None, timeout: float | None = None,
                fallback: str | None = None, calls: str | None = None) -> Any:
    """The plan with its ray:N placeholders (from RAY<N> rules) replaced by workers of the cluster `ray`, started
    and answering (a copy: the caller's plan keeps its placeholders); a plan without RAY rules as it is."""
    if not plan.remote:
        return plan
    if ray is None:
        n = len(plan.remote)
        raise RemoteDeviceError(f"the rules put experts on {', '.join(d.name for d in plan.remote)} but no cluster "
                                f"was given: pass ray='local:{n}' (--ray local:{n}) for workers on this machine, or "
                                f"the address of a cluster started with `ray start --head`")
    plan = copy.copy(plan)
    plan.remote = connect(ray, len(plan.remote), threads, timeout or DEFAULT_TIMEOUT_S, fallback, calls)
    return plan


def _actor(ray, node: str | None, threads: int | None, local: bool):
    opts: dict[str, Any] = dict(num_cpus=0, max_restarts=0, max_concurrency=1)
    if local:   # workers import this moert (a checkout is not installed on the workers' path otherwise)
        root = str(Path(__file__).resolve().parent.parent)
        opts["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}}
    if node is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
    return ray.remote(ExpertWorker).options(**opts).remote(threads)


def attach(weights: Any, devices: list[RayDevice], model_path: str, act_quant: str | None, repack: bool) -> None:
    """Give each worker its experts before the first token: its own copy of the file mapped, or the bytes sent."""
    for dev in devices:
        tensors = {}
        for w in weights.values():
            for p in getattr(w, "pieces", None) or (w,):          # a SplitWeight's pieces, or the Weight
                if p.device is dev:
                    experts = p.experts if p.experts is not None else tuple(range(w.shape[0]))
                    tensors[w.name] = (w.type, tuple(w.shape), experts, p.data)
        dev.attach(tensors, model_path, {"act_quant": act_quant, "repack": repack})


class RayDevice(RemoteDevice):
    """ray:N: a Ray actor holding some routed experts; one call per MoE layer and forward (moert/experts.py)."""

    def __init__(self, index: int, actor: Any, timeout: float, fallback: str | None):
        super().__init__(index)
        self.actor, self.timeout, self.fallback = actor, float(timeout), (fallback if fallback == "cpu" else None)
        self.host, self.pid = "?", 0
        self.source = ""                 # "file": the worker mapped its own copy; "sent": it was sent the bytes
        self.group: CompiledCalls | None = None     # the cluster's compiled graph; None: plain actor calls
        self._keys = 0

    def __repr__(self) -> str:
        return f"<RayDevice {self.name} on {self.host} (pid {self.pid}){' LOST' if self.lost else ''}>"

    def _get(self, ref: Any, timeout: float, doing: str, layer: int | None = None, limit: float | None = None) -> Any:
        """ray.get(ref) within `timeout` seconds (of `limit`, the whole allowance, for the message), errors typed."""
        ray = _ray()
        at = f" at layer {layer}" if layer is not None else ""
        fix = "run `ray status` and check the worker's node; restart the model to reconnect" + (
            "" if self.fallback else ", or pass ray_fallback='cpu' (--ray-fallback cpu) to run a lost worker's "
                                     "experts on this host")
        try:
            if ref is HUNG:
                raise ray.exceptions.GetTimeoutError()
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            msg = (f"{self.name} (Ray worker on {self.host}) did not answer {doing}{at} within {limit or timeout:g} s: "
                   f"it hung or is overloaded; {fix}, or raise ray_timeout (--ray-timeout) if its experts are slow")
        except ray.exceptions.RayActorError as e:
            msg = (f"{self.name} (Ray worker on {self.host}) died or became unreachable during {doing}{at} "
                   f"({type(e).__name__}); {fix}")
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            msg = f"{self.name} (Ray worker on {self.host}) failed {doing}{at}: {cause}"
        except ray.exceptions.RayError as e:
            msg = f"{self.name} (Ray worker on {self.host}): {doing}{at} failed ({type(e).__name__}: {e}); {fix}"
        raise RemoteDeviceError(msg, self.name, layer)

    def attach(self, tensors: dict, model_path: str, options: dict) -> None:
        spec = {n: (t, s, e) for n, (t, s, e, _) in tensors.items()}
        status = self._get(self.actor.load.remote(str(model_path), spec, options), SETUP_TIMEOUT_S,
                           f"mapping {model_path}")
        self.source = "file"
        if status != "ok":                  # no file there: its experts' bytes, once, through the object store
            arrays = {n: (np.ascontiguousarray(v[list(e)]), t, s, e) for n, (t, s, e, v) in tensors.items()}
            self._get(self.actor.receive.remote(arrays, options), SETUP_TIMEOUT_S, "receiving its experts")
            self.source = "sent"

    def prepare(self, names: tuple, act: str, biases: tuple | None) -> int:
        self._keys += 1       # waited for: the worker compiles its kernels here (moert.load's warm-up), not mid-token
        self._get(self.actor.prepare.remote(self._keys, tuple(names), act, tuple(biases) if biases else None),
                  SETUP_TIMEOUT_S, f"preparing {names[0]}")
        return self._keys

    def submit(self, key: int, x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> Any:
        """Start this layer's call: queued in the cluster's compiled graph (run by `start`), or a plain actor call."""
        payload = pack(x, ids, weights)
        t0 = time.perf_counter()
        queued = self.group.submit(self, key, payload) if self.group is not None else None
        ref = queued if queued is not None else self.actor.run.remote(key, payload)
        self.remote.sent_bytes += len(payload)
        return ref, t0, x.shape, (key, payload)

    @staticmethod
    def start(handles: list) -> None:
        """Every worker's call of this layer submitted: run the compiled graph's step (plain calls run already)."""
        for group in {id(h[0].group): h[0].group for h in handles if isinstance(h[0], Batch)}.values():
            group.flush()

    def collect(self, handle: Any, layer: int) -> np.ndarray:
        ref, t0, _, call = handle
        left = max(self.timeout - (time.perf_counter() - t0), 0.001)    # a batch wait may have used some already
        if isinstance(ref, Batch):
            data = self.group.reply(self, ref, left)
            if data is not None:
                return self._done(handle, data)
            # the graph failed, and its outputs do not say which worker: still inside its step past the timeout, this
            # one hung; else its call again as a plain one, which says whether it died (or answers: another failed)
            if ref.timed_out and self._get(self.actor.busy.remote(), SETUP_TIMEOUT_S, "its expert call", layer):
                return self._get(HUNG, 0, "its expert call", layer, self.timeout)
            t0, ref = time.perf_counter(), self.actor.run.remote(*call)
            handle, left = (ref, t0, *handle[2:]), self.timeout
        return self._done(handle, self._get(ref, left, "its expert call", layer, self.timeout))

    @staticmethod
    def collect_many(pairs: list, layer: int) -> list[np.ndarray]:
        """Wait for several workers' calls at once (one wait: cheaper than one each); a RemoteDeviceError if any
        failed or the first timeout passed (the caller then asks each device to learn which)."""
        ray = _ray()
        t0 = min(h[1] for _, h in pairs)
        left = max(min(d.timeout for d, _ in pairs) - (time.perf_counter() - t0), 0.001)
        if all(isinstance(h[0], Batch) for _, h in pairs):       # one compiled execution: its outputs together
            datas = [d.group.reply(d, h[0], left) for d, h in pairs]
            if any(x is None for x in datas):
                raise RemoteDeviceError(f"the compiled graph failed at layer {layer}", "", layer)
            return [d._done(h, data) for (d, h), data in zip(pairs, datas)]
        try:
            datas = ray.get([h[0] for _, h in pairs], timeout=left)
        except Exception as e:              # which one, and why: collect() of each says
            raise RemoteDeviceError(f"a worker's call failed at layer {layer} ({type(e).__name__})", "", layer) from e
        return [d._done(h, data) for (d, h), data in zip(pairs, datas)]

    def _done(self, handle: Any, data: bytes) -> np.ndarray:
        t0, (T, D) = handle[1], handle[2]
        y, seconds = unreply(data, T, D)
        r = self.remote
        r.calls += 1
        r.received_bytes += len(data)
        r.round_trip_s += time.perf_counter() - t0
        r.compute_s += seconds
        return np.array(y)                  # writable, owned (the reply's buffer is read-only)

    def stall(self, seconds: float) -> None:
        """Make the worker hang for `seconds` from now (fault tests)."""
        self._get(self.actor.stall.remote(seconds), SETUP_TIMEOUT_S, "stalling")

    def close(self) -> None:
        """Let the worker go (with a compiled graph: all of the cluster's workers, and the graph)."""
        if self.group is not None:
            self.group.close()
        self.kill()

    def kill(self) -> None:
        try:
            _ray().kill(self.actor, no_restart=True)
        except Exception:   # already gone (killed, or the cluster shut down): nothing to let go
            pass


__all__ = ["RayConfig", "RayDevice", "attach", "close_all", "connect", "parse_address", "started", "use_cluster"]
