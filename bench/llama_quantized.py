"""The e2e benchmark's Qwen3-30B-A3B-shaped model as llama.cpp quantizes it (`bench/e2e.py --llama-quantized`).

Users run files llama.cpp's `llama-quantize` made, whose Q4_K_M mix (Q4_K, Q6_K for part of attn_v and
ffn_down, Q6_K output) is llama.cpp's choice, not moert's quantizer's: this writes the benchmark shapes as F16
(moert.testing.write_qwen3moe) and has llama-cpp-python's quantize API (a reference tool, outside the test
suite) make the Q4_K_M file from it.
"""

from __future__ import annotations

import time
from pathlib import Path

from common import MODEL_VERSION, SHAPES


def llama_quantized_path(layers: int, threads: int) -> Path:
    """The benchmark model's shapes as llama.cpp's own `llama-quantize` makes a Q4_K_M file (its Q4_K / Q6_K
    mix: Q6_K for part of attn_v and ffn_down, as real downloads are), through llama-cpp-python's quantize
    API from an F16 source (about 1.2 GB a layer, deleted after); built once into moert's cache dir."""
    import ctypes

    import llama_cpp

    from moert.demo import cache_dir
    from moert.testing import write_qwen3moe

    path = cache_dir() / f"bench-qwen3moe-a3b-shapes-L{layers}-llamacpp-q4_k_m-v{MODEL_VERSION}.gguf"
    if path.exists():
        return path
    src = path.with_suffix(".f16.tmp")
    print(f"building {path} ({layers} layers: F16 source, then llama.cpp's Q4_K_M) ...", flush=True)
    t0 = time.perf_counter()
    try:
        write_qwen3moe(src, n_layer=layers, **{**SHAPES, "qtype": "F16", "types": None})
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
        params.nthread = threads
        tmp = path.with_suffix(".tmp")
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize returned {rc} for {src}")
        tmp.replace(path)
    finally:
        src.unlink(missing_ok=True)
    print(f"built in {time.perf_counter() - t0:.0f} s, {path.stat().st_size / 1e9:.2f} GB", flush=True)
    return path
