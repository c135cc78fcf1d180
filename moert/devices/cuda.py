"""The CuPy-only bits, imported lazily: nothing here runs unless a CUDA device is asked for.

    probe()              what CuPy sees, once per process: Probe(count, reason, cupy version, names)
    device_count()       how many CUDA devices (0 without CuPy, driver or GPU)
    why_unavailable()    the real reason for 0: CuPy missing, its import error's text, no driver, zero devices
"""

from __future__ import annotations

from dataclasses import dataclass, field

from moert.errors import PlacementError

INSTALL = "pip install 'moert[gpu-cuda13]' (a CUDA 13 driver) or 'moert[gpu]' (CUDA 12), one CuPy package only"


@dataclass(frozen=True)
class Probe:
    """What CuPy sees on this machine: `count` devices, else `reason` says why none."""

    count: int
    reason: str = ""                        # why count is 0; "" when there are devices
    cupy: str | None = None                 # CuPy's version, None when it does not import
    names: tuple[str, ...] = field(default=())
    packages: tuple[str, ...] = field(default=())   # the CuPy distributions installed (two break each other)


_probe: Probe | None = None


def _cupy_packages() -> tuple[str, ...]:
    from importlib import metadata

    try:
        names = {(d.metadata["Name"] or "").lower() for d in metadata.distributions()}
    except Exception:                    # a broken distribution's metadata: say nothing rather than fail
        return ()
    return tuple(sorted(n for n in names if n == "cupy" or n.startswith("cupy-cuda") or n.startswith("cupy-rocm")))


def probe(refresh: bool = False) -> Probe:
    """What CuPy sees (cached; refresh=True asks again): the device count and names, or the reason for none."""
    global _probe
    if _probe is not None and not refresh:
        return _probe
    packages = _cupy_packages()
    two = f"; {len(packages)} CuPy packages are installed ({', '.join(packages)}): keep one" if packages[1:] else ""
    try:
        import cupy as cp
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == "cupy":
            _probe = Probe(0, "CuPy is not installed", packages=packages)
        else:
            _probe = Probe(0, f"CuPy does not import: {e}{two}", packages=packages)
        return _probe
    except Exception as e:                  # CuPy raises more than ImportError when its CUDA libraries are off
        _probe = Probe(0, f"CuPy does not import: {type(e).__name__}: {e}{two}", packages=packages)
        return _probe
    version = str(getattr(cp, "__version__", "?"))
    try:
        n = int(cp.cuda.runtime.getDeviceCount())
    except Exception as e:  # no driver, no device: CuPy raises CUDARuntimeError (cudaErrorNoDevice, ...Driver)
        text = str(e)
        hint = ("no NVIDIA driver is loaded" if "InsufficientDriver" in text or "NoDriver" in text or
                "driver" in text.lower() else "CUDA reports no usable device")
        _probe = Probe(0, f"CuPy {version} imports but {hint} ({type(e).__name__}: {text}){two}", version,
                       packages=packages)
        return _probe
    if n == 0:
        _probe = Probe(0, f"CuPy {version} sees zero CUDA devices (CUDA_VISIBLE_DEVICES="
                          f"{_visible()!r}){two}", version, packages=packages)
        return _probe
    names = []
    for i in range(n):
        try:
            names.append(device_name(i))
        except Exception as e:               # a device CuPy counts but cannot describe: say so in its name
            names.append(f"(unnamed: {type(e).__name__})")
    _probe = Probe(n, "", version, tuple(names), packages)
    return _probe


def _visible() -> str | None:
    import os

    return os.environ.get("CUDA_VISIBLE_DEVICES")


def cupy():
    """The cupy module, or a PlacementError saying why it is not usable and how to get it."""
    try:
        import cupy as cp
    except Exception as e:
        raise PlacementError(f"CuPy does not import ({type(e).__name__}: {e}); {INSTALL}, or use gpu_backend='sim' "
                             f"to simulate a GPU") from None
    return cp


def device_count() -> int:
    """How many CUDA devices CuPy sees (0 without CuPy, driver or GPU)."""
    return probe().count


def why_unavailable() -> str:
    """Why device_count() is 0 (CuPy missing, its import error, no driver, zero devices); with devices, what it
    sees ("CuPy 14.2.0 sees 1 CUDA device: cuda:0 NVIDIA H200"), never a reason it does not have."""
    p = probe()
    if p.count == 0:
        return p.reason
    listed = ", ".join(f"cuda:{i} {n}" for i, n in enumerate(p.names))
    return f"CuPy {p.cupy} sees {p.count} CUDA device{'s' if p.count > 1 else ''}: {listed}"


def free_memory(index: int) -> int:
    """Free bytes on CUDA device `index` right now."""
    cp = cupy()
    with cp.cuda.Device(index):
        free, _total = cp.cuda.runtime.memGetInfo()
    return int(free)


def memory(index: int) -> tuple[int, int]:
    """(free, total) bytes on CUDA device `index` right now."""
    cp = cupy()
    with cp.cuda.Device(index):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


def device_name(index: int) -> str:
    """CUDA device `index`'s product name, e.g. 'NVIDIA H100 80GB HBM3'."""
    name = cupy().cuda.runtime.getDeviceProperties(index)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)
