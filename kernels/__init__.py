"""moert.kernels: Numba CPU kernels (installed as moert.kernels; each has a NumPy reference twin)."""
