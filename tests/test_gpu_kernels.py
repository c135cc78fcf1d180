"""moert.kernels.gpu: every Triton kernel's own source, run by Triton's interpreter on the CPU, against its NumPy
twin (moert.quants.dequantize + a float64 matmul); cubins for sm_80 and sm_90 built without a GPU; the CuPy
launcher's argument packing against a fake CuPy.

Error bounds: a kernel and its twin decode identical float32 weights (the interpreter runs deq.py's operations in
the reference's order), so a dot of K terms differs only by float32 accumulation, at most ~K 2^-24 of
sum |w x| (the standard bound); we allow K 2^-23 of it. One wrong weight among K moves a dot by ~1/K of that sum,
32x the allowance at K = 512, so a misread nibble, scale or block cannot pass.

Shapes are tiny: the interpreter runs every program of the grid in Python (seconds for the whole file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
import sys
import types

import numpy as np
import pytest

from moert.activations import glu
from moert.errors import ShapeError, UnsupportedTypeError
from moert.quants import dequantize, quantize

pytest.importorskip("triton", reason="the GPU kernels are Triton sources: pip install triton (the dev extra has it)")

from moert.kernels import gpu  # noqa: E402
from moert.kernels.gpu import aot, launch  # noqa: E402

COMPILES = pytest.mark.skipif(launch.triton_interpret_env(), reason="TRITON_INTERPRET=1: this Triton cannot compile")
ALL = ("Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "MXFP4", "F16", "BF16", "F32")
U = 2.0 ** -23


def _k(name: str) -> int:
    """Row length: 512 for the k-quants; 288 (nine 32-blocks: a partial last chunk) for the others."""
    return 512 if name.endswith("_K") else 288


def _weights(rng, name: str, shape) -> np.ndarray:
    """Random valid blocks of `name` (quantized from normal floats, as tests/ builds them elsewhere)."""
    return quantize(rng.standard_normal(shape, dtype=np.float32), name)


def _bound(x, raw, name, shape, k: int) -> np.ndarray:
    """k 2^-23 of sum |w x| per output: the float32 accumulation allowance (module docstring)."""
    return k * U * (np.abs(x.astype(np.float64)) @ np.abs(dequantize(raw, name, shape)).T.astype(np.float64))


@pytest.mark.parametrize("name", ALL)
def test_matvec_matches_twin(name):
    rng = np.random.default_rng(1)
    n, k = 25, _k(name)                                   # 25 rows: a partial last program for every R
    raw = _weights(rng, name, (n, k))
    for t in (1, 3, 8):
        x = rng.standard_normal((t, k), dtype=np.float32)
        got = gpu.matvec(raw, name, (n, k), x, backend="interpret")
        want = gpu.matmul_ref(raw, name, (n, k), x)
        assert got.shape == (t, n)
        err = np.abs(got.astype(np.float64) - want)
        assert np.all(err <= _bound(x, raw, name, (n, k), k)), (name, t, float(err.max()))


def test_matvec_reads_float16_activations():
    rng = np.random.default_rng(2)
    raw = _weights(rng, "Q4_K", (8, 256))
    x = rng.standard_normal((2, 256)).astype(np.float16)
    got = gpu.matvec(raw, "Q4_K", (8, 256), x, backend="interpret")
    want = gpu.matmul_ref(raw, "Q4_K", (8, 256), x.astype(np.float32))
    assert np.all(np.abs(got - want) <= _bound(x, raw, "Q4_K", (8, 256), 256))


@pytest.mark.parametrize("name", ALL)
def test_dequant_kernel_is_the_reference(name):
    """deq.py does the reference's float32 operations in its order: the interpreter's float32 result is equal."""
    rng = np.random.default_rng(3)
    n, k = 8, _k(name)
    raw = _weights(rng, name, (n, k))
    want = dequantize(raw, name, (n, k))
    np.testing.assert_array_equal(gpu.dequantize(raw, name, (n, k), np.float32, backend="interpret"), want)
    np.testing.assert_array_equal(gpu.dequantize(raw, name, (n, k), backend="interpret"), want.astype(np.float16))


@pytest.mark.parametrize("name", ("Q4_K", "Q6_K", "Q8_0", "MXFP4", "F16"))
def test_tiled_matches_twin_of_f16_operands(name):
    """The prompt kernel multiplies float16 casts of W and x: against a twin of those same casts, only float32
    accumulation differs (the bound above); against float32 operands each product would also carry 2^-10."""
    rng = np.random.default_rng(4)
    n, k, t = 70, _k(name), 12                              # 70 rows: a partial second tile
    raw = _weights(rng, name, (n, k))
    x = rng.standard_normal((t, k), dtype=np.float32)
    got = gpu.matmul(raw, name, (n, k), x, backend="interpret")              # T = 12 > 8: the tiled kernel
    w16 = dequantize(raw, name, (n, k)).astype(np.float16).astype(np.float64)
    want = x.astype(np.float16).astype(np.float64) @ w16.T
    assert np.all(np.abs(got - want) <= _bound(x, raw, name, (n, k), k))
    gemm = gpu.gemm_f16(gpu.dequantize(raw, name, (n, k), backend="interpret"), x, backend="interpret")
    assert np.all(np.abs(gemm - want) <= _bound(x, raw, name, (n, k), k))   # the generic path: same operands


def _moe_case(rng, name: str, t: int = 3, ks: int = 2, n_exp: int = 4):
    d = f = 256 if name.endswith("_K") else 96             # F = 96: three 32-blocks, a partial chunk
    shapes = ((n_exp, f, d), (n_exp, f, d), (n_exp, d, f))
    ws = [quantize(0.3 * rng.standard_normal(s, dtype=np.float32), name) for s in shapes]
    x = rng.standard_normal((t, d), dtype=np.float32)
    ids = np.array([[0, 3], [3, 1], [2, 2]][:t], dtype=np.int32)[:, :ks]     # a repeated and a shared expert
    wts = rng.random((t, ks), dtype=np.float32)
    return x, ids, wts, ws, shapes


def _moe_scale(x, ids, wts, ws, name, shapes, act, biases):
    """sum_k |wt| (|W_down[e]| @ |act|): the size of the sum the down kernel forms, the bound's unit."""
    wd = np.abs(dequantize(ws[2], name, shapes[2])).astype(np.float64)
    wg, wu = (dequantize(w, name, shapes[0]).astype(np.float64) for w in ws[:2])
    out = np.zeros((x.shape[0], shapes[2][1]))
    for i in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[i, j]
            g, u = wg[e] @ x[i], wu[e] @ x[i]
            if biases is not None:
                g, u = g + biases[0][e], u + biases[1][e]
            a = glu(g.astype(np.float32), u.astype(np.float32), act).astype(np.float64)
            out[i] += abs(wts[i, j]) * (wd[e] @ np.abs(a) + (0 if biases is None else np.abs(biases[2][e])))
    return out


