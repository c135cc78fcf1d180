"""`moert serve`'s HTTP routes (FastAPI): OpenAI's API, llama.cpp server's endpoints, and moert's own.

    POST /v1/chat/completions  /v1/completions   OpenAI, streaming (SSE) or not; logprobs, penalties, content parts
    GET  /v1/models  /health  /props  /metrics    OpenAI's model list; llama-server's health, settings, Prometheus
    POST /completion  /tokenize  /detokenize      llama.cpp server's
    GET  /stats  /placement                       Model.stats.total and the placement plan, as JSON
    GET  /trace[?last=N]                          the routing trace (moert serve --trace): summary, last N tokens

Every error is OpenAI's JSON error object with a message that says what to fix: bad JSON or a bad field
or a prompt longer than the context is 400, a body over --max-body 413, a full queue 503; a client that
leaves cancels its request. Tokenizing and rendering the chat template run on a worker thread, not on the
event loop, so /health answers while a large request is read. Each request is logged in one line
(method, path, status, milliseconds, and the tokens of a generation) through `log`.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from moert.errors import MoertError
from moert.serve.openai_api import (
    BadRequest,
    TooLarge,
    body_of,
    chat_ids,
    chat_logprobs,
    completion_logprobs,
    field,
    job_of,
    logprobs_chat,
    logprobs_completion,
    probs_llama,
    prompt_ids,
)
from moert.serve.server import Done, Piece, QueueFull, Server, stats_dict
from moert.serve.server import Request as Job


def error(status: int, message: str) -> JSONResponse:
    kind = {400: "invalid_request_error", 413: "invalid_request_error", 501: "not_supported_error",
            503: "unavailable_error"}.get(status, "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def run(server: Server, request: Request, job: Job, *, stream: bool, chunk, final, done_marker: bool = True):
    """Queue the job; stream its pieces as SSE (chunk(piece) / final(done)), or answer once (final(done))."""
    try:
        j = server.submit(job, asyncio.get_running_loop())
    except QueueFull as e:
        return error(503, str(e))

    async def events():
        try:
            async for item in j:
                if isinstance(item, Exception):
                    yield sse({"error": {"message": str(item), "type": "server_error", "code": _status(item)}})
                    return
                if isinstance(item, Done):
                    request.state.done = item
                yield sse(final(item) if isinstance(item, Done) else chunk(item))
            if done_marker:                       # OpenAI's end of stream (llama.cpp's /completion sends none)
                yield "data: [DONE]\n\n"
        finally:
            j.cancel()                            # the client left (or it is over): free the model

    if stream:
        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    done = None
    try:
        while True:
            try:
                item = await asyncio.wait_for(j.items.get(), timeout=0.25)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return JSONResponse({}, status_code=499)
                continue
            if item is None:
                break
            if isinstance(item, Exception):
                return error(_status(item), f"generation failed: {item}")
            if isinstance(item, Done):
                done = request.state.done = item
    finally:
        j.cancel()
    if done is None:
        return error(503, "the request was dropped: the server is shutting down")
    return JSONResponse(final(done))


def _status(e: Exception) -> int:
    """The HTTP status of a failed generation: 503 when a remote expert device (a Ray worker) is lost (the server
    itself is fine and keeps serving), 400 for moert's other errors, 500 for a bug."""
    from moert.devices.remote import RemoteDeviceError

    return 503 if isinstance(e, RemoteDeviceError) else 400 if isinstance(e, MoertError) else 500


def usage(d: Done) -> dict:
    return dict(prompt_tokens=d.prompt_tokens, completion_tokens=d.completion_tokens,
                total_tokens=d.prompt_tokens + d.completion_tokens,
                prompt_tokens_details={"cached_tokens": d.cached_tokens})


