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
