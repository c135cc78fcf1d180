"""Experts on Ray workers: `moert.load(path, rules naming RAY<N>, ray="local:2" | "HOST:PORT" | "auto")`.

    actors.py   connect / use_cluster / attach: ray.init, one actor per ray:N, each mapping its own file
    graph.py    one MoE layer's calls to every worker as one Ray Compiled Graph execute (MOERT_RAY_CALLS=plain: not)
    worker.py   what runs inside a worker: its experts, one message each way per layer, the host's own kernels

A wing above the runtime: it imports the runtime's devices (moert/devices/remote.py's RemoteDevice), quants and
kernels; the runtime imports nothing from here (moert/loader.py composes the two).
"""

from moert.cluster.actors import (
    RayConfig,
    RayDevice,
    attach,
    close_all,
    connect,
    parse_address,
    start,
    started,
    use_cluster,
)

__all__ = ["RayConfig", "RayDevice", "attach", "close_all", "connect", "parse_address", "start", "started",
           "use_cluster"]
