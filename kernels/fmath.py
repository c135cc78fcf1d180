"""Float primitives the CPU attention kernels share: 16-bit cache values read as float32, and the softmax's exp.

    as_f32(x)          a float32 as it is; a uint16 as the IEEE half its bits hold (an f16 cache)
    f32_of_bits(i)     the float32 whose bits are the int32 i (a bf16 value: its bits << 16)
    exp_neg(x)         e**x for x <= 0, vectorizable

Twins: NumPy's float16 -> float32 (tests/test_kv_types.py, all 65536 patterns) and np.exp (within 2 ulp,
tests/test_kernels_layers.py).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["as_f32", "exp_neg", "f32_of_bits"]

_FM = {"reassoc", "contract"}


@intrinsic
def as_f32(typingctx, x):
    """x as float32: a float32 as it is, a uint16 as the IEEE half whose bits it holds (an f16 KV cache, read
    through a uint16 view: Numba has no float16). LLVM vectorizes a loop of these into vcvtph2ps (F16C)."""
    if x == types.float32:
        return types.float32(x), lambda context, builder, sig, args: args[0]
    if x == types.uint16:
        def codegen(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
        return types.float32(x), codegen
    return None


@intrinsic
def f32_of_bits(typingctx, i):
    """The float32 whose IEEE bits are the int32 i."""
    if i != types.int32:
        return None
    return types.float32(i), lambda context, builder, sig, args: builder.bitcast(args[0], ir.FloatType())


@njit(cache=True, fastmath=_FM, inline="always")
def exp_neg(x):
    """e**x for x <= 0 (a softmax's shifted logits), within 2 ulp of np.exp down to e**-87 (below: e**-87, not 0;
    against a sum >= 1 no difference), as plain arithmetic LLVM vectorizes: n = round(x / ln 2), Cody-Waite
    r = x - n ln 2, Cephes' expf polynomial, times 2**n built from its bits. A loop of np.exp calls libm once an
    element (~5 ns: 2 us a layer of the demo model at position 100)."""
    x = max(x, np.float32(-87.0))
    n = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) - n * np.float32(-2.12194440e-4)
    y = ((((np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)) * r + np.float32(8.3334519073e-3)) * r
          + np.float32(4.1665795894e-2)) * r + np.float32(1.6666665459e-1)) * r + np.float32(5.0000001201e-1)
    y = y * (r * r) + r + np.float32(1.0)
    return y * f32_of_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
