"""`DeviceConfig`: where a model goes, as one value (LM-Kit's DeviceConfiguration), for load / plan / fit.

    cfg = moert.DeviceConfig(gpu_layers=20, overrides=[moert.TensorOverride.cpu(r"\\.ffn_.*_exps\\.")],
                             main_gpu=0, tensor_split=[3, 1], gpu_backend="sim", gpu_memory=["8GiB", "8GiB"])
    m = moert.load("model.gguf", device_config=cfg, context_size=4096)
    p = moert.plan("model.gguf", device_config=cfg)            # the same placement, without loading
    r = moert.fit("model.gguf", device_config=cfg)             # ... and what fits

Its fields are the keyword arguments of the same names; giving a field both ways with different values
is a PlacementError, so a config never silently loses to a default or the other way round.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from moert.errors import PlacementError


@dataclass(frozen=True)
class DeviceConfig:
    """GPU layers, tensor overrides, main GPU and split, GPU backend and memory: one placement, one value."""

    gpu_layers: int | str = "all"              # -ngl: N, "all" or "auto"
    overrides: Any = ()                        # TensorOverride rules, (pattern, device) pairs or an -ot string
    main_gpu: int = 0                          # -mg: with split="none", the GPU of every GPU layer
    tensor_split: Sequence[float] | None = None   # -ts: each GPU's share of the GPU layers
    split: str = "layer"                       # -sm: "layer" or "none"
    cpu_moe: bool = False                      # --cpu-moe
    n_cpu_moe: int | None = None               # --n-cpu-moe
    gpu_backend: str = "auto"                  # "auto", "cupy", "sim"
    gpu_memory: Any = None                     # --gpu-mem: "24GiB" or a list, one per GPU

    def kwargs(self) -> dict:
        """The keyword arguments this config stands for (overrides as a list)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        kw["overrides"] = list(kw["overrides"]) if not isinstance(kw["overrides"], str) else kw["overrides"]
        return kw


def accepts_device_config(fn):
    """Let `fn` (load, plan, fit) take device_config=DeviceConfig(...) beside its keyword arguments."""
    sig = inspect.signature(fn)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())

    @functools.wraps(fn)
    def wrapper(*args, device_config: DeviceConfig | None = None, **kwargs):
        if device_config is None:
            return fn(*args, **kwargs)
        if not isinstance(device_config, DeviceConfig):
            raise PlacementError(f"device_config must be a moert.DeviceConfig, got {type(device_config).__name__}")
        positional = dict(zip(sig.parameters, args))
        for name, value in device_config.kwargs().items():
            if name not in sig.parameters and not var_kw:
                continue
            given = positional.get(name, kwargs.get(name, _MISSING))
            if given is _MISSING:
                kwargs[name] = value
            elif _differs(given, value):
                raise PlacementError(f"{name}={given!r} and device_config.{name}={value!r} disagree; give it once")
        return fn(*args, **kwargs)

    return wrapper


_MISSING = object()


def _differs(a, b) -> bool:
    try:
        return bool(a != b)
    except Exception:   # arrays and the like: different objects count as different
        return a is not b


__all__ = ["DeviceConfig", "accepts_device_config"]
