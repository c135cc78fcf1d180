"""`moert bench -o json|jsonl|csv|sql`: one record per test with llama-bench's field names, in its order and
types (tools/llama-bench/llama-bench.cpp, `test::get_fields`), so tooling written for llama-bench reads them:

    -o json    a list of records, each with samples_ns and samples_ts   (llama-bench's json_printer)
    -o jsonl   the same records, one per line                            (jsonl_printer)
    -o csv     a header of the fields, one row per test                  (csv_printer: every value quoted)
    -o sql     CREATE TABLE IF NOT EXISTS llama_bench (...); one INSERT per test   (sql_printer)

Fields that have no meaning in moert get llama-bench's defaults (cpu_mask 0x0, poll 50, split_mode layer, ...);
moert's own numbers (best_ts, ms_per_token, GBps, bytes_per_token, the test's name) follow llama-bench's fields
in json, jsonl and csv; sql keeps exactly llama-bench's table, so moert's rows go into the same database.
"""

from __future__ import annotations

import csv
import io
import json
import time

from moert.bench import TestResult, _count

# llama-bench's fields, its order; the type of each as llama-bench's get_field_type says
FIELDS = ("build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
          "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
          "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode", "main_gpu", "no_kv_offload", "flash_attn",
          "devices", "tensor_split", "tensor_buft_overrides", "load_mode", "embeddings", "no_op_offload", "no_host",
          "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns", "stddev_ns", "avg_ts",
          "stddev_ts")
INTS = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params", "n_gpu_layers",
        "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload", "n_cpu_moe",
        "fit_target", "fit_min_ctx", "flash_attn"}
BOOLS = {"no_kv_offload", "cpu_strict", "embeddings", "no_host"}
FLOATS = {"avg_ts", "stddev_ts"}
MOERT_FIELDS = ("test", "best_ts", "ms_per_token", "GBps", "bytes_per_token")
FLASH = {"auto": -1, "off": 0, "on": 1}       # llama_flash_attn_type


def model_type(model: dict) -> str:
    """llama_model_desc's shape: architecture, parameter count, the type most of the bytes are in."""
    main = next(iter(model["bytes_by_type"]), "?")
    return f"{model['architecture']} {_count(model['params']).replace(' ', '')} {main}"


def record(machine: dict, model: dict, settings: dict, r: TestResult) -> dict:
    """llama-bench's record of one test (its fields, then samples_ns, samples_ts), moert's numbers after them.
    r.config holds the test's configuration: n_gpu_layers, n_cpu_moe, type_k, type_v, flash_attn, n_threads."""
    from moert import __version__

    c = r.config
    ngl = c.get("n_gpu_layers", "all")
    ns = [round(s * 1e9) for s in r.samples_s]
    out = dict(build_commit=f"moert-{__version__}", build_number=0, cpu_info=machine["cpu"],
               gpu_info=", ".join(settings["gpus"]), backends="CPU" + ("," + settings["gpus"][0].split(":")[0]
                                                                     if settings["gpus"] else ""),
               model_filename=model["path"], model_type=model_type(model), model_size=model["size"],
               model_n_params=model["params"], n_batch=settings["n_batch"], n_ubatch=settings.get("n_ubatch",
                                                                                                settings["n_batch"]),
               n_threads=c.get("n_threads", machine["threads"]), cpu_mask="0x0", cpu_strict=False, poll=50,
               type_k=c.get("type_k", "f16"), type_v=c.get("type_v", "f16"),
               n_gpu_layers=-1 if ngl in ("all", None) else ngl if isinstance(ngl, int) else -1,
               n_cpu_moe=c.get("n_cpu_moe") or 0, split_mode="layer", main_gpu=0, no_kv_offload=False,
               flash_attn=FLASH.get(c.get("flash_attn", "auto"), -1), devices="auto", tensor_split="0.00",
               tensor_buft_overrides=settings.get("overrides") or "none",
               load_mode="mmap" if settings.get("mmap", True) else "none", embeddings=False, no_op_offload=0,
               no_host=False, fit_target=0, fit_min_ctx=0, n_prompt=r.n_prompt, n_gen=r.n_gen, n_depth=r.depth,
               test_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r.time or time.time())),
               avg_ns=round(sum(ns) / len(ns)), stddev_ns=round(_stdev(ns)), avg_ts=r.avg_ts, stddev_ts=r.stddev_ts)
    return {**out, "samples_ns": ns, "samples_ts": r.samples_ts, "test": r.name, "best_ts": r.best_ts,
            "ms_per_token": r.ms_per_token, "GBps": r.GBps, "bytes_per_token": r.bytes_per_token}


def _stdev(xs: list[int]) -> float:
    import statistics

    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def format_json(recs: list[dict]) -> str:
    """llama-bench's -o json: a list of records."""
    return json.dumps(recs, indent=2)


def format_jsonl(recs: list[dict]) -> str:
    return "\n".join(json.dumps(r) for r in recs)


def format_csv(recs: list[dict]) -> str:
    """llama-bench's -o csv: its fields (and moert's after them), every value quoted as llama-bench quotes it."""
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    names = [*FIELDS, *MOERT_FIELDS]
    buf.write(",".join(names) + "\n")
    w.writerows([[_text(r[k]) for k in names] for r in recs])
    return buf.getvalue().rstrip("\n")


def _text(v) -> str:
    """A value as llama-bench's get_values writes it: bools as 0/1, floats with 6 decimals, None as ''."""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, float):
        return f"{v:.6f}"
    return "" if v is None else str(v)


def _sql_type(name: str) -> str:
    return "INTEGER" if name in INTS or name in BOOLS else "REAL" if name in FLOATS else "TEXT"


def format_sql(recs: list[dict]) -> str:
    """llama-bench's -o sql: CREATE TABLE IF NOT EXISTS llama_bench, then one INSERT per test."""
    out = ["CREATE TABLE IF NOT EXISTS llama_bench ("]
    out += [f"  {f} {_sql_type(f)}{',' if i < len(FIELDS) - 1 else ''}" for i, f in enumerate(FIELDS)]
    out += [");", ""]
    for r in recs:
        values = ", ".join("'" + _text(r[f]).replace("'", "''") + "'" for f in FIELDS)
        out.append(f"INSERT INTO llama_bench ({', '.join(FIELDS)}) VALUES ({values});")
    return "\n".join(out)


__all__ = ["FIELDS", "format_csv", "format_json", "format_jsonl", "format_sql", "model_type", "record"]
