"""Full-size twins that run: a zoo twin's header (moert/cost/zoo.py) with random but valid quantized weights,
written at disk speed.

    p = moert.cost.zoo_data.materialize("qwen3-30b-a3b", "Q4_K_M", "q30.gguf")       # 48 layers, 18.6 GB
    p = materialize("qwen3-30b-a3b", path="q30-2.gguf", layers=2)                     # the same, 2 layers
    moert twin zoo:qwen3-30b-a3b -o q30.gguf [--layers 2] [--quant Q4_K_M]             # the same, from the shell

moert.testing writes small real models through gguf-py's writer, quantizing every row (about 30 s a layer at
these shapes). Here each GGML type's blocks are quantized once: a pool of POOL_BLOCKS random rows through moert's
own quantizer (moert/quants/quantize.py), so every block's f16 scales are finite and sane, is shuffled into a
SLAB_BYTES slab, and each tensor is that slab read from a random block offset, wrapping around, handed to the
file in large sequential writes without a copy. Norms are ones (+-5%), the MoE router F32 random, so routing
spreads over the experts as a trained one's does. The weights mean nothing: the file is for speed, memory and
placement checks (bench/gpu_check.py), not for text. It is marked `moert.materialized = true`, not as a twin, so
moert.load runs it; it has no tokenizer (give token ids).

Measured on the 2-core build machine (2026-11-28, `moert.cost.zoo_data.measure`, a virtual disk that takes 0.14
GB/s of plain zeros): the full 48-layer qwen3-30b-a3b Q4_K_M, 18.55 GB, in 138.6 s with the fsync, 0.134 GB/s
(7.5 s a GB: the disk's speed); 2 layers (1.19 GB) into tmpfs in 1.66 s, 0.71 GB/s, 87% of it inside write().
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from moert.cost import zoo
from moert.quants.types import ggml_type

POOL_BLOCKS = 4096            # distinct quantized blocks per type
SLAB_BYTES = 32 << 20         # the shuffled slab every tensor of that type is read from
WEIGHT_STD = 0.02             # the random weights' spread (a fresh model's init; keeps 48 layers' logits finite)


def _slab(type_name: str, rng: np.random.Generator) -> np.ndarray:
    """SLAB_BYTES of valid `type_name` blocks, (n_blocks, type_size) uint8: POOL_BLOCKS quantized once, shuffled."""
    from moert.quants.quantize import quantize

    t = ggml_type(type_name)
    x = (rng.standard_normal((POOL_BLOCKS, t.block_size)) * WEIGHT_STD).astype(np.float32)
    pool = quantize(x, type_name).reshape(POOL_BLOCKS, t.type_size)                 # (P, type_size)
    n = max(POOL_BLOCKS, SLAB_BYTES // t.type_size)
    return np.ascontiguousarray(pool[rng.integers(0, POOL_BLOCKS, n)])               # (n, type_size)


def random_blocks(type_name: str, n_blocks: int, seed: int = 0) -> np.ndarray:
    """n_blocks valid random blocks of a GGML type moert quantizes to, (n_blocks, type_size) uint8: a weight matrix's
    raw bytes for kernel benchmarks (bench/gpu_check.py), at copying speed. Other types: a ZooError."""
    from moert.quants.quantize import QUANTIZABLE

    if type_name not in QUANTIZABLE:
        raise zoo.ZooError(f"no random {type_name} blocks: moert quantizes to {', '.join(sorted(QUANTIZABLE))}")
    rng = np.random.default_rng(seed)
    slab = _slab(type_name, rng)
    return slab[np.arange(n_blocks) % slab.shape[0]] if n_blocks > slab.shape[0] else slab[:n_blocks].copy()


def _floats(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """An F32 tensor: norms ones +-5%, the router (and any other matrix) random of spread WEIGHT_STD * 5."""
    if len(shape) == 1:
        return (1 + 0.05 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) * WEIGHT_STD * 5).astype(np.float32)


def _write_blocks(f, slab: np.ndarray, nbytes: int, rng: np.random.Generator) -> None:
    """nbytes of the slab's blocks from a random block offset, wrapping around (nbytes a whole number of blocks)."""
    flat = slab.reshape(-1)
    start = int(rng.integers(0, slab.shape[0])) * slab.shape[1]
    while nbytes:
        n = min(nbytes, flat.size - start)
        f.write(memoryview(flat[start:start + n]))
        nbytes -= n
        start = 0


