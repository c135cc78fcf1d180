"""moert: a NumPy/Numba reference runtime for Mixture-of-Experts models stored as GGUF.

The pipeline, one module per stage:
    gguf.open(path)            moert/gguf.py        the file: metadata and zero-copy tensor views
    quants.dequantize(...)     moert/quants/        GGML block formats (NumPy/CuPy reference), kernels/ (Numba)
    TensorOverride, -ot        moert/rules.py       placement rules: regex -> device (llama.cpp / LM-Kit semantics)
    plan(model, rules)         moert/placement.py   first-match regex rules -> a device per tensor
    estimate / fit             moert/memory.py      pre-flight memory per device
    load_weights(gguf, plan)   moert/weights.py     tensors onto cpu / cuda:N / sim:N (moert/devices.py)
    load(path, ...) -> Model   moert/model.py       KV cache + forward; architectures in moert/models/
    generate / stream / chat   moert/generate.py    tokenizer.py, sampling.py, chat.py
    predict(plan, hardware)    moert/predict.py     speed on other hardware: hardware.py, zoo.py, strategies.py
"""

from __future__ import annotations

from importlib import import_module

from moert.errors import (
    ContextOverflowError,
    DeviceOutOfMemory,
    GenerationError,
    GGUFError,
    InvalidTokenError,
    KernelOptionError,
    MoertError,
    PlacementError,
    PlacementWarning,
    TwinError,
    UnsupportedTypeError,
)

__version__ = "0.1.0"

# Public names resolved lazily, so `import moert` stays cheap (no Numba compile, no CuPy probe).
_LAZY = {
    "TensorOverride": "moert.rules",
    "parse_overrides": "moert.rules",
    "plan": "moert.placement",
    "Plan": "moert.placement",
    "estimate": "moert.memory",
    "fit": "moert.memory",
    "FitResult": "moert.memory",
    "load_weights": "moert.weights",
    "get_devices": "moert.devices",
    "load": "moert.model",
    "Model": "moert.model",
    "ConfigError": "moert.config",
    "DeviceMismatchError": "moert.devices",
    "LoadCancelled": "moert.weights",
    "TokenizerError": "moert.tokenizer",
    "SamplingError": "moert.sampling",
    "ChatTemplateError": "moert.chat",
    "Hardware": "moert.hardware",
    "CPU": "moert.hardware",
    "GPU": "moert.hardware",
    "Link": "moert.hardware",
    "HardwareError": "moert.hardware",
    "predict": "moert.predict",
    "Prediction": "moert.predict",
}

__all__ = [
    "ContextOverflowError", "DeviceOutOfMemory", "GenerationError", "GGUFError", "InvalidTokenError",
    "KernelOptionError", "MoertError",
    "PlacementError", "PlacementWarning", "TwinError", "UnsupportedTypeError", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in ("gguf", "quants", "kernels", "devices", "testing", "rules", "placement", "memory", "weights", "models",
                "hardware", "zoo", "strategies"):
        return import_module(f"moert.{name}")
    raise AttributeError(f"module 'moert' has no attribute {name!r}")
