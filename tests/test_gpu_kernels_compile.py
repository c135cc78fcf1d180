"""Every kernel of every GGML type in moert.kernels.gpu compiles to a cubin for sm_80 and sm_90 without a GPU
(triton.compile with a GPUTarget); ~80 s on two busy cores, hence slow. tests/test_gpu_kernels.py compiles a
subset and runs every kernel under Triton's interpreter."""

from __future__ import annotations

import pytest

pytest.importorskip("triton", reason="the GPU kernels are Triton sources: pip install triton (the dev extra has it)")

from test_gpu_kernels import COMPILES, _check_cubin  # noqa: E402

from moert.kernels.gpu import GPU_TYPES, aot  # noqa: E402


@COMPILES
@pytest.mark.slow
@pytest.mark.parametrize("cc", (80, 90))
@pytest.mark.parametrize("name", sorted(GPU_TYPES))
def test_all_kernels_compile(name, cc):
    for kernel, sig, const, warps in aot.specs(name) + aot.specs(name, x="fp16", tokens=8):
        _check_cubin(kernel, sig, const, cc, warps)                             # aligned shapes
        _check_cubin(kernel, sig, const, cc, warps, aligned=False)              # any shape
