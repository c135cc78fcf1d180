"""What runs inside a Ray worker (moert/cluster/actors.py makes it an actor): its experts, and one call per layer.

    w = ExpertWorker(threads=2)
    w.load(path, spec, act_quant, repack)   map the GGUF, keep views of exactly its experts ("missing": no file)
    w.receive(arrays)                       or: its experts' quantized bytes, sent once (no file there)
    w.prepare(key, names, act, biases)      one MoE layer made ready (the host's own kernels, kernels/moe_fused.py)
    w.run(key, payload) -> bytes            all (token, expert, weight) pairs of that layer, one message each way
    w.step(call) -> bytes                   the same as one step of a Ray Compiled Graph (moert/cluster/graph.py):
                                            call = keyed(key, payload), or b"" when the layer gives this worker
                                            nothing (then b"" back)

The message layout (little-endian, see `pack` / `unpack`):
    request   int32 [T, K, D] | float32 x (T, D) | int32 ids (T, K), -1 = not this worker's | float32 weights (T, K)
    reply     float32 y (T, D) | float64 seconds the kernels took here
One bytes object each way: Ray moves bytes with the least work (measured: 2 workers, one decoded token, 0.9-1.1
ms per round trip against 1.2-1.4 ms for three NumPy arrays; bench/bench_cluster.py). A compiled graph's step gets
its layer key inside the bytes too (`keyed`): a channel writes bytes raw, where a (key, payload) tuple goes through
msgpack and pickle on both sides (measured here, a compiled graph of 2 echo actors: 62-127 us at best with
bytes, 119 us with a tuple; bench/HISTORY.md, 2026-11-25 01:37-02:18).

Dimension legend: T tokens, K experts per token, D hidden, E experts, F expert hidden.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np

from moert.kernels.moe_fused import expert_layer

HEADER = np.dtype("<i4")
KEY = 4                                 # bytes of a compiled step's layer key, before its request (`keyed`)


def pack(x: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> bytes:
    """The request of one layer call: header, x (T, D) float32, ids (T, K) int32, weights (T, K) float32."""
    T, D = x.shape
    K = ids.shape[1]
    return b"".join((np.array([T, K, D], HEADER).tobytes(), np.ascontiguousarray(x, np.float32).tobytes(),
                     np.ascontiguousarray(ids, np.int32).tobytes(),
                     np.ascontiguousarray(weights, np.float32).tobytes()))


def unpack(payload: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, ids, weights of a request (zero-copy views of it)."""
    T, K, D = (int(v) for v in np.frombuffer(payload, HEADER, 3))
    o = 12
    x = np.frombuffer(payload, np.float32, T * D, o).reshape(T, D)
    o += 4 * T * D
    ids = np.frombuffer(payload, np.int32, T * K, o).reshape(T, K)
    w = np.frombuffer(payload, np.float32, T * K, o + 4 * T * K).reshape(T, K)
    return x, ids, w


def keyed(key: int, payload: bytes) -> bytes:
    """A compiled graph step's input: the layer key (int32) then the request, one bytes object."""
    return np.array([key], HEADER).tobytes() + payload


def reply(y: np.ndarray, seconds: float) -> bytes:
    return np.ascontiguousarray(y, np.float32).tobytes() + np.float64(seconds).tobytes()


def unreply(data: bytes, T: int, D: int) -> tuple[np.ndarray, float]:
    """y (T, D) and the worker's kernel seconds from a reply."""
    y = np.frombuffer(data, np.float32, T * D).reshape(T, D)
    return y, float(np.frombuffer(data, np.float64, 1, 4 * T * D)[0])


