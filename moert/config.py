"""Model configuration: a frozen dataclass per architecture, built from GGUF metadata keys only.

Each field names the key it is read from (`{arch}` is `general.architecture`):

    n_expert: int = key("{arch}.expert_count")

A missing key, or a value out of range, is a `ConfigError` that names the key. Nothing is ever guessed
from a tensor's shape. An architecture file subclasses `Config` to add its own fields and checks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from moert.errors import GGUFError
from moert.text import tokenizer_keys

_REQUIRED = object()


class ConfigError(GGUFError):
    """A GGUF metadata key the model needs is missing, has the wrong type, or is out of range."""


# Bounds no real model comes near, so a hostile count fails here with the key's name instead of as a
# multi-terabyte allocation later (DeepSeek-V3: 61 layers, 7168 hidden, 256 experts, 163840 context).
MAX_COUNT = 1 << 20            # layers, heads, experts, head and hidden sizes
MAX_CONTEXT = 1 << 24          # trained context length (16M tokens)
DEFAULT_CONTEXT = 4096         # llama.cpp's default -c (its PR 10136), or the trained context if that is smaller


def key(name: str, default: Any = _REQUIRED, *, minimum: float | None = None, maximum: float | None = None,
        positive: bool = False) -> Any:
    """A config field read from GGUF key `name`; `default` (a value, or a function of the fields read so
    far) is used when the key is absent, as llama.cpp does for optional keys. Ints are bounded by
    [minimum, maximum] (maximum defaults to MAX_COUNT); floats must be finite and, with positive, > 0."""
    return field(metadata={"key": name, "default": default, "minimum": minimum, "maximum": maximum,
                           "positive": positive})


def _coerce(value: Any, typ: Any, key_name: str) -> Any:
    """The GGUF value as the field's type; a value of another GGUF type (a string for a float, an array,
    a float for a count) is refused, never converted."""
    typ = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    ok = {"int": lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)),
          "float": lambda v: isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool),
          "bool": lambda v: isinstance(v, (bool, np.bool_)),
          "str": lambda v: isinstance(v, str)}.get(typ, lambda v: True)
    if not ok(value):
        shown = f"{value!r:.60}" if not isinstance(value, np.ndarray) else f"an array of {value.size}"
        raise ConfigError(f"GGUF key {key_name!r} is {shown} ({type(value).__name__}); expected a {typ}. The file's "
                          f"metadata is malformed: re-convert the model with llama.cpp's convert_hf_to_gguf.py")
    return {"int": int, "float": float, "bool": bool}.get(typ, lambda v: v)(value)


def _check_range(f: Any, value: Any, name: str) -> None:
    """ConfigError unless value is within the field's bounds (ints) or finite and in range (floats)."""
    lo, hi, positive = f.metadata["minimum"], f.metadata["maximum"], f.metadata["positive"]
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"GGUF key {name!r} is {value}; it must be a finite number")
        if positive and value <= 0:
            raise ConfigError(f"GGUF key {name!r} is {value}; it must be > 0")
        if hi is not None and value > hi:
            raise ConfigError(f"GGUF key {name!r} is {value:g}; no model uses more than {hi:g} "
                              f"(the file is corrupt or hostile)")
    if isinstance(value, int) and not isinstance(value, bool):
        hi = MAX_COUNT if hi is None else hi
        if value > hi:
            raise ConfigError(f"GGUF key {name!r} is {value:,}; no model moert can run has more than {hi:,} "
                              f"(the file is corrupt or hostile)")
    if lo is not None and value < lo:
        raise ConfigError(f"GGUF key {name!r} is {value}; it must be >= {lo}")


