"""GGML quantization formats: the type table, NumPy/CuPy reference dequantizers, quantizers."""

from moert.quants.types import QK_K, TYPES, TYPES_BY_ID, GGMLType, ggml_type

__all__ = ["QK_K", "TYPES", "TYPES_BY_ID", "GGMLType", "ggml_type"]
