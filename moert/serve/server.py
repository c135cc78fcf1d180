"""`moert serve`'s engine: one model, requests in arrival order, one at a time or -np N at once.

    server = Server(model, name="m.gguf", queue_size=16, n_parallel=1)   # starts the workers
    job = server.submit(Request(ids, max_tokens, params, stop), loop)   # QueueFull when `queue_size` wait
    async for item in job: ...                              # Pieces of text, then a Done (or an exception)
    job.cancel()                                            # the client left: the worker stops at the next token

n_parallel=1: one worker thread, the only one touching the model, so nothing races on its KV cache.
n_parallel=N: a worker per slot, each generating against its own part of the cache, and one Batcher thread
running every forward over all the slots' tokens together (moert/serve/slots.py, moert/batch.py). Each
request starts with the longest prefix of its prompt that is still in its cache (with slots, it takes the free
one holding the longest), so a chat that resends its history only runs the new turn. The HTTP routes live in
moert/serve/app.py, the reading of requests in moert/serve/openai_api.py. With experts on Ray workers, their compiled
graph is released after `ray_idle_s` without a request (moert/serve/idle.py): idle workers stop polling.
"""

from __future__ import annotations

import asyncio
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property

from moert.errors import MoertError
from moert.text.sampling import SamplingParams

MAX_BODY = 8 << 20   # --max-body's default: 8 MiB, a 128K-token conversation's JSON with room to spare
MIN_SLOT_CONTEXT = 16   # tokens a slot must hold at least (-np divides -c among the slots)
IDLE_S = 5.0            # --ray-idle-seconds' default: Ray workers' compiled graph released after this idle


class QueueFull(MoertError):
    """Every waiting place is taken: the client should retry later (HTTP 503)."""


@dataclass
class Request:
    """What the worker runs: prompt ids, how many tokens, the sampler, the stop strings."""

    ids: list[int]
    max_tokens: int | None
    params: SamplingParams
    stop: list[str] | None = None
    logprobs: int | None = None     # keep each token's logprob and the n most likely (OpenAI's top_logprobs)


@dataclass
class Piece:
    """Text the client may show now, and the logprobs of the tokens drawn since the last piece (if asked)."""

    text: str
    logprobs: list = field(default_factory=list)      # moert.text.sampling.TokenLogprob


@dataclass
class Done:
    """The end of a job: why it stopped and the counts and timings of GenerationStats."""

    finish_reason: str            # OpenAI's: 'stop' (end of generation or a stop string) or 'length'
    stop_reason: str              # moert's: 'eos', 'stop', 'length', 'context', 'cancelled'
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prompt_ms: float
    generation_ms: float
    text: str = ""
    timings: dict = field(default_factory=dict)
    logprobs: list = field(default_factory=list)      # every generated token's TokenLogprob (if asked)
    note: str = ""                                    # why it stopped, when the reason is not obvious


def length_note(reason: str, max_tokens: int | None, n_ctx: int) -> str:
    """Why a generation stopped at the end of the context, for `finish_reason: "length"` (empty otherwise)."""
    if reason != "context":
        return ""
    asked = "no max_tokens" if max_tokens is None else f"max_tokens {max_tokens}"
    return (f"stopped at the end of the context ({n_ctx} tokens, the prompt's included) before {asked} was "
            f"reached: shorten the prompt, or restart moert serve with a larger -c")


class Metrics:
    """llama-server's /metrics counters (Prometheus), added to by the worker thread."""

    def __init__(self):
        self.prompt_tokens = self.cached_tokens = self.predicted_tokens = self.decodes = self.busy_slots = 0
        self.prompt_seconds = self.predicted_seconds = 0.0
        self.n_tokens_max = 0

    def add(self, d: Done) -> None:
        self.prompt_tokens += d.prompt_tokens - d.cached_tokens
        self.cached_tokens += d.cached_tokens
        self.prompt_seconds += d.prompt_ms / 1e3
        self.predicted_tokens += d.completion_tokens
        self.predicted_seconds += d.generation_ms / 1e3
        self.n_tokens_max = max(self.n_tokens_max, d.prompt_tokens + d.completion_tokens)


class Job:
    """One request's channel from the worker thread to the event loop that serves its client."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop):
        self.request = request
        self.loop = loop
        self.items: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.submitted = time.perf_counter()

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, item) -> None:
        """From the worker thread: a text piece, a Done, or an exception, to the client's coroutine."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.items.get()
        if item is None:
            raise StopAsyncIteration
        return item


