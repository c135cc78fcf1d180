"""Cold start: the load-time warm-up (Model.warmup) and per-type kernel compilation (kernels_for, layer_kernel)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from moert.loader import load
from moert.testing import write_qwen3moe

TOKENS = np.random.default_rng(3).integers(0, 256, 9)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("w") / "m.gguf", n_layer=2, n_expert=8, n_expert_used=2, seed=5)


@pytest.mark.parametrize("kw", [dict(gpu_layers=0), dict(cpu_moe=True, gpu_backend="sim")], ids=["cpu", "sim"])
def test_warmup_leaves_no_trace(path, kw):
    cold = load(path, progress=False, warmup=False, **kw)
    warm = load(path, progress=False, warmup=False, **kw)
    assert cold.warmup_seconds is None
    counters = [d.stats.copy() for d in warm.plan.devices]       # loading counted its weights' transfers
    assert warm.warmup(progress=False) > 0 and warm.warmup_seconds > 0
    # the one-token run is forgotten: empty context, no calls in the stats, no transfers counted
    assert warm.position == 0 and warm.stats.total.calls == 0 and warm.stats.last.calls == 0
    assert [d.stats for d in warm.plan.devices] == counters
    assert not warm.stats.total.expert_counts.any()
    np.testing.assert_array_equal(warm.forward(TOKENS), cold.forward(TOKENS))
    assert warm.stats.total.calls == 1 and warm.stats.total.tokens == len(TOKENS)
    # warming up mid-conversation keeps the conversation
    before = warm.position
    warm.warmup(progress=False)
    assert warm.position == before and warm.stats.total.calls == 1
    np.testing.assert_array_equal(warm.forward(TOKENS[:2]), cold.forward(TOKENS[:2]))


def test_load_warms_up(path):
    m = load(path, progress=False, gpu_layers=0)
    assert m.warmup_seconds > 0 and m.position == 0 and m.stats.total.calls == 0


def test_a_type_compiles_only_its_own_row_kernels(tmp_path):
    """With an empty Numba cache, a Q8_0 matmul and a Q8_0/Q8_0 MoE layer compile Q8_0's row kernels and no
    other type's: Numba re-optimizes every kernel a function links, so compiling all eleven for every
    caller cost about a minute of cold start."""
    code = textwrap.dedent("""
        import numpy as np
        from moert.kernels import matmul as mm, moe_fused as mf
        from moert.kernels.qtensor import QTensor
        from moert.quants.quantize import quantize
        rng = np.random.default_rng(0)
        w = quantize(rng.standard_normal((64, 64), dtype=np.float32), "Q8_0")
        mm.matmul(np.ones((1, 64), np.float32), QTensor(w, "Q8_0", (64, 64)))
        e = quantize(rng.standard_normal((2 * 64, 64), dtype=np.float32), "Q8_0").reshape(2, 64, -1)
        t = QTensor(e, "Q8_0", (2, 64, 64))
        mf.moe_ffn_fused(np.ones((3, 64), np.float32), np.array([[0], [1], [0]]), np.ones((3, 1), np.float32), t, t, t)
        print({n: t.compiled() for n, t in mm.TYPES.items() if t.compiled()})
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    got = ast.literal_eval(out.stdout.split("\n")[-2])
    # dot1_q8_0 compiles on its own where it is Numba's loop; with AVX2 (kernels/simd_f32.py) it is inlined
    assert list(got) == ["Q8_0"] and set(got["Q8_0"]) - {"dot1_q8_0"} == {"rows1_q8_0", "rowsb_q8_0"}


def test_warmup_near_a_full_context(path):
    m = load(path, progress=False, gpu_layers=0, context_size=12)
    m.forward(TOKENS[:9])
    m.warmup(progress=False)                              # 3 free positions: the 2-token prompt, then 1 token
    m.forward(TOKENS[:2])
    m.warmup(progress=False)                              # 1 free: one token
    assert m.position == 11 and m.context_tokens == [*TOKENS[:9], *TOKENS[:2]]
    m.forward(TOKENS[:1])
    from moert.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError):
        m.warmup(progress=False)                          # nothing free: the usual error, nothing changed
    assert m.position == 12 and m.stats.total.calls == 3
