"""The gated activation of the fused expert layer (kernels/moe_fused.py), vectorized.

    act_mul(g, u, f0, f1, act, gb, ub, e)   in place: g[:, f0:f1] = act(g + gb[e], u + ub[e]); Numba
    tanh_fast(x) / tanh_fast_ref(x)         tanh as a rational function, Numba / its NumPy twin

moert.activations.glu is the math (its twin: moe_fused_ref calls it); act codes are moert.activations.ACTS' order.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from moert.activations import OAI_ALPHA, OAI_LIMIT

__all__ = ["TANH_CLAMP", "act_mul", "tanh_fast", "tanh_fast_ref"]

# tanh as one rational function of x (Eigen's generic_fast_tanh_float: odd degree-13 over even degree-6,
# x clamped to +-7.9053, where it reaches 1.0f): only multiplies, adds, a divide and a clamp, so LLVM turns
# act_mul's loop into AVX2 vectors, where np.tanh is a libm call per element (no SVML): for
# a pp64 layer's 512 x 768 SwiGLU, one thread, 3.4 -> 0.1 ms. Within 4e-7 of tanh (tests/test_kernels_moe_fused.py).
TANH_CLAMP = 7.90531110763549805
TANH_P = (4.89352455891786e-03, 6.37261928875436e-04, 1.48572235717979e-05, 5.12229709037114e-08,
          -8.60467152213735e-11, 2.00018790482477e-13, -2.76076847742355e-16)     # x, x^3, ..., x^13
TANH_Q = (4.89352518554385e-03, 2.26843463243900e-03, 1.18534705686654e-04, 1.19825839466702e-06)   # 1, .., x^6


@njit(cache=True, fastmath={"contract"}, inline="always", error_model="numpy")
def tanh_fast(x):
    """tanh(x) for float32 x by the rational approximation above (branch-free; x itself for |x| < 4e-4)."""
    c = np.float32(TANH_CLAMP)
    v = min(max(x, -c), c)
    v2 = v * v
    p = np.float32(TANH_P[6]) * v2 + np.float32(TANH_P[5])
    p = (((p * v2 + np.float32(TANH_P[4])) * v2 + np.float32(TANH_P[3])) * v2 + np.float32(TANH_P[2])) * v2 \
        + np.float32(TANH_P[1])
    p = p * v2 + np.float32(TANH_P[0])
    q = ((np.float32(TANH_Q[3]) * v2 + np.float32(TANH_Q[2])) * v2 + np.float32(TANH_Q[1])) * v2 + np.float32(TANH_Q[0])
    return x if abs(x) < np.float32(0.0004) else v * p / q


def tanh_fast_ref(x: np.ndarray) -> np.ndarray:
    """NumPy twin of tanh_fast (same polynomial, same order of operations, float32)."""
    x = np.asarray(x, dtype=np.float32)
    v = np.clip(x, np.float32(-TANH_CLAMP), np.float32(TANH_CLAMP))
    v2 = v * v
    p = np.full_like(v, np.float32(TANH_P[6]))
    for k in range(5, -1, -1):
        p = p * v2 + np.float32(TANH_P[k])
    q = np.full_like(v, np.float32(TANH_Q[3]))
    for k in range(2, -1, -1):
        q = q * v2 + np.float32(TANH_Q[k])
    return np.where(np.abs(x) < np.float32(0.0004), x, v * p / q).astype(np.float32)


# error_model="numpy": a float divide without the ZeroDivisionError check, whose branch kept the loop scalar;
# not inlined, so that holds whatever flags its caller compiles with.
@njit(cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
def act_mul(g, u, f0, f1, act, gb, ub, e):
    """g[:, f0:f1] = act(g + gb[e], u + ub[e]) there (no bias when gb is (0, 0)); moert.activations.glu's math,
    sigmoids through tanh as moert.activations.silu, tanh by tanh_fast. One loop per case, each vectorized."""
    half, one = np.float32(0.5), np.float32(1.0)
    for i in range(g.shape[0]):
        gi, ui = g[i, f0:f1], u[i, f0:f1]                               # 1-D contiguous views: vector loops
        if gb.shape[1] > 0:
            gi += gb[e, f0:f1]
            ui += ub[e, f0:f1]
        if act == 0:                                                    # swiglu
            for j in range(gi.shape[0]):
                v = gi[j]
                gi[j] = v * (half * (one + tanh_fast(half * v))) * ui[j]
        elif act == 1:                                                  # geglu (gelu, tanh approximation)
            c = np.float32(0.7978845608028654)
            for j in range(gi.shape[0]):
                v = gi[j]
                gi[j] = half * v * (one + tanh_fast(c * (v + np.float32(0.044715) * v * v * v))) * ui[j]
        else:                                                           # swiglu_oai (gpt-oss)
            for j in range(gi.shape[0]):
                v = min(gi[j], np.float32(OAI_LIMIT))
                w = min(max(ui[j], np.float32(-OAI_LIMIT)), np.float32(OAI_LIMIT))
                a = np.float32(OAI_ALPHA) * v
                gi[j] = v * (half * (one + tanh_fast(half * a))) * (w + one)
