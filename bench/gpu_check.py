"""One command for a GPU lease: is moert's GPU path right, and how fast is it, against the peer a Python user has.

    python bench/gpu_check.py --out DIR              # a fresh H100/H200: CuPy, numba, torch, triton, no internet
                                                     # (on the lent machine: --out $OUT; the twins go to a temp dir)
    python bench/gpu_check.py --out DIR --dry        # every stage at tiny sizes on the sim GPU, no CuPy (CI runs it)

Stages, each in its own process under a timeout, skipped (saying so) when the time left cannot hold it:
  tests      pytest tests/test_cuda*.py -k cupy: the summary line (dry: tests/test_cuda.py -k sim); the other GPU
             tests (test_gpu_attention.py, test_gpu_graph.py, test_gpu_routing.py) have no CuPy cases: they run the
             kernels' source under Triton's interpreter and on the sim, as CI does
  kernels    GB/s of moert.kernels.gpu.matvec per GGML type on 4096x4096 and 8192x8192 weights (one token), against
             a device-to-device copy (read + write bytes / s); its error against the NumPy twin ("not built" without
             the package)
  attention  moert.kernels.gpu.attention at Qwen3-30B-A3B's 32/4 heads of 128 over f16 and q8_0 caches: a decode
             token's GB/s over the cache at 4096 and 32768 keys (% of the copy's), a 512-token prompt's TFLOP/s, each
             with its error against the twin (bench/bench_gpu_attention.py's rows)
  graph      the decode step as a CUDA graph on tiny qwen3moe and gpt-oss files all on the GPU: captured or why not,
             the largest logit difference from eager steps, ms/token of each (bench/bench_decode_graph.py's check)
  e2e        pp512 / tg128 (moert.bench, 16 threads, --act-quant int8) for -ngl 0 (no GPU), -cmoe (with op offload
             and without) and all-GPU; -cmoe's and all-GPU's tg run again with the decode step as a CUDA graph
             (-cmoe: segments between the CPU experts' crossings; captured or why not), on a Qwen3-30B-A3B-shaped
             Q4_K_M twin with random valid weights (moert/cost/zoo_data.py): a 4-layer probe first, then as many of
             the 48 layers as the budget holds (the table says how many; a configuration short of time drops to one
             repetition, then tg32, then tg8)
  peer       transformers' Qwen3MoeForCausalLM, bf16, everything on the GPU, random weights of the same shapes and
             layers: pp512 and decode tokens/s
It prints one table and writes DIR/gpu_check.json (and each stage's DIR/<stage>.json).

Before the stages: gguf-py from bench/wheels/ when `import gguf` fails (the GPU image has none and no internet), and
moert installed in place (pip install --no-deps --no-build-isolation -e .) when moert.kernels does not import.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import gpu_check_kernels

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / "bench" / "wheels"
BUDGET_S = 440                                       # the stages: with the setup, under 8 minutes of a 15-minute lease
STAGES = {"tests": 95, "kernels": 50, "attention": 35, "graph": 45, "e2e": 155, "peer": 60}   # each one's limit, s
MIN_S = {"tests": 20, "kernels": 10, "attention": 10, "graph": 15, "e2e": 40, "peer": 20}   # less left: skipped
TWIN, QUANT, LAYERS, PROBE_LAYERS = "qwen3-30b-a3b", "Q4_K_M", 48, 4
CONFIGS = {                                          # -ngl 0 with no GPU at all: a GPU would take big batches' experts
    "-ngl 0 (no GPU)": dict(gpu_layers=0, gpu_backend="none"),
    "-cmoe": dict(cpu_moe=True),                     # pp: the selected experts copied to the GPU (op offload)
    "-cmoe --offload-min-batch 0": dict(cpu_moe=True, offload_min_batch=0),
    "all GPU": dict(),
}
GRAPH = ("-cmoe", "all GPU")                         # their tg runs again with the decode step as a CUDA graph


def python(*args: str, timeout: float | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def ensure_deps() -> list[str]:
    """gguf-py from the carried wheel, moert installed in place, when they do not import; the notes of what was done
    or what is missing, with the fix."""
    notes = []
    if python("-c", "import gguf").returncode:
        wheels = sorted(WHEELS.glob("gguf-*.whl"))
        r = python("-m", "pip", "install", "--no-deps", "--no-index", *map(str, wheels[-1:])) if wheels else None
        notes.append(f"gguf: installed {wheels[-1].name} from bench/wheels" if r and not r.returncode else
                     "gguf: does not import and bench/wheels has no wheel that installs; fix: pip download gguf "
                     "--no-deps -d bench/wheels/ where there is internet, then run again")
    if python("-c", "import moert.kernels").returncode:
        r = python("-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", ".")
        notes.append("moert: installed in place (pip install --no-deps --no-build-isolation -e .)" if not r.returncode
                     else f"moert: does not import and does not install: {r.stderr.strip()[-300:]}")
    for mod in ("numpy", "numba", "regex", "yaml", "tqdm"):
        if python("-c", f"import {mod}").returncode:
            notes.append(f"{mod}: missing; fix: carry its wheel in bench/wheels/ or pip install {mod} with internet")
    return notes


# ----------------------------------------------------------------------------------------------- stages

def stage_tests(dry: bool, left: float) -> dict:
    files = ["tests/test_cuda.py"] if dry else ["tests/test_cuda.py", "tests/test_cuda_forward.py",
                                                "tests/test_cuda_cache.py"]
    try:
        r = python("-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *files, "-k", "sim" if dry else "cupy",
                   timeout=left)
    except subprocess.TimeoutExpired as e:               # what ran so far, from pytest's progress characters
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
        dots = "".join(ln.split(" [")[0] for ln in text.splitlines() if re.fullmatch(r"[.FEsx]+( +\[ *\d+%\])?", ln))
        return {"summary": f"timed out after {left:.0f} s: {dots.count('.')} passed, {dots.count('F')} failed, "
                           f"{dots.count('E')} errors so far", "rc": "timeout", "failures": []}
    last = [ln for ln in r.stdout.splitlines() if " passed" in ln or " failed" in ln or " error" in ln]
    return {"summary": last[-1].strip("= ") if last else r.stdout.strip()[-200:], "rc": r.returncode,
            "failures": [ln for ln in r.stdout.splitlines() if ln.startswith("FAILED")][:20]}


def _model_file(dry: bool, layers: int, work: Path) -> tuple[Path, float]:
    """The benchmark file and the seconds it took to write (dry: a tiny qwen3moe of moert.testing)."""
    t0 = time.perf_counter()
    if dry:
        from moert.testing import write_tiny
        p = write_tiny(work / "tiny.gguf", "qwen3moe")
    else:
        from moert.cost.zoo_data import materialize
        p = materialize(TWIN, QUANT, work / f"{TWIN}-{QUANT}-L{layers}.gguf", layers=layers)
    return p, time.perf_counter() - t0


def _bench(path: Path, config: dict, dry: bool, n_prompt: int, n_gen: int, reps: int, graph: bool = False) -> dict:
    """pp and tg of one configuration; with graph, tg again with the decode step as a CUDA graph (DecodeGraph), and
    whether it was captured, else why not, or how it failed (the eager numbers kept); dry: the sim runs the GPU
    kernels' twins then, as a GPU runs them."""
    import moert
    from moert.bench import bench
    from moert.devices.sim import SimDevice
    from moert.graphs.decode import DecodeGraph

    kernels, g, m = SimDevice.run_kernels, None, None
    SimDevice.run_kernels = kernels or (dry and graph)
    try:
        t0 = time.perf_counter()
        m = moert.load(path, threads=None if dry else 16, context_size=1024, act_quant=None if dry else "int8",
                       progress=False, **{"gpu_backend": "sim" if dry else "cupy", **config})
        load_s = time.perf_counter() - t0
        pp, tg = bench(m, n_prompt=n_prompt, n_gen=n_gen, repetitions=reps)
        offload = sum(t.offload_bytes for t in m.stats.total.transfers.values())   # experts copied for prompts
        if graph:                                          # the warm-up's first step captures it (untimed)
            try:
                m.decode_graph = DecodeGraph(m)
                with warnings.catch_warnings():            # a step that cannot be captured: said in the result
                    warnings.simplefilter("ignore")
                    (tg_g,) = bench(m, n_prompt=0, n_gen=n_gen, repetitions=reps)
                why = m.decode_graph.why_eager
                g = {"tg": tg_g.avg_ts, "captured": "yes" if why is None else f"no: {why}"}
            except Exception as e:                         # not yet run on a GPU: the eager numbers stay
                g = {"tg": None, "captured": f"failed: {type(e).__name__}: {str(e)[:200]}"}
    finally:
        SimDevice.run_kernels = kernels
        if m is not None:
            m.close()
    return {"pp": pp.avg_ts, "tg": tg.avg_ts, "pp_s": n_prompt / pp.avg_ts, "tg_s": n_gen / tg.avg_ts,
            "load_s": load_s, "n_prompt": n_prompt, "n_gen": n_gen, "reps": reps, "offload_bytes": offload,
            "graph": g}


