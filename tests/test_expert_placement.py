"""Expert-granular placement: rules with expert sets, their -ot spelling, plans of pieces, loading only a
device's experts, execution where only activations move, and routing traces."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import moert
from moert import PlacementError, Trace
from moert import TensorOverride as T
from moert.placement.rules import format_experts, format_overrides, parse_overrides
from moert.testing import write_qwen3moe

D, L, E, K = 64, 3, 8, 2
TOKENS, MORE = [1, 5, 9, 3, 7, 2], [4, 6, 8]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("m") / "m.gguf", n_layer=L, n_embd=D, n_expert=E,
                          n_expert_used=K, qtype="Q8_0", seed=3)


def load(path, **kw):
    """An exact (f32) KV cache: placements differ by float noise, which an f16 cache's rounding would turn into
    whole f16 steps wherever a value sits near a rounding boundary (1e-4 of the logits, not a placement bug)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return moert.load(path, context_size=32, warmup=False, progress=False, cache_type_k="f32",
                          cache_type_v="f32", **kw)


@pytest.fixture(scope="module")
def reference(path):
    """All on the CPU: prefill logits, then the decode logits of MORE one token at a time."""
    m = load(path, gpu_layers=0)
    a = m.forward(TOKENS)
    return a, np.concatenate([m.forward([t]) for t in MORE])


# ------------------------------------------------------------------------------------------------ rules

def test_expert_sets_in_rules_and_their_ot_spelling():
    r = T.gpu(r"blk\.3\.ffn_.*_exps", 0, experts=[41, 40, *range(32)])
    assert r.experts == (*range(32), 40, 41) and str(r) == r"blk\.3\.ffn_.*_exps=GPU0@0-31+40-41"
    rules = parse_overrides(r"blk\.3\.ffn_.*_exps=CUDA0@0-31+40+41,\.ffn_.*_exps=CPU")
    assert rules[0].experts == r.experts and rules[0].backend == "cuda" and rules[1].experts is None
    assert parse_overrides(format_overrides(rules)) == rules                   # round trip, commas and all
    assert format_experts([0, 2, 4, 5, 6]) == "0+2+4-6"
    for bad in ("x=CPU@", "x=CPU@3-1", "x=CPU@a", "x=CPU@1,2"):
        with pytest.raises(PlacementError):
            parse_overrides(bad)
    with pytest.raises(PlacementError, match="experts must be a non-empty set of ids >= 0"):
        T.cpu("x", experts=[-1])


def test_plan_pieces_bytes_and_device_of_expert(path):
    p = moert.plan(str(path), [T.gpu(r"_exps", 0, experts=range(0, E, 2)), T.cpu(r"_exps")], gpu_backend="sim")
    name = "blk.1.ffn_up_exps.weight"
    whole = moert.plan(str(path), gpu_backend="sim")[name]
    pieces = p.pieces(name)
    assert [(q.device, q.experts) for q in pieces] == [("sim:0", (0, 2, 4, 6)), ("cpu", (1, 3, 5, 7))]
    assert sum(q.nbytes for q in pieces) == whole.nbytes and pieces[0].nbytes == whole.nbytes // 2
    assert [p.device_of(name, expert=e) for e in range(E)] == ["sim:0", "cpu"] * 4
    assert p.device_of("blk.1.attn_q.weight", expert=None) == "sim:0"
    with pytest.raises(PlacementError, match="is split over experts .*experts 0\\+2\\+4\\+6 on sim:0"):
        p.device_of(name)
    with pytest.raises(PlacementError, match="has no expert 8"):
        p.device_of(name, expert=8)
    assert "blk.1.ffn_up_exps.weight[0+2+4+6]" in p.explain() and "blk.1.ffn_up_exps.weight[1+3+5+7]" in p.explain()
    by = p.bytes_by_device()
    assert sum(by.values()) == sum(q.nbytes for q in moert.plan(str(path), gpu_backend="sim"))
    est = moert.estimate(p, 32)
    assert est.devices["sim:0"].weights == by["sim:0"]


