"""Running the Triton kernels of kernels/gpu/src/: under Triton's interpreter on NumPy arrays, or compiled ahead of
time to a cubin and launched by CuPy on CuPy's current stream.

    kernel(name, mode)              the kernel's Triton function: mode "jit" (for triton.compile) or "interp"
    interpret(name, grid, args, constexprs)    run it under the interpreter on NumPy arrays (no torch needed)
    compile_cubin(name, signature, constexprs, capability, num_warps, num_stages)   a Compiled: cubin + metadata
    CupyLauncher(compiled)(grid, args, stream)  launch a Compiled with CuPy (cupy.cuda.function.Module)

Why not Triton's own launcher: it launches on torch's current stream and needs torch, so a CuPy CUDA-graph
capture would miss the launch. Why a second copy of the sources for the interpreter: `@triton.jit` picks
JITFunction or InterpretedFunction when a module is imported (TRITON_INTERPRET), and a process here needs
both (the tests interpret and compile). The copy is the same files imported again under a package of its own
(moert.kernels.gpu._interp) while triton.knobs.runtime.interpret is on, so their relative imports stay in it.

The interpreter without torch: Triton's interpreter copies torch tensors to the host and back around a grid; here
the arguments are NumPy arrays behind an object with data_ptr() and dtype (HostArray) and a GridExecutor that
copies nothing. For the length of a grid, triton.language's own @jit functions (tl.sum, tl.cdiv) are swapped for
interpreted twins, and every patch the interpreter makes is undone after (_interpreted_lang), so compiling later
in the same process meets an untouched triton.language (tests/test_gpu_kernels.py checks both).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moert.errors import MoertError

SRC = Path(__file__).parent / "src"
_MODULES = ("matvec", "tiled", "attention")    # the kernel modules of src/ (deq.py: matvec's and tiled's)


class GpuKernelError(MoertError):
    """A GPU kernel could not be compiled or launched here (what, where, and the fix in the message)."""


def _triton():
    try:
        import triton
    except ImportError as e:
        raise GpuKernelError("moert's GPU kernels need Triton (kernels/gpu/src/ are Triton sources); "
                             "install it: pip install 'moert[gpu-kernels]' (or pip install triton)") from e
    return triton


@functools.cache
def _package(mode: str):
    """The src/ modules imported for `mode`: "jit" the package itself, "interp" a second copy interpreted."""
    triton = _triton()
    if mode == "jit":
        return {m: importlib.import_module(f"moert.kernels.gpu.src.{m}") for m in _MODULES}
    pkg = "moert.kernels.gpu._interp"
    if pkg not in sys.modules:
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(SRC)]
        mod.__package__ = pkg
        sys.modules[pkg] = mod
    knobs = triton.knobs.runtime
    was = knobs.interpret
    knobs.interpret = True
    try:
        return {m: importlib.import_module(f"{pkg}.{m}") for m in _MODULES}
    finally:
        knobs.interpret = was


def kernel(name: str, mode: str = "jit"):
    """The Triton kernel `name` of src/ (JITFunction for "jit", InterpretedFunction for "interp")."""
    for mod in _package(mode).values():
        if hasattr(mod, name):
            return getattr(mod, name)
    raise KeyError(f"no GPU kernel {name!r} in kernels/gpu/src/ ({', '.join(_MODULES)})")


# ----------------------------------------------------------------------------------------- interpreter

class HostArray:
    """A NumPy array as Triton's interpreter reads a tensor argument: data_ptr() and dtype, nothing else."""

    def __init__(self, a: np.ndarray):
        if not a.flags.c_contiguous:
            raise ValueError(f"a kernel argument must be C-contiguous, got strides {a.strides} for {a.shape}")
        self.a, self.dtype = a, a.dtype

    def data_ptr(self) -> int:
        return self.a.ctypes.data


@functools.cache
def _host_executor():
    """GridExecutor without its torch round trip: arguments already live in host memory, so there is nothing
    to copy to the host before the grid runs, nor back after it."""
    from triton.runtime.interpreter import GridExecutor

    class HostGridExecutor(GridExecutor):
        def _init_args_hst(self, args_dev, kwargs):
            return list(args_dev), dict(kwargs)

        def _restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
            pass

    return HostGridExecutor


@functools.cache
def _lang_jit_functions() -> tuple:
    """triton.language's own @jit functions (tl.sum, tl.cdiv, their combine functions), each with an interpreted
    twin: (module, name, JITFunction, InterpretedFunction). Imported without TRITON_INTERPRET they are
    JITFunctions, which an interpreted kernel cannot call."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    try:    # imported lazily by the interpreter's first argument, and it asserts tl.cdiv is a JITFunction
        importlib.import_module("triton.experimental.gluon")
    except ImportError:
        pass
    mods = {id(m): m for m in (tl, getattr(tl, "standard", None), getattr(tl, "math", None)) if m is not None}
    return tuple((m, k, v, InterpretedFunction(v.fn)) for m in mods.values() for k, v in list(vars(m).items())
                 if isinstance(v, JITFunction))


class _Deferred:
    """A patch scope whose restore waits for _interpreted_lang's exit."""

    def restore(self) -> None:
        pass