def _fit_run(p: dict, ratio: float, left: float, n_gen: int, reps: int) -> tuple[int, int] | None:
    """(n_gen, reps) for a config whose probe at 4 layers was p, on a file `ratio` times its bytes, in `left` s:
    as asked, else one repetition, else tg32, else tg8; None when not even that fits."""
    for r, g in ((reps, n_gen), (1, n_gen), (1, 32), (1, 8)):
        tg_s = p["tg_s"] + p.get("graph_tg_s", 0.0)            # tg eager, and again as a graph (GRAPH)
        if ratio * (r * (p["pp_s"] + tg_s * g / p["n_gen"]) + p.get("load_est_s", p["load_s"])) <= left:
            return g, r
    return None


def stage_e2e(dry: bool, left: float, work: Path, save=lambda r: None) -> dict:
    from moert.cost import zoo

    n_prompt, n_gen, reps = (40, 4, 1) if dry else (512, 128, 2)      # dry: 40 tokens, so op offload runs
    t_end = time.perf_counter() + left
    probe_file, write_s = _model_file(dry, PROBE_LAYERS, work)
    out: dict = {"write_gbs": probe_file.stat().st_size / write_s / 1e9, "probe": {}, "layers": PROBE_LAYERS}
    for name, config in CONFIGS.items():                   # pp n_prompt, tg 8: what each costs at 4 layers
        out["probe"][name] = _bench(probe_file, config, dry, n_prompt, min(8, n_gen), 1)
        save(out)
    first = min(p["load_s"] for p in out["probe"].values())   # the first load compiled the CPU kernels: once
    for name, p in out["probe"].items():
        p["load_est_s"] = min(p["load_s"], 2 * first)         # what a load costs once compiled
        p["graph_tg_s"] = p["tg_s"] if name in GRAPH else 0.0  # the graph's tg: no longer than eager's (a guess)

    def ratio(L: int) -> float:                            # time goes with the bytes read: the files' bytes
        if dry:
            return 1.0
        size = [sum(zoo.nbytes(t, s) for _, t, s in zoo.layout(zoo.twin(TWIN, n), QUANT)) for n in (L, PROBE_LAYERS)]
        return size[0] / size[1]

    def cost(L: int, g: int = n_gen, r: int = 1) -> float:
        run = sum(r * (p["pp_s"] + (p["tg_s"] + p["graph_tg_s"]) * g / p["n_gen"]) + p["load_est_s"]
                  for p in out["probe"].values())
        return ratio(L) * (run + (write_s if L != PROBE_LAYERS else 0))
    layers = PROBE_LAYERS
    if not dry:                                            # as many layers as one repetition of each config allows
        left_now = t_end - time.perf_counter() - 10
        layers = max([L for L in range(PROBE_LAYERS, LAYERS + 1) if cost(L) <= left_now], default=PROBE_LAYERS)
        out["estimate_s_48"] = cost(LAYERS, r=reps)
    out["layers"] = layers
    out["model"] = ("a tiny qwen3moe (moert.testing, dry)" if dry else
                    f"{TWIN} {QUANT}, {layers} of {LAYERS} layers" + (f" ({LAYERS}: about {out['estimate_s_48']:.0f} s)"
                                                                      if layers < LAYERS else ""))
    path = probe_file if layers == PROBE_LAYERS else _model_file(dry, layers, work)[0]
    out["runs"] = {}
    names = list(CONFIGS)
    for i, name in enumerate(names):                       # each config its share of what is left
        share = (t_end - time.perf_counter() - 5) / (len(names) - i)
        fit = (n_gen, reps) if dry else _fit_run(out["probe"][name], ratio(layers), share, n_gen, reps)
        if fit is None:
            out["runs"][name] = f"skipped: pp{n_prompt} + tg8 would not fit its {share:.0f} s"
            continue
        out["runs"][name] = _bench(path, CONFIGS[name], dry, n_prompt, *fit, graph=name in GRAPH)
        save(out)                                          # what a timeout leaves is still in the table
    return out


