"""The host side of the GPU kernels: shapes checked, buffers made, the kernel picked and run (see __init__).

Dimension legend: T tokens, N rows (output features), K columns (input features); MoE: E experts, KS experts per
token, D model width, F expert hidden.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from moert.activations import ACTS, glu
from moert.errors import ShapeError, UnsupportedTypeError
from moert.quants.dequant import dequantize as ref_dequantize
from moert.quants.types import TYPES as GGML_TYPES

from . import launch
from .table import CHUNK, DECODE_MAX_T, GPU_TYPES, GpuType

BACKENDS = ("twin", "interpret", "cuda")


def gpu_type(qtype: str | GpuType) -> GpuType:
    """The GPU table entry of a GGML type name (a GpuType passes as it is: a configuration to try), or
    UnsupportedTypeError naming the types there are."""
    if isinstance(qtype, GpuType):
        return qtype
    name = getattr(qtype, "name", qtype)
    if name not in GPU_TYPES:
        raise UnsupportedTypeError(f"no GPU kernel reads {name!r}; kernels/gpu has {', '.join(GPU_TYPES)}. "
                                   f"Keep that tensor on the CPU, or requantize it to one of those.")
    return GPU_TYPES[name]


def _is_cupy(a) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


def backend_of(w, backend: str | None) -> str:
    """"cuda" for a CuPy array; on NumPy arrays `backend`, by default "twin" (the NumPy reference: a simulated
    device runs whole models, and the interpreter takes ~1 s per 64 x 2048 matvec), or "interpret"."""
    if _is_cupy(w):
        if backend not in (None, "cuda"):
            raise ValueError(f"backend {backend!r} on a CuPy array: only 'cuda' runs there")
        return "cuda"
    backend = backend or "twin"
    if backend not in BACKENDS[:2]:
        raise ValueError(f"backend {backend!r} on NumPy arrays; one of {', '.join(BACKENDS[:2])}")
    return backend


def _check_weight(w, g: GpuType, shape: Sequence[int], what: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    t = GGML_TYPES[g.name]
    if shape[-1] % t.block_size:
        raise ShapeError(f"{what}: {g.name} rows of {shape[-1]} weights are not whole {t.block_size}-blocks; "
                         f"pass the shape in NumPy order (GGUF ne reversed)")
    want = int(np.prod(shape)) // t.block_size * t.type_size
    if w.nbytes != want:
        raise ShapeError(f"{what}: {g.name} {shape} is {want:,} bytes, the array holds {w.nbytes:,}; "
                         f"pass the tensor's raw GGUF bytes")
    return shape


def _x2d(x, k: int, what: str):
    if x.ndim != 2 or x.shape[1] != k:
        raise ShapeError(f"{what}: x must be (T, {k}), got {tuple(x.shape)}")
    if x.dtype not in (np.float32, np.float16):
        raise ShapeError(f"{what}: x must be float32 or float16, got {x.dtype}")
    return x


def _u8(w):
    """The weight's bytes as a flat uint8 array (a view)."""
    return w.reshape(-1).view(np.uint8) if w.dtype != np.uint8 else w.reshape(-1)


# ------------------------------------------------------------------------------------------------ twins

def matmul_ref(w, qtype: str, shape: Sequence[int], x) -> np.ndarray:
    """The NumPy twin of matvec/matmul: (T, N) float32 = x @ dequantize(w).T, float64 accumulation."""
    wf = ref_dequantize(np.asarray(w), qtype, shape).astype(np.float64)
    return (np.asarray(x, dtype=np.float64) @ wf.T).astype(np.float32)


