"""bench/llama_cpu_attention.py's arithmetic: what depth adds to a prompt's and a step's time, over the attention's
FLOPs (2 x tokens x mean positions x H x (Dk + Dv) a layer), per thread and stated clock; depth 0 has no rate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from bench_scripts import bench_module


def test_the_rate_is_the_flops_depth_adds_over_the_time_it_adds(monkeypatch):
    m = bench_module("llama_cpu_attention")
    monkeypatch.setattr(m, "_clock_ghz", lambda: 2.0)
    args = SimpleNamespace(threads=2, prompt=512, decode=16)
    shape = {"layers": 6, "H": 32, "Hkv": 4, "Dk": 128, "Dv": 128}
    res = {"f16": {0: {"pp": [1.0], "tg": [0.1]}, 4096: {"pp": [3.0], "tg": [0.5]}}}
    out = m._table(args, res, [0, 4096], shape, "engine", "file.gguf")
    cell = out["kv"]["f16"][4096]
    pp_flops = 2 * 512 * (4096 + 255.5) * 32 * 256 * 6          # 512 queries at mean position 4096 + 255.5
    assert cell["pp"]["flops_per_core_cycle"] == pytest.approx(pp_flops / 2.0 / (2 * 2.0e9))
    tg_flops = 2 * 16 * (4096 + 7.5) * 32 * 256 * 6
    assert cell["tg"]["flops_per_core_cycle"] == pytest.approx(tg_flops / 0.4 / (2 * 2.0e9))
    assert out["kv"]["f16"][0]["pp"]["flops_per_core_cycle"] is None
    assert "| f16 | 4096 |" in out["table"]


def test_a_sweep_needs_depths_on_its_u_batch_steps():
    m = bench_module("llama_cpu_attention")
    args = SimpleNamespace(model="x.gguf", prompt=512, depth=[0, 1000], threads=2)
    with pytest.raises(SystemExit, match="multiples"):
        m.sweep(args)
