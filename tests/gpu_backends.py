"""The GPU backends a GPU test runs on: "sim" everywhere (so CI exercises the test's logic), "cupy" where CuPy
sees a CUDA device (skipped otherwise, the reason saying "no CUDA device: <why>"). tests/test_cuda*.py use it:

    @pytest.mark.parametrize("backend", BACKENDS)
    def test_x(backend): moert.load(path, gpu_backend=backend, ...); ... GPU[backend] ...
"""

from __future__ import annotations

import pytest

from moert.devices import cuda as _cuda

HAS_CUDA = _cuda.device_count() > 0
NO_CUDA = f"no CUDA device: {_cuda.why_unavailable()}"
BACKENDS = ["sim", pytest.param("cupy", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
GPU = {"sim": "sim:0", "cupy": "cuda:0"}         # the first GPU's name on each backend
