"""-ctk / -ctv (KV cache types f16, bf16, q8_0) and -fa (flash attention: scores a chunk of keys at a time).

The cache types round what is stored exactly as ggml does (checked bit for bit against gguf-py's quantizers);
flash attention equals the standard attention; a model's logits with each type stay within a stated bound
of f32's; the memory estimate follows the type and still bounds what a sim GPU really allocates."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

import moert
from moert import layers
from moert.devices import CPU
from moert.errors import ArgumentError, PlacementError, ShapeError
from moert.kernels.flash import flash_attention as flash_cpu
from moert.kvcache import TypedKV, kv_bytes
from moert.testing import TINY, write_tiny

RNG = np.random.default_rng(3)


def rows(n=6, h=2, d=64, scale=3.0):
    x = (RNG.standard_normal((n, h, d)) * scale).astype(np.float32)
    x[0, 0, :32] = 0.0                                                 # an all-zero block: scale 0
    x[1, 1, 5] = 1e4                                                   # one outlier
    return x


def test_q8_0_and_bf16_store_what_ggml_stores():
    x = rows()
    q = TypedKV(CPU, "q8_0", x.shape, "k")
    q.write(0, x)
    ref = quants.quantize(x.reshape(-1, x.shape[-1]), GGMLQuantizationType.Q8_0).reshape(-1, 34)   # d f16, 32 q
    assert np.array_equal(q.parts[1].reshape(-1).view(np.uint8).reshape(-1, 2), ref[:, :2])
    assert np.array_equal(q.parts[0].reshape(-1, 32).view(np.uint8), ref[:, 2:])
    b = TypedKV(CPU, "bf16", x.shape, "v")
    b.write(0, x)
    ref = quants.quantize(x, GGMLQuantizationType.BF16)
    assert np.array_equal(b.parts[0].view(np.uint8).reshape(ref.shape), ref.view(np.uint8).reshape(ref.shape))
    np.testing.assert_array_equal(b.read(0, 6), quants.dequantize(ref, GGMLQuantizationType.BF16).reshape(x.shape))
    q8 = GGMLQuantizationType.Q8_0
    np.testing.assert_array_equal(q.read(2, 5), quants.dequantize(quants.quantize(x[2:5], q8), q8))


def test_type_names_bytes_and_errors():
    assert [kv_bytes(t, 64) for t in ("f32", "f16", "bf16", "q8_0")] == [256, 128, 128, 68]
    with pytest.raises(PlacementError, match="q4_0.*f32, f16, bf16, q8_0"):
        kv_bytes("q4_0", 64)
    with pytest.raises(PlacementError, match="multiple of 32"):
        TypedKV(CPU, "q8_0", (4, 1, 48), "k")


@pytest.mark.parametrize("sinks", [None, np.array([-1.0, 0.5, 3.0, 8.0], np.float32)])   # gpt-oss's sinks
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("pos0,T", [(0, 7), (13, 4), (20, 1)])
def test_flash_attention_equals_the_standard_one(pos0, T, window, sinks):
    H, Hk, Dh, n = 4, 2, 32, 32
    q, k, v = (RNG.standard_normal((T, h, Dh)).astype(np.float32) for h in (H, Hk, Hk))
    kc, vc = (RNG.standard_normal((n, Hk, Dh)).astype(np.float32) for _ in range(2))
    want = layers.attention(q, k, v, kc.copy(), vc.copy(), pos0, window=window, sinks=sinks, fast=False)
    for chunk in (3, 8, 256):                                          # the xp path (NumPy, CuPy, sim)
        got = layers.attention(q, k, v, kc.copy(), vc.copy(), pos0, window=window, sinks=sinks, fast=False,
                               flash=True, chunk=chunk)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    kc[pos0:pos0 + T], vc[pos0:pos0 + T] = k, v                         # the CPU kernel reads them there
    np.testing.assert_allclose(flash_cpu(q, kc, vc, pos0, 1 / np.sqrt(Dh), window, sinks), want, atol=1e-5,
                               rtol=1e-5)


@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0"])
# T > layers.SPLIT_TOKENS (fewer tokens go to kernels/flash_decode.py); last: past `chunk`, the twin
@pytest.mark.parametrize("pos0,T,chunk", [(0, 12, 256), (13, 10, 256), (9, 9, 16)])
def test_a_prompt_over_a_typed_cache_takes_the_cpu_flash_kernel_and_equals_the_twin(kind, pos0, T, chunk, monkeypatch):
    """Without kernels/flash_prompt.py (no SciPy), typed caches up to `chunk` positions go to kernels/flash.py read
    as float32 (fast=True); the xp twin (fast=False) over the same typed caches gives the same attention. Past
    `chunk` the twin runs."""
    import moert.kernels.flash as kflash
    import moert.kernels.flash_prompt as kprompt

    monkeypatch.setattr(kprompt, "available", lambda: False)

    H, Hk, Dh, n = 4, 2, 32, 32
    q, k, v = (RNG.standard_normal((T, h, Dh)).astype(np.float32) for h in (H, Hk, Hk))
    past = RNG.standard_normal((pos0, Hk, Dh)).astype(np.float32)

    def caches():
        kc, vc = TypedKV(CPU, kind, (n, Hk, Dh), "k"), TypedKV(CPU, kind, (n, Hk, Dh), "v")
        if pos0:
            kc.write(0, past)
            vc.write(0, past[::-1].copy())
        return kc, vc
    calls = []
    monkeypatch.setattr(kflash, "flash_attention", lambda *a: calls.append(1) or flash_cpu(*a))
    want = layers.attention(q, k, v, *caches(), pos0, fast=False, flash=True, chunk=chunk)
    got = layers.attention(q, k, v, *caches(), pos0, fast=True, flash=True, chunk=chunk)
    assert len(calls) == (pos0 + T <= chunk)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_as_f32_reads_every_half_as_numpy_does():
    """The decode kernel's f16 read (kernels/fmath.as_f32 on a uint16 view): every one of the 65536 bit patterns,
    subnormals, infinities and NaNs included, as NumPy's float16 -> float32."""
    from numba import njit

    from moert.kernels.fmath import as_f32

    @njit
    def widen(bits):
        out = np.empty(bits.shape[0], dtype=np.float32)
        for i in range(bits.shape[0]):
            out[i] = as_f32(bits[i])
        return out

    bits = np.arange(1 << 16, dtype=np.uint16)
    np.testing.assert_array_equal(widen(bits), bits.view(np.float16).astype(np.float32))   # NaN == NaN here


