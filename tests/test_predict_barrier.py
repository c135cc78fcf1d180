"""ggml's per-node barrier as a cost growing with the threads (moert/cost/roofline.py op_us): what it adds to a
prediction, that a spec-sheet JSON sets it, and that it is off unless set."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import moert
from moert import cost, zoo
from moert.cost.hardware import HardwareError
from moert.cost.roofline import op_us


def test_the_per_node_cost_is_the_call_plus_a_part_per_thread():
    # llama.cpp PR 9598's test-barrier on an EPYC: 1962.74 ns a node at 4 threads, 3039.05 at 8
    cpu = moert.CPU("epyc", 64, 400.0, call_us=0.88, barrier_us_per_thread=0.27)
    assert op_us(cpu, 4) == pytest.approx(1.96, abs=0.01)
    assert op_us(cpu, 8) == pytest.approx(3.04, abs=0.01)
    assert op_us(cpu) == pytest.approx(0.88 + 0.27 * 64)               # default: one thread a core
    assert op_us(moert.CPU("plain", 64, 400.0), 128) == 2.0           # not set: a few us, whatever the threads


def _decode_and_prefill(cpu, threads, model="qwen3-30b-a3b"):
    plan = moert.plan(zoo.path(model), gpu_layers=0)
    return moert.predict(plan, moert.Hardware(cpu=cpu), n_prompt=512, n_gen=1, threads=threads)


def test_a_tokens_barriers_add_ops_times_the_per_thread_cost_to_decode():
    off = moert.CPU("server", 64, 460.8, 12, 4800, ghz=3.5)
    on = replace(off, barrier_us_per_thread=0.27)
    a, b = _decode_and_prefill(off, 64), _decode_and_prefill(on, 64)
    ops = sum(p.ops for p in a.parts if p.phase == "decode" and p.device == "cpu")
    assert ops > 1000                                        # a 48-layer MoE: dozens of nodes a layer
    assert b.decode_s - a.decode_s == pytest.approx(ops * 0.27 * 64 * 1e-6, rel=1e-6)
    assert b.decode_tok_s < a.decode_tok_s


def test_a_prompt_barely_feels_the_barrier_even_at_many_threads():
    """At 0.27 us a thread and 128 threads a node's barrier is ~35 us; a pp512 node of a 235B model's is
    milliseconds (a small model's prompt at ~1800 t/s feels it more: 14%)."""
    off = moert.CPU("server", 128, 614.4, 12, 6400, ghz=3.2, flops_per_cycle=64)
    on = replace(off, barrier_us_per_thread=0.27)
    a, b = (_decode_and_prefill(c, 128, "qwen3-235b-a22b") for c in (off, on))
    assert b.prefill_tok_s < a.prefill_tok_s
    assert b.prefill_tok_s > 0.95 * a.prefill_tok_s                  # under 5%: not a prompt's 2x
    assert b.decode_tok_s < 0.8 * a.decode_tok_s                     # while a token is far slower


def test_a_calibrated_cpus_measured_layer_cost_replaces_the_per_op_cost():
    cpu = moert.CPU("local", 2, 15.0, layer_us=100.0, barrier_us_per_thread=5.0)
    r = _decode_and_prefill(cpu, 2)
    again = _decode_and_prefill(replace(cpu, barrier_us_per_thread=0.0), 2)
    assert r.decode_s == again.decode_s                               # moert's own threads: measured, not ggml's


def test_a_spec_sheet_json_sets_it_and_a_negative_one_is_refused(tmp_path):
    fields = {"name": "my-epyc", "cores": 64, "mem_bw_gbs": 460.8, "call_us": 0.88, "barrier_us_per_thread": 0.27}
    p = tmp_path / "cpu.json"
    p.write_text(json.dumps(fields))
    hw = cost.preset(str(p))
    assert hw.cpu.barrier_us_per_thread == 0.27 and op_us(hw.cpu, 8) == pytest.approx(3.04, abs=0.01)
    p.write_text(json.dumps({**fields, "barrier_us_per_thread": -1}))
    with pytest.raises(HardwareError, match="barrier_us_per_thread"):
        cost.preset(str(p))


def test_every_preset_leaves_it_off():
    """No source gives the barrier past 8 threads, and the PR 9598 line extrapolated to 44 threads is far off a
    training figure (roofline.py): no preset turns it on."""
    assert all(c.barrier_us_per_thread == 0 for c in cost.CPUS.values())
