"""Well-formed GGUFs whose metadata lies about its types or sizes, and API arguments of the wrong kind: each is a
typed error naming the key or argument, never a TypeError, a MemoryError or a silent wrong answer."""

from __future__ import annotations

import re
import struct
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from semantic_fuzz import read_recipe, write_recipe

import moert
from moert import ArgumentError, GGUFError, PlacementError, TwinError, gguf, zoo
from moert.text.tokenizer import Tokenizer, TokenizerError

DEMO = Path(moert.__file__).parent / "data" / "demo-qwen3moe.gguf"     # a byte-level BPE vocabulary of 2,048+
BASE = Path(__file__).parent / "fixtures" / "qwen3moe" / "l2_e4_k2_gqa2_q4km.gguf"
U8, STR, ARR = 0, 8, 9


@pytest.fixture(scope="module")
def demo():
    r = read_recipe(DEMO)        # numeric arrays as lists, so gguf-py writes them back with their own types
    return replace(r, metadata={k: (t, v.tolist() if isinstance(v, np.ndarray) else v)
                                for k, (t, v) in r.metadata.items()})


def load(path):
    return moert.load(path, warmup=False, progress=False, gpu_layers=0, context_size=32)


# ------------------------------------------------------------------------------------------ tokenizer keys

@pytest.mark.parametrize("key, value, what", [
    ("tokenizer.ggml.tokens", ("UINT32", 5), r"'tokenizer.ggml.tokens' is an integer; llama.cpp reads it as "
                                             r"ARRAY\[STRING\]"),
    ("tokenizer.ggml.token_type", ("ARRAY", ["1"] * 2100), r"'tokenizer.ggml.token_type' is an ARRAY\[STRING\]; "
                                                          r"llama.cpp reads it as ARRAY\[INT32\]"),
    ("tokenizer.ggml.merges", ("ARRAY", [1, 2, 3]), r"'tokenizer.ggml.merges' is an ARRAY\[INT32\]; llama.cpp reads "
                                                    r"it as ARRAY\[STRING\]"),
    ("tokenizer.ggml.scores", ("ARRAY", ["0.5"] * 2100), r"'tokenizer.ggml.scores' is an ARRAY\[STRING\]; llama.cpp "
                                                         r"reads it as ARRAY\[FLOAT32\]"),
    ("tokenizer.ggml.scores", ("ARRAY", [1] * 2100), r"'tokenizer.ggml.scores' is an ARRAY\[INT32\]"),
    ("tokenizer.ggml.token_type", ("ARRAY", [True] * 2100), r"'tokenizer.ggml.token_type' is an ARRAY\[BOOL\]"),
    ("tokenizer.ggml.bos_token_id", ("STRING", "1"), r"'tokenizer.ggml.bos_token_id' is a STRING; llama.cpp reads "
                                                     r"it as UINT32"),
    ("tokenizer.ggml.add_bos_token", ("UINT8", 1), r"'tokenizer.ggml.add_bos_token' is an integer; llama.cpp reads "
                                                   r"it as BOOL"),
    ("tokenizer.ggml.model", ("ARRAY", ["gpt2"]), r"'tokenizer.ggml.model' is an ARRAY\[STRING\]; llama.cpp reads "
                                                  r"it as STRING"),
    ("tokenizer.chat_template", ("UINT32", 7), r"'tokenizer.chat_template' is an integer; llama.cpp reads it as "
                                               r"STRING"),
])
def test_a_tokenizer_key_of_the_wrong_type_is_named(tmp_path, demo, key, value, what):
    p = write_recipe(replace(demo, metadata={**demo.metadata, key: value}), tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=what) as e:         # refused at load, as llama.cpp refuses it
        load(p)
    assert isinstance(e.value, TokenizerError) and "re-convert" in str(e.value)
    with gguf.open(p) as f, pytest.raises(TokenizerError, match=what):
        Tokenizer.from_gguf(f.metadata)


def test_the_demo_vocabulary_passes_the_checks(tmp_path, demo):
    p = write_recipe(demo, tmp_path / "same.gguf")      # the rewrite itself keeps every type
    m = load(p)
    try:
        assert m.detokenize(m.tokenize("the expert")) == "the expert"
    finally:
        m.close()


# What llama.cpp's llama-vocab.cpp reads each key as (get_key<uint32_t|bool|std::string>, gguf_get_arr_data as
# float* / int*): written out here from llama.cpp, not taken from moert.
LLAMA_CPP_TYPES = {
    "tokenizer.ggml.model": "STRING", "tokenizer.ggml.pre": "STRING", "tokenizer.chat_template": "STRING",
    "tokenizer.chat_template.tool_use": "STRING",
    "tokenizer.ggml.tokens": "ARRAY[STRING]", "tokenizer.ggml.merges": "ARRAY[STRING]",
    "tokenizer.ggml.token_type": "ARRAY[INT32]", "tokenizer.ggml.scores": "ARRAY[FLOAT32]",
    "tokenizer.ggml.precompiled_charsmap": "ARRAY[UINT8]", "tokenizer.ggml.token_type_count": "UINT32",
    **{f"tokenizer.ggml.{n}_token_id": "UINT32" for n in (
        "bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "fim_pre", "fim_suf", "fim_mid",
        "fim_pad", "fim_rep", "fim_sep")},
    **{f"tokenizer.ggml.{n}": "BOOL" for n in (
        "add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix", "remove_extra_whitespaces")},
}
SAMPLES = {"STRING": "x", "UINT32": 3, "BOOL": True, "ARRAY[STRING]": ["a", "b"],
           "ARRAY[INT32]": np.array([1, 3], np.int32), "ARRAY[FLOAT32]": np.array([0.5, -1], np.float32),
           "ARRAY[UINT8]": np.array([1, 2], np.uint8)}


