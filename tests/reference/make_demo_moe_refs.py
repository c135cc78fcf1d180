"""Fixtures for the demo model (moert/data/demo-qwen3moe.gguf): perplexities, tokens and greedy continuations.

    python tests/reference/make_demo_moe_refs.py [WORK]   # after train_demo_moe.py (its --work, default
                                                          # /tmp/moert-demo-train); llama.cpp if installed

Writes tests/fixtures/demo_moe/checks.json: the float torch model's held-out perplexity (from train.json),
moert's on the Q4_K_M file, llama.cpp's on the same file and windows (llama-cpp-python, when importable),
token ids of a few texts and greedy continuations of a few prompts by both engines, and two scored
windows with moert's and llama.cpp's NLL so tests/test_demo_moe.py can re-check moert without the stdlib.
The committed fixtures used llama-cpp-python 0.3.36's Python package and the libllama / libggml built from
its sdist (`pip install llama-cpp-python` compiles them first; they sit in llama_cpp/lib).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import versions  # noqa: E402
from train_demo_moe import ARCH, EVAL_TOKENS, FIXTURES, GGUF_PATH, corpus_files, eval_windows  # noqa: E402

TEXTS = ["import os\nimport sys\n", "def __init__(self, name, value=None):\n        self.name = name\n",
         "    for i in range(10):\n        print(i, 'done')\n", "class Foo(Bar):\n    \"\"\"A docstring.\"\"\"\n",
         "x = {'a': 1, \"b\": [2.5, -3e10]}  # comment\n\ttab\r\n"]
PROMPTS = ["import os\nimport sys\n\n\ndef ", "class Parser:\n    def __init__(self, ", "    for i in range(",
           "    if not isinstance(value, str):\n        raise "]
N_GREEDY = 16


def nll(logits: np.ndarray, ids: np.ndarray) -> float:
    """Sum over positions 1.. of -log p(ids[t] | ids[:t]) from logits (T, V)."""
    z = logits[:-1].astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-logp[np.arange(len(ids) - 1), ids[1:]].sum())


def moert_side(windows: np.ndarray) -> dict:
    import moert

    m = moert.load(str(GGUF_PATH), gpu_layers=0, context_size=ARCH["context_length"], progress=False)
    per = []
    for w in windows:
        m.reset()
        per.append(nll(m.forward(w), w))
    greedy = []
    for p in PROMPTS:
        m.reset()
        ids = m.tokenize(p)
        logits, out = m.forward(ids, last_only=True), []
        for _ in range(N_GREEDY):
            out.append(int(np.argmax(logits[-1])))
            logits = m.forward([out[-1]])
        greedy.append(out)
    return {"window_nll": per, "tokens": [m.tokenize(t) for t in TEXTS], "greedy": greedy}


def llama_side(windows: np.ndarray) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed: no llama.cpp fixtures", file=sys.stderr)
        return None
    llm = Llama(str(GGUF_PATH), n_ctx=ARCH["context_length"], n_batch=ARCH["context_length"], logits_all=True,
                n_threads=1, verbose=False, seed=0)
    per = []
    for w in windows:
        llm.reset()
        llm.eval(w.tolist())
        per.append(nll(np.asarray(llm.scores[:len(w)]), w))
    greedy = []
    for p in PROMPTS:
        llm.reset()
        ids, out = llm.tokenize(p.encode(), add_bos=False, special=False), []
        llm.eval(ids)
        for _ in range(N_GREEDY):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([out[-1]])
        greedy.append(out)
    return {"window_nll": per, "tokens": [llm.tokenize(t.encode(), add_bos=False, special=False) for t in TEXTS],
            "greedy": greedy}


def transformers_side(windows: np.ndarray, work: Path) -> dict | None:
    """HF Qwen3MoeForCausalLM in float32: on the Q4_K_M file's weights dequantized (NLL of the first two windows,
    as moert's), and on the float checkpoint (its logits against the training code's: the same math)."""
    try:
        import torch
        from make_qwen3moe_refs import hf_logits
        from train_demo_moe import MoE, export
    except ImportError as e:
        print(f"no transformers fixtures: {e}", file=sys.stderr)
        return None
    q4 = [nll(hf_logits(GGUF_PATH, w), w) for w in windows[:2]]
    ck = torch.load(work / "demo_moe.pt", weights_only=False)
    model = MoE(ck["arch"])
    model.load_state_dict(ck["state"])
    with torch.no_grad():
        ours = model(torch.from_numpy(windows[0][None]))[0][0].numpy()
    f32 = work / "demo-qwen3moe-f32.gguf"
    export(model, ck["arch"], ck["vocab"], f32, qtype="F32")
    hf = hf_logits(f32, windows[0])
    return {"window_nll_q4_k_m": q4, "float_logits_rel_error": float(np.linalg.norm(hf - ours) / np.linalg.norm(hf))}


def main() -> None:
    from moert import gguf
    from moert.text.tokenizer import Tokenizer

    with gguf.open(GGUF_PATH) as f:
        tok = Tokenizer(f.metadata)
    _, held = corpus_files()
    windows = eval_windows(tok, held, EVAL_TOKENS, ARCH["context_length"])
    n = windows.shape[0] * (windows.shape[1] - 1)
    train = json.loads((FIXTURES / "train.json").read_text())
    ours = moert_side(windows)
    llama = llama_side(windows)
    hf = transformers_side(windows, Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/moert-demo-train"))
    out = {"model": str(GGUF_PATH.relative_to(GGUF_PATH.parents[2])), "eval_tokens": int(windows.size),
           "scored_tokens": n, "float_perplexity": train["float_perplexity"],
           "moert_perplexity": round(math.exp(sum(ours["window_nll"]) / n), 4),
           "llama_cpp_perplexity": None if llama is None else round(math.exp(sum(llama["window_nll"]) / n), 4),
           "windows": windows[:2].tolist(),
           "windows_nll": {"moert": ours["window_nll"][:2], "llama_cpp": llama and llama["window_nll"][:2],
                           "transformers": hf and hf["window_nll_q4_k_m"]},
           "float_vs_transformers_rel_error": hf and hf["float_logits_rel_error"],
           "texts": TEXTS, "tokens": {"moert": ours["tokens"], "llama_cpp": llama and llama["tokens"]},
           "prompts": PROMPTS, "greedy": {"moert": ours["greedy"], "llama_cpp": llama and llama["greedy"]},
           "versions": versions()}
    (FIXTURES / "checks.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("float_perplexity", "moert_perplexity", "llama_cpp_perplexity")}))
    if llama:
        same = [a == b for a, b in zip(ours["greedy"], llama["greedy"])]
        print(f"tokens equal: {ours['tokens'] == llama['tokens']}; greedy equal per prompt: {same}")


if __name__ == "__main__":
    main()
