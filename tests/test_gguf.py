"""The reader against gguf-py (the oracle) on synthetic and real files, and its public API."""

from __future__ import annotations

import gguf as ggufpy
import numpy as np
import pytest

import moert
from moert import gguf
from moert.testing import write_qwen3moe


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_qwen3moe(tmp_path_factory.mktemp("m") / "tiny.gguf", n_layer=2, types={"attn_v": "F16"})


def _same_as_ggufpy(path):
    with gguf.open(path) as f:
        r = ggufpy.GGUFReader(path)
        assert list(f.tensors) == [t.name for t in r.tensors]
        for t in r.tensors:
            info = f.tensors[t.name]
            assert info.name == t.name
            assert info.type == t.tensor_type.name
            assert info.shape == tuple(int(x) for x in reversed(t.shape))
            assert info.nbytes == t.n_bytes
            assert info.offset == t.data_offset
            np.testing.assert_array_equal(f.raw(t.name), t.data.view(np.uint8).reshape(-1))
        for key, fld in r.fields.items():
            if key.startswith("GGUF."):
                continue
            want, got = fld.contents(), f.metadata[key]
            if isinstance(got, np.ndarray):
                np.testing.assert_array_equal(got, np.asarray(want))
            else:
                assert got == want and type(got) is type(want), key
        return f.version, len(f.metadata)


def test_synthetic_file_matches_ggufpy(tiny):
    version, n_keys = _same_as_ggufpy(tiny)
    assert version == 3 and n_keys >= 15


def test_api(tiny):
    with gguf.open(tiny) as f:
        assert f.architecture == "qwen3moe"
        assert f.metadata["qwen3moe.expert_count"] == 8
        info = f.tensors["blk.0.ffn_up_exps.weight"]
        assert info.shape == (8, 32, 64) and info.type == "Q8_0"
        assert info.nbytes == 8 * 32 * (64 // 32) * 34
        assert f.tensors["blk.1.attn_v.weight"].type == "F16"
        raw = f.raw("blk.0.ffn_up_exps.weight")
        assert raw.dtype == np.uint8 and raw.shape == (info.nbytes,)
        assert not raw.flags.writeable and not raw.flags.owndata  # a view of the read-only map
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            f.raw("nope")
    assert moert.gguf is gguf


def test_raw_views_outlive_close(tiny):
    f = gguf.open(tiny)
    raw = f.raw("token_embd.weight")
    expected = raw.copy()
    f.close()  # must not invalidate (or crash on) a view still in use
    np.testing.assert_array_equal(raw, expected)
    with pytest.raises(ValueError, match="closed"):
        f.raw("token_embd.weight")


def test_dequantize_matches_ggufpy(tiny):
    r = ggufpy.GGUFReader(tiny)
    with gguf.open(tiny) as f:
        for t in r.tensors:
            want = ggufpy.quants.dequantize(t.data, t.tensor_type).reshape(f.tensors[t.name].shape)
            got = f.dequantize(t.name)
            assert got.dtype == np.float32 and got.shape == f.tensors[t.name].shape
            np.testing.assert_array_equal(got, want.astype(np.float32))


def test_missing_file_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        gguf.open(tmp_path / "absent.gguf")


@pytest.mark.slow
def test_real_gemma_file_matches_ggufpy(gemma_path):
    # gguf-py's reading of it, from tests/reference/make_ggufpy_parse.py (GGUFReader itself takes ~25 s here)
    import hashlib
    import json
    from pathlib import Path

    from reference.make_ggufpy_parse import value_digest  # the fixture's own canonical form of a value

    ref = json.loads((Path(__file__).parent / "fixtures" / "gemma3" / "ggufpy_parse.json").read_text())
    with gguf.open(gemma_path) as f:
        assert f.version == 3 and [t["name"] for t in ref["tensors"]] == list(f.tensors)
        for t in ref["tensors"]:
            info = f.tensors[t["name"]]
            assert (info.type, list(info.shape), info.nbytes, info.offset) == (t["type"], t["shape"], t["nbytes"],
                                                                              t["offset"]), t["name"]
            assert hashlib.sha256(f.raw(t["name"]).tobytes()).hexdigest() == t["sha256"], t["name"]
        assert set(ref["metadata"]) == set(f.metadata)
        for key, digest in ref["metadata"].items():
            v = f.metadata[key]
            assert list(value_digest(v.tolist() if isinstance(v, np.ndarray) else v)) == digest, key
