"""The KV cache: what each layer caches (shaped by the architecture's Config) and the arrays themselves.

    spec  = kv_spec(config)                 per layer K (n_ctx, Hkv, Dk) and V (n_ctx, Hkv, Dv)
    cache = allocate_kv_cache(plan, n_ctx)  zeroed, each layer on its attention device, checked whole first

An architecture with another cache (MLA's latent cache, per-layer head counts) gives its Config a
`kv_spec()` method; this module only allocates what it is told.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from moert.devices import Device
from moert.errors import DeviceOutOfMemory, PlacementError


@dataclass(frozen=True)
class KVSpec:
    """The KV cache's shape: per layer K (n_ctx, n_head_kv, head_dim_k) and V (n_ctx, n_head_kv, head_dim_v)."""

    n_layer: int      # {arch}.block_count
    n_head_kv: int    # {arch}.attention.head_count_kv (default: head_count, as llama.cpp)
    head_dim_k: int   # {arch}.attention.key_length (default: embedding_length / head_count)
    head_dim_v: int   # {arch}.attention.value_length (default: head_dim_k)

    @classmethod
    def from_metadata(cls, md: dict) -> KVSpec:
        """From GGUF metadata; a missing key is an error naming it."""
        arch = md.get("general.architecture")
        if not isinstance(arch, str):
            raise PlacementError("metadata 'general.architecture' is missing; cannot size the KV cache")
        own = _own_cache(arch)
        if own is not None:        # the architecture says what it caches (deepseek2: MLA's latent)
            return own.from_gguf(md).kv_spec()

        def key(k: str, default: Any = None) -> int:
            v = md.get(f"{arch}.{k}", default)
            if v is None:
                raise PlacementError(f"metadata key '{arch}.{k}' is missing; cannot size the KV cache")
            if isinstance(v, (list, tuple)):  # per-layer values: size for the largest
                v = max(v)
            return int(v)

        n_head = key("attention.head_count")
        dk = key("attention.key_length", key("embedding_length") // max(n_head, 1))
        return cls(key("block_count"), key("attention.head_count_kv", n_head), dk,
                   key("attention.value_length", dk))

    def layer_bytes(self, n_ctx: int, dtype: Any = np.float32) -> int:
        """Bytes of one layer's K and V for n_ctx tokens."""
        return n_ctx * self.n_head_kv * (self.head_dim_k + self.head_dim_v) * np.dtype(dtype).itemsize


def _own_cache(arch: str) -> Any:
    """The Config class of a registered architecture that sizes its own cache (a `kv_spec()` method), or None."""
    from moert import models

    if arch not in models.ARCHITECTURES:
        return None
    cls = models.get(arch).Config
    return cls if callable(getattr(cls, "kv_spec", None)) else None


def kv_spec(config: Any) -> KVSpec:
    """A KVSpec from a KVSpec, a Config (its `kv_spec()` when it has one), a Plan, GGUF metadata, or an object
    with n_layer/n_head_kv/head_dim."""
    if isinstance(config, KVSpec):
        return config
    if callable(getattr(config, "kv_spec", None)):
        return config.kv_spec()
    if hasattr(config, "metadata") and hasattr(config, "device_names"):          # a Plan
        return KVSpec.from_metadata(config.metadata)
    if isinstance(config, dict):
        return KVSpec.from_metadata(config)
    g = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)
    n_layer, n_head_kv = g("n_layer", "block_count"), g("n_head_kv", "head_count_kv")
    dk = g("head_dim_k", "key_length", "head_dim")
    dv = g("head_dim_v", "value_length", "head_dim") or dk
    if None in (n_layer, n_head_kv, dk):
        raise PlacementError(f"cannot size a KV cache from {type(config).__name__}: it needs n_layer, "
                             f"n_head_kv and head_dim (or pass GGUF metadata / a Plan)")
    return KVSpec(int(n_layer), int(n_head_kv), int(dk), int(dv))


def kv_cache_bytes(config: Any, n_ctx: int, dtype: Any = np.float32) -> int:
    """Bytes of the whole KV cache (every layer's K and V) for n_ctx tokens."""
    s = kv_spec(config)
    return s.n_layer * s.layer_bytes(n_ctx, dtype)


@dataclass
class KVCache:
    """Per-layer K and V arrays, each on its layer's attention device."""

    k: list
    v: list
    devices: list[Device]
    n_ctx: int
    dtype: Any

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.k + self.v)

    def bytes_by_device(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d, k, v in zip(self.devices, self.k, self.v):
            out[d.name] = out.get(d.name, 0) + int(k.nbytes) + int(v.nbytes)
        return out

    def free(self) -> None:
        """Give every layer's K and V back to its device."""
        for d, k, v in zip(self.devices, self.k, self.v):
            d.free(k)
            d.free(v)
        self.k, self.v, self.devices = [], [], []


def allocate_kv_cache(plan: Any, n_ctx: int, dtype: Any = np.float32, config: Any = None) -> KVCache:
    """Zeroed K and V, float32 (n_ctx, n_head_kv, head_dim) per layer on its attention device (accounted)."""
    s = kv_spec(config if config is not None else plan)
    cache = KVCache([], [], [], n_ctx, np.dtype(dtype))
    need: dict[Device, int] = {}
    for il in range(s.n_layer):       # all of it checked first: a cache that cannot fit allocates nothing
        dev = plan.attention_device(il)
        need[dev] = need.get(dev, 0) + s.layer_bytes(n_ctx, dtype)
    for dev, nbytes in need.items():
        dev.reserve(nbytes, f"the KV cache at context {n_ctx:,} (lower context_size / -c)")
    done: list[tuple[Device, Any]] = []
    try:
        for il in range(s.n_layer):
            dev = plan.attention_device(il)
            done.append((dev, dev.zeros((n_ctx, s.n_head_kv, s.head_dim_k), dtype, what=f"blk.{il} KV cache (K)")))
            done.append((dev, dev.zeros((n_ctx, s.n_head_kv, s.head_dim_v), dtype, what=f"blk.{il} KV cache (V)")))
            cache.k.append(done[-2][1])
            cache.v.append(done[-1][1])
            cache.devices.append(dev)
    except DeviceOutOfMemory:
        for dev, a in done:  # leave nothing half-allocated behind
            dev.free(a)
        raise
    return cache



__all__ = ["KVCache", "KVSpec", "allocate_kv_cache", "kv_cache_bytes", "kv_spec"]