@contextlib.contextmanager
def _interpreted_lang():
    """For the duration of an interpreted grid, triton.language's @jit functions are their interpreted twins, and
    every patch the interpreter makes to triton.language is undone at the end, last first. Triton undoes the
    grid's own patches but not those of each interpreted call into triton.language (it expects a process that
    never compiles), and a later triton.compile would then meet interpreter builtins."""
    from triton.runtime import interpreter as ti

    swaps = [] if triton_interpret_env() else _lang_jit_functions()   # TRITON_INTERPRET=1 at import: none needed
    patch_lang, patch_tensor, scopes = ti._patch_lang, ti._patch_lang_tensor, []

    patched = set()

    def _patch_lang(fn):
        # once per module's globals: Triton patches again at every call of a @jit helper, the bulk of an
        # interpreted kernel's time, and the patches are the same each time
        if id(fn.__globals__) not in patched:
            patched.add(id(fn.__globals__))
            scopes.append(patch_lang(fn))
        return _Deferred()

    def _patch_lang_tensor(tensor, scope):
        # A scalar in the interpreter is a 1-element 1-d array, and NumPy >= 2.4 refuses int() of one (Triton
        # 3.6 calls it for range(K)); .item() reads any 1-element array
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    for m, k, _jit, interp in swaps:
        setattr(m, k, interp)
    ti._patch_lang, ti._patch_lang_tensor = _patch_lang, _patch_lang_tensor
    try:
        yield
    finally:
        for scope in reversed(scopes):
            scope.restore()
        ti._patch_lang, ti._patch_lang_tensor = patch_lang, patch_tensor
        for m, k, jit, _interp in swaps:
            setattr(m, k, jit)


def triton_interpret_env() -> bool:
    """Whether triton.language itself was imported interpreted (TRITON_INTERPRET=1 before `import triton`)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.cdiv, InterpretedFunction)


def interpret(name: str, grid: tuple[int, ...], args: list, constexprs: dict) -> None:
    """Run kernel `name` under Triton's interpreter: NumPy arrays in args are wrapped as HostArray, written in
    place; ints and floats pass as they are."""
    fn = kernel(name, "interp")
    wrapped = [HostArray(a) if isinstance(a, np.ndarray) else a for a in args]
    with _interpreted_lang():
        _host_executor()(fn.rewrite(), fn.arg_names, tuple(grid))(*wrapped, **constexprs)


# ---------------------------------------------------------------------------------- ahead-of-time cubins

@dataclass(frozen=True)
class Compiled:
    """A kernel compiled for one GPU: the cubin and what a launcher must know from its metadata."""

    name: str                 # the kernel's symbol in the cubin
    cubin: bytes
    num_warps: int
    shared: int               # bytes of dynamic shared memory
    params: tuple[str, ...]   # the kernel's parameter types in order, scratch pointers included ("*u8", "i32", ...)
    global_scratch: tuple[int, int]    # (bytes per program, alignment); size 0: a null pointer
    profile_scratch: tuple[int, int]


def compile_cubin(name: str, signature: dict[str, str], constexprs: dict, capability: int, num_warps: int,
                  num_stages: int = 2, aligned: frozenset[str] = frozenset()) -> Compiled:
    """Compile kernel `name` for compute capability `capability` (80, 90) with triton.compile: no GPU needed.
    signature maps each runtime argument to its Triton type ("*u8", "*fp32", "i32", "i64", "fp32"); `aligned`
    names the arguments known to be multiples of 16 (addresses, sizes), which lets loads vectorize. Multiply-adds
    fuse (FMA), as Triton's default up to 3.9 (said explicitly: 3.10 turns the default off)."""
    triton = _triton()
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if triton_interpret_env():
        raise GpuKernelError(f"cannot compile {name}: TRITON_INTERPRET=1 was set when Triton was imported, so its "
                             f"language is the interpreter's in this process; unset it (moert interprets without it)")
    fn = kernel(name, "jit")
    sig = {a: ("constexpr" if a in constexprs else signature[a]) for a in fn.arg_names}
    missing = [a for a in fn.arg_names if a not in sig]
    if missing:
        raise GpuKernelError(f"{name}: no type for {missing} in the signature")
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": True})
    return from_compiled(ck, [sig[a] for a in fn.arg_names if sig[a] != "constexpr"])


def _meta(md, key: str, default=0):
    return getattr(md, key, default) if not isinstance(md, dict) else md.get(key, default)


def ptx_params(ptx: str) -> list[str]:
    """The entry's parameters as the PTX declares them: ".u64 .ptr" for a pointer, else ".u32", ".u64", ".f32" ..."""
    head = ptx[ptx.index(".entry"):]
    head = head[head.index("(") + 1:head.index(")")]
    return [" ".join(p.split()[1:-1]).replace(" .global", "").split(" .align")[0] for p in head.split(",") if p.strip()]


_PTX_WIDTH = {"i1": ".u8", "i8": ".u8", "i16": ".u16", "i32": ".u32", "i64": ".u64", "u32": ".u32", "u64": ".u64",
              "fp32": ".f32", "fp64": ".f64"}


