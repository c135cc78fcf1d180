"""deepseek2 beyond the shared runner (tests/test_architectures.py): the latent KV cache and what counts it,
llama.cpp's routing (groups, selection bias, weights from unbiased scores), experts split over devices."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import moert
from moert.kvcache import KVSpec
from moert.models import deepseek2
from moert.moe import grouped_topk, sigmoid_topk
from moert.testing import TINY, write_tiny

TOKENS = [3, 14, 15, 92, 65, 35]


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("ds2") / "glm.gguf", "deepseek2", seed=5)


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, warmup=False, progress=False, **kw)


def test_the_cache_holds_the_latent_and_the_rope_key_and_the_estimate_counts_it(glm):
    hp = TINY["deepseek2"]["hparams"]
    per_token = hp["block_count"] * (hp["attention.kv_lora_rank"] + hp["rope.dimension_count"]) * 2   # f16
    m = load(glm, context_size=48, gpu_backend="sim")                  # the default cache type, as the estimate's
    assert m.kv.nbytes == 48 * per_token
    assert KVSpec.from_metadata(m.plan.metadata) == m.config.kv_spec() == KVSpec(2, 1, 40, 0)
    est = moert.estimate(m.plan, 48)
    assert est.devices["sim:0"].kv == 48 * per_token


def test_glm_4_7_flash_latent_cache_per_token():
    """docs/architectures.md's figure, from the zoo twin's GGUF keys: 47 layers * (512 + 64) floats per token, against
    47 * 20 heads * (192 + 64 + 256) for a cache of full keys and values."""
    from moert.cost.zoo import TWINS, _metadata

    md = _metadata(TWINS["glm-4.7-flash"])
    c = deepseek2.Config.from_gguf(md)
    s = KVSpec.from_metadata(md)
    assert s.layer_bytes(1) * s.n_layer == 47 * 576 * 4 == 108_288                    # float32, per token
    assert c.n_layer * c.n_head * (c.k_head + c.v_head) * 4 == 1_925_120


def reference_route(probs, k, bias, renorm, scale, n_group, topk_group):
    """transformers' DeepseekV3TopkRouter, written out per token."""
    T_, E = probs.shape
    ids, ws = [], []
    for t in range(T_):
        sel = probs[t] + (0 if bias is None else bias)
        groups = sel.reshape(n_group, -1)
        merit = np.sort(groups, axis=1)[:, -2:].sum(1)
        keep = np.argsort(-merit, kind="stable")[:topk_group]
        masked = np.full(E, -np.inf)
        for gi in keep:
            masked[gi * (E // n_group):(gi + 1) * (E // n_group)] = sel[gi * (E // n_group):(gi + 1) * (E // n_group)]
        top = np.argsort(-masked, kind="stable")[:k]
        w = probs[t, top]
        ids.append(top)
        ws.append((w / w.sum() if renorm else w) * scale)
    return np.array(ids), np.array(ws, dtype=np.float32)


@pytest.mark.parametrize("gating", ["sigmoid", "softmax"])
def test_grouped_routing_matches_the_reference(gating):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((16, 16)).astype(np.float32)
    bias = (0.3 * rng.standard_normal(16)).astype(np.float32)
    if gating == "sigmoid":
        probs = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
        ids, w = sigmoid_topk(logits, 4, bias, renorm=True, scale=1.8, n_group=4, topk_group=2)
    else:
        e = np.exp(logits - logits.max(1, keepdims=True))
        probs = (e / e.sum(1, keepdims=True)).astype(np.float32)
        ids, w = grouped_topk(probs, 4, bias, renorm=False, scale=1.0, n_group=4, topk_group=2)
    rids, rw = reference_route(probs, 4, bias, gating == "sigmoid", 1.8 if gating == "sigmoid" else 1.0, 4, 2)
    assert (ids == rids).all() and np.allclose(w, rw, rtol=1e-5)
    assert all(len(set(r // 4)) <= 2 for r in ids)                                  # at most 2 groups used


def test_experts_split_over_devices_give_the_same_logits(glm, one_numba_thread):
    """Expert-granular placement (-ot ...@0-3): half of each layer's experts on a sim GPU, half on the CPU."""
    want = load(glm, context_size=16, gpu_layers=0).forward(TOKENS)
    rules = moert.parse_overrides(r"\.ffn_.*_exps=GPU0@0-3,\.ffn_.*_exps=CPU")
    m = load(glm, context_size=16, overrides=rules, gpu_backend="sim")
    assert m.plan.device_of("blk.1.ffn_up_exps.weight", expert=2) == "sim:0"
    assert m.plan.device_of("blk.1.ffn_up_exps.weight", expert=5) == "cpu"
    got = m.forward(TOKENS)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def test_an_mtp_block_is_loaded_and_not_run(tmp_path):
    """GLM-4.7-Flash files of current converters append a multi-token-prediction block (nextn_predict_layers,
    blk.N.nextn.*): the logits are those of the file without it, and it gets no KV cache."""
    from semantic_fuzz import read_recipe, write_recipe

    hp = {**TINY["deepseek2"]["hparams"], "block_count": 3, "nextn_predict_layers": 1}
    path = write_tiny(tmp_path / "mtp.gguf", "deepseek2", seed=3, hparams=hp, optional=[r"exp_probs_b", r"^blk\.2\."])
    r = read_recipe(path)
    assert any(t[0] == "blk.2.nextn.eh_proj.weight" for t in r.tensors)
    md = {k: v for k, v in r.metadata.items() if k != "deepseek2.nextn_predict_layers"}
    md["deepseek2.block_count"] = (md["deepseek2.block_count"][0], 2)
    trunk = write_recipe(type(r)(r.arch, md, [t for t in r.tensors if not t[0].startswith("blk.2.")]),
                         tmp_path / "trunk.gguf")
    a, b = load(path, context_size=16, gpu_layers=0), load(trunk, context_size=16, gpu_layers=0)
    assert (a.forward(TOKENS) == b.forward(TOKENS)).all() and a.kv.nbytes == b.kv.nbytes
