"""`moert.hardware`, as the README shows it (preset, calibrate, CPU, GPU, Link, ...): the parts live in the cost
model's wing, moert/cost/ (hardware.py the parts, presets.py the preset parts, machines.py a machine from a
name or a JSON file, calibrate.py this machine measured)."""

from moert.cost.calibrate import calibrate
from moert.cost.hardware import (
    CPU,
    GPU,
    MAX_GPUS,
    MAX_SOCKETS,
    NUMA_MODES,
    Hardware,
    HardwareError,
    Link,
    ddr_gbs,
    numa_view,
    pcie_gbs,
    sockets,
)
from moert.cost.machines import preset, with_cpu
from moert.cost.presets import CPUS, GPUS, LINKS, examples, preset_link, table, to_dict

__all__ = ["CPU", "CPUS", "GPU", "GPUS", "Hardware", "HardwareError", "LINKS", "Link", "MAX_GPUS", "MAX_SOCKETS",
           "NUMA_MODES", "calibrate", "ddr_gbs", "examples", "numa_view", "pcie_gbs", "preset", "preset_link",
           "sockets", "table", "to_dict", "with_cpu"]
