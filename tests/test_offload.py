"""Op offload (moert/experts.py offload_gpu, llama.cpp's ggml_backend_cuda_device_offload_op): a forward of at
least `offload_min_batch` tokens (32, GGML_OP_OFFLOAD_MIN_BATCH) runs the CPU's experts on the GPU, copying only
the selected experts' blocks there for the call. On the sim device: the same logits with and without it, and the
copies counted (TransferStats.offload_bytes) as the routing's selected experts times an expert's bytes."""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert.dynamic import expert_bytes
from moert.errors import MoertError
from moert.testing import write_tiny

PROMPT = np.random.default_rng(5).integers(1, 200, 40)              # 40 tokens: over the threshold
KW = dict(gpu_backend="sim", context_size=64, warmup=False, progress=False, kv=moert.KVConfig("f32", "f32"))


@pytest.fixture(scope="module", params=["qwen3moe", "gpt-oss"])     # gpt-oss: expert biases are copied too
def path(request, tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("offload") / f"{request.param}.gguf", request.param, seed=3)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("placement", [dict(cpu_moe=True), dict(n_cpu_moe=1)])
def test_same_logits_and_the_selected_experts_copied(path, placement, one_numba_thread):
    off = moert.load(path, **KW, **placement, offload_min_batch=0)
    want = off.forward(PROMPT)
    assert off.stats.total.transfers["sim:0"].offload_count == 0
    m = moert.load(path, **KW, **placement)                             # the default: 32
    got = m.forward(PROMPT)
    assert rel(got, want) < 1e-5
    on_cpu = np.array([m.plan.device_of(f"blk.{il}.ffn_up_exps.weight") == "cpu" for il in range(m.config.n_layer)])
    selected = (m.stats.total.expert_counts > 0).sum(axis=1)             # (L,) experts the prompt picked per layer
    t = m.stats.total.transfers["sim:0"]
    assert t.offload_bytes == int((selected * expert_bytes(path) * on_cpu).sum()) > 0
    assert t.offload_count == (3 + 3 * ("gpt-oss" in str(path))) * on_cpu.sum()   # gate, up, down (+ biases)
    held = [sum(n for what, n in d.allocations() if what.startswith("crossing")) for d in (m.plan.devices[0],
                                                                                         off.plan.devices[0])]
    assert m.plan.devices[0].used - held[0] == off.plan.devices[0].used - held[1]   # the copies are freed after each
    # call (off's prompt crossed to its CPU experts: the crossing's static buffers stay, moert/devices/pinned.py)
    m.close()
    off.close()


def test_small_batches_and_decode_stay_on_the_cpu(path):
    m = moert.load(path, **KW, cpu_moe=True)
    m.forward(PROMPT[:31])                                              # under the threshold
    m.forward(PROMPT[31:32])
    assert m.stats.total.transfers["sim:0"].offload_count == 0
    m.close()
    low = moert.load(path, **KW, cpu_moe=True, offload_min_batch=4)
    low.forward(PROMPT[:4])
    assert low.stats.total.transfers["sim:0"].offload_count > 0
    low.close()


def test_without_a_gpu_nothing_is_offloaded_and_bad_values_are_refused(path):
    m = moert.load(path, gpu_layers=0, context_size=64, warmup=False, progress=False)
    assert m.plan.devices == [] and np.isfinite(m.forward(PROMPT)).all()
    m.close()
    with pytest.raises(MoertError, match="offload_min_batch"):
        moert.load(path, **KW, offload_min_batch=-1)


def test_the_flag_reaches_the_model(path, capsys):
    from moert.cli.main import main

    assert main(["run", str(path), "-p", " ".join(map(str, PROMPT[:33])), "-n", "1", "--cpu-moe", "--gpu-backend",
                 "sim", "-c", "64", "--no-warmup", "--offload-min-batch", "0", "--stats"]) == 0
    assert "op-offload" not in capsys.readouterr().err
    assert main(["run", str(path), "-p", " ".join(map(str, PROMPT[:33])), "-n", "1", "--cpu-moe", "--gpu-backend",
                 "sim", "-c", "64", "--no-warmup", "--stats"]) == 0
    assert "op-offload copies of CPU weights" in capsys.readouterr().err


def test_copies_that_do_not_fit_leave_the_experts_on_the_cpu(path):
    """-ngl 0 with a GPU present: a big batch's experts go to it, as in llama.cpp, when their copies fit what is
    free there (the memory estimate reserves no room for op offload); else the CPU runs them."""
    want = None
    for size, copied in (("64MiB", True), ("16KiB", False)):
        m = moert.load(path, **{**KW, "gpu_memory": size}, gpu_layers=0)
        logits = m.forward(PROMPT)
        assert (m.stats.total.transfers["sim:0"].offload_count > 0) is copied, size
        want = logits if want is None else want
        assert rel(logits, want) < 1e-5
        m.close()


def test_dense_cpu_weights_of_a_big_batch_run_on_the_gpu(path, one_numba_thread):
    """-ngl 1 (the output on the GPU): the CPU layers' projections of a 40-token batch run on the GPU, their whole
    bytes copied for the call (the router's small F32 matrix stays on the CPU); the same logits as without."""
    off = moert.load(path, **KW, gpu_layers=1, offload_min_batch=0)
    want = off.forward(PROMPT)
    m = moert.load(path, **KW, gpu_layers=1)
    got = m.forward(PROMPT)
    assert rel(got, want) < 1e-5
    cpu = [n for n in m.weights if m.plan.device_of(n) == "cpu" and len(m.weights[n].shape) == 2
           and n.startswith("blk.") and "ffn_gate_inp" not in n and "_exps." not in n]   # expert biases: below
    t = m.stats.total.transfers["sim:0"]
    dense = sum(m.weights[n].data.nbytes for n in cpu)                 # every 2-D CPU weight of the layers, once
    on_cpu = np.array([m.plan.device_of(f"blk.{il}.ffn_up_exps.weight") == "cpu" for il in range(m.config.n_layer)])
    experts = int(((m.stats.total.expert_counts > 0).sum(axis=1) * expert_bytes(path) * on_cpu).sum())
    assert dense > 0 and experts > 0 and t.offload_bytes == dense + experts
    m.close()
    off.close()
