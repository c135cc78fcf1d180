"""The Model: a GGUF model placed on devices (moert.load builds it: moert/loader.py), with a KV cache, a forward
pass and stats.

    kv   = kvcache.allocate_kv_cache(plan, n)   K and V on each layer's attention device (moert/kvcache.py)
    models.<arch>.forward(model, tokens)        the architecture's forward, against the runtime (model_runtime.py)

This file is the session: forward (one sequence, or several with forward_batch), the context and its position,
warm-up, close. What an architecture file calls (its contract: moert/models/runtime.py, a typed Protocol) is
moert/model_runtime.py:
`w(name, dev)` a weight as float32 on `dev`, `linear(x, name, dev)` x @ W.T (the weight store's, with its
caches: moert/weights.py), `to(x, dev)` an explicit, counted move, `phase(name, dev)` time attribution,
`experts(...)` the shared routed-expert execution wherever the plan put the expert tensors. Nothing moves
between devices except through `to` (moert.devices.transfer underneath), so the sim device catches any
forgotten move.
"""

from __future__ import annotations

import time

import numpy as np

from moert.config import MAX_CONTEXT
from moert.devices import CPU
from moert.errors import (
    ContextOverflowError,
    InvalidTokenError,
    ModelClosedError,
    check_int,
)
from moert.experts import OFFLOAD_MIN_BATCH
from moert.kernels.jit import blas_one_thread, threads
from moert.model_runtime import ModelRuntime
from moert.moe import expert_counts
from moert.stats import PHASES, ModelStats, Phase, Stats  # noqa: F401  (PHASES, Stats: re-exported)
from moert.text.generate import TextAPI
from moert.threads import StallGuard, one_kernel_thread
from moert.trace import Tracing

MAX_BATCH = 1 << 16          # n_batch above this only sizes scratch buffers nobody has memory for


# --------------------------------------------------------------------------------------------- model

