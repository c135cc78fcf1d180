"""bench/published.json (public llama.cpp / ik_llama.cpp figures) is well-formed, and its validator runs."""

from __future__ import annotations

import json

import pytest
from bench_scripts import BENCH, bench_module

from moert import cost
from moert.cost import zoo


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOERT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def _validator():
    return bench_module("validate_published")


def _entries() -> list[dict]:
    with open(BENCH / "published.json") as f:
        return json.load(f)["entries"]


def test_every_entry_has_a_source_a_quote_and_parts_moert_knows():
    entries = _entries()
    assert len(entries) >= 8 and len({e["id"] for e in entries}) == len(entries)
    for e in entries:
        assert e["source"].startswith("http") and len(e["quote"]) > 20, e["id"]
        assert e["engine"] in ("llama.cpp", "ik_llama.cpp") and e["use"] in ("error", "ranking", "excluded")
        assert e["model"] in zoo.names(), e["id"]
        assert e.get("prompt_tok_s") or e.get("gen_tok_s"), e["id"]
        h = e["hardware"]
        cpu = h.get("cpu") or h["stand_in_cpu"]
        if e["placement"].get("cpu_only"):                    # a CPU-only run names no GPU and needs none
            assert not h.get("gpu") and not h.get("stand_in_gpu"), e["id"]
            cost.preset(cpu)
        else:
            cost.preset(f"{h.get('gpu') or h['stand_in_gpu']}+{cpu}")
        if e["use"] == "excluded":
            assert e["why"]
        for figure in ("prompt_tok_s", "gen_tok_s"):           # every figure is written in its quote
            if e.get(figure):
                assert f"{e[figure]}" in e["quote"].replace(",", ""), (e["id"], figure)
    assert sum(e["use"] == "error" for e in entries) >= 5
    assert any(len([x for x in entries if x.get("pair") == e.get("pair")]) > 1 for e in entries if e.get("pair"))


