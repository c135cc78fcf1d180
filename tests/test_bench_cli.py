"""`moert bench`: llama-bench's pp/tg table and JSON on a tiny synthetic model, its errors, and bytes_per_token."""

from __future__ import annotations

import json
import re
import statistics

import gguf as gguf_py
import pytest

from moert.bench import bytes_per_token
from moert.cli.main import main
from moert.testing import write_qwen3moe

E, K, V = 4, 2, 256  # experts, experts used, vocabulary of the test model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("bench") / "m.gguf", n_layer=2, n_expert=E, n_expert_used=K,
                          n_vocab=V, context_length=512)


def bench(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def rows(table: str) -> dict[str, list[str]]:
    """The markdown rows under the header: test name -> the other cells."""
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in table.splitlines()
             if ln.startswith("| ") and not set(ln) <= set("|-: ")]
    assert cells[0] == ["test", "t/s", "best t/s", "ms/token", "GB/s"]
    return {c[0]: c[1:] for c in cells[1:]}


def test_table_has_pp_and_tg_rows_with_positive_numbers(model, capsys):
    rc, out, err = bench(capsys, model, "-p", 8, "-n", 4, "-r", 2, "--cpu-moe", "--gpu-backend", "sim")
    assert rc == 0, err
    assert "m.gguf: qwen3moe" in out and "cores" in out
    assert re.search(r"placement: cpu [\d.]+ KiB, sim:0 [\d.]+ KiB; GPUs: sim:0 \(simulated", out)
    r = rows(out)
    assert list(r) == ["pp8", "tg4"]
    for name, (ts, best, ms, gbps) in r.items():
        mean, std = (float(x) for x in ts.split(" ± "))
        assert mean > 0 and std >= 0 and float(best) >= mean and float(ms) > 0
        assert (gbps == "-") == name.startswith("pp")
    assert float(r["tg4"][3]) > 0


def test_json_has_machine_model_settings_and_every_sample(model, capsys):
    rc, out, err = bench(capsys, model, "-p", 6, "-n", 3, "-r", 3, "-ngl", 0, "--json")
    assert rc == 0, err
    d = json.loads(out)
    assert {"cpu", "cores", "threads", "numpy", "numba"} <= set(d["machine"])
    r = gguf_py.GGUFReader(model)
    assert d["model"]["params"] == sum(int(t.n_elements) for t in r.tensors)
    assert d["model"]["size"] == sum(int(t.n_bytes) for t in r.tensors)
    assert d["model"]["architecture"] == "qwen3moe" and d["model"]["n_ctx_train"] == 512
    s = d["settings"]
    assert (s["n_prompt"], s["n_gen"], s["repetitions"], s["context_size"]) == ([6], [3], 3, 6)
    assert s["bytes_by_device"] == {"cpu": d["model"]["size"]}
    pp, tg = d["tests"]
    assert (pp["test"], pp["n_prompt"], pp["n_gen"]) == ("pp6", 6, 0)
    assert (tg["test"], tg["n_gen"], tg["n_depth"]) == ("tg3", 3, 0)
    for t, n in ((pp, 6), (tg, 3)):
        assert len(t["samples_ns"]) == len(t["samples_ts"]) == 3
        assert t["samples_ts"] == pytest.approx([n / (ns / 1e9) for ns in t["samples_ns"]], rel=1e-6)
        assert t["avg_ts"] == pytest.approx(statistics.fmean(t["samples_ts"]))
        assert t["best_ts"] == max(t["samples_ts"])
        assert t["ms_per_token"] == pytest.approx(statistics.fmean(t["samples_ns"]) / 1e6 / n, rel=1e-6)
    assert pp["GBps"] is None
    assert tg["bytes_per_token"] == bytes_per_token(model)["decode"]
    assert tg["GBps"] == pytest.approx(tg["bytes_per_token"] / (tg["ms_per_token"] / 1e3) / 1e9)


def test_zero_skips_a_test(model, capsys):
    rc, out, err = bench(capsys, model, "-p", 0, "-n", 3, "-r", 1, "-ngl", 0)
    assert rc == 0, err
    assert list(rows(out)) == ["tg3"]                     # from an empty context: no depth
    rc, out, err = bench(capsys, model, "-p", 5, "-n", 0, "-r", 1, "-ngl", 0, "--json")
    assert rc == 0, err
    assert [t["test"] for t in json.loads(out)["tests"]] == ["pp5"]