@pytest.mark.parametrize("name,act,bias", [("Q4_K", "swiglu", False), ("Q6_K", "swiglu", False),
                                           ("Q8_0", "geglu", False), ("MXFP4", "swiglu_oai", True),
                                           ("F16", "swiglu", False), ("F32", "swiglu_oai", True)])
def test_moe_matches_twin(name, act, bias):
    """Gate/up dots (D terms) are within D 2^-23 of their sums; the activations are Lipschitz at these sizes
    (|g|, |u| < ~10) with a constant below 4, and the down dot (F terms) adds F 2^-23: we allow 4 (D + F) 2^-23
    of the down sum's size. A wrong expert id or routing weight moves the output by O(1) of it."""
    rng = np.random.default_rng(5)
    x, ids, wts, ws, shapes = _moe_case(rng, name)
    e, f, d = shapes[0]
    biases = (rng.standard_normal((e, f), dtype=np.float32), rng.standard_normal((e, f), dtype=np.float32),
              rng.standard_normal((e, d), dtype=np.float32)) if bias else None
    cfg = dataclasses.replace(gpu.GPU_TYPES[name], rows=32)   # fewer, larger programs: the interpreter's cost
    got = gpu.moe(x, ids, wts, *ws, cfg, shapes, act=act, biases=biases, backend="interpret")
    want = gpu.moe_ref(x, ids, wts, *ws, name, shapes, act=act, biases=biases)
    bound = 4 * (d + f) * U * _moe_scale(x, ids, wts, ws, name, shapes, act, biases)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / bound))
    swapped = gpu.moe(x, ids[:, ::-1].copy(), wts, *ws, cfg, shapes, act=act, biases=biases, backend="interpret")
    assert not np.all(np.abs(swapped - want) <= bound)        # the ids are read: other experts, other output


