"""`moert demo`: the main job on an embedded default, no download.

Writes (once) a small synthetic qwen3moe model quantized like a Q4_K_M file into the user cache,
then shows it the way a user would look at a real one: what is in it, and where each byte would go
with experts on the CPU and everything else on the GPU (`sim` when there is no CUDA device).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Qwen3-30B-A3B's layout, scaled down: Q4_K with Q6_K for attn_v and ffn_down, as llama.cpp's Q4_K_M.
DEMO_MODEL = dict(n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_expert=16, n_expert_used=4,
                  n_ff_exp=256, context_length=2048, qtype="Q4_K", types={r"attn_v|ffn_down": "Q6_K"}, seed=1234)
DEMO_VERSION = 2  # bump when DEMO_MODEL or the writer changes, so stale cached files are rebuilt


def cache_dir() -> Path:
    """$MOERT_CACHE, else $XDG_CACHE_HOME/moert, else ~/.cache/moert."""
    if os.environ.get("MOERT_CACHE"):
        return Path(os.environ["MOERT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moert"


def demo_model_path() -> Path:
    """The demo model, written on first use."""
    from moert.testing import write_qwen3moe

    path = cache_dir() / f"demo-qwen3moe-v{DEMO_VERSION}.gguf"
    if not path.exists():
        print(f"writing the demo model to {path} ...", file=sys.stderr, flush=True)
        from moert.testing import gpt2_vocab_metadata

        write_qwen3moe(path, vocab=gpt2_vocab_metadata(n_vocab=1024), **DEMO_MODEL)
    return path