def test_context_overflow_and_bad_counts_are_clean_errors(model, capsys):
    rc, out, err = bench(capsys, model, "-p", 8, "-n", 4, "-d", 4, "-c", 10, "-ngl", 0)
    assert rc == 1 and out == ""
    assert "moert bench: error:" in err and "pp8 @ d4 needs 12 tokens (-d 4 + -p 8)" in err and "-c) of 12" in err
    rc, out, err = bench(capsys, model, "-p", 500, "-n", 20, "-d", 100, "-r", 1, "-ngl", 0)  # past 512: honoured,
    assert rc == 0 and "pp500 @ d100" in out                                                # as llama-bench does,
    assert "warning: -c 600 > the 512 tokens the model was trained for" in err              # with llama.cpp's warning
    rc, out, err = bench(capsys, model, "-p", 0, "-n", 0, "-ngl", 0)
    assert rc == 1 and "nothing to measure" in err
    for flag, value in (("-p", "-1"), ("-n", "-5"), ("-r", "0"), ("-t", "0")):
        with pytest.raises(SystemExit) as e:
            main(["bench", str(model), flag, value])
        assert e.value.code == 2 and value in capsys.readouterr().err


def test_comma_lists_sweep_as_llama_bench(model, capsys):
    """-p/-n/-d lists make tests, -ngl/-ncmoe lists make configurations: one column per swept flag."""
    rc, out, err = bench(capsys, model, "-p", "4,8", "-n", 2, "-d", "0,4", "-r", 1, "-ngl", "0,all", "-ncmoe", "0,1",
                         "--gpu-backend", "sim", "-t", 1)
    assert rc == 0, err
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in out.splitlines()
             if ln.startswith("| ") and not set(ln) <= set("|-: ")]
    assert cells[0][:3] == ["ngl", "ncmoe", "test"]
    names = ["pp4", "pp8", "pp4 @ d4", "pp8 @ d4", "tg2", "tg2 @ d4"]
    assert [c[:3] for c in cells[1:]] == [[g, c, n] for g in ("0", "all") for c in ("0", "1") for n in names]


def test_csv_and_jsonl_outputs(model, capsys):
    import csv
    import io

    rc, out, err = bench(capsys, model, "-p", 4, "-n", 2, "-r", 1, "-ngl", 0, "-o", "csv")
    assert rc == 0, err
    rows_ = list(csv.DictReader(io.StringIO(out)))
    assert [r["test"] for r in rows_] == ["pp4", "tg2"] and float(rows_[0]["avg_ts"]) > 0
    rc, out, err = bench(capsys, model, "-p", 4, "-n", 2, "-d", 3, "-r", 1, "-ngl", 0, "-o", "jsonl")
    assert rc == 0, err
    recs = [json.loads(line) for line in out.splitlines()]
    assert [(r["test"], r["n_depth"], r["model_filename"]) for r in recs] == [("pp4 @ d3", 3, str(model)),
                                                                              ("tg2 @ d3", 3, str(model))]


