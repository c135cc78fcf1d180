"""Numba dequantization kernels against their reference twins and gguf-py, bit for bit."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_quants import assert_bits_equal, oracle, random_tensor

from moert import kernels
from moert.errors import UnsupportedTypeError
from moert.quants import TYPES, dequantize, dequantize_fast, quantize, slice_expert

FAST = sorted(kernels.DEQUANT_TYPES)


def test_fast_types():
    assert kernels.DEQUANT_TYPES == {"Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q5_0", "Q4_0", "F16", "BF16", "MXFP4"}


@pytest.mark.parametrize("name", FAST)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lead=st.lists(st.integers(1, 5), max_size=2), blocks=st.integers(1, 9), seed=st.integers(0, 2**32 - 1))
def test_kernel_matches_reference_and_gguf_py(name, lead, blocks, seed):
    shape = (*lead, blocks * TYPES[name].block_size)
    raw = random_tensor(name, shape, np.random.default_rng(seed))
    got = kernels.dequantize(raw, name, shape)
    assert_bits_equal(got, dequantize(raw, name, shape))
    assert_bits_equal(got, oracle(raw, name, shape))


@pytest.mark.parametrize("name", FAST)
def test_kernel_with_any_scale_bits(name):
    """Fully random bytes: subnormal, infinite and NaN fp16 scales, read-only input."""
    shape = (7, 3 * TYPES[name].block_size)
    raw = np.random.default_rng(2).integers(0, 256, (7, TYPES[name].row_bytes(shape[1])), dtype=np.uint8)
    raw.flags.writeable = False  # as a memory-mapped file gives it
    with np.errstate(all="ignore"):
        want = dequantize(raw, name, shape)
        np.testing.assert_array_equal(kernels.dequantize(raw, name, shape), want)


@pytest.mark.parametrize("name", FAST)
def test_block_rows_are_the_reference_rows(name):
    """dequantize_block_rows (a token's embedding rows, picked by fancy indexing: a writable copy) bit for bit."""
    shape = (9, 2 * TYPES[name].block_size)
    raw = random_tensor(name, shape, np.random.default_rng(3)).reshape(9, -1)   # (rows, row_bytes)
    ids = np.array([4, 0, 4, 8])
    assert_bits_equal(kernels.dequantize_block_rows(raw[ids], name), dequantize(raw, name, shape)[ids])


def test_fp16_table_is_numpy_conversion():
    """Every one of the 65536 fp16 patterns, NaN payloads included, converts as NumPy does."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = h.view(np.float16).astype(np.float32)
    assert_bits_equal(kernels.dequant.F16_TO_F32, want)
    assert_bits_equal(kernels.dequantize(h.view(np.uint8), "F16", (1 << 16,)), want)
    bf = (h.astype(np.uint32) << 16).view(np.float32)
    assert_bits_equal(kernels.dequantize(h.view(np.uint8), "BF16", (1 << 16,)), bf)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q5_0", "BF16"])
def test_rows_and_experts(name):
    t = TYPES[name]
    shape = (5, 3, 3 * max(t.block_size, 32))                             # (E, rows, cols)
    raw = random_tensor(name, shape, np.random.default_rng(11))
    full = dequantize(raw, name, shape)
    assert_bits_equal(kernels.dequantize_rows(raw, name, shape, 2, 13), full.reshape(15, -1)[2:13])
    out = np.empty(shape[1:], np.float32)
    for e in range(shape[0]):
        assert kernels.dequantize_expert(raw, name, shape, e, out=out) is out
        assert_bits_equal(out, full[e])


def test_expert_reads_only_its_bytes():
    """Expert e's kernel gets exactly e's byte range; poisoning the others changes nothing."""
    shape = (4, 6, 512)
    raw = quantize(np.random.default_rng(0).standard_normal(shape).astype(np.float32), "Q4_K")
    flat = raw.reshape(-1)
    per_expert = flat.nbytes // 4
    data, eshape = slice_expert(flat, "Q4_K", shape, 2)
    assert eshape == (6, 512) and data.nbytes == per_expert
    assert data.__array_interface__["data"][0] == flat.__array_interface__["data"][0] + 2 * per_expert
    want = kernels.dequantize_expert(flat, "Q4_K", shape, 2)
    poisoned = np.full_like(flat, 0xFF)
    poisoned[2 * per_expert:3 * per_expert] = flat[2 * per_expert:3 * per_expert]
    assert_bits_equal(kernels.dequantize_expert(poisoned, "Q4_K", shape, 2), want)


def test_out_and_errors():
    raw = random_tensor("Q8_0", (2, 64), np.random.default_rng(0))
    out = np.empty((2, 64), np.float32)
    assert kernels.dequantize(raw, "Q8_0", (2, 64), out=out) is out
    with pytest.raises(ValueError, match="out must be"):
        kernels.dequantize(raw, "Q8_0", (2, 64), out=np.empty((64, 2), np.float32))
    with pytest.raises(UnsupportedTypeError, match=r"moert.kernels cannot dequantize 'Q2_K'"):
        kernels.dequantize(np.zeros(84, np.uint8), "Q2_K", (256,))
    assert kernels.dequantize(np.zeros(0, np.uint8), "Q4_K", (0, 256)).shape == (0, 256)


def test_dequantize_fast_uses_the_kernel():
    raw = random_tensor("Q6_K", (3, 512), np.random.default_rng(5))
    assert_bits_equal(dequantize_fast(raw, TYPES["Q6_K"], (3, 512)), oracle(raw, "Q6_K", (3, 512)))


def test_import_quants_does_not_pull_numba():
    code = "import sys, moert.quants; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
