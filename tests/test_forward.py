"""moert.load / Model on synthetic qwen3moe models: continuing forward, errors, stats, placement invariance."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import pytest

import moert
from moert.errors import ContextWarning
from moert.loader import load
from moert.model import ContextOverflowError, InvalidTokenError, Model
from moert.testing import write_qwen3moe

TOKENS = np.random.default_rng(7).integers(0, 256, 24)


pytestmark = pytest.mark.usefixtures("one_numba_thread")


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("m") / "m.gguf", n_layer=2, n_expert=8, n_expert_used=2,
                          types={r"attn_q\.": "F16", r"ffn_down": "Q4_0"}, seed=11)


@pytest.fixture(scope="module")
def cpu_logits(path):
    return load(path, gpu_layers=0, progress=False).forward(TOKENS)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_forward_shape_position_reset(path, cpu_logits):
    m = load(path, gpu_layers=0, progress=False)
    assert isinstance(m, Model) and m.config.n_vocab == 256 and m.position == 0
    out = m.forward(TOKENS)
    assert out.shape == (len(TOKENS), 256) and out.dtype == np.float32 and np.isfinite(out).all()
    assert m.position == len(TOKENS)
    assert np.array_equal(out, cpu_logits)
    m.reset()
    assert m.position == 0 and np.array_equal(m.forward(TOKENS), cpu_logits)
    assert m.forward([]).shape == (0, 256)
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.config.n_layer = 1  # type: ignore[misc]
    assert m.plan.device_of("blk.0.ffn_up_exps.weight") == "cpu"


def test_continuing_equals_prefill(path, cpu_logits):
    m = load(path, gpu_layers=0, progress=False)
    parts = [m.forward(TOKENS[:10])] + [m.forward(TOKENS[i:i + 1]) for i in range(10, 16)] + [m.forward(TOKENS[16:])]
    assert rel(np.concatenate(parts), cpu_logits) < 1e-5
    chunked = load(path, gpu_layers=0, progress=False, n_batch=5).forward(TOKENS)   # prompt in 5-token chunks
    assert rel(chunked, cpu_logits) < 1e-5


def test_bad_tokens_and_overflow_leave_model_usable(path, cpu_logits):
    m = load(path, gpu_layers=0, progress=False, context_size=30)
    assert m.context_size == 30
    m.forward(TOKENS[:20])
    for bad in ([1, 256], [-1], [[1, 2]], [0.5]):
        with pytest.raises(InvalidTokenError):
            m.forward(bad)
    with pytest.raises(InvalidTokenError, match="256"):
        m.forward([3, 256])
    with pytest.raises(ContextOverflowError, match="position 20"):
        m.forward(TOKENS[:11])
    assert m.position == 20
    assert rel(m.forward(TOKENS[20:]), cpu_logits[20:]) < 1e-5          # nothing was disturbed
    with pytest.warns(ContextWarning, match="trained for"):             # honoured past the trained 512, as -c is
        assert load(path, gpu_layers=0, progress=False, context_size=2048).context_size == 2048


def test_tied_output(tmp_path):
    p = write_qwen3moe(tmp_path / "tied.gguf", tied_output=True, seed=5)
    a = load(p, gpu_layers=0, progress=False).forward(TOKENS[:6])
    b = load(p, gpu_backend="sim", progress=False).forward(TOKENS[:6])
    assert a.shape == (6, 256) and rel(b, a) < 1e-5


PLACEMENTS = {
    "experts cpu, rest sim:0": dict(gpu_backend="sim", cpu_moe=True),
    "all sim:0": dict(gpu_backend="sim", overrides=[("token_embd", "sim:0")]),
    "layers over sim:0/sim:1, experts cpu": dict(gpu_backend="sim", gpu_memory=["1GiB", "1GiB"],
                                                 overrides=[("_exps", "cpu"), (r"blk\.1\.", "sim:1")]),
    "experts of half the layers on sim:0": dict(gpu_backend="sim", n_cpu_moe=1),
    "gate/up/down split over cpu/sim:0/sim:1": dict(
        gpu_backend="sim", gpu_memory=["1GiB", "1GiB"],
        overrides=[("ffn_gate_exps", "cpu"), ("ffn_up_exps", "sim:0"), ("ffn_down_exps", "sim:1")]),
    "embedding and output on sim:1, rest cpu": dict(
        gpu_backend="sim", gpu_memory=["1GiB", "1GiB"], gpu_layers=0,
        overrides=[("token_embd", "sim:1"), ("output", "sim:1")]),
}


@pytest.mark.parametrize("name", list(PLACEMENTS))
def test_placement_invariance(path, cpu_logits, name):
    m = load(path, progress=False, **PLACEMENTS[name])
    assert len({m.plan.device_of(n) for n in m.weights}) > 1 or name == "all sim:0"
    out = np.concatenate([m.forward(TOKENS[:20]), m.forward(TOKENS[20:21]), m.forward(TOKENS[21:])])
    assert rel(out, cpu_logits) < 1e-4, name


def test_stats_and_counted_transfers(path):
    m = load(path, progress=False, gpu_backend="sim", cpu_moe=True)
    c = m.config
    T = 9
    m.forward(TOKENS[:T])
    s = m.stats.last
    assert (s.calls, s.tokens) == (1, T)
    assert set(s.time["attention"]) == {"sim:0"} and set(s.time["router"]) == {"sim:0"}
    assert set(s.time["experts"]) == {"cpu"} and set(s.time["embed"]) == {"cpu"}
    assert {"cpu->sim:0", "sim:0->cpu"} <= set(s.time["transfers"])
    t = s.transfers["sim:0"]
    # per layer: hidden, ids, weights to the cpu in one transfer; the experts' sum back. Then embeddings in, logits out.
    assert (t.h2d_count, t.d2h_count) == (c.n_layer + 1, c.n_layer + 1)
    D, K, V = c.n_embd, c.n_expert_used, c.n_vocab
    assert t.h2d_bytes == (c.n_layer + 1) * T * D * 4
    assert t.d2h_bytes == c.n_layer * T * (D * 4 + K * 4 + K * 4) + T * V * 4
    assert s.expert_counts.shape == (c.n_layer, c.n_expert)
    assert (s.expert_counts.sum(1) == T * K).all()
    m.forward(TOKENS[T:T + 1])
    tot = m.stats.total
    assert (tot.calls, tot.tokens) == (2, T + 1) and (tot.expert_counts.sum(1) == (T + 1) * K).all()
    assert tot.transfer_count == t.count + m.stats.last.transfer_count
    assert "experts" in str(m.stats) and "sim:0" in str(m.stats)
    m.stats.reset()
    assert m.stats.total.tokens == 0


def test_all_cpu_moves_nothing_and_experts_read_once_per_batch(path, monkeypatch):
    from moert import experts
    from moert.kernels import moe as kmoe

    monkeypatch.setattr(experts, "FLOAT_EXPERTS_BYTES", 0)         # the grouped path for Q4_0, not a Q8_0 copy
    m = load(path, gpu_layers=0, progress=False)
    calls = []
    real = kmoe.dequantize_expert
    monkeypatch.setattr(kmoe, "dequantize_expert", lambda t, e, out=None: calls.append(e) or real(t, e, out))
    m.forward(TOKENS)
    assert m.stats.last.transfer_count == 0 and m.stats.last.transfers == {}
    distinct = int((m.stats.last.expert_counts > 0).sum())          # (layer, expert) pairs selected
    assert len(calls) == 3 * distinct                               # gate, up, down: once each per batch


def test_failure_mid_prompt_rolls_back(path, cpu_logits, monkeypatch):
    m = load(path, gpu_layers=0, progress=False, n_batch=4)
    m.forward(TOKENS[:4])
    real, calls = m.arch.forward, []

    def flaky(model, chunk):
        calls.append(len(chunk))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(model, chunk)

    monkeypatch.setattr(m, "arch", type("A", (), {"forward": staticmethod(flaky)}))
    with pytest.raises(KeyboardInterrupt):
        m.forward(TOKENS[4:12])                                     # fails in its second chunk
    assert m.position == 4
    monkeypatch.undo()
    assert rel(m.forward(TOKENS[4:]), cpu_logits[4:]) < 1e-5


def test_model_text_interface_with_a_vocabulary(tmp_path):
    """Model.tokenize/detokenize/generate/stream: the generation loop on a real (synthetic-vocab) model."""
    from moert.testing import gpt2_vocab_metadata

    p = write_qwen3moe(tmp_path / "v.gguf", vocab=gpt2_vocab_metadata(), n_layer=1)
    m = moert.load(p, gpu_backend="sim", cpu_moe=True, context_size=64)
    ids = m.tokenize("The capital of France is")
    assert m.detokenize(ids) == "The capital of France is" and m.n_vocab == 1024
    a = m.generate("The capital of France is", max_tokens=6, temperature=0)
    s = m.stream("The capital of France is", max_tokens=6, temperature=0)
    assert "".join(s) == a and s.stats.generated_tokens >= 1
    # the same prompt again: all but its last token are still in the KV cache
    assert s.stats.cached_tokens == len(ids) - 1 and s.stats.prompt_tokens == 1
    # greedy = the argmax of the forward pass, token by token
    m.reset()
    logits = m.forward(ids)
    first = int(np.argmax(logits[-1]))
    assert a.startswith(m.detokenize([first])) or first in m.eos_ids


def test_threads_sets_numba_and_blas(tmp_path):
    """-t 1 must mean one thread for the Numba kernels and for NumPy's BLAS too (no oversubscription)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from moert.threads import set_threads

    before = numba.get_num_threads()
    with threadpool_limits(limits=None):  # restore BLAS afterwards
        load(write_qwen3moe(tmp_path / "t.gguf", n_layer=1), threads=1, progress=False, gpu_layers=0)
        assert numba.get_num_threads() == 1
        assert all(p["num_threads"] == 1 for p in threadpool_info()                     # NumPy's BLAS (scipy's,
                   if p["user_api"] == "blas" and "numpy" in p["filepath"])         # loaded later by Numba,
        #                                                                             serves no moert kernel)
        assert set_threads(10_000) == numba.config.NUMBA_NUM_THREADS  # capped at the cores Numba saw
        with pytest.raises(ValueError, match=">= 1"):
            set_threads(0)
    numba.set_num_threads(before)


