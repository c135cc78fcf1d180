"""Tokenizer vs llama.cpp (ids and pieces from tests/reference/make_tokenizer_refs.py), vs a plain port of
llama.cpp's SentencePiece tokenizer, and its own rules: special tokens, BOS/EOS, streaming, errors."""

from __future__ import annotations

import copy
import heapq
import json
import random
from pathlib import Path

import numpy as np
import pytest

from moert import gguf
from moert.errors import MoertError
from moert.testing import gpt2_vocab_metadata
from moert.text.chat import render, resolve_template
from moert.text.tokenizer import PRE_TOKENIZERS, NoVocab, Tokenizer, TokenizerError

FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def gemma_md(gemma_path):
    return gguf.open(gemma_path).metadata


@pytest.fixture(scope="module")
def gemma(gemma_md):
    return Tokenizer.from_gguf(gemma_md)  # a few seconds: 262,144 tokens, ~515k merges derived from scores


def fixture_vocab(pre: str | None = None) -> dict:
    """The synthetic vocabulary the gpt2 fixtures were made with, as GGUF metadata."""
    v = load("gpt2-vocab.json")
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre or v["pre"],
            "tokenizer.ggml.tokens": v["tokens"], "tokenizer.ggml.token_type": np.array(v["token_type"], np.int32),
            "tokenizer.ggml.merges": v["merges"], "tokenizer.ggml.bos_token_id": v["bos"],
            "tokenizer.ggml.eos_token_id": v["eos"], "tokenizer.ggml.padding_token_id": v["pad"],
            "tokenizer.ggml.add_bos_token": False}


COMBOS = {"add_special+plain": (None, False), "plain": (False, False), "add_special+special": (None, True)}


def check_cases(tok: Tokenizer, texts: list[str], ref: dict) -> None:
    """Every text's ids (and pieces) as llama.cpp gave them; all mismatches reported at once."""
    bad, n = [], 0
    for combo, expected in ref["ids"].items():
        add_bos, special = COMBOS[combo]
        for text, want in zip(texts, expected, strict=True):
            n += 1
            got = tok.tokenize(text, add_bos=add_bos, special=special)
            if got != want:
                bad.append(f"{text!r} ({combo}):\n   moert     {got}\n   llama.cpp {want}")
    for text, ids, hexes in zip(texts, ref["ids"].get("add_special+special", []), ref.get("detok", []), strict=False):
        got = [b"".join(tok.piece(i, special) for i in ids).hex() for special in (False, True)]
        if got != hexes:
            bad.append(f"{text!r}: pieces {got} != llama.cpp {hexes}")
    assert not bad, f"{len(bad)} of {n} cases differ from llama.cpp:\n" + "\n".join(bad[:20])


