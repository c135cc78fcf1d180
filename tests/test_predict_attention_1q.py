"""One query's CPU flash attention under llama.cpp at a measured rate (moert/cost/kinds.py LLAMA_CPU_ATTN_1Q_FPC,
moert/cost/roofline.py kv_gflops): what it costs a layer at depth, that a batch and ik_llama.cpp keep the GEMM
rate, and that a spec-sheet JSON sets it."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

import moert
from moert import zoo
from moert.cost import kinds
from moert.cost.hardware import HardwareError
from moert.cost.predict import CostModel
from moert.cost.roofline import kv_gflops


class _Cost:
    """What kv_gflops reads of a CostModel: llama.cpp's attention without flash attention, one query at `fpc`."""

    def __init__(self, fpc: float = 8.0):
        self.attn = kinds.LlamaCpuAttention("f16", True, True, fpc, False, flash=False) if fpc else None
        self.shape = SimpleNamespace(H=32, Dk=128, Dv=128)


def test_one_query_runs_at_its_flops_a_cycle_a_batch_at_the_gemm_rate():
    cpu = moert.CPU("box", 2, 50.0, ghz=2.5, flops_per_cycle=64, compute_efficiency=0.4)
    assert kv_gflops(cpu, 2, 1, _Cost()) == pytest.approx(2 * 2.5 * 8)           # 40 GFLOP/s
    assert kv_gflops(cpu, 1, 1, _Cost()) == pytest.approx(2.5 * 8)               # one thread: one core's
    assert kv_gflops(cpu, 2, 512, _Cost()) == pytest.approx(2 * 2.5 * 64 * 0.4)  # a prompt: 128, the GEMM rate
    assert kv_gflops(cpu, 2, 1, _Cost(0.0)) == pytest.approx(128)
    assert kv_gflops(cpu, 2, 1, _Cost(40.0)) == pytest.approx(128)              # never above the GEMM rate


def _box(**kw):
    # the measuring box of bench/RESULTS.md "e2e.py -d against llama.cpp: depth to 32768": 2 Zen 5 cores at the
    # 2.596 GHz /proc/cpuinfo gives; memory fast enough that the KV read does not bound
    return moert.Hardware(cpu=moert.CPU("zen5-vm", 2, 400.0, ghz=2.596, flops_per_cycle=64, **kw))


def test_a_layers_decode_attention_at_16384_keys_is_the_measured_time():
    plan = moert.plan(zoo.path("qwen3-30b-a3b"), gpu_layers=0)                  # 32 query / 4 KV heads of 128
    hw = _box()
    c = CostModel(plan, hw)
    c.attn = kinds.llama_cpu_attention(hw.cpu, flash=False)      # the measurement ran without flash attention
    part = c.kv("decode", "cpu", 0, 1, 16384)
    measured = (1 / 24.2 - 1 / 159.0) / 6          # llama.cpp tg32 at depth 16384 and 0, 6 layers (RESULTS)
    assert part.seconds == pytest.approx(measured, rel=0.01)
    assert part.bound == "compute"


@pytest.mark.parametrize("policy, slower", [("llama.cpp", True), ("ik_llama.cpp", False)])
def test_decode_at_depth_slows_under_llama_cpp_only_and_prompts_do_not(policy, slower):
    plan = moert.plan(zoo.path("qwen3-30b-a3b"), gpu_layers=0)
    kw = dict(n_prompt=512, n_gen=32, depth=16384, policy=policy, flash_attn=False)
    on, off = moert.predict(plan, _box(), **kw), moert.predict(plan, _box(attn_1q_flops_per_cycle=0), **kw)
    assert (on.decode_s > 1.5 * off.decode_s) is slower
    assert on.prefill_s == pytest.approx(off.prefill_s)


def test_a_json_part_sets_it_and_a_negative_one_is_refused(tmp_path):
    d = {"name": "my box", "cores": 2, "mem_bw_gbs": 400.0, "attn_1q_flops_per_cycle": 4.0}
    f = tmp_path / "cpu.json"
    f.write_text(json.dumps(d))
    hw = moert.cost.preset(str(f))
    assert hw.cpu.attn_1q_flops_per_cycle == 4.0
    assert moert.CPU("x", 2, 50.0).attn_1q_flops_per_cycle == pytest.approx(8.85, abs=0.01)   # the measured default
    with pytest.raises(HardwareError, match="attn_1q_flops_per_cycle"):
        replace(moert.CPU("x", 2, 50.0), attn_1q_flops_per_cycle=-1.0)
