"""bench/published_residuals.py: the residual table of CPU figures says what the model assumed and what was measured."""

from __future__ import annotations

import pytest
from bench_scripts import bench_module


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOERT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_a_cpu_only_figures_row_splits_its_predicted_time_and_reads_the_measured_gemm_rate():
    res = bench_module("published_residuals")
    (e,) = [e for e in res.vp.load() if e["id"] == "reddit-qwen3-30b-epyc9b14-cpu"]     # a training figure
    rows = {r["metric"]: r for r in res.rows([e], {}, show_held_out=False)}
    pp, tg = rows["prompt"], rows["gen"]
    assert (pp["measured"], tg["measured"]) == (e["prompt_tok_s"], e["gen_tok_s"])
    assert pp["ratio"] == pytest.approx(pp["predicted"] / pp["measured"]) and (pp["threads"], pp["cores"]) == (44, 96)
    assert sum(pp["shares"].values()) == pytest.approx(1.0) and pp["shares"]["gpu"] == 0.0
    assert pp["tokens_per_expert"] == 512 * 8 / 128 and tg["tokens_per_expert"] is None
    # the measured MACs a clock against the modelled: the model's own time of those matmuls over what the measured
    # time leaves once the model's time for everything else is taken out
    meas, model = pp["mac"]
    pred_s, meas_s, w = 512 / pp["predicted"], 512 / pp["measured"], pp["shares"]["cpu w"]
    assert meas / model == pytest.approx(pred_s * w / (meas_s - pred_s * (1 - w)), rel=1e-6)
    held = [x for x in res.vp.load() if x.get("collected")][:1]
    assert res.rows(held, {}, show_held_out=False) == []                # frozen figures only with --held-out