@pytest.mark.parametrize("name,act,bias", [("Q4_K", "swiglu", False), ("MXFP4", "swiglu_oai", True)])
def test_moe_prompt_groups_tokens_by_expert(name, act, bias):
    """T = 12 > 8: pairs grouped by expert, each expert's 11-13 pairs through the tiled kernel (f16 operands). The
    twin rounds what the kernels round (x, the weights, the activation to f16), so only float32 accumulation and
    the activation's float32 evaluation differ: the decode bound above holds."""
    rng = np.random.default_rng(8)
    d = f = 256 if name.endswith("_K") else 96
    shapes = ((2, f, d), (2, f, d), (2, d, f))
    ws = [quantize(0.3 * rng.standard_normal(sh, dtype=np.float32), name) for sh in shapes]
    x = rng.standard_normal((12, d), dtype=np.float32)
    ids = np.array([[0, 1]] * 11 + [[1, 1]], dtype=np.int32)               # 11 and 13 pairs: both tiled
    wts = rng.random((12, 2), dtype=np.float32)
    biases = tuple(rng.standard_normal(sh, dtype=np.float32) for sh in ((2, f), (2, f), (2, d))) if bias else None
    got = gpu.moe(x, ids, wts, *ws, name, shapes, act=act, biases=biases, backend="interpret")
    r16 = lambda a: np.asarray(a, dtype=np.float32).astype(np.float16).astype(np.float64)
    wg, wu, wd = (r16(dequantize(w, name, sh)) for w, sh in zip(ws, shapes))
    want = np.zeros((12, d))
    for i in range(12):
        for j in range(2):
            e = ids[i, j]
            g, u = wg[e] @ r16(x[i]), wu[e] @ r16(x[i])
            if bias:
                g, u = g + biases[0][e], u + biases[1][e]
            y = wd[e] @ r16(glu(g.astype(np.float32), u.astype(np.float32), act)) + (biases[2][e] if bias else 0)
            want[i] += wts[i, j] * y
    bound = 4 * (d + f) * U * _moe_scale(x, ids, wts, ws, name, shapes, act, biases)
    assert np.all(np.abs(got - want) <= bound), float(np.max(np.abs(got - want) / bound))
    plain = gpu.moe_ref(x, ids, wts, *ws, name, shapes, act=act, biases=biases)      # float32 operands throughout
    assert np.max(np.abs(got - want)) < np.max(np.abs(plain - want)) / 10   # the tiled (f16) kernels did run


def test_interpreting_leaves_triton_language_as_it_was():
    """An interpreted run patches triton.language; what it left patched a later triton.compile would meet. (It
    may add names: the interpreter copies its globals into the modules it runs, and a restored tensor.__repr__
    lands on the class itself; none of those shadows anything.)"""
    import triton.language as tl

    spaces = (tl, tl.core, tl.standard, tl.math, tl.tensor, tl.dtype)
    before = [dict(vars(m)) for m in spaces]
    rng = np.random.default_rng(7)
    raw = _weights(rng, "Q4_K", (8, 256))
    gpu.matvec(raw, "Q4_K", (8, 256), rng.standard_normal((1, 256), dtype=np.float32), backend="interpret")
    for m, b in zip(spaces, before):
        after = dict(vars(m))
        assert [k for k in b if after.get(k) is not b[k]] == [], m


def test_twin_backend_and_errors():
    rng = np.random.default_rng(6)
    raw = _weights(rng, "Q8_0", (4, 64))
    x = rng.standard_normal((9, 64), dtype=np.float32)
    np.testing.assert_array_equal(gpu.matmul(raw, "Q8_0", (4, 64), x), gpu.matmul_ref(raw, "Q8_0", (4, 64), x))
    with pytest.raises(ShapeError, match="up to 8 tokens"):
        gpu.matvec(raw, "Q8_0", (4, 64), x)
    with pytest.raises(ShapeError, match=r"x must be \(T, 64\)"):
        gpu.matvec(raw, "Q8_0", (4, 64), x[:, :32])
    with pytest.raises(ShapeError, match="bytes"):
        gpu.matvec(raw, "Q8_0", (8, 64), x[:2])
    with pytest.raises(UnsupportedTypeError, match="Q2_K"):
        gpu.matvec(raw, "Q2_K", (4, 256), x[:1])


# ------------------------------------------------------------------------------------------ cubins, no GPU

