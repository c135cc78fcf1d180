"""Where the cost model was checked (moert/cost/coverage.py): a prediction outside the published figures' classes
says so and widens its range; compare prints why; placements on one box tie by the same-box ratio spread."""

from __future__ import annotations

import json
import math

import pytest
from bench_scripts import bench_module

import moert
from moert import cost
from moert.cost import coverage
from moert.cost.range import VALIDATION, choose


def _validator():
    return bench_module("validate_published")


@pytest.mark.parametrize("name, family", [("Q4_K_M", "k-quant"), ("UD-Q4_K_XL", "k-quant"), ("IQ4_XS", "i-quant"),
                                          ("MXFP4 experts (the F16 file)", "mxfp4"), ("Q8_0", "legacy"),
                                          ("Q4_0", "legacy"), ("BF16", "float"), ("F16", "float"), ("?", "other")])
def test_quant_families(name, family):
    assert coverage.quant_family(name) == family


def test_depth_classes_and_which_axes_a_kind_of_run_is_asked():
    assert [coverage.depth_class(d) for d in (0, 4095, 4096, 32768, 32769)] == ["<4k", "<4k", "4k-32k", "4k-32k",
                                                                                ">32k"]
    hw = cost.preset("rtx4090+2x epyc-9374f")
    c = coverage.classes(hw, 40000, "Q4_K", "ik_llama.cpp", "hybrid")
    assert c == {"cpu": "amd zen4", "isa": "avx512-vnni", "sockets": "2-socket", "gpu": "consumer cuda",
                 "depth": ">32k", "quant": "k-quant", "engine": "ik_llama.cpp", "kind": "hybrid"}
    assert coverage.classes(hw, kind_="all-GPU")["sockets"] is None       # the CPU is not asked of an all-GPU run
    assert coverage.classes(hw, kind_="cpu-only")["gpu"] == "none"
    cov = {"sockets": {"1-socket": 40, "2-socket": 2}, "kind": {"decode, hybrid": 12, "prefill, hybrid": 3}}
    assert coverage.reasons(c, cov) == ["no figure from amd zen4 CPUs", "no figure from CPUs whose int8 path is "
                                        "avx512-vnni", "2 figures from 2-socket boxes", "no figure from consumer cuda "
                                        "GPUs", "no figure at depth >32k", "no figure of k-quant weights",
                                        "no figure from ik_llama.cpp", "3 figures of prefill, hybrid"]


def test_a_two_socket_cpu_only_prediction_extrapolates_and_its_range_widens_by_the_held_out_spread():
    hw = cost.preset("2x epyc-9374f")
    p = moert.plan(moert.zoo.path("qwen3-30b-a3b"), gpu_layers=0)
    r = moert.predict(p, hw, n_prompt=512, n_gen=32, depth=40000)
    cov = VALIDATION["coverage"]
    assert cov["sockets"].get("2-socket", 0) < coverage.MIN_FIGURES      # what the reasons below rest on
    assert f"{'no figure' if not cov['sockets'].get('2-socket') else cov['sockets']['2-socket']}" in \
        " ".join(r.extrapolating)
    assert any("2-socket boxes" in x for x in r.extrapolating) and any("depth >32k" in x for x in r.extrapolating)
    assert r.to_dict()["extrapolating"] == r.extrapolating and "extrapolating: " in r.table()
    for phase, tok_s in (("decode", r.decode_tok_s), ("prefill", r.prefill_tok_s)):
        k = len(r.extrapolating_in((phase,)))
        s = VALIDATION["classes"][f"{phase}, cpu-only"]["spread68"]
        h = VALIDATION["held_out"]["spread68"]
        lo, hi = r.likely(phase)
        assert k >= 2 and math.log(hi / tok_s) == pytest.approx(math.sqrt(s * s + k * h * h))
        assert math.log(tok_s / lo) > s
    # a box the published figures cover well says nothing and keeps its class's range
    hw = cost.preset("rtx3090+ryzen-7950x")
    p = moert.plan(moert.zoo.path("gpt-oss-20b"), cpu_moe=True, gpu_backend="sim", gpu_memory=hw.gpu_memory())
    r = moert.predict(p, hw)
    assert r.extrapolating == []
    assert math.log(r.likely("decode")[1] / r.decode_tok_s) == pytest.approx(
        VALIDATION["classes"]["decode, hybrid"]["spread68"])


