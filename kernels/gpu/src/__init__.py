"""The Triton sources of moert.kernels.gpu (imported by kernels/gpu/launch.py, never by the package itself)."""