def test_bytes_per_token_from_the_tensor_list(model):
    """Dense tensors whole, K of E experts, one row of the embedding, counted with gguf-py's reader."""
    r = gguf_py.GGUFReader(model)
    nbytes = {t.name: int(t.n_bytes) for t in r.tensors}
    experts = sum(n for name, n in nbytes.items() if name.endswith("_exps.weight"))
    embd = nbytes["token_embd.weight"]
    dense = sum(nbytes.values()) - experts - embd
    assert "output.weight" in nbytes and experts > 0 and embd % V == 0
    expected = dense + experts * K // E + embd // V
    b = bytes_per_token(model)
    assert b == dict(file=sum(nbytes.values()), decode=expected, experts_per_token=experts * K // E,
                     dense=dense + embd // V)


def test_bytes_per_token_tied_output_reads_the_whole_embedding(tmp_path):
    p = write_qwen3moe(tmp_path / "tied.gguf", n_layer=1, n_expert=E, n_expert_used=K, n_vocab=V, tied_output=True)
    nbytes = {t.name: int(t.n_bytes) for t in gguf_py.GGUFReader(p).tensors}
    assert "output.weight" not in nbytes
    embd = nbytes["token_embd.weight"]
    experts = sum(n for name, n in nbytes.items() if name.endswith("_exps.weight"))
    assert bytes_per_token(p)["decode"] == sum(nbytes.values()) - experts + experts * K // E + embd // V
    assert bytes_per_token(p)["dense"] == sum(nbytes.values()) - experts + embd // V


def test_act_quant_is_shown_and_refused_cleanly_without_avx2(model, capsys):
    """--act-quant int8 runs and says so in the settings line; on a CPU without AVX2 it is one clear error."""
    from moert.kernels import simd

    rc, out, err = bench(capsys, model, "-p", 4, "-n", 2, "-r", 1, "-ngl", 0, "--act-quant", "int8")
    if simd.available():
        assert rc == 0, err
        assert re.search(r"settings: .*activations int8", out)
    else:
        assert rc == 1 and "AVX2" in err and "Traceback" not in err
    rc, out, err = bench(capsys, model, "-p", 4, "-n", 2, "-r", 1, "-ngl", 0)
    assert rc == 0 and "activations" not in out


def test_json_is_llama_benchs_list_of_records(model, capsys):
    """-o json: llama-bench's json_printer layout: a list, its fields in its order, its types, every sample."""
    from moert.bench_records import FIELDS

    rc, out, err = bench(capsys, model, "-p", 6, "-n", 3, "-r", 3, "-ngl", 0, "-o", "json")
    assert rc == 0, err
    recs = json.loads(out)
    assert isinstance(recs, list) and [(r["n_prompt"], r["n_gen"]) for r in recs] == [(6, 0), (0, 3)]
    for r in recs:
        assert list(r)[:len(FIELDS) + 2] == [*FIELDS, "samples_ns", "samples_ts"]
        assert r["model_type"].startswith("qwen3moe ") and r["model_filename"] == str(model)
        assert r["model_size"] == sum(int(t.n_bytes) for t in gguf_py.GGUFReader(model).tensors)
        for name in ("n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "avg_ns", "stddev_ns", "flash_attn"):
            assert type(r[name]) is int, name
        assert type(r["no_kv_offload"]) is bool and type(r["avg_ts"]) is float
        n = r["n_prompt"] + r["n_gen"]
        assert r["samples_ts"] == pytest.approx([n / (ns / 1e9) for ns in r["samples_ns"]], rel=1e-6)
        assert r["avg_ts"] == pytest.approx(statistics.fmean(r["samples_ts"]))
        assert r["stddev_ts"] == pytest.approx(statistics.stdev(r["samples_ts"]))
        assert r["avg_ns"] == round(statistics.fmean(r["samples_ns"]))
        assert (r["n_gpu_layers"], r["type_k"], r["flash_attn"]) == (0, "f16", -1)  # llama-bench's default type


def test_sql_loads_into_sqlite_as_llama_benchs_table(model, capsys):
    import sqlite3

    rc, out, err = bench(capsys, model, "-p", 4, "-n", 2, "-r", 2, "-ngl", 0, "-o", "sql")
    assert rc == 0, err
    db = sqlite3.connect(":memory:")
    db.executescript(out)
    db.executescript(out)                                   # CREATE TABLE IF NOT EXISTS: runs append
    rows = db.execute("SELECT n_prompt, n_gen, avg_ts, type_k, model_type FROM llama_bench").fetchall()
    assert [r[:2] for r in rows] == [(4, 0), (0, 2)] * 2 and all(r[2] > 0 and r[3] == "f16" for r in rows)
    types = {name: kind for _, name, kind, *_ in db.execute("PRAGMA table_info(llama_bench)")}
    assert (types["avg_ts"], types["n_prompt"], types["model_type"], types["no_kv_offload"]) == \
        ("REAL", "INTEGER", "TEXT", "INTEGER")


def test_ctk_and_fa_lists_sweep(tmp_path, capsys):
    """-ctk f16,q8_0 -fa 0,1: one configuration per pair, a column for each swept flag, each record says its own."""
    import csv
    import io

    p = write_qwen3moe(tmp_path / "sweep.gguf", n_layer=1, n_expert=E, n_expert_used=K, n_vocab=V, head_dim=32)
    rc, out, err = bench(capsys, p, "-p", 4, "-n", 2, "-r", 1, "-ngl", 0, "-ctk", "f16,q8_0", "-fa", "0,1")
    assert rc == 0, err
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in out.splitlines()
             if ln.startswith("| ") and not set(ln) <= set("|-: ")]
    assert cells[0][:3] == ["type_k", "fa", "test"]
    assert [c[:3] for c in cells[1:]] == [[k, f, t] for k in ("f16", "q8_0") for f in ("off", "on")
                                          for t in ("pp4", "tg2")]
    rc, out, err = bench(capsys, p, "-p", 4, "-n", 0, "-r", 1, "-ngl", 0, "-ctk", "f16,q8_0", "-fa", "0,1",
                         "-o", "csv")
    assert rc == 0, err
    rows_ = list(csv.DictReader(io.StringIO(out)))
    assert [(r["type_k"], r["flash_attn"]) for r in rows_] == [("f16", "0"), ("f16", "1"), ("q8_0", "0"),
                                                               ("q8_0", "1")]
    with pytest.raises(SystemExit):
        main(["bench", str(p), "-ctk", "f16,q4"])
    assert "'q4'" in capsys.readouterr().err