@pytest.mark.parametrize("kinds", [("f16", "f16"), ("f16", "f32"), ("f32", "f16"), ("bf16", "f16")])
@pytest.mark.parametrize("window,sinks", [(None, None), (5, np.array([-1.0, 0.5, 3.0, 8.0], np.float32))])
def test_one_token_decode_reads_f16_caches_in_the_cpu_kernel(kinds, window, sinks, monkeypatch):
    """An f16 cache (llama.cpp's default -ctk/-ctv) decodes in the Numba kernel through a uint16 view, with what
    TypedKV itself stores at the new position, and equals the reference path's attention over the same
    rounded keys; a bf16 cache still takes the reference path."""
    from moert.kernels import layers as klayers

    H, Hk, Dh, n, pos0 = 4, 2, 64, 40, 23
    q, k, v = (RNG.standard_normal((1, h, Dh)).astype(np.float32) for h in (H, Hk, Hk))
    past = [RNG.standard_normal((pos0, Hk, Dh)).astype(np.float32) for _ in range(2)]

    def caches():
        out = []
        for kind, x in zip(kinds, past):
            c = TypedKV(CPU, kind, (n, Hk, Dh), "test") if kind != "f32" else np.zeros((n, Hk, Dh), np.float32)
            if kind == "f32":
                c[:pos0] = x
            else:
                c.write(0, x)
            out.append(c)
        return out

    calls = []
    real = klayers.attention_decode
    monkeypatch.setattr(klayers, "attention_decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    kc, vc = caches()
    got = layers.attention(q, k, v, kc, vc, pos0, window=window, sinks=sinks)
    assert calls == ([] if "bf16" in kinds else [1])                   # the kernel ran exactly where it should
    rk, rv = caches()
    want = layers.attention(q, k, v, rk, rv, pos0, window=window, sinks=sinks, fast=False)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    for a, b in ((kc, rk), (vc, rv)):                                  # position pos0 stored as TypedKV stores it
        np.testing.assert_array_equal(a[pos0] if isinstance(a, np.ndarray) else a.read(pos0, pos0 + 1)[0],
                                      b[pos0] if isinstance(b, np.ndarray) else b.read(pos0, pos0 + 1)[0])


def test_the_cpu_flash_kernel_over_more_keys_than_a_block_and_its_checks():
    T, H, Hk, Dh, pos0 = 9, 8, 2, 64, 150                               # 159 keys: blocks of 64, 64, 31
    q = RNG.standard_normal((T, H, Dh)).astype(np.float32)
    kc, vc = (RNG.standard_normal((200, Hk, Dh)).astype(np.float32) for _ in range(2))
    want = layers.attention(q, kc[pos0:pos0 + T], vc[pos0:pos0 + T], kc.copy(), vc.copy(), pos0, fast=False)
    np.testing.assert_allclose(flash_cpu(q, kc, vc, pos0, 1 / 8, None), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ShapeError):
        flash_cpu(q, kc, vc, 195, 1 / 8, None)                         # past the cache's end


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hp = {**TINY["qwen3moe"]["hparams"], "attention.key_length": 32, "attention.value_length": 32}   # q8_0: 32s
    return write_tiny(tmp_path_factory.mktemp("kv") / "q3.gguf", "qwen3moe", seed=2, hparams=hp)


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, context_size=kw.pop("context_size", 32), warmup=False, progress=False, **kw)


