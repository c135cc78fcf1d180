"""Model configuration: a frozen dataclass per architecture, built from GGUF metadata keys only.

Each field names the key it is read from (`{arch}` is `general.architecture`):

    n_expert: int = key("{arch}.expert_count")

A missing key, or a value out of range, is a `ConfigError` that names the key. Nothing is ever guessed
from a tensor's shape. An architecture file subclasses `Config` to add its own fields and checks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moert.errors import GGUFError

_REQUIRED = object()


class ConfigError(GGUFError):
    """A GGUF metadata key the model needs is missing, has the wrong type, or is out of range."""


def key(name: str, default: Any = _REQUIRED, *, minimum: float | None = None) -> Any:
    """A config field read from GGUF key `name`; `default` (a value, or a function of the fields read so
    far) is used when the key is absent, as llama.cpp does for optional keys."""
    return field(metadata={"key": name, "default": default, "minimum": minimum})


def _coerce(value: Any, typ: Any, key_name: str) -> Any:
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if typ == "int":
            if isinstance(value, bool) or int(value) != value:
                raise TypeError
            return int(value)
        if typ == "float":
            return float(value)
        if typ == "bool":
            return bool(value)
        if typ == "str":
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError):
        raise ConfigError(f"GGUF key {key_name!r} is {value!r}; expected a {typ}. The file's metadata is "
                          f"malformed: re-convert the model with llama.cpp's convert_hf_to_gguf.py") from None
    return value


@dataclass(frozen=True)
class Config:
    """Fields every decoder-only transformer in GGUF has; architectures subclass it."""

    arch: str = key("general.architecture")
    n_layer: int = key("{arch}.block_count", minimum=1)
    n_ctx_train: int = key("{arch}.context_length", minimum=1)
    n_embd: int = key("{arch}.embedding_length", minimum=1)
    n_head: int = key("{arch}.attention.head_count", minimum=1)
    n_head_kv: int = key("{arch}.attention.head_count_kv", lambda f: f["n_head"], minimum=1)
    head_dim: int = key("{arch}.attention.key_length", lambda f: f["n_embd"] // f["n_head"], minimum=1)
    head_dim_v: int = key("{arch}.attention.value_length", lambda f: f["head_dim"], minimum=1)
    rms_eps: float = key("{arch}.attention.layer_norm_rms_epsilon", minimum=0.0)
    rope_base: float = key("{arch}.rope.freq_base", 10000.0, minimum=0.0)
    rope_scaling: str = key("{arch}.rope.scaling.type", "none")
    n_vocab: int = key("{arch}.vocab_size", lambda f: f["_n_tokens"], minimum=1)

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Config:
        """Read every field from its GGUF key; ConfigError names the first missing or invalid key."""
        if "general.architecture" not in metadata:
            raise ConfigError("GGUF key 'general.architecture' is missing; every GGUF model has it. "
                              "Is this a model file (and not a LoRA or vocab-only file)?")
        arch = metadata["general.architecture"]
        tokens = metadata.get("tokenizer.ggml.tokens")
        values: dict[str, Any] = {"_n_tokens": None if tokens is None else len(tokens)}
        for f in dataclasses.fields(cls):
            name = f.metadata["key"].format(arch=arch)
            default = f.metadata["default"]
            if name in metadata:
                value = _coerce(metadata[name], f.type, name)
            elif default is _REQUIRED:
                raise ConfigError(f"GGUF key {name!r} is missing; {cls.__name__} needs it ({f.name}). "
                                  f"Re-convert the model with a recent llama.cpp convert_hf_to_gguf.py")
            else:
                value = default(values) if callable(default) else default
                if value is None:
                    raise ConfigError(f"GGUF key {name!r} is missing and there is no tokenizer.ggml.tokens "
                                      f"to count instead; add {name!r} to the file's metadata")
            lo = f.metadata["minimum"]
            if lo is not None and value < lo:
                raise ConfigError(f"GGUF key {name!r} is {value}; it must be >= {lo}")
            values[f.name] = value
        del values["_n_tokens"]
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Cross-field checks; subclasses extend them."""
        self._check(self.n_head % self.n_head_kv == 0, "attention.head_count_kv",
                    f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        self._check(self.rope_scaling == "none", "rope.scaling.type",
                    f"RoPE scaling {self.rope_scaling!r} is not supported yet (only none); "
                    f"use a GGUF converted without rope scaling")

    def _check(self, ok: bool, key_suffix: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"GGUF key '{self.arch}.{key_suffix}': {why}")


@dataclass(frozen=True)
class MoEConfig(Config):
    """A transformer whose FFN is a routed mixture of experts."""

    n_expert: int = key("{arch}.expert_count", minimum=1)
    n_expert_used: int = key("{arch}.expert_used_count", minimum=1)
    n_ff_exp: int = key("{arch}.expert_feed_forward_length", minimum=1)

    def validate(self) -> None:
        super().validate()
        self._check(self.n_expert_used <= self.n_expert, "expert_used_count",
                    f"expert_used_count {self.n_expert_used} > expert_count {self.n_expert}; "
                    f"a token cannot pick more experts than exist")

