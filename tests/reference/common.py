"""What the reference scripts share: the error measure and the versions recorded in every fixture."""

from __future__ import annotations

import numpy as np


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Relative L2 error of a against b, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def versions() -> dict:
    """Versions of the libraries that made a fixture (those installed)."""
    v = {"numpy": np.__version__}
    for mod in ("torch", "transformers", "llama_cpp", "gguf"):
        try:
            v[mod] = getattr(__import__(mod), "__version__", "?")
        except ImportError:
            pass
    return v