def check_facts(tok: Tokenizer, facts: dict) -> None:
    assert tok.n_vocab == facts["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.eot_id) == (facts["bos"], facts["eos"], facts["eot"])
    assert (tok.add_bos, tok.add_eos) == (facts["add_bos"], facts["add_eos"])
    assert sorted(tok.eog_ids) == facts["eog"]


# -- the real Gemma-3 vocabulary --------------------------------------------------------------------------

def test_gemma_ids_and_pieces_match_llama_cpp(gemma):
    ref = load("gemma3.json")
    check_cases(gemma, ref["texts"], ref)
    check_facts(gemma, ref["facts"])
    assert int(np.sum(gemma.types == 3)) == ref["facts"]["n_control"]
    for i, plain, special in ref["pieces"]:
        assert (gemma.piece(i).hex(), gemma.piece(i, special=True).hex()) == (plain, special), i


def test_gemma_with_space_prefix_matches_llama_cpp(gemma):
    """add_space_prefix on: '▁' before text that starts the input or follows a special token, as llama.cpp."""
    ref = load("gemma3-space-prefix.json")
    tok = copy.copy(gemma)  # the same vocabulary as {**metadata, "tokenizer.ggml.add_space_prefix": True} builds
    tok.add_space_prefix = True
    check_cases(tok, ref["texts"], ref)


def spm_reference(tok: Tokenizer, scores: np.ndarray, text: str) -> list[int]:
    """llama.cpp's llm_tokenizer_spm_session.tokenize, ported line by line: the plain twin of the HF path."""
    ids, sym = tok._ids, list(text)
    size = [len(c.encode()) for c in sym]
    prev, nxt = list(range(-1, len(sym) - 1)), [*range(1, len(sym)), -1]
    queue = []  # best score first, then leftmost

    def try_add(left: int, right: int) -> None:
        if left != -1 and right != -1 and (t := ids.get(sym[left] + sym[right])) is not None:
            heapq.heappush(queue, (-float(scores[t]), left, right, size[left] + size[right]))

    for i in range(1, len(sym)):
        try_add(i - 1, i)
    while queue:
        _, left, right, n = heapq.heappop(queue)
        if size[left] == 0 or size[right] == 0 or size[left] + size[right] != n:
            continue  # one side was merged away since this pair was queued
        sym[left], size[left], sym[right], size[right] = sym[left] + sym[right], n, "", 0
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        try_add(prev[left], left)
        try_add(left, nxt[left])
    out, i = [], 0 if sym else -1
    while i != -1:
        out.extend([ids[sym[i]]] if sym[i] in ids else [ids[f"<0x{b:02X}>"] for b in sym[i].encode()])
        i = nxt[i]
    return out


def test_gemma_merges_equal_llama_cpp_spm_algorithm_on_random_text(gemma, gemma_md):
    scores = np.asarray(gemma_md["tokenizer.ggml.scores"])
    alphabet = [*"aaabbc   ==--..!!\t", "▁", "é", "中", "文", "😀", "ab", "the", "ing", " the", "  ", "<", ">", "eos",
                "<bos", "ſ", "\u0301", "\x00", "𝄞"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))).replace(" ", "▁")
        assert gemma._hf.encode(text, add_special_tokens=False).ids == spm_reference(gemma, scores, text), text


def test_gemma_special_tokens(gemma, gemma_md):
    text = "<start_of_turn>user\nHi<end_of_turn>\n"
    assert gemma.tokenize(text, special=True) == [2, 105, 2364, 107, 10979, 106, 107]
    plain = gemma.tokenize(text)  # control-token text is just text when special=False
    assert 105 not in plain and 106 not in plain and plain[0] == 2
    assert gemma.detokenize(plain) == text
    assert gemma.detokenize([2, 105, 2364], special=True) == "<bos><start_of_turn>user"
    assert gemma.detokenize([2, 105, 2364]) == "user"  # control tokens print nothing by default
    assert gemma.tokenize("\n\n", add_bos=False) == [108]  # user-defined tokens are always split out
    # <eos>, <end_of_turn> (found by its text), and </s> (user-defined in the file; llama.cpp makes it EOG too)
    assert gemma.eog_ids == {1, 106, 212} and gemma.eot_id == 106


def test_gemma_chat_template(gemma, gemma_md):
    assert "tokenizer.chat_template" not in gemma_md  # this file has none: the built-in Gemma template applies
    text = render(resolve_template(None, gemma), [{"role": "user", "content": "Hi"}], bos_token=gemma.bos_token)
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert gemma.tokenize(text, add_bos=False, special=True) == [2, 105, 2364, 107, 10979, 106, 107, 105, 4368, 107]


def test_gemma_streaming_holds_split_characters(gemma):
    text = "Music 𝄞 and runes ᚠᛇᚻ and \U000f0000 end"
    ids = gemma.tokenize(text, add_bos=False)
    assert any(gemma.types[i] == 6 for i in ids)  # some characters fall back to <0xXX> byte tokens
    dec = gemma.decoder()
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    dec = gemma.decoder()
    first_byte = next(i for i in ids if gemma.types[i] == 6)
    assert dec.push(first_byte) == "" and dec.flush() == "\ufffd"  # unfinished at the end: replaced


def test_out_of_range_ids_are_clear_errors(gemma):
    n = gemma.n_vocab
    for bad in (n, -1, 10**12):
        with pytest.raises(TokenizerError, match=f"out of range.*{n} tokens"):
            gemma.detokenize([5, bad])
    with pytest.raises(TokenizerError, match="integers"):
        gemma.piece("7")
    with pytest.raises(TokenizerError, match="takes a str"):
        gemma.tokenize(b"bytes")
    assert issubclass(TokenizerError, MoertError) and issubclass(TokenizerError, ValueError)


