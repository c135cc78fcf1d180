"""A model's decode step as a CUDA graph (moert/graphs/decode.py) against the same steps run eagerly, per architecture:
whether the step was captured (else why not), the largest logit difference over the steps, and ms per token of each.

    python bench/bench_decode_graph.py                 on cuda:0 (CuPy and Triton installed): the check a first GPU
                                                       run of the graphs needs (under a minute)
    python bench/bench_decode_graph.py --dry           on sim:0 with the GPU kernels' twins (what the tests run)

Each architecture's tiny file (moert.testing.write_tiny), every weight on the GPU, a 4-token prompt, then --steps
one-token steps; logits within 1e-3 of eager's and "captured: yes" are what to look for. One table, then the
machine and the command.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ARCHS = ["qwen3moe", "qwen2moe", "olmoe", "llama", "gpt-oss", "deepseek2", "gemma3"]


def _steps(path: Path, backend: str, graph: bool, n: int) -> tuple[np.ndarray, float, str]:
    """Logits of n decode steps, seconds a step (after the first: the capture), and what the graph said."""
    import moert
    from moert.graphs.decode import DecodeGraph

    m = moert.load(path, gpu_backend=backend, gpu_layers="all", context_size=64, warmup=False, progress=False)
    try:
        m.forward([3, 17, 5, 9])
        if graph:
            m.decode_graph = DecodeGraph(m)
        out = [m.forward([1])]
        t0 = time.perf_counter()
        out += [m.forward([(7 * i) % 50 + 2]) for i in range(n - 1)]
        dt = (time.perf_counter() - t0) / max(n - 1, 1)
        g = m.decode_graph
        said = "" if g is None else ("yes" if g.why_eager is None else f"no: {g.why_eager}")
        return np.concatenate(out), dt, said
    finally:
        m.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry", action="store_true", help="the simulated GPU with the kernels' twins (no GPU needed)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--arch", default=",".join(ARCHS), help="comma-separated architectures")
    args = ap.parse_args(argv)
    rows = check(args.arch.split(","), "sim" if args.dry else "cupy", args.steps)
    print("| architecture | captured | max logit diff | eager ms/token | graph ms/token |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['captured'][:60]} | {r['diff']:.2e} | {r['eager_ms']:.2f} | {r['graph_ms']:.2f} |")
    print(f"\n{platform.node()}, {'sim:0 (kernels twins)' if args.dry else 'cuda:0'}; "
          f"python bench/bench_decode_graph.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    return 0 if all(r["captured"] == "yes" and r["diff"] < 1e-3 for r in rows) else 1


def check(archs: list[str], backend: str, steps: int = 8) -> list[dict]:
    """Per architecture: arch, captured ("yes", or "no: why"), diff (the largest |logit| difference from eager),
    eager_ms and graph_ms (a step, after the first). backend: "cupy", or "sim" (through the GPU kernels' twins)."""
    from moert.devices.sim import SimDevice
    from moert.testing import write_tiny

    rows, kernels = [], SimDevice.run_kernels
    SimDevice.run_kernels = True                        # the sim reads weights through the GPU kernels' twins
    try:
        with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for arch in archs:
                path = write_tiny(Path(d) / f"{arch}.gguf", arch, seed=3)
                want, eager_s, _ = _steps(path, backend, False, steps)
                got, graph_s, said = _steps(path, backend, True, steps)
                rows.append(dict(arch=arch, captured=said, diff=float(np.abs(got - want).max()),
                                 eager_ms=eager_s * 1e3, graph_ms=graph_s * 1e3))
    finally:
        SimDevice.run_kernels = kernels
    return rows


if __name__ == "__main__":
    sys.exit(main())
