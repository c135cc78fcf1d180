"""Every kernel of every GGML type in moert.kernels.gpu compiles to a cubin for sm_80 and sm_90 without a GPU
(triton.compile with a GPUTarget), and the attention kernels for each KV cache type; ~80 s and ~130 s on
two busy cores, hence slow. tests/test_gpu_kernels.py and tests/test_gpu_attention.py compile a subset and run
every kernel under Triton's interpreter."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the GPU kernels are Triton sources: pip install triton (the dev extra has it)")

from test_gpu_kernels import COMPILES, _check_cubin  # noqa: E402

from moert.kernels.gpu import GPU_TYPES, aot, attn  # noqa: E402


@COMPILES
@pytest.mark.slow
@pytest.mark.parametrize("cc", (80, 90))
@pytest.mark.parametrize("name", sorted(GPU_TYPES))
def test_all_kernels_compile(name, cc):
    for kernel, sig, const, warps in aot.specs(name) + aot.specs(name, x="fp16", tokens=8):
        _check_cubin(kernel, sig, const, cc, warps)                             # aligned shapes
        _check_cubin(kernel, sig, const, cc, warps, aligned=False)              # any shape


@COMPILES
@pytest.mark.slow
@pytest.mark.parametrize("cc", (80, 90))
@pytest.mark.parametrize("kv", attn.KV_CODES)
def test_attention_kernels_compile(kv, cc):
    """Attention over each cache type (its V in the same type, and q8_0 beside f16): one token of a 4:1 group of 128
    dims with a window, 8 tokens of an 8:1 group of 64 (64 rows), one of a 2:1 group of 256 with sinks; prompts of
    64 tokens over 128 dims (window, sinks) and 256."""
    shapes = [dict(T=1, G=4, Dh=128, window=True), dict(T=8, G=8, Dh=64), dict(T=1, G=2, Dh=256, sinks=True),
              dict(T=64, G=4, Dh=128, window=True, sinks=True), dict(T=64, G=2, Dh=256)]
    todo = [c for sh in shapes for c in attn.specs(kv, **sh)] + attn.specs(kv, "q8_0" if kv == "f16" else "f16")
    for kernel, sig, const, warps in todo:
        _check_cubin(kernel, sig, const, cc, warps)
        _check_cubin(kernel, sig, const, cc, warps, aligned=False)


@COMPILES
@pytest.mark.slow
@pytest.mark.parametrize("cc", (80, 90))
@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_wide_head_attention_compiles(kv, cc):
    """MLA's heads (deepseek2: 576 dims of keys, 512 of values, 16 query heads on one KV head): decode (1 and 8
    tokens) and a 64-token prompt."""
    todo = [c for t in (1, 8, 64) for c in attn.specs(kv, T=t, G=16, Dh=576, Dv=512)[:-2]]
    for kernel, sig, const, warps in todo:
        _check_cubin(kernel, sig, const, cc, warps)