def materialize(name: str, quant: str | None = None, path: str | os.PathLike | None = None, *,
                layers: int | None = None, seed: int = 0,
                progress: Callable[[int, int], None] | None = None) -> Path:
    """Write zoo twin `name` (quant mix `quant`, the twin's own by default) with random valid weights to `path`
    (default: the zoo cache, `NAME-QUANT[-LN]-materialized.gguf`); layers=N keeps the first N layers. progress(done,
    total) is called after each tensor with bytes written. Returns the path; moert.load runs it."""
    tw = zoo.twin(name, layers)
    q = (quant or tw.quant).upper()
    if path is None:
        cut = f"-L{layers}" if layers is not None else ""
        path = zoo.cache_dir() / f"{tw.name}-{q}{cut}-materialized.gguf"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head, placed = zoo.header(tw, q, **{zoo.TWIN_KEY: False, "moert.materialized": True,
                                        "general.name": f"{tw.name} (moert materialized twin, random weights)"})
    from moert.quants.quantize import QUANTIZABLE

    bad = sorted({t for _, t, _, _ in placed} - QUANTIZABLE - {"F32", "F16", "BF16"})
    if bad:
        raise zoo.ZooError(f"materialize cannot write {', '.join(bad)} blocks ({tw.name} {q}); moert quantizes to "
                           f"{', '.join(sorted(QUANTIZABLE))}: pick a quant mix of those types, e.g. Q4_K_M or Q8_0")
    rng = np.random.default_rng(seed)
    slabs: dict[str, np.ndarray] = {}
    total = placed[-1][3] + zoo.nbytes(placed[-1][1], placed[-1][2])
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb", buffering=0) as f:
        f.write(head)
        for tname, t, shape, offset in placed:
            pad = offset - (f.tell() - len(head))
            if pad:
                f.write(b"\0" * pad)                                                  # alignment between tensors
            if t in ("F32", "F16", "BF16"):
                f.write(_float_bytes(_floats(tname, shape, rng), t))
            else:
                if t not in slabs:
                    slabs[t] = _slab(t, rng)
                _write_blocks(f, slabs[t], zoo.nbytes(t, shape), rng)
            if progress is not None:
                progress(offset + zoo.nbytes(t, shape), total)
        f.write(b"\0" * (-f.tell() % zoo.ALIGNMENT))
    tmp.replace(path)
    return path


def _float_bytes(x: np.ndarray, type_name: str) -> bytes:
    """x's bytes as F32, F16 or BF16 (the top half of each float32, as gguf-py truncates)."""
    if type_name == "BF16":
        return (x.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return x.astype(np.float32 if type_name == "F32" else np.float16).tobytes()


def measure(name: str = "qwen3-30b-a3b", quant: str | None = None, layers: int = 8,
            folder: str | os.PathLike | None = None) -> dict:
    """Write a materialized twin and time it: {"path", "bytes", "seconds", "gb_s"} (GB = 1e9 bytes)."""
    folder = Path(folder or zoo.cache_dir())
    t0 = time.perf_counter()
    p = materialize(name, quant, folder / f"{name}-measure-L{layers}.gguf", layers=layers)
    with open(p, "rb+") as f:
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    size = p.stat().st_size
    return {"path": str(p), "bytes": size, "seconds": dt, "gb_s": size / dt / 1e9}


__all__ = ["POOL_BLOCKS", "SLAB_BYTES", "WEIGHT_STD", "materialize", "measure", "random_blocks"]
