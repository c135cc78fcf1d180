"""Text <-> token ids from a GGUF's `tokenizer.ggml.*` keys, token for token as llama.cpp does it.

    text --split out special tokens--> fragments: raw text | token id        (llama.cpp's tokenizer_st_partition)
         --each raw fragment-->  'llama' (SentencePiece): ' ' -> '▁', pairs merged by score, byte fallback <0xXX>
                                 'gpt2'  (byte-level BPE): pre-tokenizer regexes (tokenizer.ggml.pre), merges by rank
         --> ids, with BOS / EOS as tokenizer.ggml.add_bos_token / add_eos_token say

The merging is HF `tokenizers`' BPE model; the rest (special-token splitting, ▁ handling, which
tokens are control or end-of-generation, token -> bytes) follows llama.cpp's src/llama-vocab.cpp.
A SentencePiece vocabulary has scores, not merges: every split of a token into two tokens becomes a
merge, ranked by the token's score, which is what llama.cpp's llm_tokenizer_spm does with its queue.

Checked against llama.cpp (tests/fixtures/tokenizer, made by tests/reference/make_tokenizer_refs.py).
Known differences, none seen on the test corpora: pairs whose merged tokens have *equal* scores are taken
in rank order, where llama.cpp takes the leftmost; llama.cpp's per-model lstrip/rstrip token attributes
(jina, phi-3, modern-bert, by model name) are not applied; `detokenize` joins token pieces as llama.cpp's
token_to_piece gives them (what llama-cli prints), without llama_detokenize's clean-up of spaces.
"""

from __future__ import annotations

import codecs
import operator
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from moert.errors import TokenizerError
from moert.text import tokenizer_keys

MAX_TOKEN_CHARS = 1024   # longest token accepted (Gemma 3's longest is 31 characters)


# tokenizer.ggml.token_type values (llama.h, LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# Pre-tokenizer regexes by tokenizer.ggml.pre, verbatim from llama.cpp's llama-vocab.cpp (llm_tokenizer_bpe);
# each regex splits the pieces the previous one made. The C++ literals are valid Python literals as they are.
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
           "|\\s+(?!\\S)|\\s+")
_QWEN2 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
          "|\\s+(?!\\S)|\\s+")
_QWEN35 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_GPT4O = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + _CONTRACTIONS + "?"
          "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" + _CONTRACTIONS + "?"
          "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2, "\\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "llama3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
    "gpt4o": (_GPT4O,),
    "deepseek-v3": (
        "\\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "deepseek-coder": ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"),
    "starcoder": ("\\p{N}", _GPT2),
    "falcon": ("[\\p{P}\\$\\+<=>\\^~\\|`]+", _GPT2, "[0-9][0-9][0-9]"),
}
# tokenizer.ggml.pre name -> (regex family, ignore_merges, default add_bos), as llama-vocab.cpp maps them
PRE_TOKENIZERS: dict[str, tuple[str, bool, bool]] = {
    "default": ("default", False, False),
    **{n: ("gpt2", False, False) for n in ("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "trillion")},
    **{n: ("llama3", True, True) for n in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral")},
    **{n: ("llama3", False, False) for n in ("dbrx", "smaug-bpe", "chatglm-bpe")},
    **{n: ("qwen2", False, False) for n in ("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan")},
    "qwen35": ("qwen35", False, False),
    **{n: ("gpt4o", False, False) for n in ("gpt-4o", "llama4", "minimax-m2")},
    **{n: ("deepseek-v3", False, False) for n in ("deepseek-v3", "hunyuan-dense")},
    "deepseek-coder": ("deepseek-coder", False, False),
    **{n: ("starcoder", False, False) for n in ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone")},
    "falcon": ("falcon", False, False),
}

# llama.cpp finds end-of-turn / end-of-generation tokens by their text (llama-vocab.cpp, "auto-detect special
# tokens by text"); such a token becomes a control token even if the file says otherwise.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
              "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOG_TEXTS = frozenset(_EOT_TEXTS + ("<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "<|eom_id|>", "[EOS]",
                                     "<eos>", "<turn|>", "<|tool_response>", "[e~["))

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-in for each byte (the ByteLevel alphabet), inverted: char -> byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars)}


