"""moert.kernels.gpu.attention: the decode attention kernels' own Triton source under the interpreter against their
NumPy twin, and the twin against moert.layers.attention, for every KV cache type, GQA ratios, windows, sinks and
key counts on either side of a step (32 keys) and of a split; cubins for sm_80 and sm_90 without a GPU.

Error bound: each score is a float32 dot of Dh terms (within Dh 2^-24 of sum |q k| scale: d), the softmax and the
weighted sum add a float32 rounding per key; so a row's output is within (2 d + 4 S 2^-24) max |v| of the float64
twin's, and we allow twice that. Seeing one key too many or too few moves a row by ~1/S of max |v| (the keys are
random), far outside it at these sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

from moert import layers
from moert.devices import CPU
from moert.errors import ShapeError, UnsupportedTypeError
from moert.kvcache import TypedKV, store

pytest.importorskip("triton", reason="the GPU kernels are Triton sources: pip install triton (the dev extra has it)")

from test_gpu_kernels import COMPILES, _check_cubin  # noqa: E402

from moert.kernels import gpu  # noqa: E402
from moert.kernels.gpu import attn  # noqa: E402

U = 2.0 ** -24


def _cache(rng, kind: str, n_ctx: int, hk: int, d: int):
    """A cache of `kind` filled with random rows, as moert/kvcache.py stores them: (cache argument, TypedKV or the
    f32 array)."""
    x = rng.standard_normal((n_ctx, hk, d), dtype=np.float32)
    if kind == "f32":
        return x, x
    c = TypedKV(CPU, kind, (n_ctx, hk, d), kind)
    store(c, 0, x)
    return (kind, *c.parts), c


def _bound(q, kc, vc, pos: int, scale: float) -> float:
    """The module docstring's allowance for these inputs (the largest over rows)."""
    K, V = np.abs(attn.read(kc)).astype(np.float64), np.abs(attn.read(vc)).astype(np.float64)
    T, H, Dh = q.shape
    G = H // K.shape[1]
    d = max(float((K[:pos + t + 1, h // G] @ np.abs(q[t, h])).max()) for t in range(T) for h in range(H))
    return 2 * (2 * Dh * U * d * scale + 4 * (pos + T) * U) * float(V.max())


def _case(rng, kk: str, vk: str, T: int, H: int, Hk: int, n_ctx: int, Dh: int = 32, Dv: int | None = None):
    q = rng.standard_normal((T, H, Dh), dtype=np.float32)
    return q, _cache(rng, kk, n_ctx, Hk, Dh), _cache(rng, vk, n_ctx, Hk, Dv or Dh)


@pytest.mark.parametrize("kk,vk", [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16"), ("q8_0", "q8_0"),
                                   ("f16", "q8_0")])
def test_kernel_matches_twin_per_cache_type(kk, vk):
    """Keys 1, 32, 33 and 70 at T = 1 and 3, GQA 4:1 and 1:1, one split and several (70 keys in 3 splits: 32 + 32 +
    6); a window of 5 and sinks on two of them; 8 tokens of a 16:1 group (128 rows: two programs of 64)."""
    rng = np.random.default_rng(1)
    for T, H, Hk, pos, n_split, window, sinks in [(1, 4, 1, 0, None, None, False), (3, 4, 1, 29, 1, None, True),
                                                  (1, 2, 2, 32, 2, None, False), (3, 8, 2, 67, 3, 5, False),
                                                  (1, 4, 2, 69, None, 5, True), (8, 16, 1, 60, 2, None, True)]:
        q, (kc, _), (vc, _) = _case(rng, kk, vk, T, H, Hk, 72)
        s = rng.standard_normal(H, dtype=np.float32) if sinks else None
        got = gpu.attention(q, kc, vc, pos, window=window, sinks=s, n_split=n_split, backend="interpret")
        want = gpu.attention_ref(q, kc, vc, pos, window=window, sinks=s)
        bound = _bound(q, kc, vc, pos, 1 / np.sqrt(32))
        assert got.shape == (T, H * 32) and np.max(np.abs(got - want)) <= bound, (T, H, Hk, pos, n_split)


@pytest.mark.parametrize("kk", ["f32", "f16", "bf16", "q8_0"])
def test_twin_is_layers_attention(kk):
    """The twin against moert.layers.attention's array code (fast=False: what a GPU ran before these kernels) over
    TypedKV caches that store this step's keys and values as the layer does: GQA 4:2, T = 1 and 3, window, sinks."""
    rng = np.random.default_rng(2)
    T, H, Hk, Dh, n_ctx = 3, 4, 2, 32, 40
    for pos, window, sinks in [(0, None, None), (36, None, rng.standard_normal(H, dtype=np.float32)), (20, 6, None)]:
        for t in (1, T):
            (_, kt), (_, vt) = (_cache(rng, kk, n_ctx, Hk, Dh) for _ in range(2))
            q, k, v = (rng.standard_normal((t, h, Dh), dtype=np.float32) for h in (H, Hk, Hk))
            ref = layers.attention(q, k, v, kt, vt, pos, window=window, sinks=sinks, fast=False)   # stores k, v
            got = gpu.attention_ref(q, kt, vt, pos, window=window, sinks=sinks)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


def test_device_position_fixed_splits_and_buffers():
    """pos as an int32 array read by the kernel, n_split fixed (4, and 37: more than the merge takes in one step
    of 16; most splits empty at pos 3, 20 of them holding keys at 620), out and work given: the same result as an
    int position, written into the buffers given."""
    rng = np.random.default_rng(3)
    q, (kc, _), (vc, _) = _case(rng, "f16", "f16", 2, 4, 2, 640, Dh=32, Dv=16)
    assert attn.splits(128, 2) == 1 and attn.splits(4096, 2) == 16 and attn.splits(1 << 20, 8) == 32
    for pos, n_split in ((3, 4), (620, 4), (3, 37), (620, 37)):                 # 620: 20 splits of 32 keys
        out = np.full((2, 4 * 16), np.nan, dtype=np.float32)
        work = np.empty(attn.work_size(2, 4, 16, n_split), dtype=np.float32)
        got = gpu.attention(q, kc, vc, np.array([pos], dtype=np.int32), n_split=n_split, out=out, work=work,
                            backend="interpret")
        assert got is out
        want = gpu.attention(q, kc, vc, pos, backend="interpret")
        np.testing.assert_allclose(out, want, rtol=0, atol=_bound(q, kc, vc, pos, 1 / np.sqrt(32)))
        np.testing.assert_array_equal(gpu.attention(q, kc, vc, pos, out=np.empty_like(out)), attn.attention_ref(
            q, kc, vc, pos))                                 # NumPy arrays without a backend: the twin


def _r16(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("kk,vk", [("f32", "f32"), ("f16", "f16"), ("bf16", "q8_0"), ("q8_0", "bf16")])
def test_prompt_kernel_matches_twin_of_f16_operands(kk, vk):
    """T > 8: the prompt kernel (64-token blocks, 32-key steps), whose tl.dot takes q, K and V rounded to f16, against
    the twin given the same roundings: what is left is the f16 rounding of the probabilities in the second dot (2^-11
    of each, with the float32 sums: at most 2 2^-11 max |v| a row; we allow twice that). Against the float32
    operands each score would also move by ~2^-10 of sum |q k|. Tokens 12, 40 and 70 (two blocks), GQA 2:1 and 4:1,
    windows of 9 keys and sinks."""
    rng = np.random.default_rng(8)
    for T, H, Hk, pos, window, sinks in [(12, 4, 2, 0, None, False), (40, 4, 1, 7, None, True),
                                         (70, 2, 1, 3, 9, False), (12, 4, 2, 50, 9, True)]:
        q, (kc, _), (vc, _) = _case(rng, kk, vk, T, H, Hk, 80)
        s = rng.standard_normal(H, dtype=np.float32) if sinks else None
        got = gpu.attention(q, kc, vc, pos, window=window, sinks=s, backend="interpret")
        want = gpu.attention_ref(_r16(q), _r16(attn.read(kc)), _r16(attn.read(vc)), pos, window=window, sinks=s)
        bound = 4 * 2.0 ** -11 * float(np.abs(attn.read(vc)).max())
        assert got.shape == (T, H * 32) and np.max(np.abs(got - want)) <= bound, (T, pos, window, sinks)


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
def test_latent_cache_wide_heads(kind):
    """MLA (deepseek2): one latent cache of 576 dims per key as both K and V, the values its first 512 (dv): q read
    9 chunks of 64 dims, the values in 4 blocks of 128 (a program each); decode (4 query heads, 1 and 8 tokens,
    2 splits) against the twin, and a 12-token prompt against the twin of its f16 operands (the prompt bound)."""
    rng = np.random.default_rng(9)
    c, _ = _cache(rng, kind, 40, 1, 576)
    for T, pos in ((1, 38), (8, 20)):                                     # 8 tokens: 32 rows, two programs of 16
        q = rng.standard_normal((T, 4, 576), dtype=np.float32)
        got = gpu.attention(q, c, c, pos, dv=512, scale=0.05, n_split=2, backend="interpret")
        want = gpu.attention_ref(q, c, c, pos, dv=512, scale=0.05)
        assert got.shape == (T, 4 * 512) and np.max(np.abs(got - want)) <= _bound(q, c, c, pos, 0.05)
    q = rng.standard_normal((12, 4, 576), dtype=np.float32)
    got = gpu.attention(q, c, c, 20, dv=512, scale=0.05, backend="interpret")
    f16 = _r16(attn.read(c))
    want = gpu.attention_ref(_r16(q), f16, f16, 20, dv=512, scale=0.05)
    assert np.max(np.abs(got - want)) <= 4 * 2.0 ** -11 * float(np.abs(f16).max())


@pytest.mark.parametrize("kind", ["f32", "f16", "bf16", "q8_0"])
def test_kv_write_is_the_caches_own_write(kind):
    """The write kernel, interpreted, stores exactly what moert.kvcache's TypedKV.write stores (bit for bit: the same
    float32 operations, IEEE divisions), at a position read from an array; rows around it are untouched. Rows of 48
    values (a partial power-of-two tile) except q8_0's 64 (two blocks), an exact half-way value and a zero block."""
    rng = np.random.default_rng(6)
    d = 64 if kind == "q8_0" else 48
    x = rng.standard_normal((3, 2, d), dtype=np.float32)
    x[0, 0, :32] = 0.0                                                   # a q8_0 block of zeros: d = 0
    x[1, 1, :3] = (127.0, 63.5, -63.5)                                   # d = 1: halves, rounded away from 0
    (got, _), (_, want) = _cache(rng, kind, 9, 2, d), _cache(rng, kind, 9, 2, d)
    for a, b in zip(got[1:] if kind != "f32" else (got,), want.parts if kind != "f32" else (want,)):
        a[...] = b                                                       # the same random rows before the write
    gpu.kv_write(got, x, np.array([4], dtype=np.int32), backend="interpret")
    store(want, 4, x)
    for a, b in zip(got[1:] if kind != "f32" else (got,), want.parts if kind != "f32" else (want,)):
        np.testing.assert_array_equal(a, b)


def test_attention_writes_this_steps_keys_first():
    """attention(k=, v=) writes them at the position it reads (kernel and twin) and gives what a write and then
    attention give."""
    rng = np.random.default_rng(7)
    q, (kc, kt), (vc, vt) = _case(rng, "q8_0", "bf16", 2, 4, 2, 40)
    k, v = (rng.standard_normal((2, 2, 32), dtype=np.float32) for _ in range(2))
    before = [a.copy() for a in kc[1:] + vc[1:]]                         # kc, vc share kt's and vt's arrays
    store(kt, 30, k)
    store(vt, 30, v)
    want = gpu.attention_ref(q, kt, vt, 30)
    for backend in ("interpret", "twin"):
        kc2, vc2 = ("q8_0", before[0].copy(), before[1].copy()), ("bf16", before[2].copy())
        got = gpu.attention(q, kc2, vc2, 30, k=k, v=v, backend=backend)
        np.testing.assert_array_equal(kc2[1], kt.parts[0])
        np.testing.assert_array_equal(vc2[1], vt.parts[0])
        assert np.max(np.abs(got - want)) <= _bound(q, kc2, vc2, 30, 1 / np.sqrt(32))


def test_value_dims_and_scale():
    """dv < the value rows (the first dv dims read) and an explicit scale."""
    rng = np.random.default_rng(4)
    q, (kc, _), (vc, _) = _case(rng, "f32", "bf16", 1, 2, 1, 50, Dh=16, Dv=64)
    got = gpu.attention(q, kc, vc, 40, scale=0.5, dv=48, backend="interpret")
    want = gpu.attention_ref(q, kc, vc, 40, scale=0.5, dv=48)
    assert got.shape == (1, 96) and np.max(np.abs(got - want)) <= _bound(q, kc, vc, 40, 0.5)


def test_errors():
    rng = np.random.default_rng(5)
    q, (kc, _), (vc, _) = _case(rng, "q8_0", "f16", 1, 4, 2, 16)
    with pytest.raises(ShapeError, match="past the cache"):
        gpu.attention(np.zeros((12, 4, 32), np.float32), kc, vc, 5)                  # a prompt too
    with pytest.raises(UnsupportedTypeError, match="q4_0"):
        gpu.attention(q, ("q4_0", kc[1]), vc, 0)
    with pytest.raises(ShapeError, match="scales"):
        gpu.attention(q, kc[:2], vc, 0)
    with pytest.raises(ShapeError, match="past the cache"):
        gpu.attention(q, kc, vc, 16)
    with pytest.raises(ShapeError, match="do not fit"):
        gpu.attention(q[:, :3], kc, vc, 0)
    with pytest.raises(ShapeError, match="MLA"):
        z = np.zeros((4, 1, 640), np.float32)
        gpu.attention(np.zeros((1, 2, 640), np.float32), z, z, 0)
    with pytest.raises(ShapeError, match="sinks"):
        gpu.attention(q, kc, vc, 0, sinks=np.zeros(3, np.float32))


@COMPILES
@pytest.mark.parametrize("cc", (80, 90))
def test_attention_compiles(cc):
    """The f16 cache's kernels (GQA 4:1, 128 dims, window and sinks: one token, and a 64-token prompt) for sm_80 and
    sm_90; tests/test_gpu_kernels_compile.py builds every cache type and shape class."""
    for name, sig, const, warps in (attn.specs("f16", T=1, G=4, Dh=128, window=True, sinks=True)
                                    + attn.specs("f16", T=64, G=4, Dh=128, window=True, sinks=True)[:1]):
        _check_cubin(name, sig, const, cc, warps)


# ------------------------------------------------------------------------------------------------- in a model

LAYERS = {"qwen3moe": 2, "gemma3": 3, "gpt-oss": 3, "deepseek2": 2}       # the tiny models' (moert.testing.TINY)


def _model_logits(path, kernels: bool, monkeypatch, kv: str = "f32", backend: str | None = None, prompt: int = 6):
    """Logits of a `prompt`-token prefill and three decode steps on sim:0 with every layer there; with `kernels` the
    sim runs the GPU kernels' path (SimDevice.run_kernels), attention counted (and run under `backend`)."""
    import moert
    from moert.devices.sim import SimDevice

    calls = []
    real = gpu.attention

    def counted(*a, **k):
        calls.append(a[0].shape[0])
        return real(*a, **k, backend=backend)

    with monkeypatch.context() as mp:
        mp.setattr(SimDevice, "run_kernels", kernels)
        mp.setattr(gpu, "attention", counted)
        m = moert.load(path, gpu_backend="sim", context_size=32, warmup=False, progress=False, gpu_layers="all",
                       kv=moert.KVConfig(kv, kv))
        try:
            toks = [3, 17, 5, 99, 42, 7, 8, 30, 2, 61, 90, 14][:prompt]
            out = np.concatenate([m.forward(toks)] + [m.forward([t]) for t in (11, 4, 60)])
        finally:
            m.close()
    return out, calls


@pytest.mark.parametrize("arch", ["qwen3moe", "gemma3", "gpt-oss", "deepseek2"])
def test_model_logits_through_the_kernel(arch, tmp_path, monkeypatch):
    """The sim's kernel path (matmuls, MoE and attention through kernels/gpu's twins) against the plain array path,
    f32 KV: 1e-4 of the logits' norm (float32 orders of summation differ); attention went through kernels/gpu for
    the prefill (12 tokens: the prompt kernel's place) and each decode step in every layer. gemma3 and gpt-oss:
    windows of 4 keys, gpt-oss's sinks; deepseek2's latent cache (MLA) as both keys and values."""
    from moert.testing import write_tiny

    path = write_tiny(tmp_path / f"{arch}.gguf", arch, seed=3)
    want, none = _model_logits(path, False, monkeypatch, prompt=12)
    got, calls = _model_logits(path, True, monkeypatch, prompt=12)
    assert none == [] and calls == [12] * LAYERS[arch] + [1] * 3 * LAYERS[arch], calls
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-4


@pytest.mark.parametrize("arch,kv", [("gemma3", "q8_0"), ("gpt-oss", "bf16"), ("deepseek2", "f16")])
def test_model_logits_interpreted_typed_cache(arch, kv, tmp_path, monkeypatch):
    """The decode kernels' own source under the interpreter (a 6-token prefill and 3 steps) over a q8_0 cache
    (gemma3: a window; its heads of 32 are whole q8_0 blocks), a bf16 one (gpt-oss: a window and sinks) and an f16
    latent cache (deepseek2): the plain path reads the same stored values, so the same bound holds. (The prompt
    kernel rounds to f16: it is held to its twin of those roundings above.)"""
    from moert.testing import write_tiny

    path = write_tiny(tmp_path / f"{arch}.gguf", arch, seed=4)
    want, _ = _model_logits(path, False, monkeypatch, kv=kv)
    got, calls = _model_logits(path, True, monkeypatch, kv=kv, backend="interpret")
    assert calls == [6] * LAYERS[arch] + [1] * 3 * LAYERS[arch], calls
    assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) < 1e-4


def test_bench_script_dry(capsys):
    """bench/bench_gpu_attention.py --dry (NumPy, the interpreter): a decode row and a prompt row per cache type,
    each with its error against the twin (a prompt's f16 operands: ~1e-3)."""
    from bench_scripts import bench_module

    assert bench_module("bench_gpu_attention").main(["--dry", "--kv", "q8_0,f16"]) == 0
    rows = [r.split() for r in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("q8_0", "T=1"), ("q8_0", "prompt"), ("f16", "T=1"), ("f16", "prompt")]
    assert all(float(r[-1]) < (1e-5 if r[1] == "T=1" else 3e-3) for r in rows), rows


@COMPILES
def test_cuda_launch_signature(monkeypatch):
    """ops.run on device arrays as attention() passes them: the scale a float32 parameter (never marked divisible
    by 16), bf16 bits as *fp16, q8_0 values as *u8, the position an *i32; compiled once for sm_90."""
    import contextlib
    import types

    from moert.kernels.gpu import launch

    made, launched = [], []

    def dev(dtype, ptr):
        return types.SimpleNamespace(dtype=np.dtype(dtype), ndim=1, data=types.SimpleNamespace(ptr=ptr))

    compile_cubin = launch.compile_cubin
    monkeypatch.setattr(launch, "compile_cubin", lambda *a, **k: made.append(k["aligned"]) or compile_cubin(*a, **k))
    monkeypatch.setattr(launch, "CupyLauncher", lambda c: lambda grid, args, stream=None: launched.append((c, grid)))
    monkeypatch.setattr(gpu.ops, "_device", lambda a: (0, 90))
    monkeypatch.setattr(gpu.ops, "_on", lambda d: contextlib.nullcontext())
    gpu.ops._launcher.cache_clear()
    gpu.ops._compiled.cache_clear()
    f32 = dev(np.float32, 256)
    args = dict(q_ptr=f32, k_ptr=dev(np.float16, 512), ks_ptr=dev(np.float16, 512), v_ptr=dev(np.uint8, 768),
                vs_ptr=dev(np.float16, 1024), pos_ptr=dev(np.int32, 1280), mp_ptr=f32, lp_ptr=f32, ap_ptr=f32, T=1,
                H=32, Hk=4, Dh=128, Dv=128, Dkr=128, Dvr=128, window=0, n_split=16, scale=0.08838834764831845, NR=1)
    gpu.ops.run("attn_split_kernel", (4, 16), args, attn._split_constexprs("bf16", "q8_0", 1, 8, 128, 128, None),
                attn.WARPS, "cuda")
    (c, grid), = launched
    assert grid == (4, 16) and c.params[:6] == ("*fp32", "*fp16", "*fp16", "*u8", "*fp16", "*i32")
    assert c.params[9:20] == ("i32",) * 9 + ("fp32", "i32") and "scale" not in made[0] and "T" not in made[0]
    gpu.ops._launcher.cache_clear()
    gpu.ops._compiled.cache_clear()