def stage_peer(dry: bool, left: float, layers: int) -> dict:
    try:
        import torch
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    except ImportError as e:
        return {"status": "skipped", "why": f"{e}; fix: pip install transformers (needs internet)"}
    from moert.cost import zoo

    h = zoo.twin(TWIN).hp
    dims = (dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=128,
                 vocab_size=256) if dry else
            dict(hidden_size=h["D"], num_hidden_layers=layers, num_attention_heads=h["H"], num_key_value_heads=h["Hkv"],
                 head_dim=h["Dh"], num_experts=h["X"], num_experts_per_tok=h["K"], moe_intermediate_size=h["F"],
                 intermediate_size=h["ff"], vocab_size=h["V"]))
    cfg = Qwen3MoeConfig(**dims, norm_topk_prob=True, max_position_embeddings=4096)
    dev = "cpu" if dry else "cuda"
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = Qwen3MoeForCausalLM(cfg).eval()
    n_prompt, n_gen = (16, 4) if dry else (512, 32)
    ids = torch.randint(0, cfg.vocab_size, (1, n_prompt), device=dev)

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        model(ids[:, :32])                                                           # warm-up
        sync()
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        sync()
        pp_s = time.perf_counter() - t0
        pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(n_gen):
            out = model(tok, past_key_values=pkv, use_cache=True)
            pkv, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        sync()
        tg_s = time.perf_counter() - t0
    import transformers
    return {"pp": n_prompt / pp_s, "tg": n_gen / tg_s, "n_prompt": n_prompt, "n_gen": n_gen, "layers": dims[
        "num_hidden_layers"], "transformers": transformers.__version__, "torch": torch.__version__}