class Server:
    """The model behind a FIFO queue of `queue_size` waiting requests and one worker thread."""

    def __init__(self, model, name: str, queue_size: int = 16, defaults: dict | None = None,
                 chat_template: str | None = None, max_body: int = MAX_BODY, n_parallel: int = 1,
                 ray_idle_s: float = IDLE_S):
        import numba

        from moert.serve.idle import IdleRelease

        if queue_size < 1:
            raise MoertError(f"queue size (--queue) must be >= 1, got {queue_size}")
        if max_body < 1:
            raise MoertError(f"the body limit (--max-body) must be >= 1 byte, got {max_body}")
        if n_parallel < 1:
            raise MoertError(f"slots (-np) must be >= 1, got {n_parallel}")
        if not (ray_idle_s >= 0 or ray_idle_s == -1):
            raise MoertError(f"--ray-idle-seconds must be >= 0 seconds, or -1 (never release), got {ray_idle_s}")
        if model.context_size // n_parallel < MIN_SLOT_CONTEXT:
            raise MoertError(f"-np {n_parallel} divides the context of {model.context_size} into slots of "
                             f"{model.context_size // n_parallel} tokens; give each at least {MIN_SLOT_CONTEXT}: "
                             f"a larger -c, or a smaller -np")
        self.model, self.name, self.queue_size, self.max_body = model, name, queue_size, max_body
        self.n_parallel = n_parallel
        self.n_ctx_slot = model.context_size // n_parallel     # the context one request may fill
        self.defaults = dict(max_tokens=-1, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                             repeat_last_n=64, seed=None, stop=None) | (defaults or {})
        self.chat_template = chat_template
        self.created = int(time.time())
        self.counts = dict(served=0, cancelled=0, rejected=0, failed=0)
        self.metrics = Metrics()
        self.processing = 0                       # requests being generated now
        self._lock = threading.Lock()             # for `processing`, which every worker changes
        self.idle = IdleRelease(model, ray_idle_s, self._lock)   # Ray workers' compiled graph released when idle
        self._jobs: queue.Queue = queue.Queue(maxsize=queue_size)
        self._threads = numba.get_num_threads()   # numba's setting is per thread: the worker takes the loader's
        self.batcher, slots = None, [None]
        if n_parallel > 1:                        # a thread per slot, and one that runs their forwards together
            from moert.batch import sequences
            from moert.serve.slots import Batcher, SlotModel

            self.batcher = Batcher(model, self._threads)
            self._free = sequences(model, n_parallel)  # contexts not in use: a job takes the one it shares most with
            slots = [SlotModel(model, None, self.batcher) for _ in range(n_parallel)]
        self._workers = [threading.Thread(target=self._run, args=(slot,), name=f"moert-serve-slot-{i}", daemon=True)
                         for i, slot in enumerate(slots)]
        for w in self._workers:
            w.start()

    @cached_property
    def longest_token_bytes(self) -> int:
        """The most bytes of text one token of the vocabulary stands for (0: unknown), bounding a prompt's size."""
        tokens = getattr(getattr(self.model, "tokenizer", None), "tokens", None)
        return max((len(t.encode()) for t in tokens), default=0) if tokens else 0

    @property
    def busy(self) -> bool:
        return self.processing > 0

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def submit(self, request: Request, loop: asyncio.AbstractEventLoop) -> Job:
        """Queue a request; QueueFull if `queue_size` requests already wait."""
        job = Job(request, loop)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            self.counts["rejected"] += 1
            raise QueueFull(f"the server is busy: {self.queue_size} requests are waiting (moert serve --queue "
                            f"{self.queue_size}); retry later, or restart it with a larger --queue") from None
        return job

    def close(self) -> None:
        """Stop the worker after the running request (waiting ones are dropped)."""
        while True:
            try:
                self._jobs.get_nowait().cancel()
            except queue.Empty:
                break
        for _ in self._workers:
            self._jobs.put(None)
        for w in self._workers:
            w.join(timeout=30)
        if self.batcher is not None:
            self.batcher.close()
        self.idle.close()

    def _run(self, slot) -> None:
        """A worker: takes the next job and generates it, on the model itself (-np 1) or on its slot."""
        import numba

        numba.set_num_threads(self._threads)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self.counts["cancelled"] += 1
                job.emit(None)
                continue
            with self._lock:
                self.processing += 1
                self.idle.busy(+1)
            if self.batcher is not None:
                self.batcher.enter()
            try:
                if slot is None:
                    self._generate(job)
                else:
                    slot.seq = self._take_context(job.request.ids)
                    try:
                        self._generate(job, slot)
                    finally:
                        with self._lock:
                            self._free.append(slot.seq)
            except Exception as e:   # nothing a request does may stop the worker
                self.counts["failed"] += 1
                job.emit(e)
            finally:
                if self.batcher is not None:
                    self.batcher.leave()
                with self._lock:
                    self.processing -= 1
                    self.idle.busy(-1)
                job.emit(None)

    def _take_context(self, ids: list[int]):
        """The free slot context holding the longest prefix of ids (llama-server picks its slot so), taken."""
        import numpy as np

        def shared(seq) -> int:
            n = min(seq.position, len(ids))
            same = seq.ids[:n] == np.asarray(ids[:n])
            return n if same.all() else int(np.argmin(same))

        with self._lock:
            seq = max(self._free, key=shared)
            self._free.remove(seq)
        return seq

    def _generate(self, job: Job, model=None) -> None:
        from moert.text.generate import TextStream

        r = job.request
        model = model or self.model
        calls0 = self.model.stats.total.calls
        s = TextStream(model, r.ids, r.max_tokens, r.params, r.stop, logprobs=r.logprobs)
        pieces = iter(s)                         # a generator: close() ends it and resets the model's context
        sent = 0                                 # logprobs sent with earlier pieces
        for piece in pieces:
            if job.cancelled.is_set():
                break
            lps = s.sampler.logprobs[sent:len(s.tokens)]
            sent += len(lps)
            job.emit(Piece(piece, lps))
        if job.cancelled.is_set():
            pieces.close()
            self.counts["cancelled"] += 1
            s.stats.stop_reason = "cancelled"
        else:
            self.counts["served"] += 1
        st = s.stats
        finish = "length" if st.stop_reason in ("length", "context") else "stop"
        done = Done(finish, st.stop_reason, len(r.ids), st.cached_tokens, len(s.tokens), st.prompt_seconds * 1e3,
                    st.generation_seconds * 1e3, s.text, _timings(st, len(s.tokens)),
                    s.sampler.logprobs[:len(s.tokens)], length_note(st.stop_reason, r.max_tokens,
                                                                    model.context_size))
        self.metrics.add(done)
        if self.batcher is None:                          # -np 1: the prompt's forward and one per sampled token
            calls = self.model.stats.total.calls - calls0
            self.metrics.decodes += calls
            self.metrics.busy_slots += calls
        job.emit(done)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: a free one). Made with proto IPPROTO_TCP so that asyncio sets TCP_NODELAY
    on its connections (it skips sockets whose proto is 0, as socket.create_server makes them): without it, a
    response's second small write waits for the client's delayed ACK, about 40 ms per request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def _timings(st, n: int) -> dict:
    """llama.cpp server's `timings` object."""
    p_ms, g_ms = st.prompt_seconds * 1e3, st.generation_seconds * 1e3
    return dict(prompt_n=st.prompt_tokens, prompt_ms=p_ms, prompt_per_second=st.prompt_tokens / p_ms * 1e3
                if p_ms else None, predicted_n=n, predicted_ms=g_ms,
                predicted_per_second=n / g_ms * 1e3 if g_ms else None, cache_n=st.cached_tokens)


def stats_dict(model) -> dict:
    """Model.stats.total as JSON: calls, tokens, seconds, time per phase and device, transfers, remote devices' calls
    and round trips, expert counts."""
    for _ in range(3):                        # the worker may add to it while we read: retry a torn read
        try:
            t = model.stats.total
            return dict(calls=t.calls, tokens=t.tokens, seconds=t.seconds,
                        time={p: dict(d) for p, d in t.time.items()},
                        transfers={d: x.as_dict() for d, x in dict(t.transfers).items()},
                        remote={d: r.as_dict() for d, r in dict(t.remote).items()},   # Ray workers (ray:N)
                        expert_counts=t.expert_counts.tolist())
        except RuntimeError:
            time.sleep(0.01)
    return {}


__all__ = ["Done", "Job", "Metrics", "Piece", "QueueFull", "Request", "Server", "length_note", "listen",
           "stats_dict"]
