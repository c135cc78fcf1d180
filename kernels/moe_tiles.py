"""A float prompt's routed experts by sgemm: kernels/moe_fused.py's layer, each expert's weights dequantized a tile
at a time into float32 buffers and multiplied with all of the expert's tokens by np.dot.

    layer(g_type, d_type, rows_items, wrap)   moe_fused's layer kernel with this worker: same arguments, same
                                              results to float rounding; None where SciPy is missing

moe_fused plans the items (expert, part) and sums their outputs; this worker runs an item: its tokens' rows of x
gathered, then per TILE hidden units gate and up rows dequantized (exactly, kernels/dequant.py) and multiplied
(n, D) @ (D, TILE), the activation, and down's columns of those units dequantized and multiplied (n, TILE) @
(TILE, D) into the item's output rows. An expert with fewer than FEW tokens keeps moe_fused's row kernels (its
whole weights dequantized for one token would cost more than reading them once). Twin: moe_fused_ref;
tests/test_kernels_moe_tiles.py holds both to it and to moe_fused.

Dimension legend: n tokens of one expert, D hidden, F expert hidden, TILE hidden units a tile.
"""

from __future__ import annotations

import functools

import numpy as np

from moert.kernels import matmul_tiles
from moert.kernels.glu import act_mul
from moert.kernels.jit import variant
from moert.kernels.ktypes import TYPES

__all__ = ["FEW", "MIN_TOKENS", "TILE", "layer"]

MIN_TOKENS = 128     # a layer call of at least this many tokens (a prompt chunk) takes the tiles
FEW = 64             # an expert with fewer tokens than this keeps the row kernels (Q4_K/Q6_K, 768 x 2048, 2 shared
#                      cores, tiles over rows: 0.81x at 16 tokens, 0.91x at 32, 1.06x at 64, 1.23x at 128, 1.46x at 256)
TILE = 256           # hidden units a tile: gate and up (TILE, D), down (D, TILE) float32

# Bound per (gate/up type, down type) by `layer`: g_deq, d_deq (the types' dequantize kernels, serial),
# G_BYTES, G_BLOCK, D_BYTES (block bytes and weights), rows_items (moe_fused's worker for the same types).
g_deq = d_deq = rows_items = None
G_BYTES = G_BLOCK = D_BYTES = 0


def _tile_items(mine, offsets, slots, x, K, T, g_raw, g_f16, u_raw, u_f16, d_raw, d_f16, nb_in, nb_down,
                block_down, parts, act, gb, ub, Y):
    """moe_fused._moe_items' signature and results: one thread's items, each by dequantized tiles and sgemm."""
    F, D, C = g_raw.shape[1], d_raw.shape[1], x.shape[1]
    Fp = nb_down // parts * block_down                                  # hidden units of a part
    per_row = g_raw.shape[2] // G_BYTES                                 # blocks of a gate / up row
    tile = max(block_down, TILE // block_down * block_down)
    gt = np.empty((tile, C), dtype=np.float32)                          # (tile, D) gate or up rows
    dt = np.empty((D, tile), dtype=np.float32)                          # (D, tile) down's columns
    for j in range(mine.shape[0]):
        e, p = mine[j] // parts, mine[j] % parts
        o0, n = offsets[e], offsets[e + 1] - offsets[e]
        if n < FEW:
            rows_items(mine[j:j + 1], offsets, slots, x, K, T, g_raw, g_f16, u_raw, u_f16, d_raw, d_f16, nb_in,
                       nb_down, block_down, parts, act, gb, ub, Y)
            continue
        xe = np.empty((n, C), dtype=np.float32)                         # (n, D) this expert's tokens
        for i in range(n):
            src = slots[o0 + i] // K
            for c in range(C):
                xe[i, c] = x[src, c]
        f0, f1 = p * Fp, (p + 1) * Fp
        g = np.zeros((n, F), dtype=np.float32)                          # (n, F), columns [f0, f1) used
        u = np.zeros((n, F), dtype=np.float32)
        for a in range(f0, f1, tile):
            m = min(f1, a + tile) - a
            for w_raw, w_f16, out in ((g_raw, g_f16, g), (u_raw, u_f16, u)):
                g_deq(w_raw[e, a:a + m].reshape(m * per_row, G_BYTES), gt[:m].reshape(m * per_row, G_BLOCK), w_f16)
                y = np.dot(xe, gt[:m].T)                                # (n, m) sgemm
                for i in range(n):
                    for c in range(m):
                        out[i, a + c] = y[i, c]
        act_mul(g, u, f0, f1, act, gb, ub, e)                           # h = act(g + bg, u + bu), in g
        ye = Y[p, o0:o0 + n]                                            # (n, D), zeros from the layer
        for a in range(f0, f1, tile):
            m = min(f1, a + tile) - a
            dm = dt.reshape(D * tile)[:D * m].reshape(D, m)             # (D, m), contiguous: np.dot takes it
            for k in range(m // block_down):                            # down's blocks over these columns
                c = a // block_down + k
                d_deq(d_raw[e, :, c * D_BYTES:(c + 1) * D_BYTES], dm[:, k * block_down:(k + 1) * block_down], d_f16)
            h = np.empty((n, m), dtype=np.float32)
            for i in range(n):
                for c in range(m):
                    h[i, c] = g[i, a + c]
            y = np.dot(h, dm.T)                                         # (n, D) sgemm
            for i in range(n):
                for c in range(D):
                    ye[i, c] += y[i, c]


@functools.cache
def layer(g_type: str, d_type: str, rows_items, wrap):
    """The tiled layer kernel for gate/up of g_type and down of d_type (moe_fused.layer_kernel's arguments), made on
    first use, or None (no SciPy, or a type without a dequantize kernel). rows_items: moe_fused's float worker for
    these types (the few-token experts'); wrap(items, name): moe_fused's layer around a worker."""
    g, d = TYPES[g_type], TYPES[d_type]
    if matmul_tiles.tiled(g_type) is None or matmul_tiles.tiled(d_type) is None:
        return None
    name = f"{g_type.lower()}_{d_type.lower()}"
    items = variant(_tile_items, f"moe_tile_items_{name}", fastmath={"reassoc", "contract"},
                    g_deq=matmul_tiles.serial_dequant(g_type), d_deq=matmul_tiles.serial_dequant(d_type),
                    G_BYTES=g.block_bytes, G_BLOCK=g.block, D_BYTES=d.block_bytes, rows_items=rows_items)
    return wrap(items, f"moe_tile_layer_{name}")