@dataclass(frozen=True)
class Config:
    """Fields every decoder-only transformer in GGUF has; architectures subclass it."""

    ROPE_SCALINGS: ClassVar[tuple[str, ...]] = ("none",)   # rope.scaling.type values the architecture runs

    arch: str = key("general.architecture")
    n_layer: int = key("{arch}.block_count", minimum=1)
    n_ctx_train: int = key("{arch}.context_length", minimum=1, maximum=MAX_CONTEXT)
    n_embd: int = key("{arch}.embedding_length", minimum=1)
    n_head: int = key("{arch}.attention.head_count", minimum=1)
    n_head_kv: int = key("{arch}.attention.head_count_kv", lambda f: f["n_head"], minimum=1)
    head_dim: int = key("{arch}.attention.key_length", lambda f: f["n_embd"] // f["n_head"], minimum=1)
    head_dim_v: int = key("{arch}.attention.value_length", lambda f: f["head_dim"], minimum=1)
    rms_eps: float = key("{arch}.attention.layer_norm_rms_epsilon", positive=True)
    rope_base: float = key("{arch}.rope.freq_base", 10000.0, positive=True)
    rope_scaling: str = key("{arch}.rope.scaling.type", "none")
    # YaRN (llama.cpp's keys and defaults; read only when rope_scaling is "yarn", see yarn())
    rope_scaling_factor: float = key("{arch}.rope.scaling.factor", 0.0, minimum=0.0)     # 0: none (llama.cpp)
    rope_orig_ctx: int = key("{arch}.rope.scaling.original_context_length", lambda f: f["n_ctx_train"],
                             minimum=1, maximum=MAX_CONTEXT)
    yarn_beta_fast: float = key("{arch}.rope.scaling.yarn_beta_fast", 32.0, positive=True)
    yarn_beta_slow: float = key("{arch}.rope.scaling.yarn_beta_slow", 1.0, positive=True)
    rope_attn_factor: float = key("{arch}.rope.scaling.attn_factor", 1.0, positive=True, maximum=100.0)
    yarn_attn_factor: float = key("{arch}.rope.scaling.yarn_attn_factor", lambda f: f["rope_attn_factor"],
                                  positive=True, maximum=100.0)   # llama.cpp's newer key; else the older one
    # 0.1 * mscale_all_dim (DeepSeek: 0.1); it multiplies ln(factor) in the attention scale's square
    yarn_log_multiplier: float = key("{arch}.rope.scaling.yarn_log_multiplier", 0.0, minimum=0.0, maximum=10.0)
    n_vocab: int = key("{arch}.vocab_size", lambda f: f["_n_tokens"], minimum=1, maximum=1 << 24)

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any]) -> Config:
        """Read every field from its GGUF key; ConfigError names the first missing or invalid key."""
        if "general.architecture" not in metadata:
            raise ConfigError("GGUF key 'general.architecture' is missing; every GGUF model has it. "
                              "Is this a model file (and not a LoRA or vocab-only file)?")
        arch = metadata["general.architecture"]
        tokenizer_keys.check(metadata)       # llama.cpp refuses a malformed vocabulary at load, and so do we
        tokens = metadata.get("tokenizer.ggml.tokens")
        values: dict[str, Any] = {"_n_tokens": None if tokens is None else len(tokens)}
        # keys present first, then defaults: a default may be a function of fields declared after it (a
        # subclass redefining an inherited field keeps the field's original place in the order)
        todo = list(dataclasses.fields(cls))
        for f in todo:
            name = f.metadata["key"].format(arch=arch)
            if name in metadata:
                values[f.name] = _coerce(metadata[name], f.type, name)
                _check_range(f, values[f.name], name)
            elif f.metadata["default"] is _REQUIRED:
                raise ConfigError(f"GGUF key {name!r} is missing; {cls.__name__} needs it ({f.name}). "
                                  f"Re-convert the model with a recent llama.cpp convert_hf_to_gguf.py")
        for f in todo:
            name, default = f.metadata["key"].format(arch=arch), f.metadata["default"]
            if f.name in values:
                continue
            value = default(values) if callable(default) else default
            if value is None:
                raise ConfigError(f"GGUF key {name!r} is missing and there is no tokenizer.ggml.tokens "
                                  f"to count instead; add {name!r} to the file's metadata")
            _check_range(f, value, name)
            values[f.name] = value
        n_tokens = values.pop("_n_tokens")
        if n_tokens is not None and n_tokens != values["n_vocab"]:
            raise ConfigError(f"GGUF key '{arch}.vocab_size' is {values['n_vocab']} but tokenizer.ggml.tokens holds "
                              f"{n_tokens} tokens; llama.cpp sizes the embedding by the token list, and so does "
                              f"moert: the file is inconsistent, re-convert it")
        cfg = cls(**values)
        cfg.validate()
        return cfg

    @classmethod
    def required_keys(cls, arch: str) -> list[str]:
        """The GGUF keys this Config cannot do without (no default), for architecture `arch`."""
        return [f.metadata["key"].format(arch=arch) for f in dataclasses.fields(cls)
                if f.metadata["default"] is _REQUIRED]

    def validate(self) -> None:
        """Cross-field checks; subclasses extend them."""
        self._check(self.n_head % self.n_head_kv == 0, "attention.head_count_kv",
                    f"head_count {self.n_head} is not a multiple of head_count_kv {self.n_head_kv}")
        self._check(self.rope_scaling != "yarn" or self.rope_base > 1.0, "rope.freq_base",
                    f"YaRN needs a RoPE base above 1 (its ramp divides by ln(base)), not {self.rope_base:g}")
        self._check(self.rope_scaling in self.ROPE_SCALINGS, "rope.scaling.type",
                    f"RoPE scaling {self.rope_scaling!r} is not supported for {self.arch} (only "
                    f"{', '.join(self.ROPE_SCALINGS)}); use a GGUF converted without rope scaling")

    def yarn(self):
        """The file's YaRN scaling as a layers.Yarn (None unless rope.scaling.type is "yarn"), with ggml's
        magnitude: cos and sin times attn_factor * (1 + 0.1 ln factor). An architecture that scales
        differently (deepseek2 moves it into the attention scale) builds its own from these fields."""
        from moert.layers import Yarn

        if self.rope_scaling != "yarn" or self.rope_scaling_factor in (0.0, 1.0):
            return None
        f = self.rope_scaling_factor
        return Yarn(f, self.rope_orig_ctx, self.yarn_beta_fast, self.yarn_beta_slow,
                    self.yarn_attn_factor * (1.0 + 0.1 * math.log(f)))

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

