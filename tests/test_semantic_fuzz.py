"""A sample of the semantic fuzzer (tests/semantic_fuzz.py) in every run: files that lie about their model
must end in a typed moert error or a correct run (finite logits), never a signal, a hang or an untyped error.
The long run is `python tests/semantic_fuzz.py --cases 20000`."""

from __future__ import annotations

from collections import Counter

import pytest
from semantic_fuzz import fuzz, passed


@pytest.mark.slow
def test_lying_files_end_in_typed_errors_or_correct_runs():
    results = fuzz(1500, seed=2026, quick=True)
    failures = [(label, o) for label, o in results if not passed(o) and not o.startswith("unwritable")]
    assert not failures, "\n".join(f"{label}: {o}" for label, o in failures[:20])
    kinds = Counter(o.split(":")[0] for _, o in results)
    # the sample reaches both ends: runs that complete and several kinds of refusal
    assert kinds["ok"] >= 100 and sum(v for k, v in kinds.items() if k.startswith("typed ")) >= 800, kinds
    assert {"typed TensorMismatchError", "typed ConfigError"} <= set(kinds), kinds


@pytest.mark.parametrize("base, key, vtype, value, says", [
    ("deepseek2.gguf", "deepseek2.rope.scaling.yarn_log_multiplier", "FLOAT32", 1e30, "yarn_log_multiplier"),
    ("deepseek2.gguf", "deepseek2.rope.freq_base", "UINT32", 1, "RoPE base above 1"),
    ("gpt-oss.gguf", "gpt-oss.rope.freq_base", "UINT32", 1, "RoPE base above 1")])
def test_what_the_long_run_found(tmp_path, base, key, vtype, value, says):
    # `fuzz(4000, seed=5)` over every base: non-finite logits from a huge YaRN log multiplier, and a division
    # by zero in YaRN's ramp at base 1; both are typed ConfigErrors now
    from pathlib import Path

    from semantic_fuzz import _set, read_recipe, run_case, write_recipe

    path = write_recipe(_set(key, vtype, value)(read_recipe(Path(__file__).parent / "fixtures" / "arch" / base)),
                        tmp_path / base)
    outcome = run_case(str(path), dict(gpu_layers=0))
    assert outcome.startswith("typed ConfigError") and says in outcome, outcome
