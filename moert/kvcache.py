"""The KV cache: what each layer caches (shaped by the architecture's Config) and the arrays themselves.

    spec  = kv_spec(config)                 per layer K (n_ctx, Hkv, Dk) and V (n_ctx, Hkv, Dv)
    cache = allocate_kv_cache(plan, n_ctx)  zeroed, each layer on its attention device, checked whole first

K and V are stored as llama.cpp's -ctk / -ctv say: f16 (the default, llama.cpp's), f32 (exact), bf16 or q8_0
(blocks of 32 with an f16 scale, ggml's quantize_row_q8_0). f32 caches are plain arrays; the others are
`TypedKV`s, which round what is written and give float32 back when read (`store` / `load` take either).

An architecture with another cache (MLA's latent cache, per-layer head counts) gives its Config a
`kv_spec()` method; this module only allocates what it is told.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from moert.devices import Device, xp_of
from moert.errors import ArgumentError, DeviceOutOfMemory, PlacementError

KV_TYPES = ("f32", "f16", "bf16", "q8_0")     # llama.cpp's cache type names that moert runs
DEFAULT_KV_TYPE = "f16"                       # llama.cpp's default -ctk / -ctv; everything that sizes KV uses it
_ROW = {"f32": (4, 1), "f16": (2, 1), "bf16": (2, 1), "q8_0": (34, 32)}    # bytes per `n` values


def kv_type(name: Any) -> str:
    """A cache type's name ("f32", ...; a NumPy float32 / float16 dtype is accepted too), or a PlacementError."""
    if not isinstance(name, str):
        try:
            name = {"float32": "f32", "float16": "f16"}[np.dtype(name).name]
        except (TypeError, KeyError):
            raise PlacementError(f"KV cache type {name!r}: use one of {', '.join(KV_TYPES)}") from None
    if name.lower() not in KV_TYPES:
        raise PlacementError(f"KV cache type {name!r} is not supported; use one of {', '.join(KV_TYPES)} "
                             f"(-ctk / -ctv)")
    return name.lower()


def kv_bytes(kind: Any, n_values: int) -> int:
    """Bytes that `n_values` values (a multiple of 32 for q8_0) take in cache type `kind`."""
    b, n = _ROW[kv_type(kind)]
    return n_values * b // n


