"""The generation loop: prompt -> forward -> sample -> forward ... until EOS, a stop string, max tokens, full context.

It works with any model object that has these (moert's Model has them; tests use a table-driven fake):

    model.tokenize(text, add_bos=None, special=False) -> list[int]   text -> ids (add_bos None: the vocabulary decides)
    model.detokenize(ids) -> str                                     ids -> text, control tokens as ''
    model.forward(tokens, last_only) -> np.ndarray (T or 1, n_vocab) run T tokens at model.position, advance it by T
    model.reset()                                                    empty the KV cache; position back to 0
    model.position: int                                              tokens in the KV cache
    model.context_size: int                                          how many it can hold
    model.eos_ids: set[int]                                          ids that end generation (EOS, EOT, ...)
    model.tokenizer (only for chat())                                a moert Tokenizer: its chat_template, BOS/EOS text

A call keeps the longest prefix of its prompt that is already in the KV cache (a model with
`context_tokens`, as moert's Model has: chat turns, a prompt that extends the last one) and runs only the
rest; other models start from an empty cache (model.reset()). If anything goes wrong mid-way (an error,
Ctrl-C, a consumer that stops early) the model is reset, so the next call finds it usable.
Timings come back in GenerationStats (stream(...).stats), printed the way llama.cpp prints them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from moert.errors import ContextOverflowError, GenerationError
from moert.text.sampling import Sampler, SamplingParams


@dataclass
class GenerationStats:
    """Counts and wall-clock times of one generation (forwards on a virtual clock's time, moert/cost/vclock.py);
    `report()` prints them as llama.cpp does."""

    prompt_tokens: int = 0  # prompt tokens run through the model (not counting the cached ones)
    cached_tokens: int = 0  # prompt tokens whose KV entries were still in the cache from the last call
    prompt_seconds: float = 0.0  # the forward pass over the prompt
    generated_tokens: int = 0  # tokens sampled (an end-of-generation token included)
    generation_seconds: float = 0.0  # from the prompt's logits to the last sampled token
    stop_reason: str = ""  # 'eos', 'stop' (a stop string), 'length' (max_tokens), 'context' (full), 'interrupted'

    def report(self) -> str:
        """Three lines in llama.cpp's `llama_perf_context_print` format."""

        def rate(ms: float, n: int) -> str:
            per = ms / n if n else 0.0
            return f"({per:8.2f} ms per token, {1e3 / per if per else 0.0:8.2f} tokens per second)"

        p_ms, g_ms = self.prompt_seconds * 1e3, self.generation_seconds * 1e3
        return "\n".join([
            f"prompt eval time = {p_ms:10.2f} ms / {self.prompt_tokens:5d} tokens {rate(p_ms, self.prompt_tokens)}",
            f"       eval time = {g_ms:10.2f} ms / {self.generated_tokens:5d} runs   "
            f"{rate(g_ms, self.generated_tokens)}",
            f"      total time = {p_ms + g_ms:10.2f} ms / {self.prompt_tokens + self.generated_tokens:5d} tokens",
        ])


def prompt_ids(model, prompt: str | Sequence[int], add_bos: bool | None = None, special: bool = True) -> list[int]:
    """The prompt as ids, checked: not empty, and fits the model's context."""
    if isinstance(prompt, str):
        ids = list(model.tokenize(prompt, add_bos=add_bos, special=special))
    else:
        try:
            ids = [int(i) for i in prompt]
        except (TypeError, ValueError):
            raise GenerationError(f"a prompt is a str or a sequence of token ids, got {prompt!r:.80}") from None
        n_vocab = getattr(model, "n_vocab", None)
        bad = [i for i in ids if i < 0 or (n_vocab is not None and i >= n_vocab)]
        if bad:
            raise GenerationError(f"prompt token ids {bad[:5]} are out of range (vocabulary: {n_vocab} tokens).")
    if not ids:
        raise GenerationError("the prompt is empty (no tokens to start from): give some text, or leave add_bos on "
                              "so the prompt starts with the BOS token.")
    if len(ids) > model.context_size:
        raise ContextOverflowError(f"the prompt is {len(ids)} tokens but the context holds {model.context_size}: "
                                   f"shorten the prompt or load the model with a larger context (-c).")
    return ids


def _tokens(model, ids: list[int], max_tokens: int | None, sampler: Sampler, stats: GenerationStats) -> Iterator[int]:
    """Sampled token ids, one at a time; resets the model if it does not finish normally."""
    keep = _cached_prefix(model, ids)
    stats.prompt_tokens, stats.cached_tokens = len(ids) - keep, keep
    if keep:
        model.position = keep           # the KV entries past it are overwritten as the rest arrives
    else:
        model.reset()
    finished = False
    try:
        if max_tokens == 0:
            stats.stop_reason = "length"
            finished = True
            return
        # with a virtual clock (moert.load(..., hardware=)) a forward takes the clock's time, not the wall's:
        # `unclocked` is the wall time of forwards less their clocked time, taken off
        clocked, unclocked = getattr(model, "clock", None) is not None, 0.0
        t0 = time.perf_counter()
        logits = model.forward(ids[keep:], last_only=True)  # (1, V): the prompt's last position
        t1 = time.perf_counter()
        stats.prompt_seconds = model.stats.last.seconds if clocked else t1 - t0
        history = list(ids)
        while True:
            tok = sampler(logits[-1], history)
            stats.generated_tokens += 1
            stats.generation_seconds = time.perf_counter() - t1 - unclocked
            if tok in model.eos_ids:
                stats.stop_reason = "eos"
                break
            history.append(tok)
            yield tok
            if max_tokens is not None and stats.generated_tokens >= max_tokens:
                stats.stop_reason = "length"
                break
            if model.position >= model.context_size:
                stats.stop_reason = "context"
                break
            tf = time.perf_counter()
            logits = model.forward([tok])
            if clocked:
                unclocked += time.perf_counter() - tf - model.stats.last.seconds
        finished = True
    except KeyboardInterrupt:
        stats.stop_reason = "interrupted"
        raise
    finally:
        if not finished:
            model.reset()


def _cached_prefix(model, ids: list[int]) -> int:
    """How many leading prompt ids are already in the model's KV cache, leaving at least one to run (its
    logits start the generation). 0 for a model that does not say what is in its cache."""
    cached = getattr(model, "context_tokens", None)
    if not cached:
        return 0
    n = min(len(cached), len(ids) - 1)
    keep = 0
    while keep < n and cached[keep] == ids[keep]:
        keep += 1
    return keep


class _IncrementalText:
    """Text of generated ids through model.detokenize alone, one piece per token, never half a character.

    Decodes a short window (a few tokens of context + the new ones) and emits what it adds, as HF's
    TextStreamer and vLLM do; a window ending in U+FFFD may be a byte token's unfinished UTF-8, so it waits.
    """

    def __init__(self, detokenize, context: Sequence[int]):
        self._detokenize = detokenize
        self._ids = list(context[-4:])
        self._prefix, self._read = 0, len(self._ids)

    def push(self, tok: int) -> str:
        self._ids.append(tok)
        prev = self._detokenize(self._ids[self._prefix:self._read])
        new = self._detokenize(self._ids[self._prefix:])
        if new.endswith("\ufffd") or len(new) <= len(prev):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return new[len(prev):]

    def flush(self) -> str:
        prev = self._detokenize(self._ids[self._prefix:self._read])
        return self._detokenize(self._ids[self._prefix:])[len(prev):]


class TextStream:
    """Iterate for text pieces as they decode; `.text`, `.tokens`, `.stats` fill in as it goes.

    Stop strings are cut from the output: text that could be the start of one is held back until it is not.
    """

    def __init__(self, model, prompt: str | Sequence[int], max_tokens: int | None = None,
                 params: SamplingParams | None = None, stop: str | Sequence[str] | None = None,
                 add_bos: bool | None = None, special: bool = True, logprobs: int | None = None):
        self.stop = _stop_strings(stop)
        if max_tokens == -1:
            max_tokens = None  # llama.cpp's -n -1: until EOS or a full context
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens < 0):
            raise GenerationError(f"max_tokens = {max_tokens!r}: use a count >= 0, or None / -1 for "
                                  f"'until end of generation or a full context'.")
        self.model = model
        self.prompt_ids = prompt_ids(model, prompt, add_bos, special)
        self.max_tokens = max_tokens
        self.sampler = Sampler(params, logprobs)   # logprobs=n: each draw's TokenLogprob in sampler.logprobs
        self.stats = GenerationStats()
        self.tokens: list[int] = []
        self.text = ""
        self._it = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._it

    def __next__(self) -> str:
        return next(self._it)

    def _run(self) -> Iterator[str]:
        text = _IncrementalText(self.model.detokenize, self.prompt_ids)
        tokens = _tokens(self.model, self.prompt_ids, self.max_tokens, self.sampler, self.stats)
        pending = ""  # decoded, not yet shown: it may be the start of a stop string
        try:
            for tok in tokens:
                self.tokens.append(tok)
                pending += text.push(tok)
                out, pending, hit = _cut(pending, self.stop)
                if out:
                    self.text += out
                    yield out
                if hit:
                    self.stats.stop_reason = "stop"
                    return
            pending += text.flush()
            out, pending, hit = _cut(pending, self.stop, final=True)
            if hit:
                self.stats.stop_reason = "stop"
            if out:
                self.text += out
                yield out
        finally:
            tokens.close()  # stopping early (a stop string, or the consumer) resets the model


