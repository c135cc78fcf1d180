"""moert: a NumPy/Numba reference runtime for Mixture-of-Experts models stored as GGUF.

The pipeline, one module per stage:
    gguf.open(path)            moert/gguf.py        the file: metadata and zero-copy tensor views
    quants.dequantize(...)     moert/quants/        GGML block formats (NumPy/CuPy reference), kernels/ (Numba)
    TensorOverride, -ot        moert/placement/     rules.py: regex (+ expert set) -> device (llama.cpp, LM-Kit)
    plan(model, rules)                              build.py -> plan.py: first match wins, per tensor and expert
    estimate / fit                                  memory.py: pre-flight bytes; strategies.py: rules that fit
    load_weights(gguf, plan)   moert/weights.py     tensors onto cpu / cuda:N / sim:N / ray:N (moert/devices/)
    load(path, ...) -> Model   moert/loader.py      -> moert/model.py: KV cache (kvcache.py), forward, experts.py
    forward(m, tokens)         moert/models/        one file per architecture, on layers.py, moe.py
    generate / stream / chat   moert/text/          tokenizer, chat templates, sampling, the generation loop

The wings above it (the runtime imports none of them):
    predict(plan, hardware)    moert/cost/          the cost model: a placement's speed on hardware you may not have
    moert serve                moert/serve/         an OpenAI-compatible server
    RAY<N> devices             moert/cluster/       experts on Ray workers
    moert explain / inspect    moert/explain/       teaching views of one forward pass
    moert CLI                  moert/cli/           one module per command (main.py: the entry point)
"""

from __future__ import annotations

from importlib import import_module

from moert.errors import (
    ArgumentError,
    ContextOverflowError,
    ContextWarning,
    DeviceOutOfMemory,
    GenerationError,
    GGUFError,
    InvalidTokenError,
    KernelOptionError,
    ModelClosedError,
    MoertError,
    PlacementError,
    PlacementWarning,
    ShapeError,
    TwinError,
    UnsupportedTypeError,
)

__version__ = "0.1.0"

# Public names resolved lazily, so `import moert` stays cheap (no Numba compile, no CuPy probe).
_LAZY = {
    "TensorOverride": "moert.placement",
    "parse_overrides": "moert.placement",
    "DeviceConfig": "moert.devices.config",
    "KVConfig": "moert.kvcache",
    "RayConfig": "moert.cluster",
    "plan": "moert.placement",
    "Plan": "moert.placement",
    "estimate": "moert.placement",
    "fit": "moert.placement",
    "FitResult": "moert.placement",
    "hot_experts": "moert.placement",
    "load_weights": "moert.weights",
    "get_devices": "moert.devices.gpus",
    "load": "moert.loader",
    "Model": "moert.model",
    "ConfigError": "moert.config",
    "DeviceMismatchError": "moert.devices",
    "LoadCancelled": "moert.weights",
    "TokenizerError": "moert.text.tokenizer",
    "SamplingError": "moert.text.sampling",
    "ChatTemplateError": "moert.text.chat",
    "TensorMismatchError": "moert.models.spec",
    "Trace": "moert.trace",
    "TraceError": "moert.trace",
    "Hardware": "moert.cost.hardware",
    "CPU": "moert.cost.hardware",
    "GPU": "moert.cost.hardware",
    "Link": "moert.cost.hardware",
    "HardwareError": "moert.cost.hardware",
    "predict": "moert.cost.predict",
    "calibrate": "moert.cost.calibrate",
    "Prediction": "moert.cost.predict",
    "ExpertCache": "moert.dynamic",
    "replay": "moert.dynamic",
    "Replay": "moert.dynamic",
}

__all__ = [
    "ArgumentError", "ContextOverflowError", "ContextWarning", "DeviceOutOfMemory", "GenerationError", "GGUFError",
    "InvalidTokenError", "KernelOptionError", "ModelClosedError", "MoertError", "PlacementError",
    "PlacementWarning", "ShapeError", "TwinError", "UnsupportedTypeError", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in ("gguf", "quants", "kernels", "devices", "testing", "placement", "kvcache", "weights", "models",
                "trace", "cost", "cli", "dynamic", "text", "serve", "cluster", "explain"):
        return import_module(f"moert.{name}")
    if name == "zoo":                                  # moert.zoo.path(...): the twins live in the cost model's wing
        return import_module("moert.cost.zoo")
    raise AttributeError(f"module 'moert' has no attribute {name!r}")