# ------------------------------------------------------------------------------------------ the run


def run_stage(stage: str, dry: bool, left: float, out: Path) -> dict:
    """One stage in this process (the child's side): its result, also written to out/<stage>.json."""
    if stage == "tests":
        r = stage_tests(dry, left)
    elif stage in ("kernels", "attention", "graph"):
        r = getattr(gpu_check_kernels, f"stage_{stage}")(
            dry, left, lambda r: (out / f"{stage}.json").write_text(json.dumps(r, indent=1)))
    elif stage == "e2e":                                  # the twins (up to 18.5 GB) stay out of --out, and go
        with tempfile.TemporaryDirectory(prefix="moert-gpu-check-") as work:
            r = stage_e2e(dry, left, Path(work), lambda r: (out / "e2e.json").write_text(json.dumps(r, indent=1)))
    else:
        e2e = out / "e2e.json"
        layers = json.loads(e2e.read_text()).get("layers", LAYERS) if e2e.exists() else LAYERS
        r = stage_peer(dry, left, layers)
    (out / f"{stage}.json").write_text(json.dumps(r, indent=1, default=str))
    return r


def child(stage: str, dry: bool, left: float, out: Path) -> dict:
    """A stage in its own process under a timeout (GPU memory freed between stages; a hang cannot stop the run)."""
    if left < MIN_S[stage]:
        return {"status": "skipped", "why": f"{left:.0f} s left, the stage needs at least {MIN_S[stage]} s"}
    limit = min(STAGES[stage], left)
    t0 = time.perf_counter()
    args = [str(Path(__file__).resolve()), "--stage", stage, "--out", str(out), "--left", f"{limit - 8:.0f}"]
    f = out / f"{stage}.json"
    f.unlink(missing_ok=True)
    try:
        r = python(*args, *(["--dry"] if dry else []), timeout=limit)
    except subprocess.TimeoutExpired:
        why = f"stopped after {limit:.0f} s (the stage's limit)"
        return {**json.loads(f.read_text()), "timed_out": why} if f.exists() else {"status": "timed out", "why": why}
    if r.returncode:                                   # a crash (a CUDA error, say): what it saved before stays
        why = (r.stderr or r.stdout).strip()[-400:]
        return {**json.loads(f.read_text()), "crashed": why} if f.exists() else {"status": "failed", "why": why}
    if not f.exists():
        return {"status": "failed", "why": (r.stderr or r.stdout).strip()[-400:]}
    return {**json.loads(f.read_text()), "seconds": time.perf_counter() - t0}