def test_expert_rules_that_cannot_apply(path):
    with pytest.raises(PlacementError, match=r"has an expert set but matches blk.0.ffn_norm.weight \(64,\), which "
                                             r"has no expert axis"):
        moert.plan(str(path), [T.cpu(r"blk\.0\.ffn_", experts=[1])], gpu_backend="sim")
    with pytest.raises(PlacementError, match=r"names expert 8 but blk.0.ffn_(gate|up|down)_exps.weight has 8 "
                                             r"experts \(ids 0-7\)"):
        moert.plan(str(path), [T.cpu(r"_exps", experts=[8])], gpu_backend="sim")


# ------------------------------------------------------------------------------------ loading, execution

PLACEMENTS = {
    "whole: experts on cpu": dict(gpu_backend="sim", cpu_moe=True),
    "half on the gpu": dict(gpu_backend="sim", overrides=[T.gpu(r"_exps", 0, experts=range(4)), T.cpu(r"_exps")]),
    "every other": dict(gpu_backend="sim", overrides=[T.cpu(r"_exps", experts=range(0, E, 2))]),
    "a single expert": dict(gpu_backend="sim", overrides=[T.gpu(r"_exps", 0, experts=[3]), T.cpu(r"_exps")]),
    "all but one": dict(gpu_backend="sim", overrides=[T.cpu(r"_exps", experts=[5])]),
    "two gpus": dict(gpu_backend="sim", gpu_memory=["1GiB", "1GiB"],
                     overrides=[T.gpu(r"_exps", 0, experts=range(4)), T.gpu(r"_exps", 1, experts=range(4, E))]),
    "split by kind": dict(gpu_backend="sim", overrides=[T.gpu(r"ffn_up_exps", 0), T.cpu(r"_exps")]),
    "kind and expert": dict(gpu_backend="sim", overrides=[T.gpu(r"ffn_down_exps", 0, experts=[1, 2]), T.cpu(r"_exps")]),
    "per-layer hot sets": dict(gpu_backend="sim", overrides=[T.gpu(r"blk\.0\.ffn_.*_exps", 0, experts=[0, 1]),
                                                             T.gpu(r"blk\.2\.ffn_.*_exps", 0, experts=[6]),
                                                             T.cpu(r"_exps")]),
}


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_same_logits_and_only_activations_move(path, reference, placement, one_numba_thread):
    m = load(path, **PLACEMENTS[placement])
    assert rel(m.forward(TOKENS), reference[0]) < 1e-4
    decode = []
    for t in MORE:
        decode.append(m.forward([t]))
        moved = sum(s.h2d_bytes + s.d2h_bytes + s.d2d_bytes for s in m.stats.last.transfers.values())
        # per layer: the hidden state out and back, ids and weights: ~4 D floats; an expert is 3 x 8 KiB
        assert moved <= L * 8 * D * 4 + 2 * 256 * 4, (placement, moved)
    assert rel(np.concatenate(decode), reference[1]) < 1e-4


def test_a_gpu_gets_only_its_experts_bytes_and_cpu_pieces_stay_views(path):
    m = load(path, **PLACEMENTS["half on the gpu"])
    w = m.weights["blk.0.ffn_gate_exps.weight"]
    gpu, cpu = (next(p for p in w.pieces if p.device.name == d) for d in ("sim:0", "cpu"))
    full = m.gguf.tensors["blk.0.ffn_gate_exps.weight"].nbytes
    assert gpu.data.shape[0] == 4 and gpu.nbytes == full // 2 and cpu.nbytes == full // 2
    assert not cpu.data.flags.owndata and np.shares_memory(cpu.data, m.gguf.raw("blk.0.ffn_gate_exps.weight"))
    assert m.weights.bytes_by_device() == m.plan.bytes_by_device()
    np.testing.assert_array_equal(w.dequantize_expert(5), cpu.dequantize_expert(5))