class Model(ModelRuntime, TextAPI, Tracing):
    """A loaded model: `forward(tokens)` continues from `position`; `reset()` empties the context. The text
    API (tokenize, generate, stream, chat) is in moert/text/generate.py, tracing in moert/trace.py."""

    def __init__(self, gguf_file, arch, config, plan, weights, context_size: int, n_batch: int = 512,
                 act_quant: str | None = None, kv_types: tuple[str, str] = ("f16", "f16"), flash_attn: bool = True,
                 repack: bool = False):
        from moert.kvcache import allocate_kv_cache

        self.gguf, self.arch, self.config, self.plan, self.weights = gguf_file, arch, config, plan, weights
        self.context_size = check_int("context_size", context_size, 1, MAX_CONTEXT)   # KV cache length
        self.n_batch = check_int("n_batch", n_batch, 1, MAX_BATCH)   # prompt chunks of at most this many tokens
        self.act_quant = act_quant               # None, "int16" or "int8": CPU matmuls read x quantized
        self.repack = bool(repack)               # int8: CPU Q4_K weights in kernels/repack.py's layout
        self._position = 0                       # tokens in the context so far (`position`)
        self._closed = False
        self._ids = np.zeros(self.context_size, dtype=np.int64)   # the token ids in the KV cache, [:position]
        self.kv = allocate_kv_cache(plan, self.context_size, kv_types, config)
        self.flash_attn = bool(flash_attn)       # attention a chunk of keys at a time (layers.flash_attention)
        self.stats = ModelStats(config.n_layer, getattr(config, "n_expert", 0))
        self._call: Stats | None = None
        self._phases: list[list] = []            # the open phase timers, innermost last
        self._rope: dict[tuple, tuple] = {}      # (id(device), head dim, base, yarn) -> cos, sin of this chunk
        self._rope_tables: dict[tuple, tuple] = {}   # the same key -> cos, sin of positions 0, 1, ... (rope)
        self._n = 0                              # tokens in this chunk
        self._last_only = False                  # this forward call wants the last position's logits only
        self._batch = None                       # a moert.batch.Batch while forward_batch runs
        self.warmup_seconds: float | None = None  # what `warmup` took (None: it has not run)
        weights.bind(self.to, act_quant, repack)  # w / linear / linears read the store (moert/weights.py)
        self._trace = None
        self._layer: int | None = None            # the block being computed (per-layer times)
        self._replaced = 0.0                      # measured seconds inside predicted phases (forward)
        # a timing hook: None (every phase measured), or what moert.cost.vclock.attach sets, a clock that
        # predicts the time of the devices it `covers` (sim GPUs timed as a named hardware's)
        self.clock = None
        self.expert_cache = None                  # a dynamic.runtime.RuntimeCache (use_expert_cache)
        self.offload_min_batch = OFFLOAD_MIN_BATCH   # a batch this big runs CPU weights on a GPU (op offload; 0: never)
        # decode steps stalled by a busy core go to one thread (threads.py); None: every step on the threads set
        self.stall_guard: StallGuard | None = StallGuard()
        # a one-token step runs each CPU layer as two kernel calls where it can (moert/fused.py; time counted as
        # the phase "layer"); False: always the architecture's Python block, with per-phase times
        self.fused_decode = True
        self._fused: dict = {}                    # a fused layer kind -> per layer its fused.LayerStep or None
        self._device_counts: dict = {}            # GPU name -> [(n_layer, E) expert counts there, not read yet]
        self.decode_graph = None                  # a graphs.decode.DecodeGraph: one-token steps replay a CUDA graph
        self._static = None                       # the DecodeGraph while it records its step

    # -- the public interface
    def forward(self, tokens, last_only: bool = False, *, batch=None) -> np.ndarray:
        """Logits (T, n_vocab) float32 for tokens (T,), continuing the context; position advances by T.
        last_only: only the last position's logits, (1, n_vocab) (what generation needs: the output
        projection of a prompt is T times the vocabulary, 20 GMAC for 64 tokens of a 150k vocabulary).
        batch: a moert.batch.Batch instead of tokens (see forward_batch)."""
        self._check_open()
        tokens = self._check_tokens(tokens) if batch is None else batch.rows
        self.gguf.check_intact()     # a mapped file truncated since load: a typed error, not a SIGBUS
        self._last_only = bool(last_only)
        devs = [d for d in self.plan.devices if d.is_gpu]          # their transfers are counted per call
        before = {d.name: d.stats.copy() for d in devs}
        remote = {d.name: d.remote.copy() for d in self.plan.remote}
        self._call = Stats(*self.stats._shape, calls=1, tokens=len(tokens),
                           hardware=self.clock.hardware.name if self.clock is not None else "")
        self._replaced = 0.0                     # measured seconds inside predicted phases, left out
        t0, start = time.perf_counter(), self.position
        mark = self._trace.mark() if self._trace is not None else None
        snap = self.expert_cache.snapshot() if self.expert_cache is not None else None
        out = []
        guard = (self.stall_guard if len(tokens) == 1 and batch is None and threads() > 1
                 else None)                                       # one sequence's decode step on several threads
        if guard is not None:
            guard.at(start)
        one = guard is not None and guard.one_thread()
        try:
            with blas_one_thread(), one_kernel_thread(one):   # BLAS on one thread while the kernels run (jit.py)
                step = self.n_batch if batch is None else len(tokens)     # a batch is one chunk
                self._batch = batch
                for s in range(0, len(tokens), step):
                    chunk = tokens[s:s + step]
                    self._n, self._rope = len(chunk), {}
                    out.append(self.arch.forward(self, chunk) if self.decode_graph is None or batch is not None
                               else self.decode_graph.forward(chunk))
                    if batch is not None:
                        if self._trace is not None:
                            self._trace.end_chunk(0, len(chunk), batch.positions, batch.prefill)
                        batch.advance()
                        continue
                    if self._trace is not None:
                        self._trace.end_chunk(self._position, len(chunk))
                    self._ids[self._position:self._position + len(chunk)] = chunk
                    self._position += len(chunk)
        except BaseException:
            self._position = start   # all or nothing: KV entries past `position` are simply overwritten later
            if self._trace is not None:
                self._trace.rollback(mark)
            if snap is not None:     # and the expert cache as it was (moert/dynamic/runtime.py)
                self.expert_cache.restore(snap)
            raise
        finally:
            self._read_device_counts()
            self._call.seconds = time.perf_counter() - t0 - self._replaced + self._call.predicted_seconds
            self._call.transfers = {d.name: d.stats - before[d.name] for d in devs}
            self._call.remote = {d.name: d.remote - remote[d.name] for d in self.plan.remote}
            self.stats.add(self._call)
            self._call, self._phases, self._layer, self._batch = None, [], None, None
            if guard is not None:
                guard.step(time.perf_counter() - t0, one)
        if not out:
            return np.zeros((0, self.config.n_vocab), dtype=np.float32)
        if last_only:
            return out[-1]
        return out[0] if len(out) == 1 else np.concatenate(out)

    def forward_batch(self, parts) -> np.ndarray:
        """The next-token logits (len(parts), n_vocab) of several sequences at once: parts is [(sequence, tokens),
        ...] with sequences from moert.batch.sequences(model, n); one forward over all their tokens, attention
        per sequence against its own cache (moert/batch.py). Each sequence's position advances by its tokens."""
        from moert.batch import Batch

        return self.forward(None, batch=Batch(parts, self.config.n_vocab))

    def reset(self) -> None:
        """Empty the context (the KV cache is overwritten as new tokens arrive)."""
        self._position = 0

    @property
    def position(self) -> int:
        """Tokens in the context so far: the next token's position."""
        return self._position

    @position.setter
    def position(self, value: int) -> None:
        """Rewind to `value` (0 <= value <= position): the first `value` tokens stay in the context."""
        self._position = check_int("position", value, 0, self._position)

    @property
    def context_tokens(self) -> list[int]:
        """The token ids in the context, in order (len == position). Setting `position` lower keeps the first
        `position` of them: generate() does that to reuse a prompt's cached prefix, as llama.cpp does."""
        return self._ids[:self.position].tolist()

    def warmup(self, progress: bool = True) -> float:
        """Run a 2-token prompt and a 1-token step through the model and forget them: the context, `stats`
        and the devices' transfer counters are as before. They run at the next free positions (entries the
        next tokens overwrite anyway); with fewer than 3 free, just one token. The CPU kernels compile here
        (prompt and decode paths), on first use of a weight type on this machine: seconds, then Numba's
        cache in kernels/__pycache__ has them. Returns the seconds it took. A bar shows after 1 s."""
        from tqdm import tqdm

        t0, position = time.perf_counter(), self.position
        saved = self.stats.snapshot()
        tracing, self._trace = self._trace, None
        cache, self.expert_cache = self.expert_cache, None       # the warm-up's experts are not requests
        counters = {d.name: d.stats.copy() for d in self.plan.devices}
        steps = [2, 1] if self.context_size - position >= 3 else [1]
        what = "compiles the CPU kernels on a first run" + ("; repacks the Q4_K weights" if self.repack else "")
        with tqdm(total=len(steps), desc=f"warming up ({what})", unit="step",
                  delay=1.0, disable=not progress, leave=False) as bar:
            try:
                for n in steps:
                    self.forward(np.zeros(n, dtype=np.int64))
                    bar.update(1)
            finally:
                self.position = position
                self.stats.restore(saved)
                self._trace = tracing
                self.expert_cache = cache
                for d in self.plan.devices:
                    d.stats.reset_to(counters[d.name])
        if self.stall_guard is not None:          # its steps compiled kernels: not a measure of anything
            self.stall_guard = StallGuard()
        self.warmup_seconds = time.perf_counter() - t0
        return self.warmup_seconds

    def record_routing(self, il: int, counts: np.ndarray, ids_h: np.ndarray, weights, logits=None) -> None:
        """What layer il's router chose, for the stats (counts (E,)) and, when tracing, the trace (ids (T, K)
        on the host, weights (T, K) and logits (T, E) moved there, counted)."""
        if self._call is not None:
            self._call.expert_counts[il] += counts
        if self.clock is not None:
            self.clock.routing(il, counts)
        if self._trace is None:
            return
        w = weights if isinstance(weights, np.ndarray) else self.to(weights, CPU, "trace: expert weights")
        lg = None
        if logits is not None and self._trace.full:
            lg = logits if isinstance(logits, np.ndarray) else self.to(logits, CPU, "trace: router logits")
        self._trace.layer(il, np.array(ids_h, dtype=np.int32), np.array(w, dtype=np.float32), lg)

    def record_routing_on_device(self, il: int, ids, dev) -> bool:
        """Count layer il's choices (ids (T, K) on the GPU dev) on dev, in counts read back with the logits (no sync
        inside the step); False, nothing counted, where the host needs the ids now (a trace, a virtual clock): then
        record_routing."""
        if self._trace is not None or self.clock is not None or self._call is None:
            return False
        got = self._device_counts.get(dev.name)
        if got is None:
            shape = (self.config.n_layer, self.config.n_expert)
            got = self._device_counts[dev.name] = [dev.zeros(shape, np.int64, "expert counts"), False]
        got[0][il] += expert_counts(ids, self.config.n_expert, dev.xp)                  # (E,) on dev
        got[1] = True
        return True

    def host_logits(self, logits, dev):
        """Logits (T, V) on dev to the host; one row's (a decode step's) in one transfer with the expert counts kept
        on dev (record_routing_on_device, or a replayed graph's), which go into this call's stats: one read a step."""
        got = self._device_counts.get(dev.name)
        if got is None or logits.shape[0] != 1:
            return self.to(logits, CPU, "logits")
        logits, counts = self.to_together((logits, got[0].reshape(1, -1)), CPU, "logits, expert counts")
        self._call.expert_counts += counts.reshape(got[0].shape)
        got[0][...], got[1] = 0, False
        return logits

    def _read_device_counts(self) -> None:
        """Expert counts kept on a GPU and not read with logits (a prompt's; a GPU without the output), into this
        call's stats: one read a GPU."""
        for got in self._device_counts.values():
            if got[1]:
                self._call.expert_counts += self.to(got[0], CPU, "expert counts")
                got[0][...], got[1] = 0, False

    @property
    def repacked_bytes(self) -> int:
        """Bytes of the CPU weights copied into kernels/repack.py's layout so far (moert.load's warmup repacks
        them all; 0 without repack=True)."""
        return self.weights.repacked_bytes

    def cached(self, key, make):
        """A per-model value made once (prepared CPU kernels, expert layouts); freed by close()."""
        return self.weights.cached(key, make)

    def close(self) -> None:
        """Give the KV cache and the weights back to their devices; later calls are a ModelClosedError."""
        self._closed = True
        if self.expert_cache is not None:
            self.expert_cache.close()
        self.kv.free()
        self.weights.free()
        for d in self.plan.remote:     # let the Ray workers go
            d.close()

    def __repr__(self) -> str:
        return (f"<moert.Model {self.config.arch} {self.config.n_layer} layers, position "
                f"{self.position}/{self.context_size}, devices {', '.join(self.plan.device_names())}>")

    def _check_open(self) -> None:
        if self._closed:
            raise ModelClosedError(f"this {self.config.arch} model was closed (its weights and KV cache are freed); "
                                   f"load it again with moert.load()")

    def _check_tokens(self, tokens) -> np.ndarray:
        t = np.asarray(tokens)
        if t.ndim == 0:
            t = t.reshape(1)
        if t.ndim != 1 or not (t.dtype.kind in "iu" or t.size == 0):
            raise InvalidTokenError(f"tokens must be a 1-D sequence of integer ids, got {t.dtype} shape {t.shape}")
        t = t.astype(np.int64)
        if len(t) == 1:                                   # a decode step: no array operations (~2 us a token)
            lo = hi = int(t[0])
        else:
            lo, hi = (int(t.min()), int(t.max())) if t.size else (0, 0)
        if lo < 0 or hi >= self.config.n_vocab:
            bad = np.flatnonzero((t < 0) | (t >= self.config.n_vocab))
            i = int(bad[0])
            raise InvalidTokenError(f"token id {int(t[i])} at index {i} is outside the vocabulary "
                                    f"[0, {self.config.n_vocab}); nothing was processed")
        if self.position + len(t) > self.context_size:
            raise ContextOverflowError(
                f"{len(t)} tokens do not fit: position {self.position} + {len(t)} > context size "
                f"{self.context_size}; nothing was processed. Call reset(), or load with a larger "
                f"context_size (the model was trained for {self.config.n_ctx_train})")
        return t
