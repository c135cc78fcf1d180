"""The cost model: a placement's speed on hardware you may not have (predict.py), the parts and presets it reads
(hardware.py, presets.py, machines.py, calibrate.py), model twins (zoo.py), strategies that need hardware
(strategies.py), and the virtual clock that times a real run's sim GPUs (vclock.py).

A machine is described here: `moert.cost.preset("rtx3090+ryzen-7950x")`, `moert.calibrate()` (this CPU,
measured: calibrate.py), or parts of your own (`moert.cost.CPU(...)`, `GPU(...)`, `Link(...)`, `Hardware(...)`).

A wing above the runtime: it reads plans, GGUF metadata and (calibrate) runs kernels; the runtime imports nothing
from here (moert/loader.py applies the virtual clock as a pass).
"""

from __future__ import annotations

from importlib import import_module

# the names a user describes a machine with, resolved lazily (importing the cost model stays cheap)
_LAZY = {
    **dict.fromkeys(("CPU", "GPU", "MAX_GPUS", "MAX_SOCKETS", "NUMA_MODES", "Hardware", "HardwareError", "Link",
                     "ddr_gbs", "numa_view", "pcie_gbs", "sockets"), "moert.cost.hardware"),
    **dict.fromkeys(("CPUS", "GPUS", "LINKS", "examples", "preset_link", "table", "to_dict"), "moert.cost.presets"),
    **dict.fromkeys(("preset", "with_cpu"), "moert.cost.machines"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'moert.cost' has no attribute {name!r}")
