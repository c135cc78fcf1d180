"""How kernels are compiled and run: `variant` (a per-type compiled copy of a template), `threads` (the
size of Numba's pool, cheaply), `blas_one_thread` (NumPy's BLAS kept off the cores while they run) and
`drop_stale_cache` (run at import). The ground floor of kernels/: it imports no other kernel module."""

from __future__ import annotations

import contextlib
import hashlib
import os
import types as pytypes
from collections.abc import Callable
from pathlib import Path

import numba
from numba import njit

_SOURCE = hashlib.sha1(b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))).hexdigest()[:8]
STAMP = "moert-kernels-source.txt"      # in the cache folder: the _SOURCE its compiled kernels were built from


def drop_stale_cache(folder: Path, source: str = _SOURCE) -> int:
    """Delete Numba's cached kernels (*.nbi, *.nbc) in `folder` if they were compiled from other kernel sources
    than `source`; returns how many files went. Numba checks a cached function against its own file's time stamp
    only, so a kernel whose callee in another file changed (kernels/decode.py's fused layer inlines
    kernels/flash_decode.py's loops) would keep running the old callee from the cache: after any change to
    kernels/*.py, every kernel compiles afresh once. `variant`s carry _SOURCE in their names for the same reason."""
    stamp = folder / STAMP
    try:
        if stamp.read_text() == source:
            return 0
    except OSError:
        pass
    gone = 0
    for f in [*folder.glob("*.nbi"), *folder.glob("*.nbc")]:
        with contextlib.suppress(OSError):              # another process got there first
            f.unlink()
            gone += 1
    with contextlib.suppress(OSError):                  # a read-only install: Numba cannot cache there either
        folder.mkdir(exist_ok=True)
        stamp.write_text(source)
    return gone


if not os.environ.get("NUMBA_CACHE_DIR"):                # Numba's default: __pycache__ beside the sources
    drop_stale_cache(Path(__file__).parent / "__pycache__")


def variant(template: Callable, name: str, *, inline: bool = False, **options_and_bindings):
    """njit(cache=True) of `template`'s code under the name `name`, with each keyword that is not a Numba
    option (parallel, fastmath) bound as a global of that copy: the per-type code of one template."""
    opts = {k: options_and_bindings.pop(k) for k in ("parallel", "fastmath") if k in options_and_bindings}
    g = dict(template.__globals__)
    g.update(options_and_bindings)
    fn = pytypes.FunctionType(template.__code__, g, name, template.__defaults__)
    fn.__qualname__ = f"{name}_{_SOURCE}"
    fn.__module__, fn.__doc__ = template.__module__, template.__doc__
    return njit(cache=True, inline="always" if inline else "never", **opts)(fn)


def threads() -> int:
    """numba.get_num_threads(), without its per-call thread-pool check once the pool is up (~3 us a call)."""
    global _num_threads
    if _num_threads is None:
        numba.get_num_threads()                                         # starts the pool
        try:
            from numba.np.ufunc.parallel import _get_num_threads as _num_threads
        except ImportError:                                             # a Numba without it: the public one
            _num_threads = numba.get_num_threads
    return _num_threads()


_num_threads = None


_BLAS = None                                                            # threadpoolctl's views of NumPy's BLAS


def blas_one_thread():
    """A context in which NumPy's BLAS runs on one thread, while the kernels run on several (a no-op on one).
    Both pools spin-wait between calls, so with a core each they take turns on the cores instead of working:
    an int8 pp64 of the Qwen3-30B-A3B-shaped benchmark file on 2 threads went 170 -> 325 tok/s (its
    attention, router and experts all faster; bench/HISTORY.md, 2026-11-23 run J). Model.forward runs in it, so the
    setting is scoped to moert's forward passes, not the process. The libraries' own get/set calls (~6 us a forward),
    not threadpoolctl's `limit` context (15-30 us: 5% of a small model's decode step)."""
    global _BLAS
    if threads() < 2:
        return contextlib.nullcontext()
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController().select(user_api="blas").lib_controllers
    return _OneBlasThread()


class _OneBlasThread:
    __slots__ = ("before",)

    def __enter__(self):
        self.before = [(lib, lib.get_num_threads()) for lib in _BLAS]
        for lib, n in self.before:
            if n != 1:
                lib.set_num_threads(1)

    def __exit__(self, *exc):
        for lib, n in self.before:
            if n != 1:
                lib.set_num_threads(n)
