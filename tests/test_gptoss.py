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