def test_compare_prints_the_reasons_under_its_table_and_json_carries_them(capsys):
    from moert.cli.main import main

    assert main(["compare", "zoo:qwen3-30b-a3b", "--hardware", "2x epyc-9374f", "--depth", "40000", "-c",
                 "48000"]) == 0
    out = capsys.readouterr().out
    assert "extrapolating (fewer than 10 published figures" in out
    assert out.index("extrapolating (") > out.index("everything on the CPU")
    assert main(["compare", "zoo:qwen3-30b-a3b", "--hardware", "2x epyc-9374f", "--depth", "40000", "-c", "48000",
                 "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert any("2-socket boxes" in x for x in j["extrapolating"])
    assert all(x in j["extrapolating"] for r in j["rows"] for x in r["extrapolating"])


def test_the_validator_reports_error_per_class_and_counts_coverage(tmp_path):
    v = _validator()
    out = tmp_path / "v.json"
    ids = ["ik841-gptoss20b-4080-7950x", "reddit-qwen3-30b-epyc9b14-cpu"]
    assert v.main(["--only", ",".join(ids), "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert set(res["by_class"]) == set(coverage.AXES)
    # the EPYC 9B14 (Zen 4) runs CPU-only, the 4080 box (Ryzen 7950X, Zen 4) hybrid: both figures of each are Zen 4
    assert res["coverage"]["cpu"] == {"amd zen4": 4}
    assert res["coverage"]["gpu"] == {"consumer cuda": 2, "none": 2}
    assert res["coverage"]["kind"] == {"prefill, hybrid": 1, "decode, hybrid": 1, "prefill, cpu-only": 1,
                                       "decode, cpu-only": 1}
    assert "by coverage class" in v.table(res)


def test_ties_are_decided_by_the_same_box_ratio_spread_and_every_published_pair_picks_the_faster():
    v = _validator()
    from published_cv import ratio_pairs

    entries = [e for e in v.load() if e.get("pair") and e["use"] != "excluded"]
    rows = []
    for e in entries:
        p = v.predict(e)
        rows.append({"id": e["id"], "use": e["use"], "pair": e["pair"], "placement": e["placement"],
                     "test": e["test"], "held_out": bool(e.get("collected")),
                     **{m: {"measured": e.get(f"{m}_tok_s"), "predicted": p[m]} for m in ("prompt", "gen")}})
    pairs = ratio_pairs(rows)
    assert len([x for x in pairs if not x["held_out"]]) == VALIDATION["pairs"]
    by_id = {r["id"]: r for r in rows}
    for x in pairs:
        a, b = by_id[x["a"]], by_id[x["b"]]
        cands = [{"strategy": r["id"], "fits": True, "tg": r[x["metric"]]["predicted"], "flags": []} for r in (a, b)]
        pick = by_id[choose(cands, "tg")["strategy"]]
        best = max(a[x["metric"]]["measured"], b[x["metric"]]["measured"])
        assert pick[x["metric"]]["measured"] >= 0.95 * best, x
    # two rows tie only within the ratio spread, not within each prediction's own likely range
    s = VALIDATION["ratio_spread68"]
    rows = [{"strategy": "a", "fits": True, "tg": 10.0, "flags": ["--cpu-moe"]},
            {"strategy": "b", "fits": True, "tg": 10.0 * math.exp(1.5 * s), "flags": ["--n-cpu-moe", "33"]}]
    assert choose(rows, "tg")["strategy"] == "b" and not rows[0]["tied"]
    rows[1]["tg"] = 10.0 * math.exp(0.5 * s)
    assert choose(rows, "tg")["strategy"] == "a" and rows[1]["tied"]


def test_compare_recommends_filling_the_gpu_of_an_rtx4060_box():
    from moert.cli.compare import compare

    hw = cost.preset("rtx4060+ryzen-7600")
    rows = compare(str(moert.zoo.path("qwen3-30b-a3b")), hw, 4096)
    best = next(r for r in rows if r["best"])
    cpu_moe = next(r for r in rows if r["strategy"] == "all experts on the CPU")
    assert best is not cpu_moe and best["gpu_share"] > 0.25 and best["tg"] > 1.1 * cpu_moe["tg"]
