"""bench/gpu_check.py's stages of the GPU kernels alone, each a function (dry, left seconds, save) -> its result:

  kernels    moert.kernels.gpu.matvec per GGML type (GB/s against a device-to-device copy, error against the twin)
  attention  moert.kernels.gpu.attention (bench/bench_gpu_attention.py's rows) at Qwen3-30B-A3B's 32/4 heads of 128
  graph      a tiny model's decode step as a CUDA graph against eager steps (bench/bench_decode_graph.py's check)

save(result) is called as results come in, so a stage stopped by its timeout keeps what it measured.
"""

from __future__ import annotations

import time

ATTN_KV = ("f16", "q8_0")                  # the cache types: llama.cpp's default, and -ctk/-ctv q8_0
ATTN_DEPTHS = (4096, 32768)                # keys in the cache at a decode step
GRAPH_ARCHS = ("qwen3moe", "gpt-oss")      # the Qwen3 MoE family; gpt-oss: MXFP4 experts, windows and sinks


def _timed(fn, xp, reps: int) -> float:
    """Seconds per call of fn() (CUDA events on CuPy, wall time on NumPy), after 3 warm-up calls."""
    for _ in range(3):
        fn()
    if xp.__name__ == "cupy":
        start, end = xp.cuda.Event(), xp.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return xp.cuda.get_elapsed_time(start, end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _copy_seconds(xp, nbytes: int, reps: int) -> float:
    """Seconds of one device-to-device copy of nbytes (the bandwidth a matvec reading its weight once can reach)."""
    src = xp.ones(nbytes, dtype=xp.uint8)
    dst = xp.empty_like(src)
    return _timed(lambda: xp.copyto(dst, src), xp, reps)


def _failed(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e)[:120]}"