def spm_merges(tokens: Sequence[str], scores: np.ndarray) -> list[tuple[str, str]]:
    """SentencePiece scores as BPE merges: every (a, b) with a, b, a+b all tokens, best score of a+b first."""
    vocab = set(tokens)
    # highest score first; equal scores keep (token id, split point) order (llama.cpp takes the leftmost pair)
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    merges = []
    for i in order.tolist():
        t = tokens[i]
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                merges.append((t[:k], t[k:]))
    return merges


def _key(md: Mapping[str, object], key: str, default=None, required: bool = False):
    if key in md:
        return md[key]
    if required:
        raise TokenizerError(f"GGUF metadata has no {key!r}; the file has no usable vocabulary. "
                             f"Re-convert the model with llama.cpp's convert_hf_to_gguf.py.")
    return default


class NoVocab:
    """The vocabulary of a model stored without one (tokenizer.ggml.model = 'none'): it runs from token ids."""

    has_vocab = False
    bos_id = eos_id = eot_id = None
    eog_ids: frozenset[int] = frozenset()
    chat_template = None

    def __init__(self, n_vocab: int | None = None):
        self.n_vocab = n_vocab

    def _fail(self, what: str):
        raise TokenizerError(f"cannot {what}: this model has no vocabulary (tokenizer.ggml.model = 'none'). "
                             f"Give the prompt as token ids, or use a GGUF that includes its tokenizer.")

    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Always fails: there is no vocabulary to turn text into ids."""
        self._fail("tokenize text")

    def detokenize(self, ids: Iterable[int], special: bool = False) -> str:
        """Always fails: there is no vocabulary to turn ids into text."""
        self._fail("turn token ids into text")

    def __repr__(self) -> str:
        return f"NoVocab(n_vocab={self.n_vocab})"


class Tokenizer:
    """A GGUF vocabulary: `tokenize`, `detokenize`, `piece`, and a streaming `decoder`."""

    has_vocab = True

    def __init__(self, md: Mapping[str, object]):
        tokenizer_keys.check(md)
        self.model = _key(md, "tokenizer.ggml.model", required=True)
        if self.model not in ("llama", "gpt2"):
            raise TokenizerError(f"tokenizer.ggml.model = {self.model!r} is not supported; moert reads 'llama' "
                                 f"(SentencePiece) and 'gpt2' (byte-level BPE) vocabularies, and 'none'.")
        self.tokens: list[str] = list(_key(md, "tokenizer.ggml.tokens", required=True))
        n = self.n_vocab = len(self.tokens)
        longest = max(range(n), key=lambda i: len(self.tokens[i]), default=None)
        if longest is not None and len(self.tokens[longest]) > MAX_TOKEN_CHARS:
            raise TokenizerError(f"token {longest} of tokenizer.ggml.tokens is {len(self.tokens[longest]):,} "
                                 f"characters long; real vocabularies stay under {MAX_TOKEN_CHARS} (the cost of "
                                 f"building the merges and of tokenizing grows with it): a corrupt or hostile file.")
        types = _key(md, "tokenizer.ggml.token_type")
        self.types = np.full(n, NORMAL, np.int32) if types is None else np.array(types, np.int32)
        if len(self.types) < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(self.types)} entries for {n} tokens; "
                                 f"the file is inconsistent, re-convert it.")
        self.types = self.types[:n]
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self.chat_template: str | None = _key(md, "tokenizer.chat_template")

        def special_id(name: str, default: int | None) -> int | None:
            """tokenizer.ggml.{name}_token_id if in range, else the default if in range (llama.cpp's rule)."""
            v = _key(md, f"tokenizer.ggml.{name}_token_id")
            if v is not None and 0 <= int(v) < n:
                return int(v)
            return default if default is not None and 0 <= default < n else None

        if self.model == "llama":
            self.pre = "default"
            default_bos, default_eos, default_unk = 1, 2, 0  # llama.cpp's SentencePiece defaults
            default_add_bos, default_space = True, True
        else:
            self.pre = _key(md, "tokenizer.ggml.pre", "default")
            if self.pre not in PRE_TOKENIZERS:
                raise TokenizerError(f"tokenizer.ggml.pre = {self.pre!r} is not supported; moert knows "
                                     f"{', '.join(sorted(PRE_TOKENIZERS))}.")
            default_bos = default_eos = 11 if n > 11 else None  # llama.cpp's gpt2 defaults
            default_unk, default_add_bos, default_space = None, PRE_TOKENIZERS[self.pre][2], False
        self.bos_id = special_id("bos", default_bos)
        self.eos_id = special_id("eos", default_eos)
        self.unk_id = special_id("unknown", default_unk)
        self.add_bos: bool = _key(md, "tokenizer.ggml.add_bos_token", default_add_bos)
        self.add_eos: bool = _key(md, "tokenizer.ggml.add_eos_token", False)
        self.add_space_prefix: bool = _key(md, "tokenizer.ggml.add_space_prefix", default_space)

        # end of turn / end of generation, by key and by text, as llama.cpp decides them
        # (llama.cpp takes the first EOT-looking token its hash map yields; we take them in _EOT_TEXTS order,
        # which gives what llama.cpp reports for Llama-3, Qwen and Gemma)
        self.eot_id = special_id("eot", None)
        if self.eot_id is None:
            self.eot_id = next((self._ids[t] for t in _EOT_TEXTS if t in self._ids), None)
        eog = set()
        for t in _EOG_TEXTS:
            if t in self._ids:
                eog.add(self._ids[t])
                self.types[self._ids[t]] = CONTROL
        eog.update(i for i in (self.eos_id, self.eot_id, special_id("eom", None)) if i is not None)
        # ...and llama.cpp's two exceptions: gpt-oss's <|end|> ends a message, not the generation; and where
        # <|tool_response> marks turns, </s> is an ordinary token
        texts = {self.tokens[i]: i for i in eog}
        if "<|end|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts) and (
                "<|return|>" in texts or "<|flush|>" in texts):
            eog.discard(texts["<|end|>"])
            self.types[texts["<|end|>"]] = USER_DEFINED
        if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
            eog.discard(texts["</s>"])
            self.types[texts["</s>"]] = NORMAL
        self.eog_ids = frozenset(eog)

        # special tokens are split out of the text first, longest first (control/unknown ones only when special=True)
        spec = np.flatnonzero(np.isin(self.types, (CONTROL, USER_DEFINED, UNKNOWN)))
        self._specials = sorted(((self.tokens[i], int(i), self.types[i] != USER_DEFINED) for i in spec),
                                key=lambda s: -len(s[0].encode()))
        self._byte_decoder = _gpt2_byte_decoder() if self.model == "gpt2" else None
        self._hf = self._build_hf(md)

    @classmethod
    def from_gguf(cls, md: Mapping[str, object]) -> Tokenizer | NoVocab:
        """The vocabulary in a GGUF's metadata; `NoVocab` when tokenizer.ggml.model is 'none'."""
        tokenizer_keys.check(md)
        if _key(md, "tokenizer.ggml.model") in ("none", "no_vocab"):
            arch = md.get("general.architecture")
            n = md.get(f"{arch}.vocab_size")
            return NoVocab(int(n) if n is not None else None)
        return cls(md)

    def _build_hf(self, md: Mapping[str, object]):
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        if self.model == "llama":
            scores = _key(md, "tokenizer.ggml.scores")
            scores = np.zeros(self.n_vocab, np.float32) if scores is None else np.asarray(scores)[: self.n_vocab]
            bpe = models.BPE(self._ids, spm_merges(self.tokens, scores), byte_fallback=True)
            return Tokenizer(bpe)
        merges = []
        for m in _key(md, "tokenizer.ggml.merges", required=True):
            p = m.find(" ", 1)
            a, b = m[:p], m[p + 1:]
            if p > 0 and a in self._ids and b in self._ids and a + b in self._ids:
                merges.append((a, b))
        family, ignore_merges, _ = PRE_TOKENIZERS[self.pre]
        tok = Tokenizer(models.BPE(self._ids, merges, ignore_merges=ignore_merges))
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE_REGEXES[family]]
        tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                                                        use_regex=False)])
        return tok

    # -- text -> ids --------------------------------------------------------------------------------------

    def split_special(self, text: str, special: bool = False) -> list[str | int]:
        """Text -> raw-text fragments and special-token ids (user-defined tokens always, control ones if special)."""
        frags: list[str | int] = [text] if text else []
        for tok_text, tid, is_control in self._specials:
            if (is_control and not special) or tok_text not in text:
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok_text not in f:
                    out.append(f)
                    continue
                for j, part in enumerate(f.split(tok_text)):
                    if j:
                        out.append(tid)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def tokenize(self, text: str, add_bos: bool | None = None, special: bool = False) -> list[int]:
        """Text -> ids. add_bos None: as the vocabulary says (BOS, and EOS if add_eos_token); False: neither."""
        if not isinstance(text, str):
            raise TokenizerError(f"tokenize() takes a str, got {type(text).__name__}")
        want_bos = self.add_bos if add_bos is None else bool(add_bos)
        want_eos = self.add_eos and add_bos is not False
        ids: list[int] = []
        if want_bos:
            if self.bos_id is None:
                raise TokenizerError("a BOS token was asked for but this vocabulary has none "
                                     "(no tokenizer.ggml.bos_token_id); call tokenize(..., add_bos=False).")
            ids.append(self.bos_id)
        prev_special = True  # SentencePiece puts '▁' before text that starts the input or follows a special token
        for f in self.split_special(text, special):
            if isinstance(f, int):
                ids.append(f)
                prev_special = True
                continue
            if self.model == "llama":
                f = ("▁" if self.add_space_prefix and prev_special else "") + f.replace(" ", "▁")
            # encode_batch releases the GIL (encode holds it): a server's other threads run meanwhile
            ids.extend(self._hf.encode_batch([f], add_special_tokens=False)[0].ids)
            prev_special = False
        if want_eos:
            if self.eos_id is None:
                raise TokenizerError("the vocabulary asks for EOS (add_eos_token) but has no eos_token_id; "
                                     "call tokenize(..., add_bos=False).")
            ids.append(self.eos_id)
        return ids

    # -- ids -> text --------------------------------------------------------------------------------------

    def _check(self, token_id) -> int:
        try:
            i = operator.index(token_id)
        except TypeError:
            raise TokenizerError(f"token ids are integers, got {token_id!r}") from None
        if not 0 <= i < self.n_vocab:
            raise TokenizerError(f"token id {i} is out of range: the vocabulary has {self.n_vocab} tokens "
                                 f"(ids 0..{self.n_vocab - 1}).")
        return i

    def piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes one token stands for (llama_token_to_piece); control tokens are empty unless special."""
        i = self._check(token_id)
        kind, text = self.types[i], self.tokens[i]
        if kind in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if kind == USER_DEFINED:
            return text.encode()
        if kind == BYTE:
            m = _BYTE_TOKEN.fullmatch(text)
            return bytes([int(m.group(1), 16)]) if m else text.encode()
        if kind != NORMAL:
            return b""  # unused / undefined tokens print nothing
        if self._byte_decoder is None:
            return text.replace("▁", " ").encode()
        bd = self._byte_decoder
        return b"".join(bytes([bd[c]]) if c in bd else c.encode() for c in text)

    def detokenize(self, ids: Iterable[int], special: bool = False) -> str:
        """Ids -> text: the pieces joined (what llama.cpp prints); broken UTF-8 becomes U+FFFD."""
        return b"".join(self.piece(i, special) for i in ids).decode("utf-8", errors="replace")

    def decoder(self, special: bool = False) -> StreamDecoder:
        """A streaming detokenizer: push ids one at a time, get text only once its UTF-8 is complete."""
        return StreamDecoder(self, special)

    def token_text(self, token_id: int) -> str:
        """The token as the vocabulary spells it (`<start_of_turn>`, `▁Hello`, `<0x0A>`)."""
        return self.tokens[self._check(token_id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled `text` exactly, or None."""
        return self._ids.get(text)

    @property
    def bos_token(self) -> str:
        return "" if self.bos_id is None else self.tokens[self.bos_id]

    @property
    def eos_token(self) -> str:
        return "" if self.eos_id is None else self.tokens[self.eos_id]

    def __repr__(self) -> str:
        return (f"Tokenizer({self.model!r}, pre={self.pre!r}, n_vocab={self.n_vocab}, bos={self.bos_id}, "
                f"eos={self.eos_id}, eog={sorted(self.eog_ids)})")


class StreamDecoder:
    """Token ids in, text out, holding back a UTF-8 sequence that a byte token left unfinished."""

    def __init__(self, tokenizer: Tokenizer, special: bool = False):
        self._tokenizer, self._special = tokenizer, special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (maybe '')."""
        return self._utf8.decode(self._tokenizer.piece(token_id, self._special))

    def flush(self) -> str:
        """End of stream: whatever is still held, an unfinished sequence as U+FFFD."""
        return self._utf8.decode(b"", final=True)