def from_compiled(ck, arg_types: list[str]) -> Compiled:
    """A Compiled from triton.compile's result: its cubin, and from its metadata and PTX the launch facts. Triton
    appends scratch pointers after the kernel's own parameters (>= 3.3: global_scratch and profile_scratch, nulls
    when their size is 0; before: global_scratch only), as its launcher passes them (third_party/nvidia/backend/
    driver.py, make_launcher); how many is read off the PTX entry itself, and every parameter checked against it."""
    md = ck.metadata
    if _meta(md, "num_ctas", 1) != 1 or _meta(md, "launch_cooperative_grid", False) or _meta(md, "launch_pdl",
                                                                                               False):
        raise GpuKernelError(f"{ck.name}: a cluster, cooperative or PDL launch, which the CuPy launcher does not do; "
                             f"compile with num_ctas=1 and without launch_cooperative_grid / launch_pdl")
    if "ptx" in ck.asm:
        declared = ptx_params(ck.asm["ptx"])
        want = [".u64 .ptr" if t.startswith("*") else _PTX_WIDTH[t] for t in arg_types]
        n_scratch = len(declared) - len(want)
        if declared[:len(want)] != want or n_scratch not in (1, 2) or set(declared[len(want):]) != {".u64 .ptr"}:
            raise GpuKernelError(f"{ck.name}: the PTX entry takes {declared}, not {want} + scratch pointers; this "
                                 f"Triton passes kernel arguments in a way kernels/gpu/launch.py does not know")
    else:   # no PTX to read (a cache without it): Triton >= 3.3's metadata has profile_scratch_size
        n_scratch = 2 if hasattr(md, "profile_scratch_size") or (isinstance(md, dict) and "profile_scratch_size"
                                                                 in md) else 1
    params = tuple(arg_types) + ("*scratch",) * n_scratch
    return Compiled(name=ck.name, cubin=bytes(ck.asm["cubin"]), num_warps=int(_meta(md, "num_warps")),
                    shared=int(_meta(md, "shared")), params=params,
                    global_scratch=(int(_meta(md, "global_scratch_size")), int(_meta(md, "global_scratch_align", 1))),
                    profile_scratch=(int(_meta(md, "profile_scratch_size")),
                                     int(_meta(md, "profile_scratch_align", 1))))


_SCALARS = {"i1": np.int8, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "u32": np.uint32,
            "u64": np.uint64, "fp32": np.float32, "fp64": np.float64}


def pack_args(compiled: Compiled, args: list, scratch: list) -> tuple:
    """The launch arguments for CuPy: device arrays as they are (CuPy passes their pointer), scalars as NumPy
    scalars of the parameter's exact width, then the scratch pointers (an array, or np.uint64(0) for null)."""
    own = compiled.params[:len(compiled.params) - len(scratch)]
    if len(args) != len(own):
        raise GpuKernelError(f"{compiled.name} takes {len(own)} arguments ({', '.join(own)}), got {len(args)}")
    out = []
    for ty, a in zip(own, args):
        if ty.startswith("*"):
            if isinstance(a, (int, np.integer)) or not hasattr(a, "data"):
                raise GpuKernelError(f"{compiled.name}: a {ty} parameter got {type(a).__name__}, not a device array")
            out.append(a)
        else:
            out.append(_SCALARS[ty](a))
    return tuple(out) + tuple(np.uint64(0) if s is None else s for s in scratch)


class CupyLauncher:
    """Loads a Compiled's cubin into a CuPy Module and launches it on CuPy's current stream (or `stream`), so a
    CuPy CUDA-graph capture records it."""

    def __init__(self, compiled: Compiled):
        import cupy

        self.c = compiled
        self.module = cupy.cuda.function.Module()
        self.module.load(compiled.cubin)
        self.fn = self.module.get_function(compiled.name)
        if compiled.shared > 48 * 1024:    # above 48 KB a kernel must opt in to dynamic shared memory
            try:
                self.fn.max_dynamic_shared_size_bytes = compiled.shared
            except AttributeError:         # a CuPy without the property: the driver call it wraps
                cupy.cuda.driver.funcSetAttribute(self.fn.ptr, 8, compiled.shared)   # 8: ..._MAX_DYNAMIC_SHARED_SIZE

    def scratch(self, n_programs: int) -> list:
        """The scratch buffers its metadata asks for: one (size x programs) device buffer each, None where 0."""
        import cupy

        out = []
        for size, _align in (self.c.global_scratch, self.c.profile_scratch)[:self.n_scratch]:
            out.append(cupy.empty(size * n_programs, dtype=cupy.uint8) if size else None)   # CuPy aligns to 256
        return out

    @property
    def n_scratch(self) -> int:
        return sum(1 for p in self.c.params if p == "*scratch")

    def __call__(self, grid: tuple[int, ...], args: list, stream=None) -> None:
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        if min(grid) == 0:
            return
        packed = pack_args(self.c, args, self.scratch(grid[0] * grid[1] * grid[2]))
        self.fn(grid, (32 * self.c.num_warps, 1, 1), packed, shared_mem=self.c.shared, stream=stream)