def noted(out: dict, d: Done) -> dict:
    """The answer with moert's `note` (why it stopped, when that is not obvious) added."""
    return {**out, "note": d.note} if d.note else out


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def request_log(app, log):
    """ASGI middleware: one line per request once its response has ended (streams included)."""
    async def logged(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        t0, status = time.perf_counter(), [0]

        def line(code: int) -> None:
            d = scope.get("state", {}).get("done")
            gen = (f" prompt {d.prompt_tokens} (cached {d.cached_tokens}) + {d.completion_tokens} tokens, "
                   f"{d.stop_reason}" if d is not None else "")
            client = scope.get("client") or ("-", 0)
            log(f"request: {scope['method']} {scope['path']} {client[0]} {code} "
                f"{(time.perf_counter() - t0) * 1e3:.0f} ms{gen}")

        async def send_(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            if message["type"] == "http.response.body" and not message.get("more_body") and status[0]:
                line(status[0])                    # before the last bytes: the client sees it logged
                status[0] = 0
            await send(message)

        try:
            await app(scope, receive, send_)
        finally:
            if status[0]:                          # started but never ended: the client left mid-stream
                line(499)
    return logged


def create_app(server: Server, log=stderr_line, metrics: bool = False) -> FastAPI:
    """The FastAPI app serving `server`'s model; log(line) gets one line per request; metrics: GET /metrics
    answers (llama-server's --metrics), else 501."""
    app = FastAPI(title="moert serve", docs_url=None, redoc_url=None)
    m = server.model

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest):
        return error(400, str(e))

    @app.exception_handler(TooLarge)
    async def too_large(request: Request, e: TooLarge):
        return error(413, str(e))

    @app.exception_handler(MoertError)
    async def moert_error(request: Request, e: MoertError):
        return error(400, str(e))

    async def body(request: Request) -> dict:
        return await body_of(request, server.max_body)

    @app.get("/health")
    async def health():
        return {"status": "ok", "busy": server.busy, "waiting": server.waiting, **server.counts}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": server.name, "object": "model", "created": server.created,
                                            "owned_by": "moert"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        b = await body(request)
        n_lp = completion_logprobs(b)
        job = job_of(server, b, await asyncio.to_thread(prompt_ids, server, b.get("prompt")), n_lp)
        rid, now, stream = f"cmpl-{uuid.uuid4().hex}", int(time.time()), field(b, ("stream",), False, bool)
        offset = [0]

        def head(text: str, finish, lps):
            lp = None
            if n_lp is not None:
                lp = logprobs_completion(m, lps, offset[0])
                offset[0] += len(text)
            return {"id": rid, "object": "text_completion", "created": now, "model": server.name,
                    "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

        def final(d: Done):
            out = head("", d.finish_reason, []) if stream else head(d.text, d.finish_reason, d.logprobs)
            return noted({**out, "usage": usage(d)}, d)

        return await run(server, request, job, stream=stream, chunk=lambda p: head(p.text, None, p.logprobs),
                         final=final)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        b = await body(request)
        n_lp = chat_logprobs(b)
        job = job_of(server, b, await asyncio.to_thread(chat_ids, server, b), n_lp)
        rid, now, stream = f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), field(b, ("stream",), False, bool)
        first = [True]

        def choice(key: str, value: dict, finish, lps) -> dict:
            return {"index": 0, key: value, "logprobs": logprobs_chat(m, lps) if n_lp is not None else None,
                    "finish_reason": finish}

        def chunk(p: Piece):
            delta = {"role": "assistant", "content": p.text} if first[0] else {"content": p.text}
            first[0] = False
            return {"id": rid, "object": "chat.completion.chunk", "created": now, "model": server.name,
                    "choices": [choice("delta", delta, None, p.logprobs)]}

        def final(d: Done):
            if stream:
                return noted({"id": rid, "object": "chat.completion.chunk", "created": now, "model": server.name,
                              "choices": [choice("delta", {}, d.finish_reason, [])], "usage": usage(d)}, d)
            return noted({"id": rid, "object": "chat.completion", "created": now, "model": server.name,
                          "choices": [choice("message", {"role": "assistant", "content": d.text}, d.finish_reason,
                                             d.logprobs)], "usage": usage(d)}, d)

        return await run(server, request, job, stream=stream, chunk=chunk, final=final)

    @app.post("/completion")
    async def completion(request: Request):  # llama.cpp server's own
        b = await body(request)
        n_lp = completion_logprobs(b, "n_probs")
        job = job_of(server, b, await asyncio.to_thread(prompt_ids, server, b.get("prompt")), n_lp)
        stream = field(b, ("stream",), False, bool)

        def probs(lps) -> dict:
            return {"completion_probabilities": probs_llama(m, lps)} if n_lp is not None else {}

        def final(d: Done):
            return noted({"content": "" if stream else d.text, "stop": True, "model": server.name,
                          "tokens_predicted": d.completion_tokens, "tokens_evaluated": d.prompt_tokens,
                          "tokens_cached": d.cached_tokens, "stop_type": d.stop_reason, "timings": d.timings,
                          **({} if stream else probs(d.logprobs))}, d)

        return await run(server, request, job, stream=stream, final=final, done_marker=False,
                         chunk=lambda p: {"content": p.text, "stop": False, **probs(p.logprobs)})

    @app.post("/tokenize")
    async def tokenize(request: Request):
        b = await body(request)
        content = b.get("content")
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string")
        add, pieces = field(b, ("add_special",), False, bool), field(b, ("with_pieces",), False, bool)

        def answer() -> bytes:                    # a large text: seconds of work, and a large answer to encode
            ids = m.tokenize(content, add_bos=add, special=True)
            if pieces:
                return json.dumps({"tokens": [{"id": i, "piece": m.detokenize([i], special=True)} for i in ids]})
            return json.dumps({"tokens": list(ids)})

        return Response(await asyncio.to_thread(answer), media_type="application/json")

    @app.post("/detokenize")
    async def detokenize(request: Request):
        b = await body(request)
        ids = b.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BadRequest("'tokens' must be a list of token ids")
        bad = [i for i in ids if not 0 <= i < m.n_vocab]
        if bad:
            raise BadRequest(f"token ids {bad[:5]} are out of range: the vocabulary has {m.n_vocab}")
        return {"content": await asyncio.to_thread(m.detokenize, ids, special=True)}

    @app.get("/props")
    async def props():
        """llama-server's /props: the defaults a request starts from, the slots, the model and its template."""
        from moert import __version__

        tok = getattr(m, "tokenizer", None)
        template = server.chat_template or getattr(tok, "chat_template", None) or ""
        return {"default_generation_settings": {"n_ctx": server.n_ctx_slot, "params": dict(server.defaults)},
                "total_slots": server.n_parallel, "model_path": str(getattr(m.gguf, "path", server.name)),
                "model_alias": server.name, "chat_template": template,
                "bos_token": getattr(tok, "bos_token", "") or "", "eos_token": getattr(tok, "eos_token", "") or "",
                "modalities": {"vision": False, "audio": False}, "build_info": f"moert {__version__}"}

    @app.get("/metrics")
    async def prometheus():
        if not metrics:
            return error(501, "this server does not answer /metrics: start it with moert serve ... --metrics")
        return PlainTextResponse(metrics_text(server), media_type="text/plain; version=0.0.4")

    @app.get("/stats")
    async def stats():
        return {"model": server.name, "requests": dict(server.counts), **stats_dict(m)}

    @app.get("/placement")
    async def placement():
        return m.plan.to_dict()

    @app.get("/trace")
    async def trace(last: int = 0):
        """The routing trace since the server started (moert serve --trace): its summary, and with ?last=N the
        expert ids and weights of the last N tokens processed (a request's are the last it added)."""
        t = m.trace
        if t is None:
            return error(400, "tracing is off: start the server with moert serve ... --trace")
        out = t.summary()
        if last > 0:
            out["last"] = {"positions": t.positions[-last:].tolist(), "ids": t.ids[-last:].tolist(),
                           "weights": t.weights[-last:].round(6).tolist()}
        return out

    app.add_middleware(_Logged, log=log)
    return app


class _Logged:
    """request_log as Starlette middleware (add_middleware builds it with the app inside)."""

    def __init__(self, app, log):
        self.call = request_log(app, log)

    async def __call__(self, scope, receive, send):
        await self.call(scope, receive, send)


def metrics_text(server: Server) -> str:
    """llama-server's /metrics: its `llamacpp:` counters and gauges, in Prometheus' text format."""
    x, b = server.metrics, server.batcher
    decodes, busy = x.decodes + (b.steps if b else 0), x.busy_slots + (b.busy_slots if b else 0)
    counters = [("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", x.prompt_tokens),
                ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", x.cached_tokens),
                ("prompt_seconds_total", "Total time spent processing prompts", x.prompt_seconds),
                ("tokens_predicted_total", "Number of generation tokens processed", x.predicted_tokens),
                ("tokens_predicted_seconds_total", "Total time spent generating tokens", x.predicted_seconds),
                ("n_decode_total", "Total number of forward calls", decodes),
                ("n_tokens_max", "Largest observed sequence length (prompt + generation)", x.n_tokens_max)]
    gauges = [("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
               x.prompt_tokens / x.prompt_seconds if x.prompt_seconds else 0.0),
              ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
               x.predicted_tokens / x.predicted_seconds if x.predicted_seconds else 0.0),
              ("requests_processing", "Number of requests processing", server.processing),
              ("requests_deferred", "Number of requests deferred", server.waiting),
              ("n_busy_slots_per_decode", "Average number of busy slots per forward call",
               busy / max(decodes, 1))]
    out = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, help_, value in items:
            out += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    return "\n".join(out) + "\n"


__all__ = ["BadRequest", "create_app", "metrics_text", "request_log"]