TOKENS = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 4, 6]


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# measured on this tiny model (logits' relative error against f32): f16 2.8e-4, bf16 2.6e-3, q8_0 7.0e-3
BOUND = {"f16": 1e-3, "bf16": 1e-2, "q8_0": 2e-2}


def test_logits_per_cache_type_and_flash(tiny, one_numba_thread):
    f32 = load(tiny, gpu_layers=0)
    want = np.concatenate([f32.forward(TOKENS[:8]), f32.forward(TOKENS[8:])])
    fa = load(tiny, gpu_layers=0, flash_attn="on")
    assert fa.flash_attn and rel(np.concatenate([fa.forward(TOKENS[:8]), fa.forward(TOKENS[8:])]), want) < 1e-5
    for t, bound in BOUND.items():
        m = load(tiny, gpu_layers=0, cache_type_k=t, cache_type_v=t)
        assert m.flash_attn and m.kv.types == (t, t)                    # auto: on for a cache that is not f32
        got = np.concatenate([m.forward(TOKENS[:8])] + [m.forward([x]) for x in TOKENS[8:]])   # prompt, then decode
        assert 0 < rel(got, want) < bound, (t, rel(got, want))
        assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    with pytest.raises(ArgumentError, match="flash_attn"):
        load(tiny, flash_attn="maybe")


@pytest.mark.parametrize("types,flash", [(("q8_0", "q8_0"), True), (("f16", "bf16"), False), (("f32", "f32"), True)])
def test_the_estimate_follows_the_type_and_bounds_the_sim_peak(tiny, types, flash, one_numba_thread):
    n_ctx = 32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = moert.plan(str(tiny), gpu_backend="sim")
    est = moert.estimate(p, n_ctx, n_batch=8, kv_dtype=types, flash_attn=flash, all_logits=True)
    f32 = moert.estimate(p, n_ctx, n_batch=8, kv_dtype="f32")
    ratio = (kv_bytes(types[0], 64) + kv_bytes(types[1], 64)) / 512
    assert est.devices["sim:0"].kv == pytest.approx(f32.devices["sim:0"].kv * ratio)
    cap = est.devices["sim:0"].total
    m = load(tiny, gpu_backend="sim", gpu_memory=[cap], context_size=n_ctx, n_batch=8, cache_type_k=types[0],
             cache_type_v=types[1], flash_attn="on" if flash else "off")
    m.forward(list(range(1, n_ctx - 2)))
    for t in (4, 5, 6):
        m.forward([t])
    assert m.position == n_ctx and m.plan.devices[0].peak <= cap
    assert m.kv.nbytes == est.devices["sim:0"].kv


def test_cli_takes_llama_cpp_cache_and_flash_flags(tiny, capsys):
    from moert.cli.main import main

    assert main(["run", str(tiny), "-p", "1 2 3", "-n", "3", "--temp", "0", "-ctk", "q8_0", "-ctv", "f16", "-fa", "on",
                 "-c", "32", "-t", "1", "--no-warmup"]) in (0, None)
    assert main(["inspect", str(tiny), "--no-tensors", "-ctk", "q8_0", "-ctv", "q8_0", "-c", "32"]) in (0, None)
    assert "KV q8_0" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", str(tiny), "-p", "hi", "-ctk", "q4_0"])
    assert "q4_0" in capsys.readouterr().err


def test_f16_is_the_default_everywhere_that_sizes_a_kv_cache(tiny):
    """moert.load allocates f16 (llama.cpp's default) and flash attention (-fa auto); estimate, fit, and the
    gpu_layers='auto' plan that load asks fit for size the same cache; f32 stays available, everywhere."""
    from moert.placement import fit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = moert.plan(str(tiny), gpu_backend="sim")
        m = load(tiny, gpu_backend="sim", context_size=32)
        assert m.kv.types == ("f16", "f16") and m.flash_attn
        assert m.kv.nbytes == moert.estimate(p, 32).devices["sim:0"].kv == moert.estimate(p, 32, kv_dtype="f32")\
            .devices["sim:0"].kv // 2
        f16, f32 = (fit(str(tiny), 32, gpu_backend="sim", **kw).estimate.devices["sim:0"].kv
                    for kw in ({}, {"kv_dtype": "f32"}))
        assert f16 == m.kv.nbytes and f32 == 2 * f16
        # a GPU that holds every layer with an f16 cache, not with f32: gpu_layers="auto" follows the cache type
        need = {kv: moert.estimate(p, 4096, kv_dtype=kv, flash_attn=True).devices["sim:0"].total
                for kv in ("f16", "f32")}
        assert need["f16"] < need["f32"]
        kw = dict(gpu_backend="sim", gpu_memory=[need["f16"]], gpu_layers="auto", context_size=4096, flash_attn="on")
        a, b = load(tiny, **kw), load(tiny, cache_type_k="f32", cache_type_v="f32", **kw)
        assert a.plan.gpu_layers == a.config.n_layer + 1 and b.plan.gpu_layers < a.plan.gpu_layers
        assert a.kv.types == ("f16", "f16") and b.kv.types == ("f32", "f32")
