"""One test runner every architecture passes (mlx-lm's model_test_runner): each registered architecture
brings a tiny writer (moert.testing.TINY) and gets, for free: prefill = token-by-token decode, the same
logits in every placement, the memory estimate bounding the sim peak over a full context, and a typed error
naming each missing key and tensor. Then the float oracle: transformers in float32 on the same weights
(fixtures by tests/reference/make_arch_refs.py) for the architectures that came with this runner."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import moert
from moert import GGUFError, models
from moert.config import ConfigError
from moert.models.spec import TensorMismatchError
from moert.testing import TINY, write_tiny

FIX = Path(__file__).parent / "fixtures" / "arch"
TOKENS = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]


def test_every_architecture_has_a_tiny_writer():
    assert {TINY[n].get("arch", n) for n in TINY} == set(models.ARCHITECTURES)


@pytest.fixture(scope="module", params=sorted(TINY))
def tiny(request, tmp_path_factory):
    return request.param, write_tiny(tmp_path_factory.mktemp("arch") / f"{request.param}.gguf", request.param, seed=7)


def load(path, **kw):
    """moert.load with an f32 KV cache unless told otherwise: this file compares with float oracles."""
    kw = {"cache_type_k": "f32", "cache_type_v": "f32", **kw}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, context_size=kw.pop("context_size", 32), warmup=False, progress=False, **kw)


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_prefill_equals_decode_and_placements_agree(tiny, kv, one_numba_thread):
    """f32: exact paths agree to float noise; f16 (the default): both paths round K and V alike, but the prompt
    runs flash attention (-fa auto), whose online softmax sums in another order than the decode kernel."""
    name, path = tiny
    tol, kv_kw = (1e-5 if kv == "f32" else 1e-4), dict(cache_type_k=kv, cache_type_v=kv)
    ref = load(path, gpu_layers=0, **kv_kw)
    a = ref.forward(TOKENS)
    ref.reset()
    b = np.concatenate([ref.forward([t]) for t in TOKENS])
    assert rel(b, a) < tol and np.isfinite(a).all()
    for kw in (dict(gpu_backend="sim"), dict(gpu_backend="sim", cpu_moe=True),
               dict(gpu_backend="sim", gpu_memory=["1GiB", "1GiB"]), dict(gpu_backend="sim", gpu_layers=1)):
        m = load(path, **kw, **kv_kw)
        assert rel(m.forward(TOKENS), a) < tol, (name, kw)
        assert rel(m.forward([7]), load(path, gpu_layers=0, **kv_kw).forward([*TOKENS, 7])[-1:]) < tol, (name, kw)


@pytest.mark.parametrize("n_batch", [5, 32])
def test_the_estimate_bounds_the_sim_peak_over_a_full_context(tiny, n_batch, one_numba_thread):
    name, path = tiny
    n_ctx = 32
    for kw in (dict(), dict(cpu_moe=True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = moert.estimate(moert.plan(str(path), gpu_backend="sim", **kw), n_ctx, n_batch=n_batch,
                                  all_logits=True)
        cap = est.devices["sim:0"].total     # the defaults of both: an f16 cache, flash attention (-fa auto)
        m = load(path, gpu_backend="sim", gpu_memory=[cap], context_size=n_ctx, n_batch=n_batch, cache_type_k="f16",
                 cache_type_v="f16", **kw)
        m.forward(list(range(1, n_ctx - 2)))
        for t in (4, 5, 6):
            m.forward([t])
        sim = m.plan.devices[0]
        assert m.position == n_ctx and sim.peak <= cap, (name, kw, sim.peak, cap)


def test_every_missing_key_and_tensor_is_named(tiny, tmp_path):
    from semantic_fuzz import read_recipe, write_recipe

    name, path = tiny
    r = read_recipe(path)
    module = models.get(r.arch)
    required = module.Config.required_keys(r.arch)
    assert f"{r.arch}.block_count" in required and f"{r.arch}.embedding_length" in required, name
    for key in required:
        if key == "general.architecture":
            continue
        out = write_recipe(type(r)(r.arch, {k: v for k, v in r.metadata.items() if k != key}, r.tensors),
                           tmp_path / "k.gguf")
        with pytest.raises(ConfigError, match=rf"GGUF key '{key}' is missing"):
            load(out)
    config = module.Config.from_gguf({k: v for k, (_, v) in r.metadata.items()} | {"general.architecture": r.arch})
    needed = [s.name for s in module.tensors(config) if not s.optional and (not s.name.startswith("blk.")
                                                                           or s.name.startswith("blk.0."))]
    for t in needed:
        out = write_recipe(type(r)(r.arch, r.metadata, [x for x in r.tensors if x[0] != t]), tmp_path / "t.gguf")
        with pytest.raises(TensorMismatchError, match=rf"tensor '{t}' is missing; {r.arch} needs it"):
            load(out)


def test_registry_refuses_what_it_does_not_know(tmp_path):
    from moert.testing import write_gguf

    p = write_gguf(tmp_path / "x.gguf", "mamba", {"mamba.block_count": 1},
                   [("a.weight", np.zeros(32, np.float32), "F32")])
    with pytest.raises(GGUFError, match="general.architecture is 'mamba', which moert does not implement; supported: "
                                        + ", ".join(sorted(models.ARCHITECTURES))):
        load(p)


# ------------------------------------------------------------------------- the float oracle: transformers

@pytest.mark.parametrize("name", ["llama", "llama-dense", "qwen2moe", "olmoe", "deepseek2", "deepseek2-lite",
                                  "gpt-oss"])
def test_matches_transformers_float32(name, one_numba_thread):
    """MixtralForCausalLM, LlamaForCausalLM, Qwen2MoeForCausalLM, OlmoeForCausalLM, Glm4MoeLiteForCausalLM
    (deepseek2), DeepseekV2ForCausalLM (deepseek2-lite), GptOssForCausalLM in float32 on the gguf-py-dequantized
    weights of the same file (tests/reference/make_arch_refs.py, make_deepseek2_refs.py): prefill and decode at
    about 1e-6, the same top-1."""
    f = np.load(FIX / f"{name}.npz")
    want = f["hf_logits"]
    m = load(FIX / f"{name}.gguf", gpu_layers=0, context_size=64)
    a = m.forward(f["tokens"])
    m.reset()
    b = np.concatenate([m.forward([t]) for t in f["tokens"]])
    assert rel(a, want) < 2e-6 and rel(b, want) < 2e-6
    assert (a.argmax(1) == want.argmax(1)).all()


def test_cli_inspect_fit_run_on_every_architecture(tiny, capsys):
    """moert inspect (with --cpu-moe on a sim GPU), fit and run work on each architecture."""
    import json

    from moert.cli.main import main

    name, path = tiny

    def cli(*args):
        assert main([str(a) for a in args]) == 0, (name, args, capsys.readouterr().err[-500:])
        return capsys.readouterr().out

    out = cli("inspect", path, "--cpu-moe", "--gpu-backend", "sim", "-c", "32")
    assert "check: every key and tensor matches" in out and "memory at context 32" in out
    assert json.loads(cli("fit", path, "--gpu-backend", "sim", "--gpu-mem", "64MiB", "-c", "32", "--json"))["success"]
    toks = cli("run", path, "-p", "1 2 3", "-n", "4", "--temp", "0", "--cpu-moe", "--gpu-backend", "sim", "-c", "32",
               "--no-warmup")
    assert len(toks.split()) == 4


@pytest.mark.parametrize("name", ["llama_q4km", "llama-dense_q4km", "qwen2moe_q4km", "olmoe_q4km", "deepseek2_q4km",
                                  "deepseek2-lite_q4km", "gpt-oss_mxfp4"])
def test_at_least_as_close_as_llama_cpp(name, one_numba_thread):
    """On a Q4_K_M file (gpt-oss: MXFP4_MOE) llama.cpp quantized itself: moert is at least as close to the float
    oracle (on the same dequantized weights) as llama.cpp's logits are, and picks the oracle's top-1 at least as
    often."""
    f = np.load(FIX / f"{name}.npz")
    hf, ll = f["hf_logits"], f["llama_logits"]
    ours = load(FIX / f"{name}.gguf", gpu_layers=0, context_size=64).forward(f["tokens"])
    assert rel(ours, hf) < 1e-5 and rel(ours, hf) <= rel(ll, hf)
    assert (ll.argmax(1) == hf.argmax(1)).mean() > 0.5                      # the fixture means something
    assert (ours.argmax(1) == hf.argmax(1)).mean() >= (ll.argmax(1) == hf.argmax(1)).mean()