def _fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def rows(res: dict) -> list[tuple[str, str, str]]:
    """(stage, item, result) lines of the table."""
    out = [("setup", "", note) for note in res["setup"]] or [("setup", "", "gguf and moert import")]
    for stage in STAGES:
        r = res[stage]
        if "status" in r:
            out.append((stage, r["status"], r.get("why", "")[:150]))
            continue
        if r.get("timed_out"):
            out.append((stage, "timed out: what it measured so far", r["timed_out"]))
        if r.get("crashed"):
            out.append((stage, "failed: what it measured before", r["crashed"][-150:]))
        if stage == "e2e" and "runs" not in r:
            out.append((stage, "probe only", json.dumps(r.get("probe"), default=str)[:150]))
        elif stage == "tests":
            out.append((stage, "pytest tests/test_cuda*.py", r["summary"]))
            out += [(stage, "", f) for f in r["failures"]]
        elif stage in ("kernels", "attention", "graph"):
            out += gpu_check_kernels.rows(stage, r)
        elif stage == "e2e":
            out.append((stage, "model", r["model"]))
            out.append((stage, "twin writer", f"{r['write_gbs']:.2f} GB/s"))
            for name, v in r["runs"].items():
                out.append((stage, name, f"pp{v['n_prompt']} {v['pp']:.1f} t/s, tg{v['n_gen']} "
                            f"{v['tg']:.2f} t/s, load {v['load_s']:.0f} s, op offload {v['offload_bytes'] / 1e6:.1f} MB"
                            if isinstance(v, dict) else v))
                if isinstance(v, dict) and v.get("graph"):
                    g = v["graph"]
                    out.append((stage, f"{name}, decode as a CUDA graph", g["captured"][:150] if g["tg"] is None else
                                f"tg{v['n_gen']} {g['tg']:.2f} t/s (eager {v['tg']:.2f} t/s), captured: "
                                f"{g['captured'][:100]}"))
        else:
            out.append((stage, f"transformers {r['transformers']} bf16, {r['layers']} layers",
                        f"pp{r['n_prompt']} {r['pp']:.1f} t/s, decode {r['tg']:.2f} t/s"))
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json and each stage's JSON")
    ap.add_argument("--dry", action="store_true", help="tiny sizes on the sim GPU, no CuPy (the test suite runs it)")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for the whole run (default {BUDGET_S})")
    ap.add_argument("--stage", choices=list(STAGES), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--left", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.stage:
        return run_stage(a.stage, a.dry, a.left, out)
    t0 = time.perf_counter()
    res: dict = {"dry": a.dry, "setup": [] if a.dry else ensure_deps(), "command": " ".join(sys.argv)}
    for stage in STAGES:
        res[stage] = child(stage, a.dry, a.budget - (time.perf_counter() - t0), out)
    res["seconds"] = time.perf_counter() - t0
    (out / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str))
    lines = rows(res)
    w = [max(len(r[i]) for r in lines) for i in range(2)]
    print(f"gpu_check{' --dry' if a.dry else ''}: {res['seconds']:.0f} s; {out / 'gpu_check.json'}")
    for stage, item, result in lines:
        print(f"{stage:<{w[0]}}  {item:<{w[1]}}  {result}")
    return res


if __name__ == "__main__":
    main()
