"""Chat templates: a conversation -> one prompt string, with the GGUF's `tokenizer.chat_template` (Jinja2).

A template is untrusted input (it comes with a downloaded file), so it runs in Jinja2's
ImmutableSandboxedEnvironment: no attribute access to `__class__`/`__mro__`/..., no mutating
methods; a template that tries is a ChatTemplateError, never code execution. The sandbox limits what
a template may touch, not how long it runs, so moert adds a budget: `**` and string/list repetition
are bounded, `range` is too, the output is capped at MAX_OUTPUT characters, and rendering stops at a
deadline (a trace hook on the template's own code, which checks the clock at every line it runs).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from moert.errors import MoertError


class ChatTemplateError(MoertError, ValueError):
    """A chat template that is missing, does not parse, refuses the conversation, or breaks the sandbox rules."""


# Built-in templates for files without tokenizer.chat_template, picked by the vocabulary's turn tokens.
BUILTIN_TEMPLATES: dict[str, str] = {
    # Qwen / ChatML, without a default system prompt
    "chatml": (
        "{%- for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    # Gemma 3 instruction-tuned models (google/gemma-3-*-it, tokenizer_config.json), text parts only
    "gemma": (
        "{{ bos_token }}"
        "{%- if messages[0]['role'] == 'system' -%}"
        "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
        "{%- set loop_messages = messages[1:] -%}"
        "{%- else -%}"
        "{%- set first_user_prefix = '' -%}"
        "{%- set loop_messages = messages -%}"
        "{%- endif -%}"
        "{%- for message in loop_messages -%}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif -%}"
        "{%- if (message['role'] == 'assistant') -%}{%- set role = 'model' -%}"
        "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
        "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
        "{{ message['content'] | trim }}"
        "{{ '<end_of_turn>\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
    ),
}
_TURN_TOKENS = {"gemma": ("<start_of_turn>", "<end_of_turn>"), "chatml": ("<|im_start|>", "<|im_end|>")}


MAX_SECONDS = 2.0          # a real template renders in about a millisecond
MAX_OUTPUT = 1 << 20       # characters of rendered prompt (and of any string or list a template builds)
MAX_EXPONENT = 1024        # `a ** b` with |b| above this is refused (9 ** 999999999 never finishes)
MAX_RANGE = 100_000        # range() length, as Jinja2's sandbox; the deadline bounds loops of ranges


def _sandbox():
    """Jinja2's immutable sandbox, made strict (an unsafe attribute raises at once) and bounded (`**`,
    repetition, range)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Sandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"**", "*"})

        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
                raise SecurityError(f"the exponent {right!r} is larger than {MAX_EXPONENT}")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_OUTPUT:
                        raise SecurityError(f"repeating a {type(seq).__name__} of {len(seq)} {n} times exceeds "
                                            f"{MAX_OUTPUT:,} items")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja2's signature)
            # str.ljust/center/zfill/expandtabs/... with a huge width build the string before anything else
            # could stop them: a size argument to a method of a string or list is bounded like repetition
            if isinstance(getattr(__obj, "__self__", None), (str, list, tuple)):
                for a in (*args, *kwargs.values()):
                    if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_OUTPUT:
                        raise SecurityError(f"{getattr(__obj, '__name__', 'a method')}() with {a:,} exceeds "
                                            f"{MAX_OUTPUT:,} items")
            return super().call(__context, __obj, *args, **kwargs)

    return Sandbox


def _bounded(f):
    """Filter f, refusing size arguments above MAX_OUTPUT (`|center(10**9)` would build the string first)."""
    import functools

    from jinja2.sandbox import SecurityError

    @functools.wraps(f)   # keeps Jinja2's pass_context / pass_environment marks
    def g(*args, **kwargs):
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_OUTPUT:
                raise SecurityError(f"filter {f.__name__} with {a:,} exceeds {MAX_OUTPUT:,} items")
        return f(*args, **kwargs)
    return g


def _bounded_range(*args):
    r = range(*args)
    if len(r) > MAX_RANGE:
        from jinja2.sandbox import SecurityError

        raise SecurityError(f"range of {len(r):,} items is larger than {MAX_RANGE:,}")
    return r


class _Deadline:
    """A trace hook on the template's own frames (Jinja2 compiles templates to Python code named
    '<template>'): at every line they run it checks the clock, and past the deadline raises inside them."""

    def __init__(self, seconds: float):
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds

    def __call__(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == "<template>" else None

    def _line(self, frame, event, arg):
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the chat template ran longer than {self.seconds} s (a loop that does not "
                                    f"end, or one far too large); pass template= to use another one")
        return self._line


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str):
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def resolve_template(template: str | None, tokenizer=None) -> str:
    """A template: the given one (source or a BUILTIN_TEMPLATES name), else the vocabulary's, else a built-in."""
    if template is not None:
        return BUILTIN_TEMPLATES.get(template, template)
    own = getattr(tokenizer, "chat_template", None)
    if own:
        return own
    token_id = getattr(tokenizer, "token_id", None)
    for name, turn in _TURN_TOKENS.items():
        if token_id is not None and all(token_id(t) is not None for t in turn):
            return BUILTIN_TEMPLATES[name]
    raise ChatTemplateError("this model has no chat template (no tokenizer.chat_template in the GGUF) and its "
                            "vocabulary has no known turn tokens; pass template= (a Jinja2 template or one of "
                            f"{sorted(BUILTIN_TEMPLATES)}), or use plain generation.")


def render(template: str, messages: Sequence[Mapping[str, object]], *, add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **extra) -> str:
    """Render a conversation with a chat template in Jinja2's immutable sandbox."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import SecurityError

    if not isinstance(messages, Sequence) or isinstance(messages, str) or not all(
            isinstance(m, Mapping) and "role" in m for m in messages):
        raise ChatTemplateError("messages must be a list of {'role': ..., 'content': ...} dicts, got "
                                f"{messages!r:.120}")
    # the environment HF transformers gives templates (apply_chat_template), so real templates render the same
    env = _sandbox()(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters.update({k: _bounded(f) for k, f in env.filters.items()})
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["range"] = _bounded_range
    old = sys.gettrace()
    try:
        compiled = env.from_string(template)
        sys.settrace(_Deadline(MAX_SECONDS))
        out, n = [], 0
        for piece in compiled.generate(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                       bos_token=bos_token, eos_token=eos_token, **extra):
            n += len(piece)
            if n > MAX_OUTPUT:
                raise ChatTemplateError(f"the chat template produced more than {MAX_OUTPUT:,} characters; "
                                        f"pass template= to use another one")
            out.append(piece)
        return "".join(out)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"the chat template tried something the sandbox forbids ({e}); the template "
                                f"is unsafe, do not use this file's template (pass template=).") from None
    except jinja2.TemplateError as e:
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise ChatTemplateError(f"the chat template does not render{where}: {str(e).rstrip('.')}. "
                                f"Pass template= to use another one.") from None
    except Exception as e:  # a template is untrusted input: whatever it trips on is the template's error
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {str(e).rstrip('.')}. "
                                f"Pass template= to use another one.") from None
    finally:
        sys.settrace(old)
