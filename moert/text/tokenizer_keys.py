"""The GGUF type of every `tokenizer.*` key, as llama.cpp reads it, checked before the vocabulary is built.

llama.cpp reads these keys with typed getters (llama-vocab.cpp: `get_key`, `gguf_get_arr_data`), so a
well-formed file whose `tokenizer.ggml.tokens` is a UINT32, or whose `token_type` holds strings, is refused
there; here it is a `TokenizerKeyError` naming the key, the type llama.cpp reads and the type the file has.
A numeric array must have the exact element type (llama.cpp casts its bytes: an INT64 `token_type` would be
misread); a scalar id only has to be an integer (a token id stored as UINT64 reads the same).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from moert.errors import GGUFError, TokenizerError

_IDS = ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "cls", "prefix", "suffix", "middle",
        "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
_FLAGS = ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces")

# key -> the GGUF type llama.cpp reads (gguf-py's constants.py Keys.Tokenizer names them all)
KEY_TYPES: dict[str, str] = {
    "tokenizer.ggml.model": "STRING",
    "tokenizer.ggml.pre": "STRING",
    "tokenizer.ggml.tokens": "ARRAY[STRING]",
    "tokenizer.ggml.token_type": "ARRAY[INT32]",
    "tokenizer.ggml.token_type_count": "UINT32",
    "tokenizer.ggml.scores": "ARRAY[FLOAT32]",
    "tokenizer.ggml.merges": "ARRAY[STRING]",
    "tokenizer.ggml.precompiled_charsmap": "ARRAY[UINT8]",
    **{f"tokenizer.ggml.{n}_token_id": "UINT32" for n in _IDS},
    **{f"tokenizer.ggml.{n}": "BOOL" for n in _FLAGS},
    "tokenizer.chat_template": "STRING",
    "tokenizer.chat_templates": "ARRAY[STRING]",
    "tokenizer.huggingface.json": "STRING",
    "tokenizer.rwkv.world": "STRING",
}
_NAMED_TEMPLATE = re.compile(r"tokenizer\.chat_template\..+")   # tokenizer.chat_template.{name}: STRING

_DTYPES = {"u1": "UINT8", "i1": "INT8", "u2": "UINT16", "i2": "INT16", "u4": "UINT32", "i4": "INT32",
           "f4": "FLOAT32", "u8": "UINT64", "i8": "INT64", "f8": "FLOAT64", "b1": "BOOL"}


class TokenizerKeyError(TokenizerError, GGUFError):
    """A tokenizer key whose GGUF type is not the one llama.cpp reads (the file is malformed)."""


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def type_name(v: object) -> str:
    """The GGUF type a metadata value read by moert.gguf has: 'UINT32', 'ARRAY[STRING]', ..."""
    if isinstance(v, (bool, np.bool_)):
        return "BOOL"
    if _is_int(v):
        return "an integer"
    if isinstance(v, (float, np.floating)):
        return "FLOAT32"
    if isinstance(v, str):
        return "STRING"
    if isinstance(v, np.ndarray):
        return f"ARRAY[{_DTYPES.get(v.dtype.str[1:], str(v.dtype))}]"
    if isinstance(v, (list, tuple)):
        kinds = {type_name(x) for x in v[:1000]}
        return "ARRAY" if not kinds else f"ARRAY[{kinds.pop()}]" if len(kinds) == 1 else "ARRAY[mixed]"
    return type(v).__name__


def _matches(v: object, want: str) -> bool:
    if want == "STRING":
        return isinstance(v, str)
    if want == "UINT32":
        return _is_int(v)
    if want == "BOOL":
        return isinstance(v, (bool, np.bool_))
    elem = {"ARRAY[STRING]": lambda x: isinstance(x, str), "ARRAY[INT32]": _is_int,
            "ARRAY[UINT8]": _is_int, "ARRAY[FLOAT32]": _is_real}[want]
    if isinstance(v, np.ndarray):          # as moert.gguf reads them: llama.cpp casts the bytes, so the width counts
        return v.ndim == 1 and f"ARRAY[{_DTYPES.get(v.dtype.str[1:])}]" == want
    return isinstance(v, (list, tuple)) and all(elem(x) for x in v)


def check(md: Mapping[str, object]) -> None:
    """TokenizerKeyError for the first tokenizer key whose value is not of the GGUF type llama.cpp reads."""
    for key, value in md.items():
        if not key.startswith("tokenizer."):
            continue
        want = KEY_TYPES.get(key) or ("STRING" if _NAMED_TEMPLATE.fullmatch(key) else None)
        if want is not None and not _matches(value, want):
            got = type_name(value)
            got = got if got.startswith("an ") else ("an " if got[0] in "AEI" else "a ") + got
            raise TokenizerKeyError(f"GGUF key {key!r} is {got}; llama.cpp reads it as {want}. The "
                                    f"file's vocabulary is malformed: re-convert the model with llama.cpp's "
                                    f"convert_hf_to_gguf.py")
