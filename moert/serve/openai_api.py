"""`moert serve`'s reading of a request and writing of its answer, as OpenAI and llama.cpp's server shape them.

    body = await body_of(request, limit)          # the JSON object, TooLarge (413) past `limit` bytes
    ids  = prompt_ids(server, body["prompt"])     # text or token ids -> checked ids   (call off the event loop:
    ids  = chat_ids(server, body)                 # messages -> chat template -> ids    they can take seconds)
    job  = job_of(server, body, ids)              # sampler, max_tokens, stop strings, logprobs
    logprobs_chat(model, lps) / logprobs_completion(model, lps, offset)   # OpenAI's two logprobs layouts

A field moert cannot honour is a BadRequest naming it (`tools`, `response_format` other than text, `n` > 1,
image parts), never silently ignored.
"""

from __future__ import annotations

import json

from moert.errors import MoertError
from moert.serve.server import Request as Job
from moert.text.sampling import SamplingParams


class BadRequest(MoertError):
    """A request the server cannot run as sent (HTTP 400)."""


class TooLarge(MoertError):
    """A body over the server's --max-body (HTTP 413)."""


MAX_TOP_LOGPROBS = 20          # OpenAI's limit for chat's top_logprobs


async def body_of(request, limit: int) -> dict:
    """The JSON object a POST sent (read at most `limit` bytes), or BadRequest / TooLarge saying what is wrong."""
    import asyncio

    def too_large(n: str) -> TooLarge:
        return TooLarge(f"the body is {n} bytes, more than this server takes ({limit:,} bytes): send less, or "
                        f"restart moert serve with a larger --max-body")

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(f"{int(declared):,}")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise too_large(f"more than {limit:,}")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = await asyncio.to_thread(json.loads, raw or b"null")    # a few MB of JSON: tens of ms, off the loop
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"the body is not valid JSON ({e}); send a JSON object such as "
                         f'{{"prompt": "Hello", "max_tokens": 16}}') from None
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body


_KINDS = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}


def field(body: dict, names: tuple[str, ...], default, kind, check=None, want: str = ""):
    """The first of `names` present in body, of type `kind` (int accepted for float), checked."""
    name = next((n for n in names if n in body and body[n] is not None), None)
    if name is None:
        return default
    v = body[name]
    ok = isinstance(v, kind) and not isinstance(v, bool) or (kind is bool and isinstance(v, bool))
    if kind is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok or (check is not None and not check(v)):
        raise BadRequest(f"'{name}' = {v!r}: expected {want or _KINDS.get(kind, kind.__name__)}")
    return v


def refuse_unsupported(body: dict) -> None:
    """BadRequest naming a field whose meaning moert does not implement (yet), rather than ignoring it."""
    for name in ("tools", "functions"):
        if body.get(name):
            raise BadRequest(f"'{name}' is not supported: moert serve does not do tool calls yet; send the "
                             f"request without '{name}'")
    if body.get("tool_choice") not in (None, "none"):
        raise BadRequest(f"'tool_choice' = {body['tool_choice']!r} is not supported: moert serve does not do "
                         f"tool calls yet; leave it out (or 'none')")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise BadRequest(f"'response_format' = {json.dumps(fmt)[:80]} is not supported: moert serve has no "
                         f"constrained (JSON) output yet; leave it out or send {{\"type\": \"text\"}}")


def job_of(server, body: dict, ids: list[int], logprobs: int | None = None) -> Job:
    """The sampler, token budget and stop strings of a request (the server's flags fill what it omits)."""
    d = server.defaults
    refuse_unsupported(body)
    if field(body, ("n",), 1, int) != 1:
        raise BadRequest("'n' must be 1: moert generates one choice per request")
    max_tokens = field(body, ("max_tokens", "max_completion_tokens", "n_predict"), d["max_tokens"], int,
                       lambda v: v >= -1, "an integer >= -1 (-1: until the end of generation)")
    stop = body.get("stop", d["stop"])
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise BadRequest(f"'stop' = {stop!r}: expected a non-empty string or a list of them")
    n_ctx = server.n_ctx_slot
    if len(ids) >= n_ctx:
        raise BadRequest(f"the prompt is {len(ids)} tokens but the context holds {n_ctx} (and needs one more "
                         f"for the reply): shorten the prompt, or restart moert serve with a larger -c")
    penalty = lambda v: -2 <= v <= 2                                        # noqa: E731
    try:
        params = SamplingParams(
            temperature=field(body, ("temperature",), d["temperature"], float),
            top_k=field(body, ("top_k",), d["top_k"], int), top_p=field(body, ("top_p",), d["top_p"], float),
            min_p=field(body, ("min_p",), d["min_p"], float),
            repeat_penalty=field(body, ("repeat_penalty",), d["repeat_penalty"], float),
            repeat_last_n=field(body, ("repeat_last_n",), d["repeat_last_n"], int),
            presence_penalty=field(body, ("presence_penalty",), d.get("presence_penalty", 0.0), float, penalty,
                                   "a number in [-2, 2]"),
            frequency_penalty=field(body, ("frequency_penalty",), d.get("frequency_penalty", 0.0), float, penalty,
                                    "a number in [-2, 2]"),
            seed=field(body, ("seed",), d["seed"], int))
    except MoertError as e:
        raise BadRequest(str(e)) from None
    return Job(ids, None if max_tokens == -1 else max_tokens, params, stop or None, logprobs)


