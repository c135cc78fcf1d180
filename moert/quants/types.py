"""The GGML tensor types: id as stored in GGUF, name as GGML spells it, block size and bytes per block."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGMLType:
    id: int          # the value stored in a GGUF tensor info
    name: str        # exactly as GGML spells it: "Q4_K", "BF16", ...
    block_size: int  # elements per block (1 for plain types)
    type_size: int   # bytes per block

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of n elements (n must be a multiple of block_size)."""
        return n // self.block_size * self.type_size


QK_K = 256  # super-block size of the k-quants

# From ggml.h's `enum ggml_type` and ggml.c's type_traits (Q8_1 is 36 bytes: two fp16 + 32 int8;
# gguf-py still lists an older 40). Ids 4, 5, 31-33 and 36-38 were removed from GGML.
_TABLE = [
    (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22), (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 36),
    (10, "Q2_K", QK_K, 84), (11, "Q3_K", QK_K, 110), (12, "Q4_K", QK_K, 144), (13, "Q5_K", QK_K, 176),
    (14, "Q6_K", QK_K, 210), (15, "Q8_K", QK_K, 292), (16, "IQ2_XXS", QK_K, 66), (17, "IQ2_XS", QK_K, 74),
    (18, "IQ3_XXS", QK_K, 98), (19, "IQ1_S", QK_K, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", QK_K, 110),
    (22, "IQ2_S", QK_K, 82), (23, "IQ4_XS", QK_K, 136), (24, "I8", 1, 1), (25, "I16", 1, 2),
    (26, "I32", 1, 4), (27, "I64", 1, 8), (28, "F64", 1, 8), (29, "IQ1_M", QK_K, 56),
    (30, "BF16", 1, 2), (34, "TQ1_0", QK_K, 54), (35, "TQ2_0", QK_K, 66), (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36), (41, "Q1_0", 128, 18),
]

TYPES_BY_ID: dict[int, GGMLType] = {i: GGMLType(i, n, b, s) for i, n, b, s in _TABLE}
TYPES: dict[str, GGMLType] = {t.name: t for t in TYPES_BY_ID.values()}


def ggml_type(name_or_id: str | int) -> GGMLType:
    """Look up a GGML type by name ("Q4_K") or id (12); KeyError names the valid ones."""
    table = TYPES_BY_ID if isinstance(name_or_id, int) else TYPES
    try:
        return table[name_or_id]
    except KeyError:
        raise KeyError(f"unknown GGML type {name_or_id!r}; known: {', '.join(TYPES)}") from None