def _sm(cubin: bytes) -> int:
    """The SM version a cubin was built for, from its ELF header's e_flags: the low byte up to ELF ABI version 7,
    the second byte from version 8 on (Triton 3.9's ptxas writes 8 for sm_90, 7 for sm_80)."""
    assert cubin[:4] == b"\x7fELF"
    flags = struct.unpack_from("<I", cubin, 0x30)[0]
    return (flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF


@COMPILES
@pytest.mark.parametrize("cc", (80, 90))
def test_every_kernel_compiles_to_a_cubin(cc):
    """Every kernel of Q4_K and the f16 GEMM for sm_80 and sm_90, and on sm_90 the matvec of every other type (all
    four decoder families); tests/test_gpu_kernels_compile.py compiles every kernel of every type for both."""
    todo = aot.specs("Q4_K") + [aot.GEMM_SPEC]
    todo += [aot.specs(q)[0] for q in ALL if q != "Q4_K"] if cc == 90 else []
    for name, sig, const, warps in todo:
        _check_cubin(name, sig, const, cc, warps)


def _check_cubin(name, sig, const, cc, warps, aligned=True):
    c = launch.compile_cubin(name, sig, const, cc, warps, aligned=aot.aligned(sig) if aligned else frozenset())
    assert _sm(c.cubin) == cc and c.name.encode() in c.cubin, (name, const)
    args = [a for a in launch.kernel(name).arg_names if a not in const]
    assert c.params[:len(args)] == tuple(sig[a] for a in args)           # the kernel's own, in order
    assert set(c.params[len(args):]) == {"*scratch"} and c.num_warps == warps


# ------------------------------------------------------------------------------ the CuPy launcher, faked

class _FakeArray:
    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)


def _fake_compiled(shared=1024, scratch=(0, 1)):
    return launch.Compiled(name="k", cubin=b"\x7fELF", num_warps=4, shared=shared,
                           params=("*u8", "*fp32", "i32", "i64", "fp32", "*scratch", "*scratch"),
                           global_scratch=scratch, profile_scratch=(0, 1))


def test_from_compiled_reads_metadata():
    md = types.SimpleNamespace(num_warps=8, shared=4096, global_scratch_size=0, global_scratch_align=1,
                               profile_scratch_size=0, profile_scratch_align=1, num_ctas=1)
    c = launch.from_compiled(types.SimpleNamespace(metadata=md, name="kern", asm={"cubin": b"abc"}), ["*u8", "i32"])
    assert (c.name, c.num_warps, c.shared, c.params) == ("kern", 8, 4096, ("*u8", "i32", "*scratch", "*scratch"))
    old = types.SimpleNamespace(**{k: v for k, v in vars(md).items() if not k.startswith("profile")})
    assert launch.from_compiled(types.SimpleNamespace(metadata=old, name="k", asm={"cubin": b""}),
                                ["i32"]).params == ("i32", "*scratch")   # Triton before profile_scratch
    ptx = (".entry k(\n\t.param .u64 .ptr .global .align 1 k_param_0,\n\t.param .u32 k_param_1,\n"
           "\t.param .u64 .ptr .global .align 1 k_param_2\n)\n.reqntid 256\n{")
    with_ptx = types.SimpleNamespace(metadata=md, name="k", asm={"cubin": b"", "ptx": ptx})
    assert launch.from_compiled(with_ptx, ["*u8", "i32"]).params == ("*u8", "i32", "*scratch")   # as the PTX says
    with pytest.raises(launch.GpuKernelError, match="PTX entry"):
        launch.from_compiled(with_ptx, ["*u8", "i64"])
    md.num_ctas = 2
    with pytest.raises(launch.GpuKernelError, match="cluster"):
        launch.from_compiled(types.SimpleNamespace(metadata=md, name="k", asm={"cubin": b""}), ["i32"])


def test_pack_args_exact_widths_and_null_scratch():
    a, b = _FakeArray(256), _FakeArray(512)
    packed = launch.pack_args(_fake_compiled(), [a, b, 7, 2**40, 0.5], [None, None])
    assert packed[:2] == (a, b)
    assert [type(v) for v in packed[2:]] == [np.int32, np.int64, np.float32, np.uint64, np.uint64]
    assert packed[2:5] == (7, 2**40, 0.5) and packed[5:] == (0, 0)
    with pytest.raises(launch.GpuKernelError, match="takes 5 arguments"):
        launch.pack_args(_fake_compiled(), [a, b, 7], [None, None])
    with pytest.raises(launch.GpuKernelError, match="not a device array"):
        launch.pack_args(_fake_compiled(), [a, 3, 7, 1, 0.5], [None, None])


