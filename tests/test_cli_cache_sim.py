"""`moert cache-sim`: the table, --json and bad flags (the numbers are the replay's, tested in test_dynamic.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moert.cli.main import main
from moert.trace import Trace


@pytest.fixture
def trace_file(tmp_path):
    ids = np.array([0, 0, 0, 1, 2, 1, 2, 0], np.int32)[:, None, None]        # tests/test_dynamic.py's SEQ
    t = Trace(5, np.arange(8), np.zeros(8, bool), ids, np.ones(ids.shape, np.float32), None, {"model": "x"})
    return str(t.save(tmp_path / "t.npz"))


def test_json(trace_file, capsys):
    assert main(["cache-sim", trace_file, "--slots", "1,2", "--policy", "lru,belady", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = {(r["policy"], r["slots"]): r["hits"] for r in d["results"]}
    # by hand: one slot, LRU hits the two repeats of 0; two slots LRU 4, Belady 4 (test_dynamic.py)
    assert got == {("lru", 1): [2], ("lru", 2): [4], ("belady", 1): [3], ("belady", 2): [4]}
    assert d["requests"] == 8 and d["per_layer"] is True


def test_table(trace_file, capsys):
    assert main(["cache-sim", trace_file, "--slots", "2", "--policy", "lru"]) == 0
    out = capsys.readouterr().out
    assert "lru" in out and "50.0%" in out                              # 4 hits of 8


@pytest.mark.parametrize("flags, what", [(["--slots", "a,b"], "whole numbers"), (["--slots", "-1"], ">= 0"),
                                         (["--policy", "fifo"], "lru,lfu")])
def test_bad_flags(trace_file, capsys, flags, what):
    assert main(["cache-sim", trace_file, *flags]) == 2
    assert what in capsys.readouterr().err


def test_compare_adds_cache_rows(tmp_path, capsys):
    from pathlib import Path

    import moert

    demo = str(Path(moert.__file__).parent / "data" / "demo-qwen3moe.gguf")
    m = moert.load(demo, cpu_moe=True, gpu_backend="sim", context_size=64, warmup=False, trace=True)
    m.generate("def main(", 12, seed=0)
    path = str(m.trace.save(tmp_path / "run.npz"))
    m.close()
    argv = ["compare", demo, "--hardware", "rtx3090+ryzen-7950x", "-c", "256", "--trace", path]
    assert main([*argv, "--cache-slots", "2,4", "--cache-policy", "lru,static", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    cache = [r for r in rows if r["strategy"].startswith("cache ")]
    assert [r["strategy"].split(" (")[0] for r in cache] == ["cache lru, 2/layer", "cache lru, 4/layer",
                                                            "cache static, 2/layer", "cache static, 4/layer"]
    assert all(r["tg"] > 0 and 0 <= r["gpu_share"] <= 1 and not r["best"] for r in cache)
    assert any("(trace)" in r["strategy"] for r in rows)                 # --trace adds the hot-experts row
    cpu_moe = next(r for r in rows if r["flags"] == ["--cpu-moe"])
    assert all(r["ram_gib"] == cpu_moe["ram_gib"] and r["flags"] == ["--cpu-moe"] for r in cache)
    assert main([*argv[:-2], "--cache-slots", "2"]) == 2
    assert "--trace" in capsys.readouterr().err


def test_run_with_an_expert_cache(capsys):
    from pathlib import Path

    import moert

    demo = str(Path(moert.__file__).parent / "data" / "demo-qwen3moe.gguf")
    argv = ["run", demo, "-p", "def main(", "-n", "8", "--temp", "0", "--gpu-backend", "sim", "--cpu-moe",
            "--no-warmup", "--json", "--cache-slots", "4", "--prefetch", "next-router"]
    assert main(argv) == 0
    cache = json.loads(capsys.readouterr().out)["stats"]["cache"]
    assert sum(cache["hits"]) + sum(cache["misses"]) > 0 and cache["weight_bytes"] > 0
    assert cache["recall"][0] is None and all(0 <= r <= 1 for r in cache["recall"][1:])
    assert main(["run", demo, "-p", "x", "-n", "1", "-ngl", "0", "--no-warmup", "--cache-slots", "4"]) == 1
    assert "--gpu-backend sim" in capsys.readouterr().err


def test_prefetch_replays_the_recorded_guesses(tmp_path, capsys):
    import moert
    from moert.dynamic import ExpertCache, replay
    from moert.testing import write_tiny

    path = write_tiny(tmp_path / "q.gguf", "qwen3moe", seed=3)
    cache = ExpertCache("sim:0", 2, "lfu", prefetch="next-router")
    m = moert.load(path, cpu_moe=True, gpu_backend="sim", context_size=64, warmup=False, expert_cache=cache,
                   trace=True)
    m.forward(np.array([5, 9, 2, 33]))
    for t in (3, 5, 7, 9, 11):
        m.forward(np.array([t]))
    hits, saved = m.stats.cache.hits.tolist(), str(m.trace.save(tmp_path / "run.npz"))
    m.close()
    assert main(["cache-sim", saved, "--slots", "2,4", "--policy", "lfu,belady", "--prefetch", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    got = {(r["policy"], r["slots"], r["prefetch"]): r["hits"] for r in d["results"]}
    assert got[("lfu", 2, "next-router")] == hits                        # the run's own counts
    plain = replay(moert.Trace.load(saved), ExpertCache("sim:0", 4, "belady"))
    assert got[("belady", 4, None)] == plain.hits.tolist() and d["prefetch"] == "next-router"
    assert main(["cache-sim", saved, "--slots", "2", "--prefetch"]) == 0
    assert "without prefetch" in capsys.readouterr().out
    t = moert.Trace.load(saved)
    t.prefetch = None
    bare = str(t.save(tmp_path / "bare.npz"))
    assert main(["cache-sim", bare, "--prefetch"]) == 2
    assert "--prefetch next-router" in capsys.readouterr().err