@pytest.mark.parametrize("key", list(LLAMA_CPP_TYPES))
def test_every_tokenizer_key_is_checked_against_llama_cpp(key):
    from moert.text import tokenizer_keys

    want = LLAMA_CPP_TYPES[key]
    tokenizer_keys.check({key: SAMPLES[want]})
    for other, value in SAMPLES.items():
        if other != want:
            with pytest.raises(tokenizer_keys.TokenizerKeyError, match=re.escape(f"{key!r}") + ".*reads it as "
                                                                     + re.escape(want) + "[.]"):
                tokenizer_keys.check({key: value})


# ------------------------------------------------------------------------------------- metadata array sizes

def sparse(tmp_path, arrays: list[tuple[int, int]], name="bomb.gguf") -> Path:
    """A GGUF whose metadata holds arrays of (element type, count), each all zeros: holes in a sparse file."""
    p = tmp_path / name
    with p.open("wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(arrays)))
        for i, (etype, n) in enumerate(arrays):
            f.write(struct.pack("<Q", 2) + f"k{i}".encode() + struct.pack("<IIQ", ARR, etype, n))
            f.seek(n * (8 if etype == STR else 1), 1)    # 2^31 empty strings: no disk, but 16 GiB of list
        f.truncate(f.tell())
    return p


@pytest.mark.parametrize("etype, n", [(STR, 2**31), (U8, 2**31), (STR, 2**24 + 1)])
def test_a_huge_metadata_array_is_refused_before_anything_is_built(tmp_path, etype, n):
    p = sparse(tmp_path, [(etype, n)])
    t0 = time.perf_counter()
    with pytest.raises(GGUFError, match=rf"value of 'k0' count at offset 42: {n:,} elements; moert reads at most "
                                        r"16,777,216 per metadata array"):
        gguf.open(p)
    assert time.perf_counter() - t0 < 1


def test_metadata_arrays_are_capped_in_total(tmp_path):
    with gguf.open(sparse(tmp_path, [(U8, 2**24), (U8, 2**24)], "two.gguf")) as f:   # at the cap: still read
        assert f.metadata["k1"].shape == (2**24,)
    with pytest.raises(GGUFError, match=r"value of 'k2' count .* 33,554,432 in all"):
        gguf.open(sparse(tmp_path, [(U8, 2**24), (U8, 2**24), (U8, 1)]))


# -------------------------------------------------------------------------------------------- arguments

@pytest.mark.parametrize("kwargs, what", [
    (dict(overrides=42), r"overrides=42: expected an -ot string"),
    (dict(overrides=[None]), r"overrides\[0\] = None: expected TensorOverride"),
    (dict(gpu_memory=float("nan")), r"gpu_memory=nan: invalid size nan: give a finite number of bytes"),
    (dict(gpu_memory=float("inf")), r"gpu_memory=inf: invalid size inf"),
    (dict(gpu_memory=["1GiB", float("-inf")]), r"gpu_memory=\['1GiB', -inf\]: invalid size -inf"),
    (dict(gpu_memory=np.float32("nan")), r"gpu_memory=.*nan.*: invalid size"),
])
def test_placement_arguments_of_the_wrong_kind(kwargs, what):
    with pytest.raises(PlacementError, match=what):
        moert.load(BASE, warmup=False, progress=False, gpu_backend="sim", context_size=32, **kwargs)


def test_overrides_as_a_pattern_device_dict():
    m = moert.load(BASE, warmup=False, progress=False, gpu_backend="sim", context_size=32,
                   overrides={r"\.ffn_.*_exps\.": "CPU"})
    try:
        assert m.plan.device_of("blk.1.ffn_up_exps.weight") == "cpu"
        assert m.plan.device_of("blk.1.attn_q.weight") != "cpu"
    finally:
        m.close()


@pytest.mark.parametrize("path, what", [(123, r"model path 123 is a int, not a str or Path"),
                                        ("a\0b.gguf", r"model path 'a\\x00b.gguf' contains a NUL byte"),
                                        (None, r"model path None is a NoneType")])
def test_a_path_that_is_not_a_path(path, what):
    with pytest.raises(ArgumentError, match=what):
        gguf.open(path)


def test_dequantize_on_a_twin_is_refused():
    with gguf.open(zoo.path("olmoe-1b-7b")) as f, pytest.raises(TwinError, match="model twin from moert.zoo"):
        f.dequantize("blk.0.ffn_up_exps.weight")


@pytest.mark.parametrize("path, what", [(123, r"model path 123 is a int"), ("a\0b", r"contains a NUL byte")])
def test_load_names_a_path_that_is_not_a_path(path, what):
    with pytest.raises(ArgumentError, match=what):
        moert.load(path)


def test_a_context_beyond_the_trained_one_is_honoured_with_a_warning():
    with pytest.warns(moert.ContextWarning, match=r"context_size=600 > the 512 tokens the model was trained for"):
        m = moert.load(BASE, warmup=False, progress=False, gpu_layers=0, context_size=600)
    try:
        assert m.context_size == 600
        m.forward([i % 255 + 1 for i in range(580)], last_only=True)      # past the trained 512: no error
        assert m.position == 580
    finally:
        m.close()
