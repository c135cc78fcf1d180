"""`moert explain`: one token's walk through a model (moert/explain/walk.py), on small synthetic models and Gemma 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from moert.errors import MoertError
from moert.explain import explain, format_trace
from moert.loader import load
from moert.testing import gpt2_vocab_metadata, write_qwen3moe

PROMPT = "def forward(self, x):\n    return x"


def moert(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moert", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("explain") / "m.gguf", n_layer=3, n_expert=8, n_expert_used=2,
                          vocab=gpt2_vocab_metadata(n_vocab=300))


@pytest.fixture(scope="module")
def model(path, one_numba_thread):
    m = load(path, cpu_moe=True, gpu_backend="sim", context_size=64, progress=False)
    yield m
    m.close()


def test_each_layer_routes_like_the_runtime(model):
    t = explain(model, PROMPT, token=-1)
    assert [lt.layer for lt in t.layers] == [0, 1, 2] and t.position == len(model.tokenize(PROMPT)) - 1
    for lt in t.layers:
        p = np.asarray(lt.probs)
        assert lt.ffn == "moe" and p.shape == (8,) and abs(p.sum() - 1) < 1e-9
        assert sorted(lt.experts) == sorted(np.argsort(-p)[:2].tolist())     # what ran = the router's top 2
        assert abs(sum(lt.weights) - 1) < 1e-5
        assert np.allclose(sorted(lt.weights), sorted(p[lt.experts] / p[lt.experts].sum()), atol=1e-5)
        assert lt.attention_device == "sim:0" and lt.expert_device == "cpu"
        assert lt.attention_update > 0 and lt.ffn_update > 0 and lt.residual_norm > 0


def test_bytes_time_and_transfers_follow_the_placement(model):
    t = explain(model, PROMPT, token=3)
    g = model.gguf.tensors
    lt = t.layers[1]
    experts = sum(g[f"blk.1.ffn_{w}_exps.weight"].nbytes for w in ("gate", "up", "down"))
    assert lt.bytes_read["cpu"] == experts * len(set(lt.experts)) // 8
    assert lt.bytes_read["sim:0"] == sum(x.nbytes for n, x in g.items() if n.startswith("blk.1.") and "_exps" not in n)
    assert set(lt.seconds) >= {"attention", "router", "experts"} and "cpu" in lt.seconds["experts"]
    moved = {what for what, *_ in lt.transfers}
    assert moved == {"hidden, expert ids, weights", "expert output"}         # one crossing each way (to_together)
    assert t.transfers["sim:0"]["d2h_count"] >= 3                # 1 per layer to the experts, then the logits


def test_recording_changes_nothing(model, path):
    ids = model.tokenize(PROMPT)
    t = explain(model, PROMPT, token=-1)
    assert "to" not in vars(model) and "experts" not in vars(model)           # the class's methods again
    model.reset()
    p = model.forward(ids)[-1].astype(np.float64)
    p = np.exp(p - p.max())
    p /= p.sum()
    best = [(i, float(p[i])) for i in np.argsort(-p, kind="stable")[:5]]
    assert [(i, round(q, 5)) for i, _, q in t.next_tokens] == [(i, round(q, 5)) for i, q in best]
    model.reset()
    model.forward(ids[:-1])
    model.forward(ids[-1:])                                  # the same step, not recorded: the same transfers
    plain = model.stats.last.transfers["sim:0"].as_dict()
    assert {k: v for k, v in plain.items() if k != "seconds"} == \
        {k: v for k, v in t.transfers["sim:0"].items() if k != "seconds"}


def test_all_on_one_device_moves_nothing(path, one_numba_thread):
    m = load(path, gpu_layers=0, context_size=64, progress=False)
    try:
        t = explain(m, "x = 1", token=0)
        assert t.position == 0 and all(not lt.transfers for lt in t.layers)
        assert all(set(lt.bytes_read) == {"cpu"} for lt in t.layers)
        assert "transfers: none" in format_trace(t)
    finally:
        m.close()


def test_text_shows_bars_and_choices(model):
    text = format_trace(explain(model, PROMPT), layer=2)
    assert "layer 2" in text and "layer 1 " not in text
    assert "<- chosen, weight" in text and "█" in text and "weights read:" in text and "next token:" in text


def test_bad_token_index(model):
    with pytest.raises(MoertError, match="outside the prompt"):
        explain(model, "x", token=5)


def test_dense_model_says_dense(gemma_path, one_numba_thread):
    m = load(gemma_path, gpu_layers=0, context_size=32, progress=False)
    try:
        t = explain(m, "The capital of France is", token=-1)
        assert len(t.layers) == m.config.n_layer and all(lt.ffn == "dense" and lt.probs is None for lt in t.layers)
        assert all(lt.ffn_update > 0 for lt in t.layers)
        assert "FFN dense" in format_trace(t)
    finally:
        m.close()


def test_cli_json_layer_and_plot(path, tmp_path):
    png = tmp_path / "e.png"
    r = moert("explain", path, "-p", PROMPT, "--layer", "1", "--json", "--cpu-moe", "--gpu-backend", "sim",
              "--plot", png, "-c", "64")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert [lt["layer"] for lt in d["layers"]] == [1] and len(d["layers"][0]["probs"]) == 8
    assert png.stat().st_size > 1000
    r = moert("explain", path, "-p", "x", "--layer", "7")
    assert r.returncode != 0 and "layers 0 to 2" in r.stderr


def test_a_sigmoid_router_is_shown_as_its_scores(tmp_path, one_numba_thread):
    # deepseek2 (GLM-4.7-Flash style) gates with sigmoid + a selection bias: explain shows those scores,
    # not a softmax, and says how they are made; the chosen experts are still the runtime's
    import warnings

    from moert.models import deepseek2
    from moert.testing import write_tiny

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = load(write_tiny(tmp_path / "ds.gguf", "deepseek2", seed=1), context_size=16, warmup=False,
                 progress=False, gpu_layers=0)
    assert deepseek2.GATING[m.config.expert_gating_func] == "sigmoid"
    lt = [t for t in explain(m, [1, 2, 3, 4]).layers if t.ffn == "moe"][0]
    p = np.asarray(lt.probs)
    assert ((p > 0) & (p < 1)).all() and abs(p.sum() - 1) > 0.1          # independent sigmoids, not a softmax
    assert "router: sigmoid(" in format_trace(explain(m, [1, 2, 3, 4]), layer=lt.layer)


@pytest.mark.parametrize("arch,says", [("qwen3moe", "renormalized to sum to 1"),
                                       ("qwen2moe", "not renormalized"), ("olmoe", "not renormalized")])
def test_the_router_line_says_how_the_weights_are_made(arch, says, tmp_path, one_numba_thread):
    # qwen3moe renormalizes its top k; qwen2moe and olmoe keep the softmax probabilities (read off the numbers)
    from moert.testing import write_tiny

    m = load(write_tiny(tmp_path / f"{arch}.gguf", arch, seed=2), context_size=16, warmup=False, progress=False,
             gpu_layers=0)
    tr = explain(m, [1, 2, 3, 4])
    lt = [t for t in tr.layers if t.ffn == "moe"][0]
    w, p = np.asarray(lt.weights), np.asarray(lt.probs)[list(lt.experts)]
    assert np.allclose(w, p / p.sum() if arch == "qwen3moe" else p, rtol=1e-4)
    assert says in format_trace(tr, layer=lt.layer)
    m.close()