# -- the synthetic gpt2 (Qwen-style) vocabulary -------------------------------------------------------------

def test_gpt2_vocab_metadata_is_the_fixture_vocabulary():
    """gpt2_vocab_metadata() is deterministic and still writes what the llama.cpp fixtures were made from."""
    v, md = load("gpt2-vocab.json"), gpt2_vocab_metadata()
    assert md["tokenizer.ggml.tokens"] == v["tokens"] and md["tokenizer.ggml.merges"] == v["merges"], (
        "gpt2_vocab_metadata() changed (a different `tokenizers` version trains differently?): "
        "rerun tests/reference/make_tokenizer_refs.py")
    assert md["tokenizer.ggml.token_type"] == v["token_type"]
    assert (md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"]) == (v["bos"], v["eos"])
    assert len(md["tokenizer.ggml.tokens"]) == 1024
    assert len(gpt2_vocab_metadata(n_vocab=700)["tokenizer.ggml.tokens"]) == 700
    with pytest.raises(ValueError, match="n_vocab"):
        gpt2_vocab_metadata(n_vocab=100)


@pytest.mark.parametrize("pre", sorted(load("gpt2.json")["pres"]))
def test_gpt2_ids_and_pieces_match_llama_cpp(pre):
    ref = load("gpt2.json")
    tok = Tokenizer.from_gguf(fixture_vocab(pre))
    check_cases(tok, ref["texts"], ref["pres"][pre])
    check_facts(tok, ref["pres"][pre]["facts"])
    if "pieces" in ref and pre == "qwen2":
        for i, plain, special in ref["pieces"]:
            assert (tok.piece(i).hex(), tok.piece(i, special=True).hex()) == (plain, special), i


def test_required_pre_tokenizers_are_known_and_checked():
    checked = set(load("gpt2.json")["pres"])
    for pre in ("default", "llama-bpe", "qwen2", "deepseek-v3", "gpt-4o"):
        assert pre in PRE_TOKENIZERS and pre in checked


def test_gpt2_specials_bos_and_streaming():
    tok = Tokenizer.from_gguf(fixture_vocab())
    im_start, think = tok.token_id("<|im_start|>"), tok.token_id("<think>")
    assert tok.tokenize("<|im_start|>hi") != tok.tokenize("<|im_start|>hi", special=True)
    assert tok.tokenize("<|im_start|>hi", special=True)[0] == im_start
    assert tok.tokenize("a<think>b")[1] == think  # user-defined: split out even when special=False
    assert tok.detokenize([think]) == "<think>" and tok.detokenize([im_start]) == ""
    # add_bos: None = the vocabulary (no BOS here), True = always, False = never
    assert tok.tokenize("hi") == tok.tokenize("hi", add_bos=False) and tok.tokenize("hi", add_bos=True)[0] == tok.bos_id
    assert tok.eog_ids == {tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")}
    text = "naïve 中文 😀 done"
    dec = tok.decoder()
    pieces = [dec.push(i) for i in tok.tokenize(text)] + [dec.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def test_bad_vocabularies_are_clear_errors():
    md = fixture_vocab()
    with pytest.raises(TokenizerError, match="'bert' is not supported"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.model": "bert"})
    with pytest.raises(TokenizerError, match="pre = 'nonesuch' is not supported.*qwen2"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.pre": "nonesuch"})
    with pytest.raises(TokenizerError, match="'tokenizer.ggml.tokens'"):
        Tokenizer.from_gguf({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(TokenizerError, match="'tokenizer.ggml.merges'"):
        Tokenizer.from_gguf({k: v for k, v in md.items() if k != "tokenizer.ggml.merges"})
    with pytest.raises(TokenizerError, match="BOS token was asked for"):
        Tokenizer.from_gguf({**md, "tokenizer.ggml.bos_token_id": 10**6,
                             "tokenizer.ggml.tokens": md["tokenizer.ggml.tokens"][:11]}).tokenize("x", add_bos=True)
    assert isinstance(Tokenizer.from_gguf({"tokenizer.ggml.model": "none"}), NoVocab)
