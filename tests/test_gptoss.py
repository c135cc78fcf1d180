"""gpt-oss specifics beyond the shared runner (tests/test_architectures.py): the YaRN rounding llama.cpp does
and transformers does not (the figures moert/models/gptoss.py's docstring states), the layer pattern, and the
zoo twins planning with the real architecture registered."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moert.layers import Yarn
from moert.models import gptoss


def test_yarn_rounding_difference_for_gpt_oss_shapes():
    """transformers (truncate False) against ggml (floor / ceil) for gpt-oss-20b/120b's RoPE."""
    hf = Yarn(32.0, 4096, 32.0, 1.0, 1 + 0.1 * math.log(32), truncate=False)
    gg = Yarn(32.0, 4096, 32.0, 1.0, 1 + 0.1 * math.log(32), truncate=True)
    lo, hi = hf.ramp_range(64, 150000.0)
    assert (round(lo, 2), round(hi, 2)) == (8.09, 17.4) and gg.ramp_range(64, 150000.0) == (8, 18)
    a, b = hf.inv_freq(64, 150000.0), gg.inv_freq(64, 150000.0)
    assert list(np.nonzero(np.abs(a / b - 1) > 1e-12)[0]) == list(range(9, 18))
    assert round(float(np.max(np.abs(b / a - 1))), 2) == 0.76
    for pos, rad in ((1000, 0.22), (4096, 0.90), (131072, 28.93)):
        assert round(float(np.max(np.abs(a - b)) * pos), 2) == rad


def test_config_layers_and_yarn(tmp_path):
    from moert import gguf, models
    from moert.testing import write_tiny

    with gguf.open(write_tiny(tmp_path / "g.gguf", "gpt-oss")) as g:
        _, c = models.read(g)
    assert [c.is_swa(i) for i in range(c.n_layer)] == [True, False, True]
    assert c.yarn().truncate is False and c.yarn().mscale == pytest.approx(1 + 0.1 * math.log(8))
    assert isinstance(c, gptoss.Config)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_zoo_twins_plan_with_the_architecture(name, tmp_path):
    """The zoo's gpt-oss twins (headers of the real files) pass the architecture's key and tensor checks."""
    from moert import gguf, models, zoo

    path = zoo.path(name, folder=tmp_path)
    with gguf.open(path) as g:
        arch, c = models.read(g)
    assert arch is gptoss and c.n_expert in (32, 128) and c.sliding_window == 128 and c.yarn().factor == 32.0


@pytest.mark.parametrize("rules", [
    [(r"_exps", 0, range(2)), (r"_exps", None, None)],                  # half the experts (and their biases) on sim
    [(r"ffn_(gate|up)_exps", 0, None), (r"_exps", None, None)],         # gate/up on sim, down on the CPU
    [(r"_exps\.weight", 0, [1, 3]), (r"_exps", None, None)],            # weights of 1, 3 on sim, their biases not
])
def test_expert_granular_placement(rules, tmp_path, one_numba_thread):
    """gpt-oss's experts with their bias rows, wherever the rules put them: the CPU-only logits."""
    import warnings

    import moert
    from moert import TensorOverride as T
    from moert.testing import write_tiny

    path = write_tiny(tmp_path / "g.gguf", "gpt-oss", seed=5)
    overrides = [T.cpu(p) if dev is None else T.gpu(p, dev, experts=ex) for p, dev, ex in rules]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = moert.load(path, gpu_layers=0, context_size=32, warmup=False, progress=False)
        m = moert.load(path, gpu_backend="sim", overrides=overrides, context_size=32, warmup=False, progress=False)
    tokens = [3, 14, 15, 92, 65, 35]
    want, got = ref.forward(tokens), m.forward(tokens)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    assert np.abs(m.forward([7]) - ref.forward([7])).max() <= 1e-4 * np.abs(want).max()


def test_flash_attention_and_typed_caches(tmp_path, one_numba_thread):
    """-fa on (the sinks in the online softmax) equals the standard attention; an f16 cache (flash on by
    default; TINY's head size 16 is too small for q8_0) stays close, with the same top-1 nearly everywhere."""
    import warnings

    import moert
    from moert.testing import write_tiny

    path = write_tiny(tmp_path / "g.gguf", "gpt-oss", seed=9)
    tokens = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 4, 6]

    def run(**kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = moert.load(path, gpu_layers=0, context_size=32, warmup=False, progress=False, **kw)
        return np.concatenate([m.forward(tokens[:8])] + [m.forward([t]) for t in tokens[8:]])

    want = run(cache_type_k="f32", cache_type_v="f32")
    fa = run(flash_attn="on", cache_type_k="f32", cache_type_v="f32")
    assert np.linalg.norm(fa - want) / np.linalg.norm(want) < 1e-5
    f16 = run()                                                       # the default cache type
    assert 0 < np.linalg.norm(f16 - want) / np.linalg.norm(want) < 1e-3
    assert (f16.argmax(-1) == want.argmax(-1)).mean() >= 0.9


def test_explain_shows_the_routing_gpt_oss_computes(tmp_path):
    """moert explain: the router bias included, softmax over the chosen k (0 elsewhere), the chosen experts and
    their weights equal to what the forward pass used."""
    import warnings

    import moert
    from moert.testing import write_tiny

    path = write_tiny(tmp_path / "g.gguf", "gpt-oss", seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = moert.load(path, gpu_layers=0, context_size=32, warmup=False, progress=False)
    from moert.explain import explain

    t = explain(m, [3, 14, 15, 92])
    for lt in t.layers:
        p = np.asarray(lt.probs)
        assert "bias" in lt.router and np.count_nonzero(p) == 2 and abs(p.sum() - 1) < 1e-6
        assert sorted(np.flatnonzero(p)) == sorted(lt.experts)
        np.testing.assert_allclose([p[e] for e in lt.experts], lt.weights, rtol=1e-5)
