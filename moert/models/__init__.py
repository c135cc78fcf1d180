"""Architectures, one module each, found by the GGUF key `general.architecture`.

Each module defines `Config` (a frozen dataclass built from GGUF keys, see moert/config.py),
`tensors(config) -> [TensorSpec]` (every tensor the file must hold, shapes as functions of the config:
moert/models/spec.py) and `forward(m, tokens) -> logits`, written against the runtime `m` (moert/model.py:
weights on their devices, explicit moves, KV cache, phases for the stats). Adding an architecture is
adding a file and a line here.

Part of the runtime: an architecture imports moert/layers.py, moert/moe.py and moert/config.py, and is
written against the contract in runtime.py; nothing of the wings (serve, cluster, explain, cost, cli).
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import Any

from moert.errors import GGUFError

ARCHITECTURES: dict[str, str] = {
    "deepseek2": "moert.models.deepseek2",
    "gemma3": "moert.models.gemma3",
    "gpt-oss": "moert.models.gptoss",
    "llama": "moert.models.llama",
    "olmoe": "moert.models.olmoe",
    "qwen2moe": "moert.models.qwen2moe",
    "qwen3moe": "moert.models.qwen3moe",
}


class UnsupportedArchitectureError(GGUFError):
    """The GGUF's general.architecture has no moert implementation."""


def get(arch: str) -> ModuleType:
    """The module implementing `arch` (the value of general.architecture)."""
    if arch not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"general.architecture is {arch!r}, which moert does not implement; supported: "
            f"{', '.join(sorted(ARCHITECTURES))}. New architectures are one file in moert/models/.")
    return import_module(ARCHITECTURES[arch])


def read(g: Any) -> tuple[ModuleType, Any]:
    """(architecture module, Config) of an open GGUF file, its metadata and every tensor checked against the
    architecture's declaration: a file that lies about its model fails here, before anything is allocated."""
    from moert.models.spec import check, check_layers

    arch = get(g.architecture)
    config = arch.Config.from_gguf(g.metadata)
    check_layers(g.path, g.tensors, config)
    check(g.path, g.tensors, arch.tensors(config), config)
    return arch, config
