"""Checks at the Python entry of every Numba kernel: a kernel indexes without bounds checks, so inputs
whose shapes, dtypes or ids do not fit together are refused here with a ShapeError, before any of it runs.

Cheap by design (shape tuples and, for expert ids, one min/max over T*K small ints): they run per token.
"""

from __future__ import annotations

import numpy as np

from moert.errors import ShapeError


def expect(fn: str, name: str, a: np.ndarray, shape: tuple[int | None, ...]) -> None:
    """ShapeError unless a's shape is `shape` (None: any size on that axis)."""
    s = getattr(a, "shape", None)
    if s is not None and len(s) == len(shape):
        for w, d in zip(shape, s):              # a plain loop: any() over a generator costs ~1 us a call,
            if w is not None and w != d:        # and this runs ~15 times per layer per token
                break
        else:
            return
    want = "(" + ", ".join("*" if w is None else str(w) for w in shape) + ("," if len(shape) == 1 else "") + ")"
    raise ShapeError(f"{fn}: {name} has shape {s}, expected {want}; nothing was computed")


def expert_ids(fn: str, ids: np.ndarray, weights: np.ndarray, n_tokens: int, n_expert: int) -> None:
    """ids (T, K) ints in [-1, n_expert) and weights (T, K), T = n_tokens, K >= 1; -1 marks a slot this call
    skips (its expert lives on another device)."""
    expect(fn, "ids", ids, (n_tokens, None))
    expect(fn, "weights", weights, ids.shape)
    if ids.shape[1] < 1 or ids.shape[1] > n_expert:
        raise ShapeError(f"{fn}: {ids.shape[1]} experts per token for {n_expert} experts; need 1..{n_expert}")
    if ids.size and (int(ids.min()) < -1 or int(ids.max()) >= n_expert):
        bad = int(ids.min()) if int(ids.min()) < -1 else int(ids.max())
        raise ShapeError(f"{fn}: expert id {bad} is outside [0, {n_expert}): the router and the expert tensors "
                         f"disagree on the number of experts; nothing was computed")


def position(fn: str, pos0: int, n_ctx: int) -> None:
    """0 <= pos0 < n_ctx: the cache row a token is written to."""
    if not 0 <= pos0 < n_ctx:
        raise ShapeError(f"{fn}: position {pos0} is outside the KV cache's {n_ctx} rows; nothing was computed")
