"""moert explain's other views and `moert experts`: each checked against another path to the same numbers."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import moert
from moert.cli.main import main
from moert.explain import explain
from moert.explain.views import attention_view, expert_classes, format_view, logit_lens, routing_view
from moert.testing import write_tiny

DEMO = Path(moert.__file__).parent / "data" / "demo-qwen3moe.gguf"
PROMPT = "for i in range(10):"


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, warmup=False, progress=False, context_size=64, gpu_layers=0, **kw)


@pytest.fixture(scope="module")
def demo():
    m = load(DEMO)
    yield m
    m.close()


def test_the_lens_after_the_last_layer_is_the_models_own_prediction(demo):
    """The host recomputation (final norm, dequantized output) against the runtime's logits."""
    lens = logit_lens(demo, PROMPT, top=5)
    assert len(lens["layers"]) == demo.config.n_layer
    own = explain(demo, PROMPT).next_tokens                           # the runtime's softmax, top 5
    last = lens["layers"][-1]["top"]
    assert [t for t, _, _ in last] == [t for t, _, _ in own]
    np.testing.assert_allclose([p for _, _, p in last], [p for _, _, p in own], rtol=1e-4)
    assert lens["layers"][0]["top"] != last                            # the first layer does not know yet


def test_attention_weights_are_distributions_over_the_past(demo):
    v = attention_view(demo, PROMPT, token=3, top=100)
    for lt in v["layers"]:
        for g in lt["groups"]:
            assert {s for s, _, _ in g["top"]} <= set(range(4))         # only positions 0..3 (causal)
            assert sum(w for _, _, w in g["top"]) == pytest.approx(1.0, abs=1e-6)
    first = attention_view(demo, PROMPT, token=0)                      # the first token sees only itself
    assert all(g["top"][0][:1] == [0] and g["top"][0][2] == pytest.approx(1.0) for lt in first["layers"]
               for g in lt["groups"])
    assert "layer  0 kv0" in format_view(v)


def test_a_sliding_window_layer_attends_inside_its_window(tmp_path):
    m = load(write_tiny(tmp_path / "g.gguf", "gemma3", seed=1))          # window 4; layers 0, 1 slide, 2 is global
    v = attention_view(m, list(range(3, 15)), token=-1, top=12)        # position 11
    for lt in v["layers"]:
        seen = {s for g in lt["groups"] for s, _, w in g["top"] if w > 0}
        if m.config.is_swa(lt["layer"]):
            assert seen <= {8, 9, 10, 11}, lt                          # keys 11 - 3 .. 11
        else:
            assert min(seen) < 8, lt                                   # the global layer reaches further back


@pytest.mark.parametrize("name", ["deepseek2", "deepseek2-lite"])
def test_latent_attention_weights_reproduce_what_the_layer_returned(name, tmp_path, monkeypatch):
    """MLA: the view's weights (softmax over positions, the mean over all H heads, who share one key), applied
    to the cached latents, give the mean over heads of what layers.latent_attention itself returned."""
    from moert.kvcache import load as read_cache
    from moert.models import deepseek2

    m = load(write_tiny(tmp_path / f"{name}.gguf", name, seed=1))
    returned, real = {}, deepseek2.latent_attention

    def keep(q_lat, q_pe, c_kv, k_pe, cache, pos0, scale, xp=np, **kw):
        y = real(q_lat, q_pe, c_kv, k_pe, cache, pos0, scale, xp, **kw)   # (H, T, R)
        returned[len(returned)] = (y[:, -1].mean(axis=0), cache, c_kv.shape[1])
        return y

    monkeypatch.setattr(deepseek2, "latent_attention", keep)
    tokens = list(range(3, 13))
    v = attention_view(m, tokens, token=-1, top=len(tokens))
    step = list(returned.values())[-len(v["layers"]):]                  # the viewed token's own call per layer
    for lt, (y, cache, R) in zip(v["layers"], step):
        (g,) = lt["groups"]                                               # one shared key: one group
        p = np.zeros(len(tokens))
        for s, _, w in g["top"]:
            p[s] = w
        assert p.sum() == pytest.approx(1.0, abs=1e-6) and p.min() >= 0
        latents = read_cache(cache, 0, len(tokens))[:, 0, :R]              # (S, R): the values MLA attends over
        np.testing.assert_allclose(p @ latents, y, rtol=1e-4, atol=1e-5)
    assert "layer  1 kv0" in format_view(v) and "not shown" not in format_view(v)


def test_the_routing_view_is_what_each_token_ran(demo):
    r = routing_view(demo, PROMPT)
    assert len(r["tokens"]) == len(demo.tokenize(PROMPT)) and r["layers"] == demo.config.n_layer
    for k in (0, 4):                                                   # explain's Recorder saw the same experts
        walk = explain(demo, PROMPT, token=k)
        assert [lt.experts for lt in walk.layers] == r["tokens"][k]["experts"]
    assert "L0" in format_view(r) and "'for'" in format_view(r)


def test_expert_classes_is_the_demos_table_for_any_text(demo):
    from moert.demo import SAMPLE, expert_table

    d = expert_classes(demo, SAMPLE)
    assert sum(c["tokens"] for c in d["classes"]) == d["tokens"]
    assert format_view(d).splitlines()[1:] == expert_table(demo).splitlines()[1:]    # the demo's own rows


def test_dense_models_have_no_routing_to_show(tmp_path):
    m = load(write_tiny(tmp_path / "d.gguf", "llama-dense"))
    with pytest.raises(moert.MoertError, match="no routed experts"):
        routing_view(m, [1, 2, 3])


@pytest.mark.parametrize("view", ["attention", "lens", "routing"])
def test_explain_views_on_the_command_line(view, capsys):
    assert main(["explain", str(DEMO), "-p", PROMPT, "--view", view, "--json", "-t", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["view"] == view


def test_the_experts_command(capsys):
    assert main(["experts", str(DEMO), "-p", PROMPT, "--layer", "1", "-t", "1"]) == 0
    assert "which experts of layer 1 each kind of token goes to" in capsys.readouterr().out
    assert main(["experts", str(DEMO), "-p", PROMPT, "--layer", "9"]) == 1
    assert "--layer 9: the model has layers 0 to 3" in capsys.readouterr().err
    assert main(["experts", str(DEMO)]) == 1
    assert "no text: give it with -p TEXT or -f FILE" in capsys.readouterr().err
