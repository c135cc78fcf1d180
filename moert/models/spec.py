"""Tensor declarations: the tensors an architecture expects, their shapes as functions of its Config.

Each architecture module has `tensors(c: Config) -> list[TensorSpec]`, as llama.cpp's `create_tensor(name,
{ne...}, flags)` calls in llama-model.cpp. `check` compares a file against it at load, before any kernel
sees a byte: a missing tensor, a shape or type the declaration does not allow, a tensor the architecture
does not have, a `block_count` that disagrees with the `blk.N` tensors, is a `TensorMismatchError` naming the tensor,
what was expected (and from which GGUF key) and what the file holds. Kernels then never meet a shape
the config did not promise, so they never index out of bounds.

A dimension is an int, a Config field name (`"head_dim"`), or a tuple of field names multiplied
(`("n_head", "head_dim")`), so a message can say where each number comes from. Shapes are NumPy order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from moert.errors import GGUFError

Dim = int | str | tuple[str, ...]

NORM_TYPES = frozenset({"F32", "F16", "BF16"})   # 1-D weights (norms, biases): llama.cpp needs them float


class TensorMismatchError(GGUFError):
    """A tensor is missing, extra, or has a shape or type the architecture's declaration does not allow."""


@dataclass(frozen=True)
class TensorSpec:
    """One declared tensor: its GGUF name, expected shape (dims as Config fields), whether it may be absent."""

    name: str
    dims: tuple[Dim, ...]
    optional: bool = False
    types: frozenset[str] | None = None      # allowed GGML types; None: any type moert can dequantize


def spec(name: str, *dims: Dim, optional: bool = False, types: Iterable[str] | None = None) -> TensorSpec:
    """A declared tensor; 1-D tensors (norms, biases) default to float types."""
    allowed = frozenset(types) if types is not None else (NORM_TYPES if len(dims) == 1 else None)
    return TensorSpec(name, tuple(dims), optional, allowed)


def io_tensors() -> list[TensorSpec]:
    """Embedding, final norm and output projection (absent when the file ties it to the embedding)."""
    return [spec("token_embd.weight", "n_vocab", "n_embd"), spec("output_norm.weight", "n_embd"),
            spec("output.weight", "n_vocab", "n_embd", optional=True)]


def _key_of(config: Any, field_name: str) -> str:
    for f in dataclasses.fields(config):
        if f.name == field_name:
            return f.metadata.get("key", field_name).format(arch=config.arch).split(".", 1)[-1]
    return field_name


def _dim(config: Any, d: Dim) -> tuple[int, str]:
    """(value, how it was computed) of one declared dimension."""
    if isinstance(d, int):
        return d, str(d)
    names = (d,) if isinstance(d, str) else d
    value = 1
    for n in names:
        value *= int(getattr(config, n))
    parts = " * ".join(f"{_key_of(config, n)} {getattr(config, n)}" for n in names)
    return value, parts


def expected_shape(config: Any, s: TensorSpec) -> tuple[int, ...]:
    """The shape `s` declares under `config`, NumPy order."""
    return tuple(_dim(config, d)[0] for d in s.dims)


def check_layers(path: Any, tensors: Mapping[str, Any], config: Any) -> None:
    """block_count against the blk.N tensors present, before anything is built per layer (a block_count of
    10^6 must not make a million layers' declarations first)."""
    layers = {int(n.split(".")[1]) for n in tensors if n.startswith("blk.") and n.split(".")[1].isdigit()}
    have = max(layers) + 1 if layers else 0
    if have != config.n_layer:
        where = getattr(path, "name", path)
        found = f"tensors for {have} layers (blk.0 to blk.{have - 1})" if have else "no blk.N tensors"
        raise TensorMismatchError(f"{where}: block_count is {config.n_layer:,} but the file holds {found}. The file "
                                  f"does not match its own metadata; it is corrupt or was edited: re-convert the "
                                  f"model with llama.cpp's convert_hf_to_gguf.py")


def check(path: Any, tensors: Mapping[str, Any], specs: list[TensorSpec], config: Any) -> None:
    """Raise TensorMismatchError unless `tensors` (name -> TensorInfo) is exactly what `specs` declares."""
    from moert.quants import SUPPORTED

    where = f"{getattr(path, 'name', path)}"
    fix = ("The file does not match its own metadata; it is corrupt or was edited: re-convert the model "
           "with llama.cpp's convert_hf_to_gguf.py")
    declared = {s.name: s for s in specs}
    for s in specs:
        t = tensors.get(s.name)
        if t is None:
            if not s.optional:
                raise TensorMismatchError(f"{where}: tensor {s.name!r} is missing; {config.arch} needs it. {fix}")
            continue
        want = expected_shape(config, s)
        if tuple(t.shape) != want:
            how = ", ".join(_dim(config, d)[1] for d in s.dims)
            raise TensorMismatchError(f"{where}: tensor {s.name!r} has shape {tuple(t.shape)}; {config.arch} "
                                      f"expects {want} (from {how}). {fix}")
        if s.types is not None and t.type not in s.types:
            raise TensorMismatchError(f"{where}: tensor {s.name!r} is {t.type}; {config.arch} takes it as one of "
                                      f"{', '.join(sorted(s.types))}. {fix}")
        if t.type not in SUPPORTED:
            raise TensorMismatchError(f"{where}: tensor {s.name!r} is {t.type}, a type moert cannot dequantize "
                                      f"(it reads {', '.join(sorted(SUPPORTED))}); re-quantize the model with one "
                                      f"of those (llama-quantize ... Q4_K_M)")
    extra = sorted(n for n in tensors if n not in declared)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise TensorMismatchError(f"{where}: tensor {extra[0]!r}{more} is not part of a {config.arch} model; "
                                  f"moert would ignore it and compute something else than the file means. {fix}")
