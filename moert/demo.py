"""`moert demo`: the main job on the model that ships with moert, no download.

The model (moert/data/demo-qwen3moe.gguf) is a small qwen3moe (4 layers, 16 experts, top 2) that
tests/reference/train_demo_moe.py trained on Python's standard library and wrote in llama.cpp's Q4_K_M
layout with moert's own quantizer. The demo shows it the way a user would look at a real one: what is in
it, where each byte goes with experts on the CPU and the rest on the GPU (`sim` without CUDA), a
continuation of a Python prompt, what it cost, and which experts each kind of token goes to.
"""

from __future__ import annotations

import keyword
import os
from pathlib import Path

import numpy as np

from moert.errors import MoertError

DEMO_PROMPT = "import os\nimport sys\n\n\ndef main("

# A few lines of ordinary Python (written for this table, not from the training files) whose tokens are
# sorted into classes; `expert_table` shows where the router sends each class.
SAMPLE = '''\
import re
from collections import defaultdict


class Counter:
    """Count the words of a text."""

    def __init__(self, text, limit=100):
        self.words = defaultdict(int)
        for word in re.findall(r"[a-z]+", text.lower()):
            if len(word) > 2 and self.words[word] < limit:
                self.words[word] += 1

    def most_common(self, n=10):
        items = sorted(self.words.items(), key=lambda kv: -kv[1])
        return items[:n] if n else items


def main(path="words.txt", size=4096):
    with open(path, encoding="utf-8") as f:
        counts = Counter(f.read(size * 2))
    for word, n in counts.most_common(5):
        print(f"{word:>12} {n:5d}")
    return 0
'''
CLASSES = ("indentation", "keyword", "identifier", "string", "digits", "punctuation")


def cache_dir() -> Path:
    """$MOERT_CACHE, else $XDG_CACHE_HOME/moert, else ~/.cache/moert (benchmarks keep their models there)."""
    if os.environ.get("MOERT_CACHE"):
        return Path(os.environ["MOERT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moert"


def demo_model_path() -> Path:
    """The demo model shipped inside the package."""
    path = Path(__file__).resolve().parent / "data" / "demo-qwen3moe.gguf"
    if not path.is_file():
        raise MoertError(f"the demo model {path} is missing from this installation; reinstall moert "
                         f"(it is package data), or rebuild it with tests/reference/train_demo_moe.py")
    return path


def token_class(piece: str, in_string: bool) -> str:
    """The class of one token's text: indentation, keyword, identifier, string, digits or punctuation."""
    s = piece.strip()
    if in_string or s[:1] in ("'", '"') or s[-1:] in ("'", '"'):
        return "string"
    if not s:
        return "indentation"
    if keyword.iskeyword(s) or s in ("self", "True", "False", "None"):
        return "keyword"
    if s.isidentifier():
        return "identifier"
    if s.isdigit():
        return "digits"
    return "punctuation"


def classify(pieces: list[str]) -> list[str]:
    """A class per token, following string quotes across tokens (so a string's words count as string)."""
    out, quote = [], None
    for p in pieces:
        out.append(token_class(p, quote is not None))
        for ch in p:
            if quote is None and ch in "'\"":
                quote = ch
            elif ch == quote:
                quote = None
    return out


def expert_table(m, layer: int | None = None, text: str = SAMPLE, top: int = 3) -> str:
    """For each token class of `text`: how many tokens, and the experts of `layer` that got most of its picks."""
    from moert.explain import Recorder

    layer = m.config.n_layer - 1 if layer is None else layer
    ids = m.tokenize(text, add_bos=False)[:m.context_size]
    pieces = [m.detokenize([t]) for t in ids]
    m.reset()
    with Recorder(m) as rec:
        m.forward(ids, last_only=True)
    picks = rec.host(rec.layers[layer]["ids"]).astype(np.int64)                  # (T, K)
    cls = np.array(classify(pieces))
    E = m.config.n_expert
    lines = [f"which experts of layer {layer} each kind of token goes to ({len(ids)} tokens of a Python sample, "
             f"top {picks.shape[1]} of {E} per token; share of the class's picks):",
             f"  {'class':<12} {'tokens':>6}   top experts"]
    for c in CLASSES:
        rows = picks[cls == c]
        if not len(rows):
            continue
        n = np.bincount(rows.reshape(-1), minlength=E)
        best = np.argsort(-n, kind="stable")[:top]
        lines.append(f"  {c:<12} {len(rows):>6}   " + "  ".join(f"e{e:<2d} {n[e] / n.sum():4.0%}" for e in best))
    return "\n".join(lines)
