"""bench/e2e_full.py, the full-size comparison that runs each engine in a process of its own: its rounds, kept
rounds and table, on a tiny model (`--model`) and moert alone (llama.cpp is a reference, not a dependency)."""

from __future__ import annotations

import importlib.util
import json

from bench_scripts import bench_module

from moert.testing import write_qwen3moe


def test_a_round_runs_moert_in_its_own_process_and_keeps_its_second_round(tmp_path, monkeypatch, capsys):
    path = write_qwen3moe(tmp_path / "tiny.gguf", n_vocab=64)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp"
                        else find_spec(name, *a))
    out = bench_module("e2e_full").main(["--model", str(path), "--rounds", "1", "--prompt", "8", "--decode", "2",
                                         "--act-quant", "int16", "-t", "1", "--json", str(tmp_path / "o.json")])
    text = capsys.readouterr().out
    assert "llama-cpp-python is not installed: moert only" in text
    assert set(out["engines"]) == {"moert int16"}
    e = out["engines"]["moert int16"]                       # the process's second round, kept
    assert len(e["pp_tok_s"]) == 1 and all(v > 0 for v in e["pp_tok_s"] + e["tg_tok_s"])
    assert "| moert int16 |" in text and "ratio" not in e
    assert json.loads((tmp_path / "o.json").read_text())["engines"]["moert int16"]["tg_tok_s"] == e["tg_tok_s"]