def test_forward_runs_blas_on_one_thread_beside_the_kernels(path, monkeypatch):
    """With the kernels on 2 threads, a forward pass runs NumPy's BLAS on one (their spin-waits fought over
    the cores), and gives BLAS its threads back after, also when the pass fails; on one thread: untouched."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return {p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas" and "numpy" in p["filepath"]}

    m = load(path, gpu_layers=0, context_size=32, progress=False, warmup=False)
    seen = []
    forward = m.arch.forward

    def watched(rt, tokens):
        seen.append(blas_threads())
        return forward(rt, tokens)

    monkeypatch.setattr(m.arch, "forward", watched)
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() == {2}                                    # NumPy's OpenBLAS is there to limit
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        try:
            m.forward(np.array([1, 2]))
            assert seen[-1] == ({1} if numba.get_num_threads() > 1 else {2}) and blas_threads() == {2}
            numba.set_num_threads(1)
            m.forward(np.array([3]))
            assert seen[-1] == {2}
            with pytest.raises(InvalidTokenError):
                m.forward(np.array([10**9]))
            assert blas_threads() == {2}
        finally:
            numba.set_num_threads(1)
    m.close()


def test_generation_reuses_the_cached_prefix(tmp_path):
    """A prompt that extends the last one runs only its new tokens, and generates what a fresh model does."""
    from moert.testing import gpt2_vocab_metadata

    p = write_qwen3moe(tmp_path / "v.gguf", vocab=gpt2_vocab_metadata(), n_layer=2, seed=4)

    def fresh():
        return load(p, gpu_layers=0, context_size=96, progress=False)

    m = fresh()
    first = "The capital of France is"
    reply = m.generate(first, max_tokens=5, temperature=0)
    second = first + reply + " and the capital of Spain is"
    s = m.stream(second, max_tokens=5, temperature=0)
    text = "".join(s)
    want = fresh().stream(second, max_tokens=5, temperature=0)
    assert text == "".join(want)
    n = len(m.tokenize(second))
    assert s.stats.cached_tokens >= len(m.tokenize(first)) and s.stats.prompt_tokens + s.stats.cached_tokens == n
    assert want.stats.cached_tokens == 0 and want.stats.prompt_tokens == n
    assert m.context_tokens[:n] == m.tokenize(second)
    # an unrelated prompt gives the fresh model's text
    assert m.generate("Hello there", 4, temperature=0) == fresh().generate("Hello there", 4, temperature=0)
    # a stream stopped early resets the model: nothing is reused afterwards
    it = iter(m.stream(second, max_tokens=5, temperature=0))
    next(it)
    it.close()
    assert m.position == 0 and m.context_tokens == []


def test_last_only_is_the_last_row(path, cpu_logits):
    for n_batch in (512, 5):                                             # one chunk, and 5-token chunks
        m = load(path, gpu_layers=0, progress=False, n_batch=n_batch)
        last = m.forward(TOKENS, last_only=True)
        assert last.shape == (1, 256) and m.position == len(TOKENS)
        assert rel(last, cpu_logits[-1:]) < 1e-5
        assert m.forward([], last_only=True).shape == (0, 256)
        assert m.forward(TOKENS[:1]).shape == (1, 256)                   # the next call gives every row again


def test_the_default_context_is_llamas_or_the_trained_one_without_a_warning(path):
    """moert.load's context_size as -c reads it: not given, 4096 or the trained context if smaller (no warning
    for what nobody asked); 0, the trained context; more than it, honoured with a ContextWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ContextWarning)
        assert load(path, gpu_layers=0, progress=False, warmup=False).context_size == 512       # trained 512
        assert load(path, gpu_layers=0, progress=False, warmup=False, context_size=0).context_size == 512
        assert load(path, gpu_layers=0, progress=False, warmup=False, context_size=100).context_size == 100
