"""Plots: the expert-selection heatmap, the placement bars and the speed bars are written as PNG files."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("matplotlib")  # the `plot` extra; part of `dev`, so CI always runs these

from moert.placement import plan  # noqa: E402
from moert.plots import expert_heatmap, placement_bars, speed_bars  # noqa: E402
from moert.testing import write_qwen3moe  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def test_expert_heatmap(tmp_path):
    counts = np.random.default_rng(0).integers(0, 50, (6, 32))
    out = expert_heatmap(counts, tmp_path / "e.png")
    assert out.read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="n_layer, n_expert"):
        expert_heatmap(np.zeros(5), tmp_path / "bad.png")


def test_placement_bars(tmp_path):
    m = write_qwen3moe(tmp_path / "m.gguf", n_layer=2)
    p = plan(m, [r"blk\.0\.ffn_up_exps=CPU"], cpu_moe=True, gpu_backend="sim")
    assert placement_bars(p, tmp_path / "p.png").read_bytes()[:8] == PNG


def test_speed_bars(tmp_path):
    speeds = {"moert": {"pp64": 72.0, "decode": 35.0}, "moert int8": {"pp64": 119.0, "decode": 71.8},
              "llama.cpp": {"pp64": 257.4, "decode": 87.6}}
    out = speed_bars(speeds, tmp_path / "s.png", title="e2e", baseline="llama.cpp")
    assert out.read_bytes()[:8] == PNG
    with pytest.raises(ValueError, match="at least one engine"):
        speed_bars({}, tmp_path / "bad.png")
