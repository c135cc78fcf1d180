"""The generation loop and chat templates, with fake deterministic models over the small synthetic vocabulary."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pytest

from moert.errors import MoertError
from moert.testing import CHATML_TEMPLATE, gpt2_vocab_metadata
from moert.text.chat import BUILTIN_TEMPLATES, ChatTemplateError, render, resolve_template
from moert.text.generate import (
    ContextOverflowError,
    GenerationError,
    GenerationStats,
    chat,
    chat_prompt,
    generate,
    generate_ids,
    stream,
)
from moert.text.sampling import SamplingError, SamplingParams
from moert.text.tokenizer import NoVocab, Tokenizer


@lru_cache(maxsize=1)
def vocab() -> Tokenizer:
    return Tokenizer.from_gguf(gpt2_vocab_metadata())


class FakeModel:
    """The generate() protocol over a table: row = logits for the token after `token` at `position`.

    `script` makes it say those token ids after any prompt (greedy), then EOS; `table` (V, V) is a bigram
    model instead (logits depend on the last token only). `fail_at`: position where forward misbehaves.
    """

    def __init__(self, script=None, table=None, context_size=64, fail_at=None, failure="raise"):
        self.tokenizer = vocab()
        self.n_vocab = self.tokenizer.n_vocab
        self.eos_ids = set(self.tokenizer.eog_ids)
        self.script, self.table = script, table
        self.context_size, self.fail_at, self.failure = context_size, fail_at, failure
        self.position, self.n_prompt, self.forwarded = 0, None, []

    def tokenize(self, text, add_bos=None, special=False):
        return self.tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, ids):
        return self.tokenizer.detokenize(ids)

    def reset(self):
        self.position, self.n_prompt = 0, None

    def forward(self, tokens, last_only=False):
        tokens = list(tokens)
        if self.position + len(tokens) > self.context_size:
            raise AssertionError("the loop ran past the context")
        if self.n_prompt is None:
            self.n_prompt = len(tokens)
        rows = []
        for j, tok in enumerate(tokens):
            pos = self.position + j
            if pos == self.fail_at:
                if self.failure == "nan":
                    rows.append(np.full(self.n_vocab, np.nan, np.float32))
                    continue
                self.position += j  # half-written KV cache: what reset() must clean up
                raise {"raise": RuntimeError, "interrupt": KeyboardInterrupt}[self.failure]("forward failed")
            if self.table is not None:
                rows.append(self.table[tok])
                continue
            k = pos - self.n_prompt + 1  # index in the script of the token that follows this one
            row = np.zeros(self.n_vocab, np.float32)
            row[self.script[k] if 0 <= k < len(self.script) else self.tokenizer.eos_id] = 10.0
            rows.append(row)
        self.position += len(tokens)
        self.forwarded.append(tokens)
        return np.stack(rows)[-1:] if last_only else np.stack(rows)


def says(text: str, **kw) -> FakeModel:
    return FakeModel(script=vocab().tokenize(text, add_bos=False), **kw)


GREEDY = dict(temperature=0)


def test_greedy_generation_says_the_script_then_stops_at_eos():
    m = says(" Paris, of course.")
    s = stream(m, "The capital of France is", 50, **GREEDY)
    pieces = list(s)
    assert "".join(pieces) == s.text == " Paris, of course."
    assert len(pieces) == len(s.tokens) == s.stats.generated_tokens - 1  # the EOS is sampled, not shown
    assert s.stats.stop_reason == "eos"
    assert s.stats.prompt_tokens == len(vocab().tokenize("The capital of France is"))
    assert m.forwarded[0] == vocab().tokenize("The capital of France is")
    assert all(len(f) == 1 for f in m.forwarded[1:])  # one token per step after the prompt


def test_max_tokens():
    m = says(" one two three four five six")
    s = stream(m, "Count:", 3, **GREEDY)
    assert "".join(s) == s.text and len(s.tokens) == 3 and s.stats.stop_reason == "length"
    assert generate(m, "Count:", 0, **GREEDY) == ""
    everything = " one two three four five six"
    assert generate(m, "Count:", None, **GREEDY) == generate(m, "Count:", -1, **GREEDY) == everything


def test_stop_string_is_cut_and_never_streamed_even_across_tokens():
    text = " Hello world! The end."
    ids = vocab().tokenize(text, add_bos=False)
    assert len(ids) > 4
    for stop in ["world", "lo wor", "o w", "!", " The end", "end."]:
        s = stream(says(text), "Say:", 50, stop=stop, **GREEDY)
        pieces = list(s)
        assert "".join(pieces) == s.text == text[:text.index(stop)], stop
        assert s.stats.stop_reason == "stop"
    s = stream(says(text), "Say:", 50, stop=["zzz", "The", "world"], **GREEDY)  # the earliest one wins
    assert "".join(s) == s.text == " Hello "


def test_held_back_prefix_of_a_stop_string_is_released():
    text = " Hello world! The end."
    for stop in ["worldwide", "end.!", ".\n"]:
        s = stream(says(text), "Say:", 50, stop=stop, **GREEDY)
        assert "".join(s) == text and s.stats.stop_reason == "eos"
    s = stream(says(text), "Say:", 5, stop="worldwide", **GREEDY)  # max_tokens ends it while "world" is held
    assert "".join(s) == vocab().detokenize(vocab().tokenize(text, add_bos=False)[:5])


def test_a_character_split_over_byte_tokens_is_held_until_complete():
    t = vocab()
    # the model emits 😐 as its four bytes, four byte-level tokens
    stand_in = {v: k for k, v in t._byte_decoder.items()}
    byte_ids = [t.token_id(stand_in[b]) for b in "😐".encode()]
    script = [*t.tokenize(" a", add_bos=False), *byte_ids, *t.tokenize("!", add_bos=False)]
    s = stream(FakeModel(script=script), "x", 50, **GREEDY)
    pieces = list(s)
    assert "".join(pieces) == " a😐!" and not any("\ufffd" in p for p in pieces)
    assert "😐" in pieces or "😐!" in pieces
    # cut short inside the character: the held bytes come out as U+FFFD at the end
    assert generate(FakeModel(script=script), "x", 3, **GREEDY) == " a\ufffd"


def test_context_fills_up():
    m = says(" a b c d e f g h i j k l m n o p", context_size=8)
    prompt = vocab().tokenize("Go:")
    s = stream(m, "Go:", 100, **GREEDY)
    s_text = "".join(s)
    assert s.stats.stop_reason == "context"
    assert len(prompt) + len(s.tokens) == 9  # 8 in the cache, the last one sampled from the last logits
    assert s_text == vocab().detokenize(s.tokens)


def test_prompt_errors_leave_the_model_untouched():
    m = says(" ok", context_size=4)
    with pytest.raises(ContextOverflowError, match=r"prompt is \d+ tokens but the context holds 4"):
        generate(m, "this prompt is longer than four tokens for sure", 5)
    with pytest.raises(GenerationError, match="empty"):
        generate(m, "", 5)  # this vocabulary adds no BOS
    with pytest.raises(GenerationError, match="out of range"):
        generate(m, [1, 2, 99999], 5)
    with pytest.raises(GenerationError, match="max_tokens"):
        generate(m, "hi", -5)
    with pytest.raises(GenerationError, match="stop strings"):
        generate(m, "hi", 5, stop=[""])
    with pytest.raises(SamplingError, match="temperature"):
        generate(m, "hi", 5, temperature=-1)
    assert m.forwarded == [] and m.position == 0
    assert issubclass(ContextOverflowError, GenerationError) and issubclass(GenerationError, (MoertError, ValueError))


@pytest.mark.parametrize("failure, error", [("raise", RuntimeError), ("nan", SamplingError),
                                            ("interrupt", KeyboardInterrupt)])
def test_after_an_error_the_model_is_reset_and_usable(failure, error):
    m = says(" fine, thanks", fail_at=len(vocab().tokenize("How are you?")) + 2, failure=failure)
    s = stream(m, "How are you?", 20, **GREEDY)
    with pytest.raises(error):
        list(s)
    assert m.position == 0
    if failure == "interrupt":
        assert s.stats.stop_reason == "interrupted"
    m.fail_at = None
    assert generate(m, "How are you?", 20, **GREEDY) == " fine, thanks"


def test_a_consumer_that_stops_early_leaves_the_model_reset():
    m = says(" one two three four")
    s = stream(m, "Count:", 20, **GREEDY)
    next(iter(s))
    s._it.close()
    assert m.position == 0


def test_seed_reproducible_sampling():
    rng = np.random.default_rng(0)
    n = vocab().n_vocab
    table = (rng.standard_normal((n, n)) * 3).astype(np.float32)  # a random bigram model
    kw = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)

    def run(seed):
        return generate_ids(FakeModel(table=table), "Once upon a time", 20, SamplingParams(**kw, seed=seed))

    assert run(1) == run(1)
    assert len({tuple(run(s)) for s in range(2, 6)}) > 1
    assert generate(FakeModel(table=table), "Once", 10, seed=3, **kw) == generate(FakeModel(table=table), "Once", 10,
                                                                                    seed=3, **kw)


def test_stats_report_like_llama_cpp():
    s = stream(says(" a b c"), "x y", 10, **GREEDY)
    "".join(s)
    st = s.stats
    assert st.prompt_seconds > 0 and st.generation_seconds > 0
    lines = st.report().splitlines()
    num, n = r"\s*[\d.]+", st.prompt_tokens
    assert re.fullmatch(rf"prompt eval time ={num} ms /\s+{n} tokens \({num} ms per token,{num} tokens per second\)",
                        lines[0]), lines[0]
    assert re.fullmatch(rf"       eval time ={num} ms /\s+{st.generated_tokens} runs   \({num} ms per token,{num} "
                        rf"tokens per second\)", lines[1]), lines[1]
    assert re.fullmatch(rf"      total time ={num} ms /\s+{n + st.generated_tokens} tokens", lines[2]), lines[2]
    assert "0.00 tokens per second" in GenerationStats().report()  # nothing ran: no division by zero


def test_models_without_a_vocabulary_run_from_ids():
    m = FakeModel(script=[5, 6, 7])
    assert generate_ids(m, [1, 2, 3], 10, SamplingParams(temperature=0)) == [5, 6, 7]
    nv = NoVocab(1024)
    with pytest.raises(MoertError, match="no vocabulary"):
        nv.tokenize("hello")
    with pytest.raises(MoertError, match="no vocabulary"):
        nv.detokenize([1, 2])
    md = {"general.architecture": "qwen3moe", "qwen3moe.vocab_size": 256, "tokenizer.ggml.model": "none"}
    assert Tokenizer.from_gguf(md).n_vocab == 256 and not Tokenizer.from_gguf(md).has_vocab


# -- chat ------------------------------------------------------------------------------------------------

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": " Capital of France? "}]


def test_chatml_template():
    text = render(CHATML_TEMPLATE, CONVERSATION)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                    "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n Capital of France? <|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert not render(CHATML_TEMPLATE, CONVERSATION, add_generation_prompt=False).endswith("assistant\n")


def test_gemma_builtin_template():
    text = render(BUILTIN_TEMPLATES["gemma"], CONVERSATION, bos_token="<bos>")
    assert text == ("<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
                    "<start_of_turn>model\nHello.<end_of_turn>\n"
                    "<start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n")
    with pytest.raises(ChatTemplateError, match="must alternate"):
        render(BUILTIN_TEMPLATES["gemma"], [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])


def test_chat_uses_the_template_special_tokens_and_stops_at_end_of_turn():
    t = vocab()
    reply = t.tokenize(" Paris.", add_bos=False) + [t.token_id("<|im_end|>")] + t.tokenize(" junk", add_bos=False)
    m = FakeModel(script=reply)
    assert chat(m, CONVERSATION[1:], 20, **GREEDY) == " Paris."
    rendered = render(CHATML_TEMPLATE, CONVERSATION[1:])
    assert m.forwarded[0] == t.tokenize(rendered, special=True)
    assert t.token_id("<|im_start|>") in m.forwarded[0]  # the turn markers are tokens, not text


def test_chat_prompt_adds_bos_once():
    class WithBos:
        tokenizer = type("T", (), {"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": None,
                                   "token_id": staticmethod(lambda s: 1 if s in ("<start_of_turn>",
                                                                                 "<end_of_turn>") else None)})()

    text, add_bos = chat_prompt(WithBos(), [{"role": "user", "content": "hi"}])
    assert add_bos is True and text == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    text, add_bos = chat_prompt(says("x"), [{"role": "user", "content": "hi"}])
    assert add_bos is None and text.startswith("<|im_start|>user")


def test_template_resolution():
    assert resolve_template("chatml") == BUILTIN_TEMPLATES["chatml"]
    assert resolve_template("{{ 1 }}") == "{{ 1 }}"
    assert resolve_template(None, vocab()) == CHATML_TEMPLATE  # the file's own
    with pytest.raises(ChatTemplateError, match="no chat template"):
        resolve_template(None, None)


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('touch PWNED').read() }}",
    "{{ joiner.__init__.__globals__.__builtins__.open('PWNED', 'w').write('x') }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ messages.__class__ }}",
    "{% set _ = messages.append({'role': 'x'}) %}",
    "{{ raise_exception.__globals__ }}",
])
def test_template_escapes_are_errors_not_code_execution(template, tmp_path):
    target = tmp_path / "pwned"
    with pytest.raises(ChatTemplateError, match="sandbox forbids"):
        render(template.replace("PWNED", str(target)), [{"role": "user", "content": "hi"}])
    assert not target.exists()


def test_template_errors_are_typed():
    with pytest.raises(ChatTemplateError, match="line 1"):
        render("{% for %}", [])
    with pytest.raises(ChatTemplateError, match="refused the conversation: nope"):
        render("{{ raise_exception('nope') }}", [])
    with pytest.raises(ChatTemplateError, match="list of"):
        render("x", "not a conversation")
    with pytest.raises(ChatTemplateError, match="TypeError"):
        render("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "a"}])
