"""Devices that hold arrays: the host (`cpu`), CuPy GPUs (`cuda:N`), simulated GPUs (`sim:N`) and remote expert
workers (`ray:N`), behind one small interface through which every move between them goes, counted.

    base.py     the interface (Device: put / to_host / empty / free / xp), the host (CPU), transfer, sizes
    gpus.py     get_devices(gpu_backend, gpu_memory): the GPUs a plan places on; CudaDevice (CuPy)
    cuda.py     whether CuPy sees a CUDA device, and its memory and name (no import of CuPy until asked)
    sim.py      the simulated GPU: NumPy underneath, a GPU's rules on top (no hidden host reads)
    pinned.py   a GPU's crossing to the CPU experts and back: static pinned buffers, async copies, an event
    graph.py    CUDA graphs: a step captured once and replayed, cut into segments at host hops
    remote.py   the `ray:N` device as plans and stats see it (moert/cluster/ implements it on Ray)
    config.py   DeviceConfig: where a model goes, as one value (LM-Kit's DeviceConfiguration)

The runtime's lowest wing: it imports moert.errors, NumPy, and (lazily) CuPy; nothing else of moert.
"""

from moert.devices.base import (
    CPU,
    CpuDevice,
    Device,
    DeviceMismatchError,
    GiB,
    MiB,
    TransferStats,
    check_host,
    device_of,
    format_size,
    host_available_bytes,
    parse_size,
    parse_sizes,
    transfer,
    where,
    xp_of,
)

__all__ = [
    "CPU", "CpuDevice", "Device", "DeviceMismatchError", "GiB", "MiB", "TransferStats", "check_host", "device_of",
    "format_size", "host_available_bytes", "parse_size", "parse_sizes", "transfer", "where", "xp_of",
]