class ExpertWorker:
    """One worker's experts (views of its own mapped file, or bytes it was sent) and their prepared layers."""

    def __init__(self, threads: int | None = None):
        if threads:                                     # as moert.model.set_threads: Numba's pool and BLAS's
            import numba
            from threadpoolctl import threadpool_limits

            numba.set_num_threads(min(int(threads), numba.config.NUMBA_NUM_THREADS))
            threadpool_limits(limits=int(threads))
        self.threads = int(threads) if threads else None
        self.stepping = threading.local()  # a compiled graph steps on its own thread; Numba sets threads per thread
        self.running = threading.Lock()    # one layer at a time: a call resent after a graph fault waits its turn
        self.stalled_until = 0.0           # `stall`: run() waits until then (time.monotonic())
        self.tensors: dict[str, tuple] = {}      # name -> (data, type, shape, remap: expert id -> row, or None)
        self.layers: dict[int, object] = {}
        self.remap: dict[int, np.ndarray | None] = {}
        self.held: dict[str, tuple[int, ...]] = {}  # name -> the expert ids this worker holds
        self.options: dict = {}
        self.gguf = None

    def ping(self) -> tuple[str, int]:
        """Where this worker runs: (host name, process id)."""
        return socket.gethostname(), os.getpid()

    def load(self, path: str, spec: dict, options: dict) -> str:
        """Map `path` and keep a view of each tensor in spec (name -> (type, shape, experts)): "ok", or "missing:
        <why>" when the file is not here (the host then sends the bytes), or a ValueError when it differs."""
        from moert import gguf
        from moert.errors import GGUFError

        self.options = dict(options)
        if not os.path.isfile(path):
            return f"missing: no file {path} on {socket.gethostname()}"
        try:
            self.gguf = gguf.open(path)
        except (GGUFError, OSError) as e:
            return f"missing: {path} on {socket.gethostname()} does not open ({e})"
        for name, (typ, shape, _experts) in spec.items():
            t = self.gguf.tensors.get(name)
            if t is None or t.type != typ or tuple(t.shape) != tuple(shape):
                found = "missing" if t is None else f"{t.type} {tuple(t.shape)}"
                raise ValueError(f"{path} on {socket.gethostname()} is not the host's model: tensor {name} is "
                                 f"{found} there but {typ} {tuple(shape)} on the host; copy the same file there "
                                 f"(or give its path with --ray-model)")
            raw = self.gguf.raw(name)                              # zero-copy; only its experts' pages are read
            data = raw.view(np.float32).reshape(shape) if typ == "F32" else raw.reshape(*shape[:-1], -1)
            self.tensors[name] = (data, typ, tuple(shape), None)
            self.held[name] = tuple(_experts)
        return "ok"

    def receive(self, arrays: dict, options: dict) -> str:
        """Tensors sent by the host: name -> (data of its experts only, type, whole shape, expert ids)."""
        self.options = dict(options)
        for name, (data, typ, shape, experts) in arrays.items():
            remap = np.full(shape[0] + 1, -1, np.int32)          # global expert id -> row of data (last: -1)
            remap[list(experts)] = np.arange(len(experts), dtype=np.int32)
            self.tensors[name] = (data, typ, (len(experts), *shape[1:]), remap)
            self.held[name] = tuple(experts)
        return "ok"

    def prepare(self, key: int, names: tuple, act: str, biases: tuple | None) -> None:
        """Layer `key`: the gate/up/down (and bias) tensors `names` made ready for `run`."""
        from moert.kernels.qtensor import QTensor

        qs = [QTensor(self.tensors[n][0], self.tensors[n][1], self.tensors[n][2]) for n in names]
        b = None if not biases else tuple(_floats(*self.tensors[n][:3]) for n in biases)
        self.layers[key] = expert_layer(qs, b, act, self.options.get("act_quant"), self.options.get("repack", False))
        self.remap[key] = self.tensors[names[0]][3]
        e = self.held[names[0]][0]
        for T in (2, 1):        # compile (or load from Numba's cache) the prompt and decode kernels now, not mid-token
            self.run(key, pack(np.zeros((T, qs[0].shape[-1]), np.float32), np.full((T, 1), e, np.int32),
                               np.ones((T, 1), np.float32)))

    def run(self, key: int, payload: bytes) -> bytes:
        """The (T, D) weighted sum of this worker's experts for one layer call (a `pack`ed request)."""
        with self.running:
            while time.monotonic() < self.stalled_until:        # a hung worker, as the fault tests make one
                time.sleep(0.05)
            t0 = time.perf_counter()
            x, ids, w = unpack(payload)
            remap = self.remap[key]
            if remap is not None:                               # ids index the rows this worker was sent
                ids = remap[ids]                                # -1 -> remap[-1] = -1
            y = self.layers[key](x, ids, w)
            return reply(y, time.perf_counter() - t0)

    def step(self, call: bytes) -> bytes:
        """One execution of the compiled graph: `run` of a `keyed` call, or b"" when this layer has nothing here."""
        if not call:
            return b""
        if self.threads and getattr(self.stepping, "threads", None) != self.threads:
            import numba

            numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))
            self.stepping.threads = self.threads
        return self.run(int(np.frombuffer(call, HEADER, 1)[0]), memoryview(call)[KEY:])

    def busy(self) -> bool:
        """Whether a layer call is running (the host asks when a compiled graph's step timed out)."""
        return self.running.locked()

    def stall(self, seconds: float) -> None:
        """Make every layer call in the next `seconds` wait them out (the fault tests' hung worker)."""
        self.stalled_until = time.monotonic() + seconds


def _floats(data: np.ndarray, typ: str, shape: tuple) -> np.ndarray:
    """A bias tensor (E, n) as float32."""
    if typ == "F32":
        return data
    from moert import quants

    return np.stack([quants.dequantize_fast(data[e].reshape(-1), typ, shape[1:]) for e in range(shape[0])])
