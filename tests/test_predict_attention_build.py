"""llama.cpp's CPU attention kernels by build, KV cache type and -fa (moert/cost/kinds.py llama_cpu_attention): with
flash attention a prompt's rows run the tiled (GEMM-rate) kernel only since PR 19012 and over F16/F32 caches, one
query's positions are split over the threads only since PR 19209 (before it: at most one thread a query head), at the
one-query kernel's measured rates; without it ggml's mul_mat attention; ik_llama.cpp keeps its own kernels."""

from __future__ import annotations

import pytest

import moert
from moert import zoo
from moert.cost import kinds


def _attention_s(r, phase: str) -> float:
    return sum(p.seconds for p in r.parts if p.phase == phase and p.stage == "attention" and p.device == "cpu")


def _run(**kw):
    plan = moert.plan(zoo.path("qwen3-30b-a3b"), gpu_layers=0)      # 32 query heads of 128 over 4 KV heads
    hw = moert.cost.preset("epyc-9554")                            # 64 cores: more threads than query heads
    return moert.predict(plan, hw, n_prompt=512, n_gen=16, depth=16384, **kw), hw


def test_the_kernels_follow_the_build_date_and_the_cache_type():
    cpu = moert.CPU("x", 8, 100.0)
    today = kinds.llama_cpu_attention(cpu)
    assert (today.cache, today.tiled, today.split, today.old, today.flash) == ("f16", True, True, False, True)
    assert today.decode_fpc == cpu.attn_1q_flops_per_cycle
    assert not kinds.llama_cpu_attention(cpu, flash=False).flash
    between = kinds.llama_cpu_attention(cpu, "2026-01-25")          # after PR 19012, before PR 19209
    assert between.tiled and not between.split and between.tiled_x == 2.0    # and before PR 19422's GEMM tiles
    assert kinds.llama_cpu_attention(cpu, "2026-02-10").tiled_x == 1.0
    old = kinds.llama_cpu_attention(cpu, "2025-08-15")
    assert not old.tiled and not old.split and old.old
    q8 = kinds.llama_cpu_attention(cpu, "", 34 / 32)                  # a q8_0 cache takes neither path today
    assert (q8.cache, q8.tiled, q8.split, q8.old) == ("q8_0", False, False, False)
    assert kinds.llama_cpu_attention(cpu, "", 4).tiled               # F32 K and V do


def test_the_one_query_kernels_rate_is_read_at_two_depths_and_falls_between_and_beyond():
    key = ("prompt", "f16", "old")
    (n0, r0), (n1, r1) = kinds.LLAMA_CPU_ATTN_VEC[key]
    assert (r0, r1) == (8.669, 2.064)                  # bench/RESULTS.md: llama-cpp-python 0.3.16, depth 4096, 16384
    assert kinds.vec_fpc(key, n0) == r0 and kinds.vec_fpc(key, n1) == pytest.approx(r1)
    assert kinds.vec_fpc(key, 100) == r0                                  # flat below the first depth
    assert r1 < kinds.vec_fpc(key, (n0 * n1) ** 0.5) < r0                 # log-log between
    assert kinds.vec_fpc(key, 2 * n1) < r1                                # continued beyond


def test_a_prompt_runs_the_gemm_rate_only_in_tiles_of_64_rows():
    cpu = moert.CPU("box", 2, 50.0, ghz=2.5, flops_per_cycle=64)
    a = kinds.llama_cpu_attention(cpu)
    gemm = 2 * 2.5 * 64 * 0.4
    assert a.gflops(gemm, cpu, 2, 512, 32, 16384) == gemm
    vec = 2 * 2.5 * kinds.vec_fpc(("prompt", "f16", "old"), 16384)
    assert a.gflops(gemm, cpu, 2, 32, 32, 16384) == pytest.approx(min(gemm, vec))
    one = 2 * 2.5 * kinds.vec_fpc(("decode", "f16", "today"), 16384)          # split: every thread
    assert a.gflops(gemm, cpu, 2, 1, 32, 16384) == pytest.approx(min(gemm, one))
    off = kinds.llama_cpu_attention(cpu, flash=False)          # mul_mat attention: decode at the part's rate
    assert off.gflops(gemm, cpu, 2, 1, 32, 16384) == pytest.approx(min(gemm, 2 * 2.5 * off.decode_fpc))
    assert off.gflops(gemm, cpu, 2, 512, 32, 16384) == gemm


def test_an_older_build_pays_the_one_query_kernel_in_prompts_and_a_head_per_thread_in_decode():
    now, hw = _run()
    before, _ = _run(build="2025-08-15")
    cpu = hw.cpu
    att = [p for p in before.parts if p.phase == "prefill" and p.stage == "attention" and p.flops > 5e10]
    vec = cpu.cores * cpu.ghz * kinds.vec_fpc(("prompt", "f16", "old"), 16384 + 256) * 1e9
    assert sum(p.seconds for p in att) == pytest.approx(sum(p.flops for p in att) / vec, rel=0.02)
    assert _attention_s(before, "prefill") > 1.5 * _attention_s(now, "prefill")
    att = [p for p in before.parts if p.phase == "decode" and p.stage == "attention" and p.flops > 1e8]
    vec = min(cpu.cores, 32) * cpu.ghz * kinds.vec_fpc(("decode", "f16", "old"), 16384 + 8) * 1e9
    assert sum(p.seconds for p in att) == pytest.approx(sum(p.flops for p in att) / vec, rel=0.02)
    now_dec = [p for p in now.parts if p.phase == "decode" and p.stage == "attention" and p.flops > 1e8]
    vec = cpu.cores * cpu.ghz * kinds.vec_fpc(("decode", "f16", "today"), 16384 + 8) * 1e9   # split: all 64 cores
    assert sum(p.seconds for p in now_dec) == pytest.approx(sum(p.flops for p in now_dec) / vec, rel=0.02)
    q8, _ = _run(kv_bytes=34 / 32)                           # today's build over a q8_0 cache: the one-query kernel
    att = [p for p in q8.parts if p.phase == "prefill" and p.stage == "attention" and p.flops > 5e10]
    vec = cpu.cores * cpu.ghz * kinds.vec_fpc(("prompt", "q8_0", "today"), 16384 + 256) * 1e9
    assert sum(p.seconds for p in att) == pytest.approx(sum(p.flops for p in att) / vec, rel=0.02)


def test_ik_llama_cpp_keeps_its_kernels_at_any_date():
    a, _ = _run(policy="ik_llama.cpp")
    b, _ = _run(policy="ik_llama.cpp", build="2026-01-01")
    assert _attention_s(a, "prefill") == pytest.approx(_attention_s(b, "prefill"))
    assert _attention_s(a, "decode") == pytest.approx(_attention_s(b, "decode"))


def test_compare_passes_fa_to_the_prediction():
    from moert.cli.compare import compare

    hw = moert.cost.preset("epyc-9554")
    opts = dict(depth=16384, n_gen=16)
    on, off = (compare(str(zoo.path("qwen3-30b-a3b")), hw, 32768, opts={**opts, "fa": fa}) for fa in ("on", "off"))
    cpu_on = next(r for r in on if r["strategy"].startswith("everything on the CPU"))
    cpu_off = next(r for r in off if r["strategy"].startswith("everything on the CPU"))
    assert cpu_off["tg"] > 1.5 * cpu_on["tg"]       # ggml's mul_mat attention against FA's kernel at 16k positions