def _stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stops):
        raise GenerationError(f"stop strings must be non-empty str, got {stop!r}")
    return stops


def _cut(pending: str, stops: tuple[str, ...], final: bool = False) -> tuple[str, str, bool]:
    """Split pending text into (safe to show, held back, a stop string was found)."""
    hits = [i for i in (pending.find(s) for s in stops) if i >= 0]
    if hits:
        return pending[:min(hits)], "", True
    if final:
        return pending, "", False
    hold = max((n for s in stops for n in range(min(len(s) - 1, len(pending)), 0, -1)
                if pending.endswith(s[:n])), default=0)
    return pending[:len(pending) - hold], pending[len(pending) - hold:], False


def stream(model, prompt: str | Sequence[int], max_tokens: int | None = 128, temperature: float = 0.8,
           top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
           seed: int | None = None, stop: str | Sequence[str] | None = None, *, repeat_last_n: int = 64,
           presence_penalty: float = 0.0, frequency_penalty: float = 0.0, add_bos: bool | None = None,
           special: bool = True) -> TextStream:
    """Generate, yielding text pieces as they decode; the returned stream's `.stats` has the timings."""
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed,
                            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty)
    return TextStream(model, prompt, max_tokens, params, stop, add_bos=add_bos, special=special)


def generate(model, prompt: str | Sequence[int], max_tokens: int | None = 128, temperature: float = 0.8,
             top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
             seed: int | None = None, stop: str | Sequence[str] | None = None, **kwargs) -> str:
    """Generate and return the text (stop string, if hit, cut off). Same arguments as `stream`."""
    return "".join(stream(model, prompt, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop,
                          **kwargs))


