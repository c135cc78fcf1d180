"""How the CPU kernels use threads on a machine that is not idle (bench/busy.py measures it).

  - work too small to share runs on the calling thread (matmul.threads_for): the expert layer of a small
    model takes its serial kernel at any thread count, with the same bits as one thread, and the twin's values;
  - moert/omp_wait.py reports the OpenMP wait policy (moert leaves it to the environment);
  - expert tensors of a type without a fused kernel run fused from a readable copy (Q8_0 exactly, or F32).
"""

from __future__ import annotations

import json

import numba
import numpy as np
import pytest
from test_kernels_moe_fused import experts, routing, scale

from moert import omp_wait
from moert.kernels import matmul as mm
from moert.kernels import moe_fused as mf

TWO = min(2, numba.config.NUMBA_NUM_THREADS)


def with_threads(n: int, fn):
    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        return fn()
    finally:
        numba.set_num_threads(before)


def test_threads_for_one_below_the_threshold():
    n = with_threads(TWO, mm.threads)
    assert with_threads(TWO, lambda: mm.threads_for(mm._PARALLEL_MIN_BYTES - 1)) == 1
    assert with_threads(TWO, lambda: mm.threads_for(mm._PARALLEL_MIN_BYTES)) == n == TWO
    assert with_threads(1, lambda: mm.threads_for(1 << 40)) == 1


