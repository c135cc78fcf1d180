"""The contract between an architecture and moert: everything `forward(m, tokens)` may call on `m`.

An architecture file (moert/models/<arch>.py) is written against this Protocol and nothing else; moert.Model
implements it (moert/model.py). Weights are addressed by their GGUF names; the runtime knows where each
lives and moves only activations, counted. Shapes: T tokens, D hidden, V vocabulary, K experts per token.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from moert.devices import Device


class Runtime(Protocol):
    """What an architecture's forward may use."""

    config: Any          # the architecture's Config (moert/config.py): hyperparameters from GGUF keys
    position: int        # the position of this chunk's first token
    flash_attn: bool     # -fa: pass it to layers.attention(..., flash=) (scores of 256 keys at a time)

    def embed(self, name: str, tokens: np.ndarray) -> Any:
        """Rows `tokens` of the embedding `name`: (T, D) float32 on its device."""

    def attention_device(self, il: int) -> Device:
        """Where layer il's attention, KV cache and router run (ask it first in each block)."""

    def device_of(self, name: str) -> Device:
        """Where the weight `name` lives."""

    def to(self, x: Any, dev: Device, what: str = "") -> Any:
        """x moved to dev (explicit, counted); x itself when it is there already."""

    def fused_layer(self, il: int, x: Any, fused: Any) -> Any:
        """Layer il of a one-token step as one CPU kernel call (moert/fused.py), or None: run the block."""

    def phase(self, name: str, dev: Device | str) -> AbstractContextManager:
        """`with m.phase("attention", dev):` attributes the time inside to (phase, device) in the stats."""

    def w(self, name: str, dev: Device | None = None) -> Any:
        """Weight `name` as float32 on dev (norms, biases, routers: small ones are kept)."""

    def has(self, name: str) -> bool:
        """Whether the file holds the (optional) tensor `name`."""

    def linear(self, x: Any, name: str, dev: Device | None = None) -> Any:
        """x (T, in) @ W.T for the 2-D weight `name` (out, in), from its quantized bytes: (T, out)."""

    def linears(self, x: Any, names: tuple[str, ...], dev: Device | None = None) -> tuple:
        """linear for several weights that read the same x (q, k, v), in one parallel region where it can."""

    def rope(self, dev: Device, head_dim: int, base: float, yarn: Any = None) -> tuple[Any, Any]:
        """cos, sin (T, head_dim / 2) for this chunk's positions; yarn: a layers.Yarn scaling, or None."""

    def kv_cache(self, il: int) -> tuple[Any, Any]:
        """Layer il's K and V caches, (n_ctx, Hkv, Dh) each, on its attention device: float32 arrays, or
        kvcache.TypedKV for -ctk/-ctv other than f32 (kvcache.store / load read and write either)."""

    def experts(self, il: int, x: Any, ids: Any, weights: Any, names: tuple[str, str, str], logits: Any = None,
                act: str = "swiglu", biases: tuple[str, str, str] | None = None) -> Any:
        """Routed experts of layer il (x (T, D), ids and weights (T, K)) wherever the plan put them: (T, D)."""

    def output(self, norm_name: str, name: str, x: Any) -> np.ndarray:
        """Final norm and output projection: logits (T, V) on the host."""