def moe_ref(x, ids, weights, gate, up, down, qtype: str, shapes, act: str = "swiglu", biases=None) -> np.ndarray:
    """The NumPy twin of moe: a plain loop over tokens and their experts (vLLM keeps the same oracle)."""
    d_out = shapes[2][1]
    wg, wu = (ref_dequantize(np.asarray(a), qtype, shapes[0]).astype(np.float64) for a in (gate, up))
    wd = ref_dequantize(np.asarray(down), qtype, shapes[2]).astype(np.float64)
    out = np.zeros((x.shape[0], d_out), dtype=np.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            g, u = wg[e] @ x[t].astype(np.float64), wu[e] @ x[t].astype(np.float64)
            if biases is not None:
                g, u = g + biases[0][e], u + biases[1][e]
            y = wd[e] @ glu(g.astype(np.float32), u.astype(np.float32), act).astype(np.float64)
            out[t] += float(weights[t, k]) * (y if biases is None else y + biases[2][e])
    return out.astype(np.float32)


# ----------------------------------------------------------------------------------------------- launches

def _device(a=None) -> tuple[int, int]:
    """(id, compute capability as 80 / 90) of the device holding CuPy array a (CuPy's current device for None)."""
    import cupy

    d = cupy.cuda.Device(a.device.id) if getattr(a, "device", None) is not None else cupy.cuda.Device()
    return d.id, int(d.compute_capability)


def _on(device: int):
    """A context in which CuPy's current device is `device` (the launch goes to its context and stream)."""
    import cupy

    return cupy.cuda.Device(device)


@functools.cache
def _compiled(name: str, sig: tuple, constexprs: tuple, capability: int, warps: int, aligned: frozenset):
    """One (kernel, signature, constexprs, capability) compiled to a cubin: once per process (and Triton's disk
    cache across processes)."""
    return launch.compile_cubin(name, dict(sig), dict(constexprs), capability, warps, aligned=aligned)


@functools.cache
def _launcher(key: tuple, device: int):
    """The cubin of `key` (_compiled's arguments) loaded on one device: a CUDA module belongs to the context of
    the device it was loaded on, so each GPU loads its own."""
    return launch.CupyLauncher(_compiled(*key))


_TY = {np.dtype(np.float32): "*fp32", np.dtype(np.float16): "*fp16", np.dtype(np.int32): "*i32",
       np.dtype(np.uint8): "*u8"}


def run(name: str, grid: tuple[int, ...], args: dict, constexprs: dict, warps: int, backend: str, stream=None):
    """Run kernel `name` with `args` (its runtime arguments in order, by name): interpreted on NumPy arrays, or
    compiled for this GPU and launched with CuPy. Arguments divisible by 16 (pointers, ints) are compiled as such,
    as Triton's own JIT specializes them."""
    if backend == "interpret":
        launch.interpret(name, grid, list(args.values()), constexprs)
        return
    sig, aligned = [], set()
    for k, v in args.items():
        if hasattr(v, "data") and hasattr(v, "dtype") and getattr(v, "ndim", 0) >= 1:
            sig.append((k, _TY[np.dtype(v.dtype)]))
            if v.data.ptr % 16 == 0:
                aligned.add(k)
        elif isinstance(v, float):
            sig.append((k, "fp32"))
        else:
            sig.append((k, "i64" if abs(int(v)) >= 2**31 else "i32"))
            if int(v) % 16 == 0 and k not in ("T", "KS"):    # counts that change per call: not specialized
                aligned.add(k)
    device, capability = _device(next(v for v in args.values() if hasattr(v, "data")))
    key = (name, tuple(sig), tuple(sorted(constexprs.items())), capability, warps, frozenset(aligned))
    with _on(device):                     # the arrays' device, whichever is current
        _launcher(key, device)(grid, list(args.values()), stream=stream)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _xp(a):
    if _is_cupy(a):
        import cupy

        return cupy
    return np


# ------------------------------------------------------------------------------------------------- public

def matvec(w, qtype: str, shape: Sequence[int], x, out=None, stream=None, backend: str | None = None):
    """out (T, N) float32 = x (T, K) @ W.T for T <= 8, W (N, K) of GGML type qtype as its raw GGUF bytes."""
    g = gpu_type(qtype)
    n, k = _check_weight(w, g, shape, "matvec")
    x = _x2d(x, k, "matvec")
    if x.shape[0] > DECODE_MAX_T:
        raise ShapeError(f"matvec takes up to {DECODE_MAX_T} tokens, got {x.shape[0]}; call matmul, which tiles")
    return _matmul(w, g, n, k, x, out, stream, backend_of(w, backend), tiled=False)


def matmul(w, qtype: str, shape: Sequence[int], x, out=None, stream=None, backend: str | None = None):
    """out (T, N) float32 = x (T, K) @ W.T for any T: the matvec kernel up to 8 tokens, the tiled one beyond."""
    g = gpu_type(qtype)
    n, k = _check_weight(w, g, shape, "matmul")
    x = _x2d(x, k, "matmul")
    return _matmul(w, g, n, k, x, out, stream, backend_of(w, backend), tiled=x.shape[0] > DECODE_MAX_T)


def _matmul(w, g: GpuType, n: int, k: int, x, out, stream, backend: str, tiled: bool):
    xp, t = _xp(w), x.shape[0]
    if out is None:
        out = xp.empty((t, n), dtype=np.float32)
    elif tuple(out.shape) != (t, n) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ShapeError(f"out must be a C-contiguous float32 ({t}, {n}), got {out.dtype} {tuple(out.shape)}")
    if t == 0 or n == 0:
        return out
    if backend == "twin":
        out[...] = matmul_ref(w, g.name, (n, k), x)
        return out
    x = xp.ascontiguousarray(x)
    args = dict(w_ptr=_u8(w), x_ptr=x, out_ptr=out, N=n, K=k, T=t, row_bytes=GGML_TYPES[g.name].row_bytes(k),
                stride_x=k, stride_o=n)
    if tiled:
        grid = (_cdiv(n, g.tile_n), _cdiv(t, g.tile_m))
        run(g.tiled, grid, args, g.tiled_constexprs(), g.tile_warps, backend, stream)
    else:
        tp = 1 << (t - 1).bit_length()                                    # tokens rounded up to a power of 2
        run(g.matvec, (_cdiv(n, g.rows),), args, dict(g.decode_constexprs(), TP=tp), g.warps,
            backend, stream)
    return out


def dequantize(w, qtype: str, shape: Sequence[int], dtype=np.float16, stream=None, backend: str | None = None):
    """W (N, K) dequantized to float16 (or float32) on the device: the generic prompt path's first half."""
    g = gpu_type(qtype)
    n, k = _check_weight(w, g, (int(np.prod(shape[:-1])), shape[-1]), "dequantize")
    backend = backend_of(w, backend)
    if backend == "twin":
        return ref_dequantize(w, g.name, (n, k)).astype(dtype)
    y = _xp(w).empty((n, k), dtype=dtype)
    f16 = np.dtype(dtype) == np.float16
    r = g.rows * g.chunks                                                # as many tile rows as a decode step
    run(g.dequant, (_cdiv(n, r), _cdiv(k, CHUNK)), dict(w_ptr=_u8(w), y_ptr=y, N=n, K=k,
        row_bytes=GGML_TYPES[g.name].row_bytes(k)), dict(QT=g.qt, R=r, S=g.sub, L=g.lanes, F16=f16), g.warps,
        backend, stream)
    return y


def gemm_f16(wf16, x, out=None, stream=None, backend: str | None = None):
    """out (T, N) float32 = x (T, K) @ W.T for W (N, K) float16 (dequantize's output): tl.dot, f32 accumulation."""
    n, k = wf16.shape
    x = _x2d(x, k, "gemm_f16")
    backend = backend_of(wf16, backend)
    t = x.shape[0]
    out = _xp(wf16).empty((t, n), dtype=np.float32) if out is None else out
    if backend == "twin":
        out[...] = (x.astype(np.float32) @ wf16.astype(np.float32).T)
        return out
    bm, bn, bk = 32, 64, 64
    run("gemm_kernel", (_cdiv(n, bn), _cdiv(t, bm)), dict(w_ptr=wf16, x_ptr=_xp(x).ascontiguousarray(x), out_ptr=out,
        N=n, K=k, T=t, stride_x=k, stride_o=n), dict(BM=bm, BN=bn, BK=bk), 4, backend, stream)
    return out


def moe(x, ids, weights, gate, up, down, qtype: str, shapes, act: str = "swiglu", biases=None, out=None,
        work=None, stream=None, backend: str | None = None):
    """The routed experts of one layer in two launches, expert ids and weights read on the device:
    out (T, D) float32 = sum_k weights[t, k] down[e](glu(gate[e] x[t], up[e] x[t])), e = ids[t, k].

    x (T, D) float32/float16; ids (T, KS) int32; weights (T, KS) float32; gate, up, down raw GGUF bytes of one
    type `qtype`, shapes ((E, F, D), (E, F, D), (E, D, F)) in NumPy order; act one of moert.activations.ACTS;
    biases None or (bg (E, F), bu (E, F), bd (E, D)) float32 (gpt-oss); ids must be < E (on the device they are
    not checked: reading them would cost a sync). With `out` (T, D) and `work` (T * KS, F)
    float32 given, a call allocates nothing, so a CUDA graph can capture it. Beyond 8 tokens (a prompt) the tokens
    are grouped by expert instead (_moe_grouped: ids read back to the host, one matmul per active expert)."""
    g = gpu_type(qtype)
    (e, f, d) = _check_weight(gate, g, shapes[0], "moe gate")
    if tuple(shapes[1]) != (e, f, d) or tuple(shapes[2]) != (e, d, f):
        raise ShapeError(f"moe: shapes must be ((E, F, D), (E, F, D), (E, D, F)), got {shapes}")
    _check_weight(up, g, shapes[1], "moe up")
    _check_weight(down, g, shapes[2], "moe down")
    x = _x2d(x, d, "moe")
    t, ks = x.shape[0], ids.shape[1] if ids.ndim == 2 else -1
    if tuple(ids.shape) != (t, ks) or tuple(weights.shape) != (t, ks) or ids.dtype != np.int32:
        raise ShapeError(f"moe: ids must be int32 (T, KS) and weights (T, KS) for T = {t}; got {ids.dtype} "
                         f"{tuple(ids.shape)} and {tuple(weights.shape)}")
    if act not in ACTS:
        raise ValueError(f"unknown activation {act!r}; one of {', '.join(ACTS)}")
    backend = backend_of(gate, backend)
    xp = _xp(gate)
    if out is None:
        out = xp.empty((t, d), dtype=np.float32)
    if backend == "twin":
        out[...] = moe_ref(x, ids, weights, gate, up, down, g.name, shapes, act, biases)
        return out
    if t == 0:
        return out
    if t > DECODE_MAX_T:
        return _moe_grouped(x, ids, weights, (gate, up, down), g, (e, f, d), act, biases, out, stream, backend)
    act_buf = xp.empty((t * ks, f), dtype=np.float32) if work is None else work      # (T * KS, F)
    if tuple(act_buf.shape) != (t * ks, f) or act_buf.dtype != np.float32:
        raise ShapeError(f"moe: work must be float32 ({t * ks}, {f}), got {act_buf.dtype} {tuple(act_buf.shape)}")
    # without biases the bias pointers are never read (HAS_BIAS is False): any device array stands in for them
    bg, bu, bd = (act_buf,) * 3 if biases is None else (xp.ascontiguousarray(b, dtype=np.float32) for b in biases)
    tt = GGML_TYPES[g.name]
    common = dict(g.decode_constexprs(), HAS_BIAS=biases is not None)
    ids, wts, x = xp.ascontiguousarray(ids), xp.ascontiguousarray(weights, dtype=np.float32), xp.ascontiguousarray(x)
    run(g.moe_gate_up, (_cdiv(f, g.rows), t * ks),
        dict(gate_ptr=_u8(gate), up_ptr=_u8(up), bg_ptr=bg, bu_ptr=bu, x_ptr=x, ids_ptr=ids, act_ptr=act_buf, F=f,
             K=d, KS=ks, row_bytes=tt.row_bytes(d), stride_x=d),
        dict(common, ACT=ACTS.index(act)), g.warps, backend, stream)
    run(g.moe_down, (_cdiv(d, g.rows), t),
        dict(down_ptr=_u8(down), bd_ptr=bd, act_ptr=act_buf, ids_ptr=ids, wts_ptr=wts, out_ptr=out, D=d, F=f, KS=ks,
             row_bytes=tt.row_bytes(f), stride_o=d), common, g.warps, backend, stream)
    return out


def _moe_grouped(x, ids, weights, ws, g: GpuType, efd: tuple[int, int, int], act: str, biases, out, stream, backend):
    """moe for a prompt: the (token, slot) pairs grouped by expert on the host (ids read back, a sync), and each
    active expert's gate, up and down run once over all its tokens through matmul (the tiled kernel past 8), so
    an expert's weights cross memory once per layer, not once per token (the decode kernels' way). Runs on CuPy's
    current stream (or within `stream`)."""
    import contextlib

    xp = _xp(ws[0])
    (n_exp, f, d), (t, ks) = efd, ids.shape
    with stream if stream is not None else contextlib.nullcontext():
        pair_e = np.asarray(ids.get() if _is_cupy(ids) else ids).reshape(-1)          # (T * KS,) expert of each pair
        order = np.argsort(pair_e, kind="stable")
        bounds = np.searchsorted(pair_e[order], np.arange(n_exp + 1))
        tt = GGML_TYPES[g.name]
        gb, db = f * tt.row_bytes(d), d * tt.row_bytes(f)                              # bytes of one expert
        gate, up, down = (_u8(w) for w in ws)
        y = xp.zeros((t * ks, d), dtype=np.float32)                                    # (T * KS, D) per pair
        for e in np.flatnonzero(np.diff(bounds)):
            pairs = order[bounds[e]:bounds[e + 1]]
            xs = x[xp.asarray(pairs // ks)]                                            # (n, D) its tokens
            tiled = len(pairs) > DECODE_MAX_T
            gx = _matmul(gate[e * gb:(e + 1) * gb], g, f, d, xs, None, None, backend, tiled)          # (n, F)
            ux = _matmul(up[e * gb:(e + 1) * gb], g, f, d, xs, None, None, backend, tiled)
            if biases is not None:
                gx, ux = gx + xp.asarray(biases[0][e]), ux + xp.asarray(biases[1][e])
            a = xp.ascontiguousarray(glu(gx, ux, act, xp), dtype=np.float32)
            yx = _matmul(down[e * db:(e + 1) * db], g, d, f, a, None, None, backend, tiled)           # (n, D)
            y[xp.asarray(pairs)] = yx if biases is None else yx + xp.asarray(biases[2][e])
        out[...] = (y.reshape(t, ks, d) * xp.asarray(weights, dtype=np.float32)[:, :, None]).sum(axis=1)
    return out