def test_the_validator_predicts_one_entry(tmp_path):
    validate_published = _validator()
    out = tmp_path / "v.json"
    assert validate_published.main(["--only", "ik841-gptoss20b-4080-7950x", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["gen"]["measured"] == 34.01 and row["gen"]["predicted"] > 0 and row["prompt"]["predicted"] > 0
    assert row["term"]["gen"].startswith("cpu experts")             # decode bound by the experts in RAM
    (c,) = [c for c in res["classes"] if c["class"] == "all"]
    assert c["n"] == 2                       # one source: left out, nothing is fitted, so the shipped shares predict it
    assert abs(row["gen"]["out_of_sample"] - row["gen"]["error"]) < 1e-9


def test_the_validator_predicts_a_cpu_only_entry_with_its_threads(tmp_path):
    validate_published = _validator()
    (e,) = [x for x in _entries() if x["id"] == "reddit-qwen3-30b-epyc9b14-cpu"]
    assert validate_published.machine(e).gpus == ()
    used = validate_published.predict(e)["gen"]                # the 44 threads it used
    few = validate_published.predict({**e, "test": {**e["test"], "threads": 8}})["gen"]
    every = validate_published.predict({**e, "test": {**e["test"], "threads": 96}})["gen"]
    # 8 threads keep 1 of its 12 CCD links busy; 44 already keep 6, and 6 links (384 GB/s) out-read the DRAM's share
    assert 0 < few < used and abs(every / used - 1) < 0.01


def test_ranking_counts_only_placement_changes_with_the_same_test_and_scores_a_tie_as_no_call():
    v = _validator()

    def row(i, measured, predicted, placement, ub=512):
        return {"id": i, "use": "error", "pair": "box", "placement": placement, "test": {"n_ubatch": ub},
                "gen": {"measured": None, "predicted": None}, "prompt": {"measured": measured, "predicted": predicted}}
    (tie,) = v.placement_pairs([row("a", 100.0, 50.0, {"cpu_moe": True}), row("b", 200.0, 50.0, {})], 0.05)
    assert not tie["right"]
    (ok,) = v.placement_pairs([row("a", 100.0, 50.0, {"cpu_moe": True}), row("b", 200.0, 90.0, {})], 0.05)
    assert ok["right"] and ok["gain"] == 2.0 and ok["predicted_gain"] == 1.8 and ok["gain_ok"]
    assert v.placement_pairs([row("a", 100.0, 50.0, {}), row("b", 200.0, 90.0, {}, ub=2048)], 0.05) == []
    assert v.placement_pairs([row("a", 100.0, 50.0, {}), row("b", 200.0, 90.0, {"n_cpu_moe": 3}, ub=2048)], 0.05) == []
    kinds = {e["id"]: v.kind(e) for e in _entries()}
    assert kinds["reddit-qwen3-30b-epyc9b14-cpu"] == "cpu-only"
    assert kinds["ik758-gptoss20b-4080-allgpu-llamacpp"] == "all-GPU"
    assert kinds["ik841-gptoss20b-4080-7950x"] == "hybrid"


def test_cross_validation_leaves_each_source_out_and_never_fits_held_out_entries():
    _validator()                                            # puts bench/ on the path for published_cv
    from published_cv import CrossValidation, source

    calls = []

    def fake(e, **f):                       # tok/s proportional to the entry's factor: the fit finds 1 / bias
        calls.append((e["id"], tuple(sorted(f.items()))))
        k = "cpu_bw" if e["placement"].get("cpu_only") else "gpu_bw"
        return {"prompt": None, "gen": e["bias"] * e["gen_tok_s"] * f.get(k, 1.0)}

    def entry(i, src, bias, held=False):
        return {"id": i, "source": src, "use": "error", "placement": {"cpu_only": True}, "test": {},
                "gen_tok_s": 10.0, "bias": bias, **({"collected": "frozen"} if held else {})}
    es = [entry("a", "http://x/1", 2.0), entry("b", "http://x/2", 2.0), entry("c", "http://x/3", 0.5),
          entry("h", "http://x/4", 8.0, held=True)]
    res = CrossValidation(es, fake).run()
    assert res["sources"] == 3 and source(es[0]) == "http://x/1"
    assert 0.25 <= res["factors"]["cpu_bw"] <= 4 and res["factors"]["gpu_bw"] == 1.0
    # leaving "c" out, the others (both 2x too fast) fit a factor of 0.5: c is then 4x too slow
    assert abs(res["rows"]["c"]["out_of_sample"]["gen"] - __import__("math").log(0.25)) < 0.05
    assert "out_of_sample" not in res["rows"]["h"] and "held_out" in res["rows"]["h"]
    assert all(not (i == "h" and f and f != tuple(sorted(res["factors"].items()))) for i, f in calls)


def test_what_compare_says_of_the_models_error_is_what_the_validator_finds(tmp_path):
    from moert.cost.range import VALIDATION, trust

    validate_published = _validator()
    out = tmp_path / "v.json"
    assert validate_published.main(["--json", str(out)]) == 0
    res = json.loads(out.read_text())
    c = {x["class"]: x for x in res["classes"]}
    assert VALIDATION["figures"] == c["all"]["n"] and VALIDATION["sources"] == res["sources"]
    assert VALIDATION["error"] == round(c["all"]["out_of_sample"], 2)
    assert VALIDATION["in_sample_error"] == round(c["all"]["in_sample"], 2)
    assert VALIDATION["worst"] == round(c["all"]["worst"], 2)
    assert (VALIDATION["prefill_error"], VALIDATION["decode_error"]) == (round(c["prefill"]["out_of_sample"], 2),
                                                                         round(c["decode"]["out_of_sample"], 2))
    for name, v in VALIDATION["classes"].items():
        assert (v["n"], v["error"], v["spread68"]) == (c[name]["n"], round(c[name]["out_of_sample"], 2),
                                                       round(c[name]["spread68"], 2)), name
    assert (VALIDATION["ranked"], VALIDATION["ranked_of"]) == (sum(r["right"] for r in res["ranking"]),
                                                               len(res["ranking"]))
    ra = res["ratios"]                                          # same-box placement ratios, training figures
    assert (VALIDATION["pairs"], VALIDATION["ratio_error"], VALIDATION["ratio_spread68"]) == (
        ra["n"], round(ra["error"], 3), round(ra["spread68"], 3))
    assert VALIDATION["coverage"] == res["coverage"]            # training figures per coverage class value
    assert f"off by {round(100 * c['all']['out_of_sample'])}%" in trust()
    all_ = {x["class"]: x for x in validate_published.run(validate_published.load(), show_held_out=True)["classes"]}
    h = VALIDATION["held_out"]                                   # (the predictions are cached: this run is quick)
    assert (h["figures"], h["error"], h["worst"], h["spread68"]) == (
        all_["all"]["n_held_out"], round(all_["all"]["held_out"], 2), round(all_["all"]["held_out_worst"], 2),
        round(all_["all"]["held_out_spread68"], 2))
    assert f"{h['figures']} figures held out of every fit: off by {round(100 * h['error'])}%" in trust()
    held = [r for r in res["rows"] if r["held_out"]]              # frozen entries: no error printed without --held-out
    assert held and all(r[m].get("hidden") for r in held for m in ("prompt", "gen") if r[m]["measured"])


def test_the_census_counts_boxes_by_stated_parts_and_skips_excluded_entries():
    v = _validator()

    def e(source, gpu=None, cpu=None, use="error", gen=1.0, prompt=None):
        return {"source": source, "hardware": {"gpu": gpu, "cpu": cpu}, "use": use, "gen_tok_s": gen,
                "prompt_tok_s": prompt}
    entries = [e("https://a/1", "rtx4080", "ryzen-7950x", prompt=2.0),   # one box, two figures
               e("https://b/2", "rtx4080", "ryzen-7950x"),              # the same stated pair: the same box
               e("https://a/1", "rtx3090"), e("https://c/3", "rtx3090"),  # GPU only, two sources: two boxes
               e("https://d/4", None, "epyc-9b14", use="excluded")]       # not counted at all
    assert v.census(entries) == {"entries": 4, "figures": 5, "boxes": 3, "sources": 3, "held_out_figures": 0}


def test_the_set_holds_at_least_80_figures_from_25_boxes():
    n = _validator().census(_entries())
    assert n["figures"] >= 80 and n["boxes"] >= 25


def test_an_entrys_build_date_reaches_predict_unless_its_file_is_row_interleaved():
    validate_published = _validator()
    dated = [e for e in _entries() if "build" in e]
    assert dated and all(len(e["build"]) == 10 and e["build"][4] == "-" for e in dated)
    assert validate_published.build({"quant": "Q8_0 (unsloth)", "build": "2025-05-20"}) == "2025-05-20"
    assert validate_published.build({"quant": "IQ4_K_R4 (ubergarm)", "build": "2025-05-20"}) == ""   # _R4 in the file
    assert validate_published.build({"quant": "Q4_K_M"}) == ""                                       # undated: today's


def test_the_recommendation_check_scores_compares_pick_against_the_measured_fastest():
    cv = bench_module("published_cv")

    def row(i, placement, measured, predicted, pair="box", held=False):
        return {"id": i, "pair": pair, "use": "error", "placement": placement, "fits": True, "held_out": held,
                "test": {"depth": 0, "threads": 8}, "gen": {"measured": measured, "predicted": predicted}}
    # predicted far apart (beyond any tie): the faster prediction is picked; measured it is 10% slower: wrong
    rows = [row("a", {"cpu_moe": True}, 50.0, 40.0), row("b", {"n_cpu_moe": 20}, 45.0, 80.0)]
    (r,) = cv.recommendations(rows)
    assert (r["recommended"], r["fastest"], r["right"]) == ("b", "a", False) and abs(r["measured_share"] - 0.9) < 1e-9
    # within 5% of the measured fastest counts as right; one placement alone is no choice
    rows[1]["gen"]["measured"] = 48.0
    assert cv.recommendations(rows)[0]["right"]
    assert cv.recommendations([row("c", {"cpu_moe": True}, 50.0, 40.0, pair="other")]) == []
    assert cv.placement_flags({"n_cpu_moe": 3}) == ["--n-cpu-moe", "3"] and cv.placement_flags({"all_gpu": True}) == []
