"""Several sequences in one forward (moert/batch.py, Model.forward_batch): the same logits and greedy tokens as
decoding each alone, for every TINY architecture, with f16 caches and flash attention, prompts and decode steps
mixed in one forward; one forward call per step."""

from __future__ import annotations

import numpy as np
import pytest

from moert.batch import sequences
from moert.loader import load
from moert.testing import TINY, write_tiny

PROMPTS = [[1, 5, 9, 2, 7], [3, 3], [8, 1, 4, 6, 2, 9, 11, 5], [12]]
STEPS = 6


def alone(model, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and each step's logits, one sequence at a time with Model.forward."""
    model.reset()
    logits = model.forward(prompt, last_only=True)[-1]
    toks, rows = [], [logits]
    for _ in range(steps):
        toks.append(int(np.argmax(logits)))
        logits = model.forward([toks[-1]])[-1]
        rows.append(logits)
    model.reset()
    return toks, rows


def together(model, prompts: list[list[int]], steps: int, start=None):
    """The same, every sequence in one forward per step; sequence i joins at step start[i] (its prompt then
    shares a forward with the others' decode tokens)."""
    seqs = sequences(model, len(prompts))
    start = start or [0] * len(prompts)
    toks = [[] for _ in prompts]
    rows = [[] for _ in prompts]
    nxt: dict[int, list[int]] = {}
    calls = model.stats.total.calls
    for step in range(max(start) + steps + 1):
        parts, who = [], []
        for i, p in enumerate(prompts):
            if step == start[i]:
                parts.append((seqs[i], p))
            elif start[i] < step <= start[i] + steps:
                parts.append((seqs[i], nxt[i]))
            else:
                continue
            who.append(i)
        logits = model.forward_batch(parts)                                  # (len(parts), V)
        assert logits.shape == (len(parts), model.n_vocab)
        for i, row in zip(who, logits):
            rows[i].append(row)
            if len(toks[i]) < steps:
                toks[i].append(int(np.argmax(row)))
                nxt[i] = [toks[i][-1]]
    assert model.stats.total.calls - calls == max(start) + steps + 1          # one forward per step
    return toks, rows


@pytest.mark.parametrize("name", sorted(TINY))
def test_batched_greedy_equals_one_at_a_time(tmp_path, name):
    model = load(write_tiny(tmp_path / f"{name}.gguf", name, seed=3), context_size=128, gpu_layers=0)
    try:
        prompts = [[t % model.n_vocab for t in p] for p in PROMPTS]
        ref = [alone(model, p, STEPS) for p in prompts]
        toks, rows = together(model, prompts, STEPS, start=[0, 2, 0, 1])
        for (rt, rr), t, r in zip(ref, toks, rows):
            assert t == rt
            np.testing.assert_allclose(np.array(r), np.array(rr), rtol=1e-4, atol=1e-4)
    finally:
        model.close()


@pytest.mark.parametrize("kv, fa", [("f16", "on"), ("bf16", "off"), ("f32", "on")])
def test_batched_with_typed_caches_and_flash_attention(tmp_path, kv, fa):
    model = load(write_tiny(tmp_path / "q.gguf", "qwen3moe", seed=5), context_size=96, gpu_layers=0,
                 cache_type_k=kv, cache_type_v=kv, flash_attn=fa)
    try:
        prompts = [[t % model.n_vocab for t in p] for p in PROMPTS[:3]]
        ref = [alone(model, p, STEPS) for p in prompts]
        toks, rows = together(model, prompts, STEPS)
        for (rt, rr), t, r in zip(ref, toks, rows):
            assert t == rt
            np.testing.assert_allclose(np.array(r), np.array(rr), rtol=1e-4, atol=1e-4)
    finally:
        model.close()


def test_batched_on_a_simulated_gpu_and_traced(tmp_path):
    """Attention and KV cache on a sim GPU, experts on the CPU; the trace records each row at its own position."""
    model = load(write_tiny(tmp_path / "q.gguf", "qwen3moe", seed=5), context_size=96, gpu_backend="sim",
                 cpu_moe=True, trace=True)
    try:
        prompts = [[t % model.n_vocab for t in p] for p in PROMPTS[:2]]
        ref = [alone(model, p, 3)[0] for p in prompts]
        n0 = len(model.trace.positions)
        toks, _ = together(model, prompts, 3)
        assert toks == ref
        t = model.trace
        positions = t.positions[n0:].tolist()
        assert positions == [*range(len(prompts[0])), *range(len(prompts[1])), 5, 2, 6, 3, 7, 4]
        assert t.prefill[n0:].tolist() == [True] * 7 + [False] * 6
    finally:
        model.close()


def test_sequences_divide_the_cache_and_refuse_overflow(tmp_path):
    from moert.errors import ContextOverflowError, InvalidTokenError

    model = load(write_tiny(tmp_path / "q.gguf", "qwen3moe"), context_size=64, gpu_layers=0)
    try:
        seqs = sequences(model, 4)
        assert [s.n_ctx for s in seqs] == [16] * 4
        assert np.shares_memory(seqs[1].k[0].parts[0], model.kv.k[0].parts[0])     # an f16 cache, the default
        with pytest.raises(ContextOverflowError, match="at 0 of its 16"):
            model.forward_batch([(seqs[0], list(range(17)))])
        with pytest.raises(InvalidTokenError, match="outside the vocabulary"):
            model.forward_batch([(seqs[0], [1]), (seqs[1], [model.n_vocab])])
        assert seqs[0].position == seqs[1].position == 0                     # nothing was processed
    finally:
        model.close()
