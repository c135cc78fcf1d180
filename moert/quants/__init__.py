"""GGML quantization formats: the type table, NumPy/CuPy reference dequantizers, quantizers.

    dequantize(raw, type, shape, xp=numpy)  reference, one function per type (moert/quants/dequant.py)
    dequantize_fast(raw, type, shape)       Numba kernel when there is one (kernels/), else the reference
    quantize(x, type)                       float32 -> GGML blocks, for synthetic models (quantize.py)
    slice_rows / slice_expert               (bytes, shape) of a row range / one expert: a view

The runtime's base with moert/gguf.py: it imports moert.errors, NumPy and (for the fast path) moert.kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from moert.quants.dequant import (
    SUPPORTED,
    dequantize,
    dequantize_expert,
    dequantize_rows,
    slice_expert,
    slice_rows,
)
from moert.quants.quantize import QUANTIZABLE, quantize
from moert.quants.types import QK_K, TYPES, TYPES_BY_ID, GGMLType, ggml_type

__all__ = [
    "QK_K", "TYPES", "TYPES_BY_ID", "GGMLType", "ggml_type",
    "SUPPORTED", "QUANTIZABLE", "dequantize", "dequantize_fast", "dequantize_rows", "dequantize_expert",
    "slice_rows", "slice_expert", "quantize",
]


def dequantize_fast(raw: np.ndarray, ggml_type: str | GGMLType, shape: Sequence[int]) -> np.ndarray:
    """Dequantize on the CPU with moert.kernels (Numba) if the type has a kernel, else the reference."""
    from moert import kernels  # lazily: `import moert.quants` must not pull in Numba

    name = ggml_type.name if isinstance(ggml_type, GGMLType) else ggml_type
    if name in kernels.DEQUANT_TYPES:
        return kernels.dequantize(raw, name, shape)
    return dequantize(raw, name, shape)
