"""Chat templates: a conversation -> one prompt string, with the GGUF's `tokenizer.chat_template` (Jinja2).

A template is untrusted input (it comes with a downloaded file), so it runs in Jinja2's
ImmutableSandboxedEnvironment: no attribute access to `__class__`/`__mro__`/..., no mutating
methods; a template that tries is a ChatTemplateError, never code execution.
"""

from __future__ import annotations

import json
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


def _sandbox():
    """Jinja2's immutable sandbox, made strict: touching an unsafe attribute raises at once, not later."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Sandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj, attribute):
            raise SecurityError(f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe")

    return Sandbox


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
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
        return compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **extra)
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