def chat_logprobs(body: dict) -> int | None:
    """Chat's `logprobs` (true/false) and `top_logprobs` (0-20): how many alternatives to keep, None for none."""
    on = field(body, ("logprobs",), False, bool)
    top = field(body, ("top_logprobs",), None, int, lambda v: 0 <= v <= MAX_TOP_LOGPROBS,
                f"an integer in [0, {MAX_TOP_LOGPROBS}]")
    if top is not None and not on:
        raise BadRequest("'top_logprobs' needs 'logprobs': true")
    return (top or 0) if on else None


def completion_logprobs(body: dict, name: str = "logprobs") -> int | None:
    """Completions' `logprobs` (an integer 0-20: the sampled token's logprob and that many alternatives), None
    for none; name="n_probs": llama.cpp /completion's, where 0 means none."""
    n = field(body, (name,), None, int, lambda v: 0 <= v <= MAX_TOP_LOGPROBS, f"an integer in [0, {MAX_TOP_LOGPROBS}]")
    return None if n is None or (n == 0 and name == "n_probs") else n


def prompt_ids(server, prompt, add_bos: bool | None = None) -> list[int]:
    """A prompt (text, or token ids) as checked token ids."""
    m = server.model
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]                        # OpenAI's clients send [text]
    if isinstance(prompt, str) and prompt:
        check_fits(server, prompt)
        return list(m.tokenize(prompt, add_bos=add_bos, special=True))
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        bad = [i for i in prompt if not 0 <= i < m.n_vocab]
        if bad:
            raise BadRequest(f"token ids {bad[:5]} are out of range: the vocabulary has {m.n_vocab} tokens")
        return list(prompt)
    raise BadRequest(f"'prompt' = {prompt!r:.80}: expected a non-empty string or a list of token ids")


def check_fits(server, text: str) -> None:
    """BadRequest, before tokenizing, for text too long to fit the context whatever its tokens: every token
    covers at most as many bytes as its longest entry in the vocabulary (in UTF-8)."""
    longest = server.longest_token_bytes
    n = len(text)                                 # characters <= UTF-8 bytes
    if longest and n > server.n_ctx_slot * longest + 64:
        raise BadRequest(f"the prompt is {n:,} characters: more than the context's {server.n_ctx_slot} tokens can "
                         f"hold (a token of this vocabulary covers at most {longest} bytes); shorten it, or "
                         f"restart moert serve with a larger -c")


def message_text(i: int, content) -> str:
    """A message's content: a string, or OpenAI's content parts [{"type": "text", "text": ...}] joined by
    newlines (as llama-server joins them); other part types are a BadRequest naming the part."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'messages[{i}].content' must be text or a list of content parts "
                         f"[{{\"type\": \"text\", \"text\": ...}}]")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            what = f"of type {kind!r}" if isinstance(kind, str) else "that is not {\"type\": \"text\", \"text\": ...}"
            raise BadRequest(f"'messages[{i}].content[{j}]' is a part {what}: moert serve reads text parts only")
        out.append(part["text"])
    return "\n".join(out)


def chat_ids(server, body: dict) -> list[int]:
    """The conversation in `messages` through the chat template, as token ids."""
    from moert.text.chat import ChatTemplateError
    from moert.text.generate import chat_prompt

    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(x, dict) and isinstance(x.get("role"), str) for x in messages):
        raise BadRequest("'messages' must be a non-empty list of {\"role\": ..., \"content\": \"text\"} objects")
    messages = [{**x, "content": message_text(i, x.get("content"))} for i, x in enumerate(messages)]
    check_fits(server, "".join(x["content"] for x in messages))
    try:
        text, add_bos = chat_prompt(server.model, messages, server.chat_template)
    except ChatTemplateError as e:
        raise BadRequest(f"{e} (moert serve: --chat-template NAME|JINJA sets one)") from None
    return list(server.model.tokenize(text, add_bos=add_bos, special=True))


# ------------------------------------------------------------------------------------------------ answers

def token_bytes(model, i: int) -> bytes:
    """The bytes token i stands for (a byte token's single byte, not '<0x41>')."""
    piece = getattr(getattr(model, "tokenizer", None), "piece", None)
    return piece(i, special=True) if piece is not None else model.detokenize([i]).encode()


def _entry(model, i: int, lp: float) -> dict:
    b = token_bytes(model, i)
    return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}


def logprobs_chat(model, lps: list) -> dict:
    """Chat's `choices[0].logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
    return {"content": [{**_entry(model, t.id, t.logprob), "top_logprobs": [_entry(model, i, lp) for i, lp in t.top]}
                        for t in lps]}


def logprobs_completion(model, lps: list, offset: int = 0) -> dict:
    """Completions' `choices[0].logprobs`: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset."""
    tokens = [token_bytes(model, t.id).decode("utf-8", errors="replace") for t in lps]
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    return {"tokens": tokens, "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [{token_bytes(model, i).decode("utf-8", errors="replace"): lp for i, lp in t.top}
                             for t in lps], "text_offset": offsets}


def probs_llama(model, lps: list) -> list:
    """llama.cpp /completion's `completion_probabilities` (n_probs): id, token, logprob, bytes, top_logprobs."""
    return [{"id": t.id, **_entry(model, t.id, t.logprob),
             "top_logprobs": [{"id": i, **_entry(model, i, lp)} for i, lp in t.top]} for t in lps]


__all__ = ["BadRequest", "TooLarge", "body_of", "chat_ids", "chat_logprobs", "check_fits", "completion_logprobs",
           "field", "job_of", "logprobs_chat", "logprobs_completion", "message_text", "probs_llama", "prompt_ids",
           "refuse_unsupported"]
