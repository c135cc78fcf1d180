"""Shared pieces of the float matmul kernels (kernels/matmul.py): stack scratch, per-32 sums of x, and the
batch dots that multiply a dequantized block (in L1) with several tokens at once.

    stack_f32(n)                       a float32 array of literal length n on the caller's stack
    sums32(x), no_sums(x)              x (T, C) -> (T, C / 32) per-32 sums (Q4_K/Q5_K min terms), or (T, 1) zeros
    block_dot(buf, n, x, c0, acc)      acc[t] += buf[:n] . x[t, c0:c0+n], 4 tokens per pass
    block_dot2(u, v, n, x, c0, a0, a1) the same for two rows' blocks at once (each load of x feeds two FMAs)

All float32; fastmath lets LLVM reorder the sums into vector lanes (no nnan/ninf). Integers are explicit
int32 (I32): Numba widens int32 arithmetic to int64, and an int64 lane is half as many lanes.
Dimension legend: T tokens, C columns.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["FM", "I32", "PRANGE_ONLY", "Z0", "block_dot", "block_dot2", "no_sums", "stack_f32", "sums32"]

FM = {"reassoc", "contract"}    # let LLVM reorder float sums (vector lanes) and fuse mul+add; no nnan/ninf
# parallel= for every kernel with a parallel region (Numba's options): only explicit prange loops become parfors.
# With parallel=True every array expression and np.zeros in the function is a parfor too, each compiled as
# a gufunc of its own: seconds of first-run compile for work that is microseconds serially.
PRANGE_ONLY = dict(prange=True, numpy=False, comprehension=False, reduction=False, setitem=False,
                   stencil=False, fusion=False, inplace_binop=False)
I32 = np.int32
_FM = FM
# A zero to pass as a kernel's row or block bound. A literal 0 in a call makes Numba compile the callee once
# more for the type Literal[int](0) beside int64 (seconds each for a row kernel); np.int64(0) is an int64.
Z0 = np.int64(0)


@intrinsic
def _stack(typingctx, n, dtype):
    """A pointer to n elements of `dtype` on the stack of the calling function (n a literal)."""
    if not isinstance(n, types.IntegerLiteral):
        return None
    ty = dtype.dtype

    def codegen(context, builder, sig, args):
        return cgutils.alloca_once(builder, context.get_value_type(ty), size=n.literal_value)
    return types.CPointer(ty)(n, dtype), codegen


@njit(cache=True, inline="always")
def stack_f32(n):
    """A float32 array of literal length n on the stack: after unrolling, LLVM keeps it in registers."""
    return numba.carray(_stack(n, numba.float32), n)


@njit(cache=True, fastmath=_FM)
def sums32(x):
    """Per-32 sums of x (T, C) -> (T, C // 32): the Q4_K/Q5_K minimum terms are dmin*m_j * sum(x_j)."""
    T, C = x.shape
    s = np.zeros((T, C // 32), dtype=np.float32)
    for t in range(T):
        for j in range(C // 32):
            a = np.float32(0.0)
            for l in range(32):
                a += x[t, 32 * j + l]
            s[t, j] = a
    return s


@njit(cache=True, fastmath=_FM, inline="always")
def block_dot(buf, n, x, c0, acc):
    """acc[t] += buf[:n] . x[t, c0:c0+n] for every token t; 4 (then 2) tokens per pass share each weight load."""
    T = x.shape[0]
    t = 0
    while t + 4 <= T:
        x0, x1, x2, x3 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n], x[t + 2, c0:c0 + n], x[t + 3, c0:c0 + n]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        for l in range(n):
            v = buf[l]
            s0 += v * x0[l]
            s1 += v * x1[l]
            s2 += v * x2[l]
            s3 += v * x3[l]
        acc[t] += s0
        acc[t + 1] += s1
        acc[t + 2] += s2
        acc[t + 3] += s3
        t += 4
    if t + 2 <= T:                                      # 2 or 3 left: a pair, then maybe one
        x0, x1 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n]
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        for l in range(n):
            v = buf[l]
            s0 += v * x0[l]
            s1 += v * x1[l]
        acc[t] += s0
        acc[t + 1] += s1
        t += 2
    if t < T:
        xt = x[t, c0:c0 + n]
        s = np.float32(0.0)
        for l in range(n):
            s += buf[l] * xt[l]
        acc[t] += s


@njit(cache=True, fastmath=_FM, inline="always")
def block_dot2(u, v, n, x, c0, acc0, acc1):
    """acc0[t] += u[:n] . x[t, c0:c0+n] and acc1[t] += v[:n] . x[t, ...]: two rows' dequantized blocks at once,
    so each load of x feeds two FMAs (the batch kernels were bound by reloading x from L2 for every row:
    1.2-1.4x measured on Q4_K). 4 tokens per pass, then 2, then 1."""
    T = x.shape[0]
    t = 0
    while t + 4 <= T:
        x0, x1, x2, x3 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n], x[t + 2, c0:c0 + n], x[t + 3, c0:c0 + n]
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        a2 = np.float32(0.0)
        a3 = np.float32(0.0)
        b0 = np.float32(0.0)
        b1 = np.float32(0.0)
        b2 = np.float32(0.0)
        b3 = np.float32(0.0)
        for l in range(n):
            p, q = u[l], v[l]
            a0 += p * x0[l]
            a1 += p * x1[l]
            a2 += p * x2[l]
            a3 += p * x3[l]
            b0 += q * x0[l]
            b1 += q * x1[l]
            b2 += q * x2[l]
            b3 += q * x3[l]
        acc0[t] += a0
        acc0[t + 1] += a1
        acc0[t + 2] += a2
        acc0[t + 3] += a3
        acc1[t] += b0
        acc1[t + 1] += b1
        acc1[t + 2] += b2
        acc1[t + 3] += b3
        t += 4
    if t + 2 <= T:
        x0, x1 = x[t, c0:c0 + n], x[t + 1, c0:c0 + n]
        a0 = np.float32(0.0)
        a1 = np.float32(0.0)
        b0 = np.float32(0.0)
        b1 = np.float32(0.0)
        for l in range(n):
            p, q = u[l], v[l]
            a0 += p * x0[l]
            a1 += p * x1[l]
            b0 += q * x0[l]
            b1 += q * x1[l]
        acc0[t] += a0
        acc0[t + 1] += a1
        acc1[t] += b0
        acc1[t + 1] += b1
        t += 2
    if t < T:
        xt = x[t, c0:c0 + n]
        a0 = np.float32(0.0)
        b0 = np.float32(0.0)
        for l in range(n):
            a0 += u[l] * xt[l]
            b0 += v[l] * xt[l]
        acc0[t] += a0
        acc1[t] += b0


@njit(cache=True)
def no_sums(x):
    """The (T, 1) placeholder passed as `xs` for types whose kernels do not read it."""
    return np.zeros((x.shape[0], 1), dtype=np.float32)