# -------------------------------------------------------------------------------------------------- traces

def test_trace_records_every_token_and_does_not_depend_on_placement(path):
    traces = []
    for kw in (dict(gpu_layers=0), PLACEMENTS["every other"], PLACEMENTS["two gpus"]):
        m = load(path, trace=True, **kw)
        m.forward(TOKENS)
        for t in MORE:
            m.forward([t])
        traces.append(m.trace_stop())
        assert m.trace is None
    t0 = traces[0]
    assert len(t0) == len(TOKENS) + len(MORE) and t0.ids.shape == (9, L, K) and t0.ids.dtype == np.int32
    assert t0.positions.tolist() == list(range(9)) and t0.prefill.tolist() == [True] * 6 + [False] * 3
    for t in traces[1:]:
        np.testing.assert_array_equal(t.ids, t0.ids)
        np.testing.assert_allclose(t.weights, t0.weights, atol=1e-5)
    np.testing.assert_allclose(t0.weights.sum(axis=2), 1.0, atol=1e-6)     # qwen3moe renormalizes the top-k


def test_trace_questions_against_hand_counts(path, tmp_path):
    m = load(path, trace="full", gpu_backend="sim", overrides=[T.gpu(r"_exps", 0, experts=[0, 1, 2]),
                                                               T.cpu(r"_exps")])
    m.forward(TOKENS)
    t = m.trace
    assert t.logits.shape == (6, L, E)
    np.testing.assert_array_equal(t.ids[:, 0], np.argsort(-t.logits[:, 0], axis=1, kind="stable")[:, :K])
    counts = t.counts()
    assert counts.sum() == 6 * L * K and counts[1, 3] == int((t.ids[:, 1] == 3).sum())
    hot = np.sort(counts, axis=1)[:, ::-1]
    assert t.coverage(2) == pytest.approx(hot[:, :2].sum() / counts.sum()) and t.coverage(E) == 1.0
    on_gpu = counts[:, :3].sum() / counts.sum()
    assert t.hits(m.plan) == pytest.approx({"cpu": 1 - on_gpu, "sim:0": on_gpu})
    p = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_allclose(t.entropy(), -np.nansum(np.where(p > 0, p * np.log2(p), 0), axis=1))
    co = t.coactivation()
    np.testing.assert_array_equal(np.diagonal(co, axis1=1, axis2=2), counts)
    assert co[0, t.ids[0, 0, 0], t.ids[0, 0, 1]] >= 1
    back = Trace.load(t.save(tmp_path / "t.npz"))
    np.testing.assert_array_equal(back.ids, t.ids)
    np.testing.assert_array_equal(back.logits, t.logits)
    assert back.header["placement"]["overrides"] == "_exps=GPU0@0-2,_exps=CPU" and back.header["model"] == "m.gguf"
    with pytest.raises(moert.TraceError, match="not a moert trace"):
        Trace.load(path)


def test_warmup_and_failed_calls_record_nothing(path):
    m = load(path, trace=True, gpu_layers=0)
    m.warmup(progress=False)
    with pytest.raises(moert.InvalidTokenError):
        m.forward([1, 10_000])
    assert len(m.trace) == 0
    m.forward([1, 2])
    assert len(m.trace) == 2


# ------------------------------------------------------------------------------------- the hot strategy

@pytest.fixture(scope="module")
def trace(path):
    from moert.text.generate import generate_ids
    from moert.text.sampling import SamplingParams

    m = load(path, trace=True, gpu_layers=0)
    generate_ids(m, list(range(1, 17)), 24, SamplingParams(temperature=0))
    return m.trace


@pytest.mark.parametrize(("mem", "kv"), [("564KiB", "f16"), ("604KiB", "f16"), ("664KiB", "f16"),
                                         ("524KiB", "f32")])       # some experts fit, not all