class Spy:
    """Counts the calls of a compiled kernel, passing them through."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *a):
        self.calls += 1
        return self.fn(*a)


@pytest.mark.parametrize("down, E, F, D, T, parallel", [("Q8_0", 16, 128, 256, 1, False),  # the demo model's size
                                                         ("Q6_K", 8, 768, 512, 2, True)])    # 4 experts x 0.6 MB
def test_expert_layer_small_work_runs_serially(down, E, F, D, T, parallel):
    """At two threads, an expert layer reading less than the threshold runs the serial kernel (the same bits as
    at one thread), a bigger one the parallel kernel; both match the reference twin."""
    gate, up, down = experts("Q4_K", down, E, F, D, seed=E)
    x = np.random.default_rng(E).standard_normal((T, D), dtype=np.float32)
    ids, w = routing(T, E, 2, seed=E)
    p = mf.PreparedExperts(gate, up, down)
    assert (min(ids.size, E) * p.expert_bytes >= mm._PARALLEL_MIN_BYTES) == parallel
    p.kernel, p.serial = Spy(p.kernel), Spy(p.serial)
    one = with_threads(1, lambda: p(x, ids, w))
    assert (p.kernel.calls, p.serial.calls) == (0, 1)
    two = with_threads(TWO, lambda: p(x, ids, w))
    assert (p.kernel.calls, p.serial.calls) == ((1, 1) if parallel and TWO > 1 else (0, 2))
    if not parallel:
        np.testing.assert_array_equal(one, two)
    want = mf.moe_ffn_fused_ref(x, ids, w, gate, up, down)
    tol = 1e-4 * scale(x, ids, w, gate, up, down)
    assert np.all(np.abs(two - want) <= tol) and np.all(np.abs(one - want) <= tol)


def test_wait_policy_reports_the_environment(monkeypatch):
    for v in omp_wait.WAIT_VARIABLES:
        monkeypatch.delenv(v, raising=False)
    assert omp_wait.wait_policy() == "libgomp's default (spins, then sleeps)"
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert omp_wait.wait_policy() == "passive (OMP_WAIT_POLICY)"
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    assert omp_wait.wait_policy() == "spin 1000 (GOMP_SPINCOUNT)"


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_0"])
def test_q4_0_and_q5_0_become_q8_0_exactly(qtype):
    """experts.as_q8_0: the same values, bit for bit, as Q8_0 blocks (each keeps its scale; zero blocks too)."""
    from moert.experts import as_q8_0
    from moert.quants import dequantize, quantize

    x = np.random.default_rng(3).standard_normal((3, 8, 96), dtype=np.float32)
    x[1, 2, :32] = 0.0                                                  # a block whose scale is 0
    raw = quantize(x, qtype)
    got = as_q8_0(raw, qtype, (3, 8, 96))
    assert got.shape == (3, 8, 3 * 34)
    np.testing.assert_array_equal(dequantize(got, "Q8_0", (3, 8, 96)), dequantize(raw, qtype, (3, 8, 96)))


@pytest.mark.parametrize("copy", ["Q8_0", "F32"])
def test_experts_of_a_type_without_a_fused_kernel_run_fused(monkeypatch, copy):
    """The demo model's Q5_0 ffn_down (no fused kernel) is kept as Q8_0 (exactly; F32 for types without an exact
    Q8_0 form) and read by the fused kernel: the same logits as the grouped path that dequantizes each expert per
    call (FLOAT_EXPERTS_BYTES = 0), to float rounding."""
    from moert import experts, load
    from moert.demo import demo_model_path

    if copy == "F32":
        monkeypatch.setattr(experts, "_AS_Q8_0", {})

    def run():
        m = load(demo_model_path(), gpu_layers=0, context_size=64, progress=False, threads=1)
        try:
            out = np.concatenate([m.forward(np.arange(3, 11)), m.forward([42])])
            ps = [v for k, v in m.weights.prepared.items() if k[0] == "cpu experts"]
            f32 = sum(p.args[4].shape[-1] == 4 * 128 for p in ps if isinstance(p, mf.PreparedExperts))   # down's rows
            return out, [type(p).__name__ for p in ps], f32
        finally:
            m.close()
    fused, kinds, f32 = run()
    assert kinds == ["PreparedExperts"] * 4 and f32 == (2 if copy == "F32" else 0)   # every layer's experts fused
    monkeypatch.setattr(experts, "FLOAT_EXPERTS_BYTES", 0)
    grouped, kinds, _ = run()
    assert kinds.count("PreparedExperts") == 2 and len(kinds) == 4          # two layers' ffn_down are Q5_0
    np.testing.assert_allclose(fused, grouped, rtol=0, atol=2e-4 * np.abs(grouped).max())
    assert (fused.argmax(1) == grouped.argmax(1)).all()


def test_stall_guard_backs_off_and_comes_back():
    """Quiet steps stay on several threads; a stall sends 8 steps to one thread, a second stall 16; a clean step
    on several threads brings the backoff back to 8. The second step ever is a one-thread probe."""
    from moert.threads import StallGuard

    g, ms = StallGuard(), 1e-3
    seen = []

    def step(seconds):
        one = g.one_thread()
        seen.append(one)
        g.step(seconds if not one else 1.8 * ms, one)
    step(1.0 * ms)                                                       # several threads
    step(1.0 * ms)                                                       # the probe: one thread
    assert seen == [False, True] and g.fast_1 == pytest.approx(1.8 * ms)
    for _ in range(5):
        step(1.1 * ms)                                                   # quiet
    assert not any(seen[2:]) and g.stalls == 0
    step(40 * ms)                                                        # a stall
    seen.clear()
    for _ in range(8):
        step(1.0 * ms)
    assert seen == [True] * 8 and g.stalls == 1
    step(40 * ms)                                                        # stalls again: 16 on one thread
    seen.clear()
    for _ in range(16):
        step(1.0 * ms)
    assert seen == [True] * 16 and g.backoff == 32
    step(1.0 * ms)                                                       # clean on several threads
    assert g.backoff == 8 and not g.one_thread()
    g2 = StallGuard()                                                    # a step slower than 1.5x one thread's
    for s in (2.5 * ms, 1.0 * ms, 2.0 * ms, 3.0 * ms):
        g2.step(s, g2.one_thread())
    assert g2.stalls == 1 and g2.one_thread()


def test_decode_steps_the_guard_sends_to_one_thread_give_the_same_logits(monkeypatch):
    """A model's decode step with its stall guard saying 'one thread' runs the kernels on one thread (seen from
    inside the forward) and gives the logits of a step on several, to float rounding; prompts ignore the guard."""
    from moert import load
    from moert.demo import demo_model_path

    m = load(demo_model_path(), gpu_layers=0, context_size=64, progress=False)
    try:
        seen, real = [], m.arch.forward

        def spy(model, chunk):
            seen.append(numba.get_num_threads())
            return real(model, chunk)
        monkeypatch.setattr(m.arch, "forward", spy)                     # the architecture module's forward
        m.stall_guard.wait = 5
        with_threads(TWO, lambda: m.forward(np.arange(3, 11)))          # a prompt: several threads
        one = with_threads(TWO, lambda: m.forward([42]))
        m.position -= 1
        m.stall_guard.wait = 0
        m.stall_guard.steps = 2                                         # past the one-thread probe
        several = with_threads(TWO, lambda: m.forward([42]))
        assert seen == [TWO, 1, TWO] and m.stall_guard.steps == 3
        np.testing.assert_allclose(one, several, rtol=0, atol=1e-4 * np.abs(several).max())
    finally:
        m.close()


def test_stall_guard_starts_afresh_after_a_jump_in_depth():
    """Minima taken near the start of the context would call every step deep in it a stall: a step more than JUMP
    tokens from where the last one left off (a long prompt, a rewind) forgets them and probes one thread again;
    steps that follow one another, or a short prompt between them, keep them."""
    from moert.threads import StallGuard

    g = StallGuard()
    for pos, s in ((10, 1e-3), (11, 2e-3), (12, 1e-3)):
        g.at(pos)
        g.step(s, g.one_thread())
    g.at(13 + StallGuard.JUMP)                                          # a short prompt between: the same guard
    assert g.steps == 3 and g.fast_n == pytest.approx(1e-3, rel=0.01)
    g.step(1e-2, g.one_thread())                                        # 10x slower: a stall, one thread next
    assert g.wait == g.MIN_BACKOFF and g.stalls == 1
    g.at(4096)                                                          # a long prompt: afresh
    assert (g.steps, g.wait, g.fast_n, g.fast_1) == (0, 0, float("inf"), float("inf")) and g.stalls == 1
    g.step(1e-2, g.one_thread())
    g.at(4097)
    assert g.one_thread()                                               # its probe, at the new depth


def test_without_the_guard_every_decode_step_keeps_the_threads_set(monkeypatch, capsys):
    """load(stall_guard=False) / --no-stall-guard: no step goes to one thread, whatever came before; `moert bench`
    counts the steps the guard did send to one thread."""
    from moert import load
    from moert.bench import run_test
    from moert.cli.main import main
    from moert.demo import demo_model_path

    m = load(demo_model_path(), gpu_layers=0, context_size=64, progress=False, stall_guard=False)
    try:
        assert m.stall_guard is None
        seen, real = [], m.arch.forward

        def spy(model, chunk):
            seen.append(numba.get_num_threads())
            return real(model, chunk)
        monkeypatch.setattr(m.arch, "forward", spy)
        for t in range(3):                                  # the guarded model's second step would be its probe
            with_threads(TWO, lambda t=t: m.forward([40 + t]))
        assert seen == [TWO] * 3
    finally:
        m.close()
    g = load(demo_model_path(), gpu_layers=0, context_size=64, progress=False)
    try:
        g.stall_guard.wait = 4                              # as after a stall: the next 4 steps on one thread
        r = with_threads(TWO, lambda: run_test(g, n_gen=3, repetitions=2, warmup=False))
        assert r.one_thread_steps == 4 and r.to_dict()["one_thread_steps"] == 4
    finally:
        g.close()
    assert main(["bench", str(demo_model_path()), "-p", "0", "-n", "2", "-r", "1", "-t", "1",
                 "--no-stall-guard", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n_gen"] == 2