def test_cupy_launcher_with_a_fake_cupy(monkeypatch):
    calls = {}

    class Function:
        def __call__(self, grid, block, args, shared_mem=0, stream=None):
            calls.update(grid=grid, block=block, args=args, shared=shared_mem, stream=stream)

    class Module:
        def load(self, cubin):
            calls["cubin"] = cubin

        def get_function(self, name):
            calls["name"] = name
            calls["fn"] = Function()
            return calls["fn"]

    fake = types.ModuleType("cupy")
    fake.uint8 = np.uint8
    fake.empty = lambda n, dtype: ("scratch", n)
    fake.cuda = types.SimpleNamespace(function=types.SimpleNamespace(Module=Module))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    a = _FakeArray(256)
    launch.CupyLauncher(_fake_compiled(shared=64 * 1024, scratch=(128, 16)))((5, 2), [a, a, 1, 2, 3.0], stream="s")
    assert (calls["name"], calls["grid"], calls["block"], calls["shared"], calls["stream"]) == \
           ("k", (5, 2, 1), (128, 1, 1), 64 * 1024, "s")
    assert calls["fn"].max_dynamic_shared_size_bytes == 64 * 1024       # over 48 KB: opted in
    assert calls["args"][5] == ("scratch", 128 * 10) and calls["args"][6] == 0   # 10 programs' scratch; null


@COMPILES
def test_cuda_path_compiles_for_the_device_and_launches(monkeypatch):
    """ops.run on device arrays: the signature from the arrays' dtypes, multiples of 16 marked (as Triton's JIT
    does), i64 for sizes past int32, one compile per signature, the launch on the given stream."""
    made, launched = [], []

    class Launcher:
        def __init__(self, compiled):
            self.c = compiled

        def __call__(self, grid, args, stream=None):
            launched.append((self, grid, args, stream))

    compile_cubin = launch.compile_cubin

    def spy(name, sig, const, cc, warps, aligned=frozenset()):
        made.append((cc, aligned))
        return compile_cubin(name, sig, const, cc, warps, aligned=aligned)

    def dev(dtype, ptr):
        return types.SimpleNamespace(dtype=np.dtype(dtype), ndim=1, data=types.SimpleNamespace(ptr=ptr))

    monkeypatch.setattr(launch, "CupyLauncher", Launcher)
    monkeypatch.setattr(launch, "compile_cubin", spy)
    device = [0]
    monkeypatch.setattr(gpu.ops, "_device", lambda a: (device[0], 90))
    monkeypatch.setattr(gpu.ops, "_on", lambda d: contextlib.nullcontext())
    gpu.ops._launcher.cache_clear()
    gpu.ops._compiled.cache_clear()
    args = dict(w_ptr=dev(np.uint8, 256), x_ptr=dev(np.float32, 4096), out_ptr=dev(np.float32, 4100), N=64, K=4096,
                T=1, row_bytes=2304, stride_x=4096, stride_o=64)
    const = dict(gpu.GPU_TYPES["Q4_K"].decode_constexprs(), TP=1)
    for _ in range(2):
        gpu.ops.run("matvec_kernel", (8,), args, const, 4, "cuda", stream="s")
    assert made == [(90, frozenset({"w_ptr", "x_ptr", "N", "K", "row_bytes", "stride_x", "stride_o"}))]   # once
    c, grid, passed, stream = launched[-1]
    assert (grid, stream, passed) == ((8,), "s", list(args.values())) and len(launched) == 2
    c = c.c
    assert c.params[:9] == ("*u8", "*fp32", "*fp32") + ("i32",) * 6 and _sm(c.cubin) == 90
    device[0] = 1                                             # a second GPU: its own module, the same cubin
    gpu.ops.run("matvec_kernel", (8,), args, const, 4, "cuda")
    assert len(made) == 1 and launched[-1][0] is not launched[0][0] and launched[-1][0].c is launched[0][0].c
    gpu.ops.run("matvec_kernel", (8,), dict(args, row_bytes=2**31 + 16), const, 4, "cuda")
    assert launched[-1][0].c.params[6] == "i64"
    gpu.ops._launcher.cache_clear()
    gpu.ops._compiled.cache_clear()