def test_hot_experts_fills_the_gpu_with_the_most_selected_experts(path, trace, mem, kv):
    from moert.placement import estimate, hot_experts, plan

    rules = hot_experts(str(path), trace, gpu_memory=mem, context_size=64, gpu_backend="sim", kv_dtype=kv)
    p = plan(str(path), rules, gpu_backend="sim", gpu_memory=mem)
    assert estimate(p, 64, kv_dtype=kv).fits()
    counts = trace.counts()
    chosen = {(il, e) for il in range(L) for e in range(E) if p.device_of(f"blk.{il}.ffn_up_exps.weight", e) != "cpu"}
    assert chosen and all(counts[x] > 0 for x in chosen)
    # every expert left on the CPU was selected at most as often as the least-selected one on the GPU
    left = max((counts[il, e] for il in range(L) for e in range(E) if (il, e) not in chosen), default=0)
    assert left <= min(counts[x] for x in chosen)
    assert trace.hits(p)["sim:0"] == pytest.approx(sum(counts[x] for x in chosen) / counts.sum())


def test_hot_experts_more_memory_never_fewer_hits(path, trace):
    from moert.placement import hot_experts, plan

    shares = []
    for mem in ("554KiB", "584KiB", "634KiB", "684KiB", "820KiB"):       # an f16 cache, the default
        p = plan(str(path), hot_experts(str(path), trace, gpu_memory=mem, context_size=64, gpu_backend="sim"),
                 gpu_backend="sim", gpu_memory=mem)
        shares.append(trace.hits(p).get("sim:0", 0.0))
    assert shares == sorted(shares) and shares[-1] == pytest.approx(1.0) and shares[0] < 1.0


def test_hot_experts_refuses_what_cannot_work(path, trace):
    from moert.placement import hot_experts

    with pytest.raises(PlacementError, match="before any expert"):
        hot_experts(str(path), trace, gpu_memory="64KiB", context_size=64, gpu_backend="sim")
    with pytest.raises(PlacementError, match="there is none"):
        hot_experts(str(path), trace, context_size=64, devices=[])


def test_cli_trace_and_hot_fit(path, tmp_path):
    import json
    import subprocess
    import sys

    def moert_cli(*args):
        return subprocess.run([sys.executable, "-m", "moert", *map(str, args)], capture_output=True, text=True,
                              timeout=300)

    npz, png = tmp_path / "t.npz", tmp_path / "e.png"
    r = moert_cli("run", path, "-p", "1 2 3 4", "-n", "6", "--temp", "0", "-ngl", "0", "--trace", npz,
                  "--expert-plot", png, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stats"]["prefill"]["tokens"] == 4 and out["stats"]["decode"]["calls"] == 5
    assert len(out["stats"]["total"]["expert_counts"]) == L and png.stat().st_size > 1000
    assert f"routing trace: {npz} (9 tokens" in r.stderr and f"expert selections: {png}" in r.stderr
    s = json.loads(moert_cli("trace", npz, "--json", "-m", path, "--gpu-backend", "sim", "-ot",
                             "_exps=CPU@0-3").stdout)
    t = Trace.load(npz)
    assert s["tokens"] == 9 and s["counts"] == t.counts().tolist()
    assert s["hits"]["cpu"] == pytest.approx(t.counts()[:, :4].sum() / t.counts().sum())
    r = moert_cli("fit", path, "--strategy", "hot", "--trace", npz, "--gpu-backend", "sim", "--gpu-mem", "1MiB",
                  "-c", "64")
    assert r.returncode == 0 and "fits" in r.stdout and "-ot '" in r.stdout and "served by the GPU" in r.stdout
    r = moert_cli("fit", path, "--strategy", "hot", "--gpu-backend", "sim", "--gpu-mem", "1MiB")
    assert r.returncode == 1 and "--strategy hot needs --trace NPZ" in r.stderr
