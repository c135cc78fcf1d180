"""moert.load's grouped options: kv= (moert.KVConfig) and ray= (moert.RayConfig), and the flat keywords of earlier
releases (cache_type_k, flash_attn, ray_model, ...) standing for their fields."""

from __future__ import annotations

import inspect

import pytest

import moert
from moert.demo import demo_model_path
from moert.errors import ArgumentError, PlacementError


def _load(**kw):
    return moert.load(demo_model_path(), gpu_layers=0, context_size=32, warmup=False, progress=False, **kw)


def test_load_reads_at_a_glance():
    """The signature a reader takes in: few named options (the groups), the placement keywords behind **."""
    named = [p for p in inspect.signature(moert.load.__wrapped__).parameters.values() if p.kind is not p.VAR_KEYWORD]
    assert len(named) <= 16, [p.name for p in named]
    assert not [p.name for p in named if p.name.startswith(("ray_", "cache_type"))]


@pytest.mark.parametrize("kv, flat, want", [
    (moert.KVConfig("q8_0", "bf16", "on"), {}, (("q8_0", "bf16"), True)),
    ("f32", {}, (("f32", "f32"), False)),                        # one name: both caches; f32 -> flash "auto" is off
    (None, {"cache_type_k": "bf16"}, (("bf16", "f16"), True)),   # a flat -ctk alone leaves V at llama.cpp's f16
    (None, {"cache_type_k": "f32", "cache_type_v": "f32", "flash_attn": "on"}, (("f32", "f32"), True)),
    (None, {}, (("f16", "f16"), True)),
])
def test_kv_config_and_its_flat_spellings_make_the_same_cache(kv, flat, want):
    m = _load(kv=kv, **flat)
    try:
        assert (m.kv.dtype, m.flash_attn) == want
    finally:
        m.close()


def test_bad_kv_options_say_what_to_give():
    with pytest.raises(PlacementError, match="KV cache type .q4_0. is not supported"):
        _load(kv=moert.KVConfig("q4_0"))
    with pytest.raises(ArgumentError, match="kv= takes a moert.KVConfig"):
        _load(kv=8)
    with pytest.raises(ArgumentError, match="kv= and cache_type_k both given"):
        _load(kv=moert.KVConfig("f32"), cache_type_k="f16")


def test_ray_options_without_a_cluster_are_an_error_not_ignored():
    with pytest.raises(ArgumentError, match="ray_timeout given without a cluster"):
        _load(ray_timeout=3.0)
    with pytest.raises(ArgumentError, match="ray= takes a moert.RayConfig"):
        _load(ray=2)


def test_a_ray_config_folds_the_flat_spellings_in():
    from moert.loader import _grouped

    flat = {"ray_timeout": 3.0, "ray_fallback": "cpu", "gpu_layers": 0}
    kv, ray = _grouped(None, "local:2", flat)
    assert ray == moert.RayConfig("local:2", fallback="cpu", timeout=3.0) and flat == {"gpu_layers": 0}
    assert kv == moert.KVConfig()
    with pytest.raises(ArgumentError, match="ray= and ray_calls both given"):
        _grouped(None, moert.RayConfig("local:1"), {"ray_calls": "plain"})
