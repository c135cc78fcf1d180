"""bench/gpu_check.py --dry: every stage of the GPU lease's one command, end to end at tiny sizes on the sim GPU (no
CuPy), in a few seconds; a stage that cannot fit the time left is skipped and says so; the carried gguf wheel is
small and is gguf-py."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
from bench_scripts import BENCH, bench_module


def _gpu_check():
    return bench_module("gpu_check")


def test_dry_runs_every_stage_and_prints_one_table(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--dry", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert res["dry"] and set(res) >= {"tests", "kernels", "attention", "graph", "e2e", "peer"}
    assert " passed" in res["tests"]["summary"] and res["tests"]["rc"] == 0, res["tests"]
    k = res["kernels"]
    assert k.get("status") == "not built" or (k["copy_gbs"] > 0 and k["types"] and all(
        v["rel_err"] < 1e-5 for by in k["types"].values() for v in by.values())), k
    a = res["attention"]                   # f16 and q8_0 caches: a decode token, then a prompt (f16 operands: ~1e-3)
    assert a.get("status") == "not built" or [(v["kv"], v["what"]) for v in a["rows"]] == [
        ("f16", "T=1 @40"), ("f16", "prompt 12"), ("q8_0", "T=1 @40"), ("q8_0", "prompt 12")], a
    assert "rows" not in a or all(v["rel_err"] < (1e-5 if v["tflops"] is None else 3e-3) for v in a["rows"]), a
    g = res["graph"]["archs"]
    assert list(g) == ["qwen3moe", "gpt-oss"] and all(v["captured"] == "yes" and v["diff"] < 1e-3 for v in g.values())
    runs = res["e2e"]["runs"]
    assert list(runs) == ["-ngl 0 (no GPU)", "-cmoe", "-cmoe --offload-min-batch 0", "all GPU"], res["e2e"]
    assert all(v["pp"] > 0 and v["tg"] > 0 and v["n_prompt"] == 40 for v in runs.values())
    assert runs["-cmoe"]["offload_bytes"] > 0 == runs["-cmoe --offload-min-batch 0"]["offload_bytes"]
    for name in ("all GPU", "-cmoe"):              # tg again, the decode step captured on the sim (-cmoe: segments)
        graph = runs[name]["graph"]
        assert graph["captured"] == "yes" and graph["tg"] > 0, (name, runs)
    assert runs["-cmoe --offload-min-batch 0"]["graph"] is None, runs
    peer = res["peer"]
    assert peer.get("status") == "skipped" and "pip install transformers" in peer["why"] or peer["pp"] > 0, peer
    lines = r.stdout.splitlines()
    assert lines[0].startswith("gpu_check --dry: ") and sum(ln.startswith("e2e ") for ln in lines) == 8
    assert sum(ln.startswith("graph ") and "captured: yes" in ln for ln in lines) == 2
    assert sum(ln.startswith("attention ") for ln in lines) == (1 if "status" in a else 5)
    assert any(ln.startswith("e2e ") and "all GPU, decode as a CUDA graph" in ln for ln in lines)
    assert any(ln.startswith("e2e ") and "-cmoe, decode as a CUDA graph" in ln for ln in lines)


def test_the_stages_limits_fit_the_budget():
    gc = _gpu_check()
    assert list(gc.STAGES) == list(gc.MIN_S) and sum(gc.STAGES.values()) <= gc.BUDGET_S <= 8 * 60 - 40


def test_a_stage_that_cannot_fit_is_skipped_saying_why(tmp_path):
    gc = _gpu_check()
    r = gc.child("e2e", True, 5.0, tmp_path)
    assert r == {"status": "skipped", "why": "5 s left, the stage needs at least 40 s"}
    res = {"setup": [], "tests": r, "kernels": r, "attention": r, "graph": r, "e2e": r, "peer": {
           "timed_out": "stopped after 80 s", "pp": 1.0, "tg": 2.0, "n_prompt": 16, "n_gen": 4, "layers": 2,
           "transformers": "5.0", "torch": "2.11"}}
    rows = gc.rows(res)
    assert ("e2e", "skipped", "5 s left, the stage needs at least 40 s") in rows
    assert ("peer", "timed out: what it measured so far", "stopped after 80 s") in rows


def test_the_carried_gguf_wheel_is_small_and_is_gguf_py():
    (wheel,) = sorted((BENCH / "wheels").glob("gguf-*-py3-none-any.whl"))
    assert wheel.stat().st_size < 1 << 20
    with zipfile.ZipFile(wheel) as z:
        assert "gguf/__init__.py" in z.namelist() and "gguf/gguf_writer.py" in z.namelist()


def test_a_run_shrinks_to_the_time_it_has():
    """From a 4-layer probe (pp 1 s, tg8 1 s, load 1 s): two repetitions of tg128, else one, else tg32, else tg8."""
    fit = _gpu_check()._fit_run
    p = {"pp_s": 1.0, "tg_s": 1.0, "n_gen": 8, "load_s": 1.0}
    assert [fit(p, 1.0, left, 128, 2) for left in (35, 18, 6, 3, 2.9)] == [(128, 2), (128, 1), (32, 1), (8, 1), None]
    assert fit(p, 2.0, 6, 128, 2) == (8, 1)                 # twice the bytes: twice the time


def test_tests_that_run_out_of_time_say_how_far_they_got(monkeypatch):
    import subprocess

    gc = _gpu_check()

    def slow(*args, timeout=None, env=None):
        raise subprocess.TimeoutExpired(args, timeout, output=b"..F.s [ 10%]\n.E..\n")

    monkeypatch.setattr(gc, "python", slow)
    r = gc.stage_tests(False, 3.0)
    assert r["summary"] == "timed out after 3 s: 6 passed, 1 failed, 1 errors so far" and r["rc"] == "timeout"


@pytest.mark.filterwarnings("ignore::moert.errors.ContextWarning")   # a context of 1024 on a tiny model
def test_a_graph_that_fails_keeps_the_eager_numbers(tmp_path, monkeypatch):
    """The all-GPU run's tg as a graph raising (it has not run on a GPU yet): pp and tg eager stay, the row says how."""
    import moert.graphs.decode
    from moert.testing import write_tiny

    def broken(m):
        raise RuntimeError("cudaErrorStreamCaptureUnsupported")

    monkeypatch.setattr(moert.graphs.decode, "DecodeGraph", broken)
    gc = _gpu_check()
    v = gc._bench(write_tiny(tmp_path / "tiny.gguf", "qwen3moe"), {}, True, 8, 2, 1, graph=True)
    assert v["pp"] > 0 and v["tg"] > 0 and v["graph"] == {
        "tg": None, "captured": "failed: RuntimeError: cudaErrorStreamCaptureUnsupported"}
    (row,) = [r for r in gc.rows({"setup": [], **{s: {"status": "skipped"} for s in gc.STAGES},
                                  "e2e": {"model": "m", "write_gbs": 1.0, "runs": {"all GPU": v}}})
              if "CUDA graph" in r[1]]
    assert row == ("e2e", "all GPU, decode as a CUDA graph", "failed: RuntimeError: cudaErrorStreamCaptureUnsupported")


