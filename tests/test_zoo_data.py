"""Materialized twins (moert/cost/zoo_data.py): a zoo twin's header with valid random blocks, that moert.load runs.

One 1-layer olmoe-1b-7b twin (0.4 GB, a couple of seconds to write) is checked against the header-only twin of the
same name (same tensors, types, shapes), its blocks decoded by the reference dequantizer (finite, the spread asked
for), and run on the simulated GPU (NumPy, no kernel compile) to finite logits.
"""

from __future__ import annotations

import numpy as np
import pytest

import moert
from moert import gguf
from moert.cost import zoo
from moert.cost.zoo_data import WEIGHT_STD, materialize
from moert.errors import TwinError
from moert.quants.dequant import dequantize_expert, dequantize_rows


@pytest.fixture(scope="module")
def olmoe(tmp_path_factory):
    """Written by `moert twin` (so the command line is checked too): the one write of this file."""
    from moert.cli.main import main

    path = tmp_path_factory.mktemp("zd") / "olmoe-L1.gguf"
    assert main(["twin", "zoo:olmoe-1b-7b", "-o", str(path), "--layers", "1", "-q"]) == 0
    return path


def test_the_header_is_the_twins_cut_to_its_layers(olmoe):
    expect = [(n, t, s) for n, t, s in zoo.layout("olmoe-1b-7b") if not n.startswith("blk.") or
              n.startswith("blk.0.")]
    with gguf.open(olmoe) as g:
        got = [(n, g.tensors[n].type, tuple(g.tensors[n].shape)) for n in g.tensors]
        assert got == expect
        assert g.metadata["olmoe.block_count"] == 1 and g.metadata["moert.materialized"] is True
        g.check_real()                                         # not refused as a header-only twin
    with gguf.open(zoo.path("olmoe-1b-7b")) as g, pytest.raises(TwinError):
        g.check_real()


def test_the_blocks_decode_to_finite_weights_of_the_asked_spread(olmoe):
    with gguf.open(olmoe) as g:
        types = {g.tensors[n].type for n in g.tensors}
        assert {"Q4_K", "Q6_K", "F32"} <= types
        for name in ("blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight", "output.weight"):
            t = g.tensors[name]
            w = dequantize_rows(g.raw(name), t.type, t.shape, 0, 256)     # 256 rows (reference dequantizer)
            assert np.isfinite(w).all()
            assert 0.5 * WEIGHT_STD < float(w.std()) < 1.5 * WEIGHT_STD, name
        norm = g.dequantize("blk.0.attn_norm.weight")
        assert abs(float(norm.mean()) - 1) < 0.02 and float(norm.std()) > 0.01
        t = g.tensors["blk.0.ffn_gate_exps.weight"]
        e0, e1 = (dequantize_expert(g.raw(t.name), t.type, t.shape, e) for e in (0, 1))
        assert not np.array_equal(e0, e1)                    # tiled from a random offset, not one block repeated


def test_it_runs_to_finite_logits(olmoe):
    m = moert.load(olmoe, gpu_backend="sim", context_size=32, warmup=False, progress=False)
    logits = m.forward(np.array([1, 2, 3, 4]))              # one call: the sim dequantizes the 50304-row output
    assert logits.shape == (4, 50304) and np.isfinite(logits).all()
    assert logits[-1].std() > 0
    m.close()


def test_bad_layers_and_types_are_refused(tmp_path):
    with pytest.raises(zoo.ZooError, match="olmoe-1b-7b has 16 layers"):
        materialize("olmoe-1b-7b", path=tmp_path / "x.gguf", layers=17)
    with pytest.raises(zoo.ZooError, match="cannot write IQ4_XS"):
        materialize("qwen3-30b-a3b", "IQ4_XS", tmp_path / "y.gguf", layers=1)
    assert not list(tmp_path.iterdir())                        # refused before anything is written