def generate_ids(model, prompt: str | Sequence[int], max_tokens: int | None = 128,
                 params: SamplingParams | None = None, stats: GenerationStats | None = None) -> list[int]:
    """Generated token ids, no text: works for models without a vocabulary (prompt given as ids)."""
    if max_tokens == -1:
        max_tokens = None
    ids = prompt_ids(model, prompt)
    return list(_tokens(model, ids, max_tokens, Sampler(params), stats or GenerationStats()))


def chat_prompt(model, messages: Sequence[Mapping[str, object]], template: str | None = None,
                add_generation_prompt: bool = True) -> tuple[str, bool | None]:
    """The conversation rendered with the model's chat template, and the add_bos to tokenize it with."""
    from moert.text.chat import render, resolve_template

    tok = getattr(model, "tokenizer", None)
    bos = getattr(tok, "bos_token", "") or ""
    text = render(resolve_template(template, tok), messages, add_generation_prompt=add_generation_prompt,
                  bos_token=bos, eos_token=getattr(tok, "eos_token", "") or "")
    if bos and text.startswith(bos):
        return text[len(bos):], True  # the template wrote BOS as text: add it once, as an id
    return text, None


def chat(model, messages: Sequence[Mapping[str, object]], max_tokens: int | None = 256, temperature: float = 0.8,
         top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05, repeat_penalty: float = 1.0,
         seed: int | None = None, stop: str | Sequence[str] | None = None, *, template: str | None = None,
         **kwargs) -> str:
    """The assistant's reply to `messages` ([{'role': 'user', 'content': ...}, ...]) via the chat template."""
    text, add_bos = chat_prompt(model, messages, template)
    return generate(model, text, max_tokens, temperature, top_k, top_p, min_p, repeat_penalty, seed, stop,
                    add_bos=add_bos, special=True, **kwargs)


class TextAPI:
    """What moert.Model offers for text: its vocabulary, tokenize/detokenize, generate, stream, chat."""

    @cached_property
    def tokenizer(self):
        """The GGUF's vocabulary (moert/text/tokenizer.py), built on first use; NoVocab for 'none'."""
        from moert.text.tokenizer import Tokenizer

        return Tokenizer.from_gguf(self.gguf.metadata)

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    @property
    def eos_ids(self) -> set[int]:
        """Ids that end generation (EOS, EOT and the vocabulary's other end-of-generation tokens)."""
        return set(self.tokenizer.eog_ids)

    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Text -> token ids with the model's vocabulary (add_bos None: as the GGUF says)."""
        return self.tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, ids, special: bool = False) -> str:
        """Token ids -> text."""
        return self.tokenizer.detokenize(ids, special=special)

    def generate(self, prompt, max_tokens: int | None = 128, **kwargs) -> str:
        """Generated text for a prompt (str or ids); sampling options as moert.text.generate.generate."""
        return generate(self, prompt, max_tokens, **kwargs)

    def stream(self, prompt, max_tokens: int | None = 128, **kwargs):
        """Text pieces as they decode; the returned stream's `.stats` has llama.cpp-style timings."""
        return stream(self, prompt, max_tokens, **kwargs)

    def chat(self, messages, max_tokens: int | None = 256, **kwargs) -> str:
        """The assistant's reply to [{'role': ..., 'content': ...}, ...] via the GGUF's chat template."""
        return chat(self, messages, max_tokens, **kwargs)