def test_a_stage_that_crashes_keeps_what_it_saved(tmp_path, monkeypatch):
    """A stage whose process dies (a CUDA error is sticky) after saving rows: the rows stay, with the error's end."""
    gc = _gpu_check()
    saved = {"heads": "32/4 of 128", "copy_gbs": 4000.0, "rows": [
        {"kv": "f16", "what": "T=1 @4096", "us": 10.0, "gbs": 1000.0, "tflops": None, "rel_err": 1e-7},
        {"kv": "q8_0", "what": "", "failed": "CUDAError: an illegal memory access was encountered"}]}

    def crashes(*args, timeout=None, env=None):
        (tmp_path / "attention.json").write_text(json.dumps(saved))
        return subprocess.CompletedProcess(args, 1, "", "Traceback ...\ncupy_backends.CUDARuntimeError: illegal")

    monkeypatch.setattr(gc, "python", crashes)
    r = gc.child("attention", False, 100.0, tmp_path)
    assert r["crashed"].endswith("CUDARuntimeError: illegal") and r["rows"] == saved["rows"]
    rows = gc.rows({"setup": [], **{s: {"status": "skipped"} for s in gc.STAGES}, "attention": r,
                    "graph": {"archs": {"qwen3moe": "skipped: 3 s left, the last took 30 s"}}})
    assert ("attention", "f16 cache, T=1 @4096", "1000 GB/s (25% of a copy), 10 us, rel err 1.0e-07") in rows
    assert ("attention", "q8_0 cache", "CUDAError: an illegal memory access was encountered") in rows
    assert ("graph", "decode graph, tiny qwen3moe", "skipped: 3 s left, the last took 30 s") in rows
    assert rows[3][:2] == ("attention", "failed: what it measured before"), rows