def stage_kernels(dry: bool, left: float, save=lambda r: None) -> dict:
    import numpy as np

    from moert.cost.zoo_data import random_blocks
    from moert.quants import ggml_type

    try:
        import moert.kernels.gpu as kg
    except ImportError as e:
        return {"status": "not built", "why": str(e)}
    if dry:
        xp, shapes, copy_bytes, reps = np, [(256, 256)], 1 << 20, 3
    else:
        import cupy as xp
        shapes, copy_bytes, reps = [(4096, 4096), (8192, 8192)], 1 << 30, 50
    out = {"copy_gbs": 2 * copy_bytes / _copy_seconds(xp, copy_bytes, reps) / 1e9, "types": {}}
    t_end = time.perf_counter() + left - 5
    for name in kg.GPU_TYPES:
        row = out["types"][name] = {}
        for n, k in shapes:
            if time.perf_counter() > t_end:
                row[f"{n}x{k}"] = "skipped: out of time"
                continue
            try:
                t = ggml_type(name)
                w_h = random_blocks(name, n * k // t.block_size).reshape(n, -1)         # (N, row bytes)
                x_h = np.random.default_rng(0).standard_normal((1, k)).astype(np.float32)
                w, x = xp.asarray(w_h), xp.asarray(x_h)
                s = _timed(lambda w=w, x=x, n=n, k=k, t=name: kg.matvec(w, t, (n, k), x), xp, reps)
                err = None
                if (n, k) == shapes[0]:                    # the twin on the first shape only (float64 NumPy: slow)
                    y = kg.matvec(w, name, (n, k), x)
                    y = y.get() if hasattr(y, "get") else np.asarray(y)
                    ref = kg.matmul_ref(w_h, name, (n, k), x_h)
                    err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
                row[f"{n}x{k}"] = {"gbs": w_h.nbytes / s / 1e9, "us": s * 1e6, "rel_err": err}
            except Exception as e:                  # a type the kernels or the quantizer do not take: say which
                row[f"{n}x{k}"] = _failed(e)
        save(out)                                          # the first compile of each type is slow: keep what ran
    return out


def stage_attention(dry: bool, left: float, save=lambda r: None) -> dict:
    """Decode attention (one token) at each depth and a prompt's, per cache type; dry: 4/2 heads of 32, 40 keys and
    a 12-token prompt under Triton's interpreter."""
    import numpy as np

    try:
        import bench_gpu_attention as ba
    except ImportError as e:
        return {"status": "not built", "why": str(e)}
    if dry:
        xp, backend, reps, copy_bytes, (h, hk, d), depths, prompt = np, "interpret", 1, 1 << 20, (4, 2, 32), [40], 12
    else:
        import cupy as xp
        backend, reps, copy_bytes, (h, hk, d), depths, prompt = None, 20, 1 << 30, (32, 4, 128), list(ATTN_DEPTHS), 512
    out = {"heads": f"{h}/{hk} of {d}", "copy_gbs": ba.copy_gbs(xp, copy_bytes), "rows": []}
    t_end = time.perf_counter() + left - 5
    for kind in ATTN_KV:
        if time.perf_counter() > t_end:
            out["rows"].append({"kv": kind, "what": "", "failed": "skipped: out of time"})
            continue
        try:
            for r in ba.measure(xp, [kind], depths, h, hk, d, 1, prompt, reps, backend):
                out["rows"].append(r)
                save(out)                                  # each row as it comes: the first call of each compiles
        except Exception as e:
            out["rows"].append({"kv": kind, "what": "", "failed": _failed(e)})
    return out


def stage_graph(dry: bool, left: float, save=lambda r: None) -> dict:
    """Per architecture: its tiny file all on the GPU, eager steps then the captured step (sim: the kernels' twins)."""
    try:
        import bench_decode_graph as bg
    except ImportError as e:
        return {"status": "not built", "why": str(e)}
    out: dict = {"archs": {}}
    t_start, t_end = time.perf_counter(), time.perf_counter() + left - 5
    for i, arch in enumerate(GRAPH_ARCHS):
        per = (time.perf_counter() - t_start) / i if i else 0.0     # what the first one took: the next may too
        if time.perf_counter() + per / 2 > t_end:
            out["archs"][arch] = f"skipped: {t_end - time.perf_counter():.0f} s left, the last took {per:.0f} s"
            continue
        try:
            (out["archs"][arch],) = bg.check([arch], "sim" if dry else "cupy", 3 if dry else 8)
        except Exception as e:
            out["archs"][arch] = _failed(e)
        save(out)
    return out


def rows(stage: str, r: dict) -> list[tuple[str, str, str]]:
    """(stage, item, result) lines of gpu_check's table for these stages' results."""
    out = []
    if stage == "kernels":
        out.append((stage, "device copy", f"{r['copy_gbs']:.0f} GB/s (read + write)"))
        for t, by in r["types"].items():
            for shape, v in by.items():
                err = "" if not isinstance(v, dict) or v["rel_err"] is None else f", rel err {v['rel_err']:.1e}"
                out.append((stage, f"matvec {t} {shape}", f"{v['gbs']:.0f} GB/s, {v['us']:.0f} us{err}"
                            if isinstance(v, dict) else v))
    elif stage == "attention":
        out.append((stage, f"heads {r['heads']}", f"device copy {r['copy_gbs']:.0f} GB/s (read + write)"))
        for v in r["rows"]:
            err = "" if v.get("rel_err") is None else f", rel err {v['rel_err']:.1e}"
            item = f"{v['kv']} cache, {v['what']}" if v["what"] else f"{v['kv']} cache"
            out.append((stage, item, v["failed"] if "failed" in v else
                        f"{v['gbs']:.0f} GB/s ({100 * v['gbs'] / r['copy_gbs']:.0f}% of a copy), {v['us']:.0f} us{err}"
                        if v["tflops"] is None else f"{v['tflops']:.1f} TFLOP/s, {v['us']:.0f} us{err}"))
    elif stage == "graph":
        for arch, v in r["archs"].items():
            out.append((stage, f"decode graph, tiny {arch}", v if not isinstance(v, dict) else
                        f"captured: {v['captured'][:80]}, max logit diff {v['diff']:.1e}, eager {v['eager_ms']:.2f} "
                        f"ms/token, graph {v['graph_ms']:.2f} ms/token"))
    return out
