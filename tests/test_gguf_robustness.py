"""Hostile GGUF files: hand-made corruptions and a mutation fuzzer. Only GGUFError may escape.

The suite runs 2000 mutations (derandomized: the same ones every run); a long run:
    MOERT_FUZZ_EXAMPLES=50000 MOERT_FUZZ_RANDOM=1 pytest tests/test_gguf_robustness.py -k mutation
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moert import GGUFError, gguf
from moert.quants import SUPPORTED
from moert.testing import write_qwen3moe

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def u32kv(key: str, v: int) -> bytes:
    return kv(key, U32, struct.pack("<I", v))


def tinfo(name: str | bytes, ne: list[int], ttype: int = 0, offset: int = 0, n_dims: int | None = None) -> bytes:
    n_dims = len(ne) if n_dims is None else n_dims
    return s(name) + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", n) for n in ne) + \
        struct.pack("<IQ", ttype, offset)


def build(kvs=(), tensors=(), data=b"", version=3, n_tensors=None, n_kv=None, alignment=32) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % alignment)
    return body + data


def f32_tensor(name="t", n=8, offset=0):
    return tinfo(name, [n], 0, offset), np.arange(n, dtype=np.float32).tobytes()


def open_bytes(tmp_path, blob: bytes, name="f.gguf"):
    p = tmp_path / name
    p.write_bytes(blob)
    return gguf.open(p)


def test_builder_makes_valid_files(tmp_path):
    ti, data = f32_tensor()
    with open_bytes(tmp_path, build([u32kv("a.b", 7), kv("s", STR, s("héllo"))], [ti], data)) as f:
        assert f.metadata == {"a.b": 7, "s": "héllo"}
        np.testing.assert_array_equal(f.raw("t").view(np.float32), np.arange(8, dtype=np.float32))


ti8, data8 = f32_tensor()
CASES = {
    "empty file": b"",
    "short header": b"GGUF\x03\0\0\0",
    "bad magic": b"GGML" + build()[4:],
    "version 1": build(version=1),
    "version 4": build(version=4),
    "big-endian": b"GGUF" + struct.pack(">IQQ", 3, 0, 0),
    "huge tensor count": build(n_tensors=2**63),
    "huge kv count": build(n_kv=2**64 - 1),
    "huge key length": build([struct.pack("<Q", 2**63) + b"k"], n_kv=1),
    "huge string value": build([s("k") + struct.pack("<IQ", STR, 2**62)]),
    "huge array count": build([s("k") + struct.pack("<IIQ", ARR, U64, 2**61)]),
    "huge string array": build([s("k") + struct.pack("<IIQ", ARR, STR, 2**40)]),
    "array string length past end": build([s("k") + struct.pack("<IIQQ", ARR, STR, 1, 2**40)]),
    "unknown value type": build([kv("k", 13, b"\0" * 8)]),
    "unknown array element type": build([s("k") + struct.pack("<IIQ", ARR, 77, 0)]),
    "nested array": build([s("k") + struct.pack("<IIQ", ARR, ARR, 1) + struct.pack("<IQ", U8, 0)]),
    "bool of 2": build([kv("k", BOOL, b"\x02")]),
    "bool array of 3": build([s("k") + struct.pack("<IIQ", ARR, BOOL, 2) + b"\x01\x03"]),
    "invalid utf-8 key": build([kv(b"\xff\xfe", U8, b"\0")]),
    "invalid utf-8 value": build([kv("k", STR, s(b"ok\xc3"))]),
    "duplicate key": build([u32kv("k", 1), u32kv("k", 2)]),
    "alignment 0": build([u32kv("general.alignment", 0)]),
    "alignment 48": build([u32kv("general.alignment", 48)], alignment=48),
    "alignment as u64": build([kv("general.alignment", U64, struct.pack("<Q", 32))]),
    "alignment as string": build([kv("general.alignment", STR, s("32"))]),
    "n_dims 0": build(tensors=[tinfo("t", [], n_dims=0)], data=data8),
    "n_dims 5": build(tensors=[tinfo("t", [1, 1, 1, 1, 8])], data=data8),
    "n_dims huge": build(tensors=[tinfo("t", [8], n_dims=2**31)], data=data8),
    "zero dim": build(tensors=[tinfo("t", [8, 0])], data=data8),
    "overflowing dims": build(tensors=[tinfo("t", [2**32, 2**32, 2**32])], data=data8),
    "unknown type id 4": build(tensors=[tinfo("t", [32], ttype=4)], data=data8),
    "unknown type id 1000": build(tensors=[tinfo("t", [32], ttype=1000)], data=data8),
    "row not a block multiple": build(tensors=[tinfo("t", [48, 2], ttype=12)], data=b"\0" * 4096),
    "offset past end": build(tensors=[tinfo("t", [8], offset=1 << 40)], data=data8),
    "data truncated": build(tensors=[ti8], data=data8[:-1]),
    "misaligned offset": build(tensors=[tinfo("t", [2], offset=4)], data=data8),
    "duplicate tensor name": build(tensors=[tinfo("t", [2]), tinfo("t", [2], offset=32)], data=b"\0" * 64),
    "overlapping tensors": build(tensors=[tinfo("a", [16]), tinfo("b", [16], offset=32)], data=b"\0" * 96),
    "tensor name too long": build(tensors=[tinfo("x" * 64, [8])], data=data8),
    "tensor info truncated": build(tensors=[tinfo("t", [8])[:-3]], n_tensors=1)[:40],
}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_file_raises_gguf_error(tmp_path, case):
    with pytest.raises(GGUFError) as e:
        open_bytes(tmp_path, CASES[case])
    msg = str(e.value)
    assert "f.gguf" in msg and "offset" in msg or "alignment" in msg, msg  # says where


def test_error_messages_name_field_offset_and_expectation(tmp_path):
    with pytest.raises(GGUFError, match=r"tensor 't' n_dims at offset \d+: expected 1 to 4, got 5"):
        open_bytes(tmp_path, CASES["n_dims 5"])
    with pytest.raises(GGUFError, match=r"unknown GGML type id 1000"):
        open_bytes(tmp_path, CASES["unknown type id 1000"])
    with pytest.raises(GGUFError, match="big-endian"):
        open_bytes(tmp_path, CASES["big-endian"])
    with pytest.raises(GGUFError, match="duplicate key 'k'"):
        open_bytes(tmp_path, CASES["duplicate key"])


@pytest.fixture(scope="module")
def small_valid(tmp_path_factory):
    p = write_qwen3moe(tmp_path_factory.mktemp("v") / "v.gguf", n_layer=1, n_expert=4, n_embd=32,
                       n_head=2, n_head_kv=1, head_dim=16, n_ff_exp=32, n_vocab=32)
    blob = p.read_bytes()
    with gguf.open(p) as f:
        first_tensor_end = min(t.offset + t.nbytes for t in f.tensors.values())
        data_offset = f.data_offset
    return blob, data_offset, first_tensor_end


def test_truncation_at_every_byte_of_header_and_infos(tmp_path, small_valid):
    blob, data_offset, first_end = small_valid
    p = tmp_path / "cut.gguf"
    for cut in [*range(0, data_offset + 1), first_end - 1]:
        p.write_bytes(blob[:cut])
        with pytest.raises(GGUFError):
            gguf.open(p)


def _touch_everything(f):
    for name, t in f.tensors.items():
        raw = f.raw(name)
        assert raw.size == t.nbytes
        int(raw[-1]) if raw.size else None  # reading the last byte must never SIGBUS
        if t.type in SUPPORTED:  # garbage in: NaNs allowed, crashes not
            assert f.dequantize(name).shape == t.shape


@settings(max_examples=int(os.environ.get("MOERT_FUZZ_EXAMPLES", 2000)), deadline=2000,
          suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=not os.environ.get("MOERT_FUZZ_RANDOM"))
@given(data=st.data())
def test_mutation_fuzzer(tmp_path, small_valid, data):
    blob, data_offset, _ = small_valid
    b = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "u64", "u32", "cut", "insert", "delete"]))
        pos = data.draw(st.integers(0, min(len(b), data_offset + 64) - 1)) if len(b) else 0
        if kind == "flip" and b:
            b[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind in ("u64", "u32"):
            size = 8 if kind == "u64" else 4
            v = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, 0xFFFFFFFF00])) % (1 << (8 * size))
            b[pos:pos + size] = v.to_bytes(size, "little")
        elif kind == "cut":
            del b[pos:]
        elif kind == "insert":
            b[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del b[pos:pos + data.draw(st.integers(1, 16))]
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(bytes(b))
    try:
        f = gguf.open(p)
    except GGUFError:
        return
    with f:
        _touch_everything(f)