class TypedKV:
    """One layer's K or V, (n_ctx, Hkv, D), stored in a cache type other than f32 on a device."""

    def __init__(self, dev: Device, kind: str, shape: tuple[int, int, int], what: str):
        self.kind, self.shape, self.xp = kind, shape, dev.xp
        n_ctx, h, d = shape
        if kind == "q8_0":
            if d % 32:
                raise PlacementError(f"KV cache type q8_0 needs a head size that is a multiple of 32, not {d} "
                                     f"(as llama.cpp); use -ctk/-ctv f16 or bf16")
            self.parts = [dev.zeros((n_ctx, h, d), np.int8, what=what + " q8_0 values"),
                          dev.zeros((n_ctx, h, d // 32), np.float16, what=what + " q8_0 scales")]
        else:
            self.parts = [dev.zeros(shape, np.float16 if kind == "f16" else np.uint16, what=f"{what} {kind}")]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.parts)

    def write(self, pos, x) -> None:
        """Rows pos .. pos+T of the cache from x (T, Hkv, D) float32, rounded to the cache type (pos: an int, or a
        DevicePos)."""
        xp, T = self.xp, x.shape[0]
        at = rows_at(pos, T)
        if self.kind == "f16":
            self.parts[0][at] = x.astype(np.float16)
        elif self.kind == "bf16":                                    # round to nearest even, as ggml
            u = xp.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
            self.parts[0][at] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        else:                                                        # q8_0: ggml's quantize_row_q8_0_ref
            b = x.reshape(T, x.shape[1], -1, 32)                              # (T, Hkv, D/32, 32)
            d = (xp.abs(b).max(axis=-1) / np.float32(127)).astype(np.float32)  # (T, Hkv, D/32)
            inv = xp.where(d > 0, np.float32(1) / xp.where(d > 0, d, np.float32(1)), np.float32(0))
            q = b * inv[..., None]
            q = xp.sign(q) * xp.floor(xp.abs(q) + np.float32(0.5))           # roundf: halves away from zero
            self.parts[0][at] = q.reshape(x.shape).astype(np.int8)
            self.parts[1][at] = d.astype(np.float16)

    def read(self, a: int, b: int):
        """Rows a .. b as float32 (b - a, Hkv, D)."""
        if self.kind == "f16":
            return self.parts[0][a:b].astype(np.float32)
        if self.kind == "bf16":
            return (self.parts[0][a:b].astype(np.uint32) << 16).view(np.float32)
        q, d = self.parts[0][a:b], self.parts[1][a:b].astype(np.float32)
        return (q.reshape(b - a, q.shape[1], -1, 32) * d[..., None]).reshape(q.shape).astype(np.float32)


def rows(cache, a: int, b: int):
    """Positions a .. b of a cache as a cache of its own that shares the storage (a view): a sequence's part of
    a cache divided among several (moert/batch.py)."""
    if not isinstance(cache, TypedKV):
        return cache[a:b]
    view = object.__new__(TypedKV)
    view.kind, view.xp, view.shape = cache.kind, cache.xp, (b - a, *cache.shape[1:])
    view.parts = [p[a:b] for p in cache.parts]
    return view


class Rows:
    """One layer's K (or V) for a batch of sequences: each sequence's own cache, and the rows of the batch that
    are its tokens, (first row, end row, position of the first). layers.attention attends per sequence."""

    def __init__(self, caches: list, spans: list[tuple[int, int, int]]):
        self.caches, self.spans = caches, spans

    def each(self, other: Rows):
        """(first row, end row, position, this cache, other's cache) per sequence."""
        return [(a, b, p, c, o) for (a, b, p), c, o in zip(self.spans, self.caches, other.caches)]


def store(cache, pos: int, x) -> None:
    """Write x (T, Hkv, D) into a cache (an f32 array or a TypedKV) at position pos."""
    if isinstance(cache, TypedKV):
        cache.write(pos, x)
    else:
        cache[rows_at(pos, x.shape[0])] = x


class DevicePos:
    """The position of a step's first token held in device memory, `p` (1,) int32, as a CUDA graph needs it (a
    Python int would be baked into the captured launches): moert/graphs/static.py attends and writes at it."""

    def __init__(self, p):
        self.p = p

    def __repr__(self) -> str:
        return "<DevicePos: the position in device memory>"


def rows_at(pos, T: int):
    """The cache rows of T tokens from pos: a slice for an int, device indices (T,) for a DevicePos."""
    if isinstance(pos, DevicePos):
        return pos.p if T == 1 else pos.p + xp_of(pos.p).arange(T, dtype=pos.p.dtype)
    return slice(pos, pos + T)


def load(cache, a: int, b: int):
    """Positions a .. b of a cache as float32 (a view for an f32 array)."""
    return cache.read(a, b) if isinstance(cache, TypedKV) else cache[a:b]


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
        """Bytes of one layer's K and V for n_ctx tokens; dtype: a cache type, or a (K type, V type) pair."""
        tk, tv = dtype if isinstance(dtype, tuple) else (dtype, dtype)
        return n_ctx * self.n_head_kv * (kv_bytes(tk, self.head_dim_k) + kv_bytes(tv, self.head_dim_v))


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


def kv_cache_bytes(config: Any, n_ctx: int, dtype: Any = DEFAULT_KV_TYPE) -> int:
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

    @property
    def types(self) -> tuple[str, str]:
        """(K type, V type): "f32", "f16", "bf16" or "q8_0"."""
        return self.dtype if isinstance(self.dtype, tuple) else (kv_type(self.dtype),) * 2

    def bytes_by_device(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d, k, v in zip(self.devices, self.k, self.v):
            out[d.name] = out.get(d.name, 0) + int(k.nbytes) + int(v.nbytes)
        return out

    def free(self) -> None:
        """Give every layer's K and V back to its device."""
        for d, k, v in zip(self.devices, self.k, self.v):
            for a in getattr(k, "parts", [k]) + getattr(v, "parts", [v]):
                d.free(a)
        self.k, self.v, self.devices = [], [], []


def allocate_kv_cache(plan: Any, n_ctx: int, dtype: Any = DEFAULT_KV_TYPE, config: Any = None) -> KVCache:
    """Zeroed K and V (n_ctx, n_head_kv, head_dim) per layer on its attention device (accounted); dtype: a
    cache type for both ("f32", "f16", "bf16", "q8_0"), or a (K type, V type) pair (-ctk, -ctv)."""
    s = kv_spec(config if config is not None else plan)
    tk, tv = (kv_type(t) for t in (dtype if isinstance(dtype, tuple) else (dtype, dtype)))
    cache = KVCache([], [], [], n_ctx, (tk, tv))
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
            for kind, dim, kv in ((tk, s.head_dim_k, "K"), (tv, s.head_dim_v, "V")):
                shape, what = (n_ctx, s.n_head_kv, dim), f"blk.{il} KV cache ({kv})"
                done.append((dev, dev.zeros(shape, np.float32, what=what) if kind == "f32"
                             else TypedKV(dev, kind, shape, what)))
            cache.k.append(done[-2][1])
            cache.v.append(done[-1][1])
            cache.devices.append(dev)
    except DeviceOutOfMemory:
        for dev, a in done:  # leave nothing half-allocated behind
            for part in getattr(a, "parts", [a]):
                dev.free(part)
        raise
    return cache



__all__ = ["DEFAULT_KV_TYPE", "KV_TYPES", "KVCache", "KVConfig", "KVSpec", "Rows", "TypedKV", "allocate_kv_cache",
           "kv_bytes", "kv_cache_bytes", "kv_spec", "kv_type", "load", "rows", "store"]


def flash_mode(value: str | bool, kv_types: tuple[str, str]) -> bool:
    """-fa on|off|auto (or a bool) -> whether attention runs chunked; auto: when the cache is not f32."""
    v = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else str(value).strip().lower()
    if v not in ("on", "off", "auto"):
        raise ArgumentError(f"flash_attn {value!r}: give on, off or auto (-fa)")
    return v == "on" or (v == "auto" and kv_types != ("f32", "f32"))


@dataclass(frozen=True)
class KVConfig:
    """The KV cache's options, one value: `moert.load(path, kv=KVConfig("q8_0"))` (llama.cpp's -ctk / -ctv / -fa).

    type_k / type_v: "f16" (default, llama.cpp's), "f32" (exact: what a float oracle needs), "bf16" or "q8_0".
    flash_attn: "on" (attention holds the scores of 256 keys at a time, never (T, n_ctx)),
    "off", or "auto" (default: on when a cache type is not f32, since those are read back a chunk at a time)."""

    type_k: str = DEFAULT_KV_TYPE
    type_v: str = DEFAULT_KV_TYPE
    flash_attn: str | bool = "auto"

    def types(self) -> tuple[str, str]:
        """(k, v) cache types, checked (an unknown name: PlacementError naming the choices)."""
        return kv_type(self.type_k), kv_type(self.type_v)

    @classmethod
    def of(cls, value: Any) -> KVConfig:
        """A KVConfig from a KVConfig, None (the defaults) or one type name for both caches ("q8_0")."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value, value)
        raise ArgumentError(f"kv= takes a moert.KVConfig or a cache type name ({', '.join(KV_TYPES)}), "
                            f"not {type(value).__name__}")


def has_kv(md: dict, il: int) -> bool:
    """Whether layer il keeps a KV cache: not a hybrid model's linear-attention layer (its state is fixed-size)."""
    interval = md.get(f"{md.get('general.architecture')}.full_attention_interval")
    return not interval or (il + 1) % int(interval) == 0


def kv_layers(md: dict, n_layer: int) -> int:
    """How many of n_layer layers keep a KV cache: a hybrid model's full-attention layers only, else all."""
    interval = md.get(f"{md.get('general.architecture')}.full_attention_interval")
    return n_layer // int(interval) if interval else n_layer
