"""Semantic fuzzer: well-formed GGUF files that lie about their model.

The structural fuzzer (test_gguf_robustness.py) breaks bytes; this one keeps every file parseable and
changes what it says: metadata values (wrong type, zero, negative, huge, NaN, inf, dropped), tensors
(dropped, duplicated under another name, reshaped, retyped, swapped). Each case is written to disk and run
through `moert.load` + a prefill and a decode step in a worker process, with a timeout. A case passes
when it ends in one of moert's typed errors (MoertError) or in a run whose logits are all finite;
a signal (segfault, SIGBUS), a hang, an untyped exception or a non-finite logit fails it.

    python tests/semantic_fuzz.py --cases 20000 --seed 1      # the long run (the suite runs a sample)
    python tests/semantic_fuzz.py --model m.gguf --cases 500  # any GGUF moert can run as the base

The worker is one long-lived process (imports and compiled kernels once), restarted after any case
that kills or hangs it, so thousands of cases take about a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BASE_MODELS = [HERE / "fixtures" / "qwen3moe" / "l2_e4_k2_gqa2_q4km.gguf",
               HERE / "fixtures" / "qwen3moe" / "l2_e8_k2_gqa2_q8.gguf",
               HERE / "fixtures" / "gemma3" / "tiny_swa.gguf",
               HERE / "fixtures" / "arch" / "qwen2moe.gguf",
               HERE / "fixtures" / "arch" / "olmoe.gguf",
               HERE / "fixtures" / "arch" / "llama.gguf",
               HERE / "fixtures" / "arch" / "deepseek2.gguf",
               HERE / "fixtures" / "arch" / "deepseek2-lite.gguf",
               HERE / "fixtures" / "arch" / "gpt-oss.gguf"]

# ------------------------------------------------------------------------------------------ a GGUF as data


@dataclass
class Recipe:
    """A GGUF file as editable values: metadata key -> (GGUF value type name, value); tensors in file order."""

    arch: str
    metadata: dict[str, tuple[str, object]]
    tensors: list[tuple[str, str, tuple[int, ...], np.ndarray]] = field(default_factory=list)  # name, type, shape, raw


def read_recipe(path: str | Path) -> Recipe:
    """Every key and tensor of a GGUF file (moert's own reader), the tensor bytes copied out."""
    from moert import gguf

    with gguf.open(path) as f:
        md = {k: (f.value_types[k], v) for k, v in f.metadata.items() if k != "general.architecture"}
        tensors = [(t.name, t.type, tuple(t.shape), np.array(f.raw(t.name))) for t in f.tensors.values()]
        return Recipe(f.architecture, md, tensors)


def write_recipe(r: Recipe, path: str | Path) -> Path:
    """Write a Recipe with gguf-py's writer (the raw bytes as they are: a lie in the shape stays a lie)."""
    import gguf

    w = gguf.GGUFWriter(str(path), r.arch)
    for key, (vtype, value) in r.metadata.items():
        if vtype == "ARRAY":
            w.add_array(key, list(value))
        else:
            w.add_key_value(key, value, gguf.GGUFValueType[vtype])
    for name, typ, shape, raw in r.tensors:
        if typ == "F32":
            w.add_tensor(name, raw.view(np.float32).reshape(shape))
        elif typ == "F16":
            w.add_tensor(name, raw.view(np.float16).reshape(shape))
        else:
            w.add_tensor(name, raw.reshape(*shape[:-1], -1), raw_dtype=gguf.GGMLQuantizationType[typ])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


# ------------------------------------------------------------------------------------------------ mutations

Mutation = Callable[[Recipe], Recipe]


def _set(key: str, vtype: str, value) -> Mutation:
    return lambda r: replace(r, metadata={**r.metadata, key: (vtype, value)})


def _drop_key(key: str) -> Mutation:
    return lambda r: replace(r, metadata={k: v for k, v in r.metadata.items() if k != key})


def _value_mutations(key: str, vtype: str, value) -> Iterator[tuple[str, Mutation]]:
    yield f"drop {key}", _drop_key(key)
    if vtype in ("UINT32", "INT32", "UINT64", "INT64", "UINT16", "UINT8"):
        v = int(value)
        for new, t in [(0, "UINT32"), (1, "UINT32"), (-1, "INT32"), (v - 1, "INT64"), (v + 1, "UINT32"),
                       (2 * v, "UINT32"), (v // 2, "UINT32"), (2**31 - 1, "UINT32"), (2**32 + 3, "UINT64"),
                       (2**40, "UINT64"), (10**9, "UINT32"), (True, "BOOL"), (str(v), "STRING"),
                       (float(v) + 0.5, "FLOAT32"), (np.array([v, v], np.uint32), "ARRAY")]:
            yield f"{key}={new!r:.30} ({t})", _set(key, t, new)
    elif vtype in ("FLOAT32", "FLOAT64"):
        v = float(value)
        for new, t in [(0.0, "FLOAT32"), (-1.0, "FLOAT32"), (float("nan"), "FLOAT32"), (float("inf"), "FLOAT32"),
                       (float("-inf"), "FLOAT64"), (1e-30, "FLOAT32"), (1e30, "FLOAT32"), (v * 10, "FLOAT32"),
                       (str(v), "STRING"), (1, "UINT32"), (True, "BOOL")]:
            yield f"{key}={new!r:.30} ({t})", _set(key, t, new)
    elif vtype == "STRING":
        for new, t in [("", "STRING"), ("x", "STRING"), ("llama", "STRING"), (7, "UINT32")]:
            yield f"{key}={new!r:.30} ({t})", _set(key, t, new)
    elif vtype == "ARRAY":
        seq = list(value)
        yield f"{key} one shorter", _set(key, "ARRAY", seq[:-1])
        yield f"{key} empty", _set(key, "ARRAY", [])
        if seq and isinstance(seq[0], str):
            yield f"{key} a 1 MiB token", _set(key, "ARRAY", [*seq[:-1], "a" * (1 << 20)])
        yield f"{key} as a number", _set(key, "UINT32", 3)
    elif vtype == "BOOL":
        yield f"{key}=2 (UINT32)", _set(key, "UINT32", 2)


def _tensor_op(f: Callable[[list], list]) -> Mutation:
    return lambda r: replace(r, tensors=f(list(r.tensors)))


def _rows(t, n: int):
    """Tensor t with its first axis cut (or padded by repeating) to n entries: the bytes follow."""
    name, typ, shape, raw = t
    per = raw.size // shape[0]
    data = np.resize(raw, n * per)              # repeats from the start when growing
    return (name, typ, (n, *shape[1:]), data)


BLOCK = {"F32": 1, "F16": 1, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}


def _retype(t, new: str):
    """Tensor t re-encoded in type `new` (the same values, as well as the type holds them)."""
    from moert.quants import dequantize, quantize

    name, typ, shape, raw = t
    x = dequantize(raw, typ, shape)
    data = x.astype(np.float32) if new == "F32" else x.astype(np.float16) if new == "F16" else quantize(x, new)
    return (name, new, shape, np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8))


def _tensor_mutations(r: Recipe) -> Iterator[tuple[str, Mutation]]:
    names = [t[0] for t in r.tensors]
    n_layer = max((int(n.split(".")[1]) for n in names if n.startswith("blk.")), default=-1) + 1
    for i, t in enumerate(r.tensors):
        name, typ, shape, raw = t
        yield f"drop {name}", _tensor_op(lambda ts, i=i: ts[:i] + ts[i + 1:])
        if shape[0] > 1:
            yield f"{name} one {'row' if len(shape) < 3 else 'expert'} short", \
                _tensor_op(lambda ts, i=i, t=t: ts[:i] + [_rows(t, t[2][0] - 1)] + ts[i + 1:])
            yield f"{name} half the {'rows' if len(shape) < 3 else 'experts'}", \
                _tensor_op(lambda ts, i=i, t=t: ts[:i] + [_rows(t, max(1, t[2][0] // 2))] + ts[i + 1:])
        yield f"{name} doubled on axis 0", \
            _tensor_op(lambda ts, i=i, t=t: ts[:i] + [_rows(t, 2 * t[2][0])] + ts[i + 1:])
        if len(shape) == 1:
            yield f"{name} of shape (1,)", _tensor_op(lambda ts, i=i, t=t: ts[:i] + [_rows(t, 1)] + ts[i + 1:])
        for new in ("F32", "F16", "Q8_0", "Q4_K", "Q6_K"):
            if new != typ and shape[-1] % BLOCK[new] == 0:
                yield f"{name} as {new}", _tensor_op(lambda ts, i=i, t=t, new=new: ts[:i] + [_retype(t, new)]
                                                     + ts[i + 1:])
        yield f"{name} renamed to blk.{n_layer}", _tensor_op(
            lambda ts, i=i, t=t: ts + [(f"blk.{n_layer}." + t[0].split(".", 2)[-1] if t[0].startswith("blk.")
                                        else f"blk.{n_layer}.{t[0]}", *t[1:])])
        yield f"{name} duplicated as unknown", _tensor_op(lambda ts, t=t: ts + [("zz_" + t[0][-60:], *t[1:])])
    for i in range(len(r.tensors)):
        for j in (i + 1, i + 3):
            if j < len(r.tensors):
                yield f"swap {names[i]} <-> {names[j]}", _tensor_op(
                    lambda ts, i=i, j=j: [(ts[j][0] if k == i else ts[i][0] if k == j else t[0], *t[1:])
                                          for k, t in enumerate(ts)])


def mutations(r: Recipe) -> list[tuple[str, Mutation]]:
    """Every single mutation of a recipe, in a fixed order."""
    out = [("general.architecture=unknown", lambda r: replace(r, arch="nosucharch"))]
    for key, (vtype, value) in r.metadata.items():
        out += list(_value_mutations(key, vtype, value))
    return out + list(_tensor_mutations(r))


def cases(bases: list[Path], n: int, seed: int) -> Iterator[tuple[str, Path, Mutation]]:
    """n cases: each base's single mutations round robin (shuffled), then random pairs of them."""
    rng = np.random.default_rng(seed)
    recipes = [(b, read_recipe(b)) for b in bases]
    pools = [(b, r, mutations(r)) for b, r in recipes]
    singles = [(b, r, m) for b, r, ms in pools for m in ms]
    order = rng.permutation(len(singles))
    for k in range(n):
        if k < len(singles):
            b, r, (label, m) = singles[order[k]]
            yield f"{b.name}: {label}", r, m
        else:
            b, r, ms = pools[int(rng.integers(len(pools)))]
            (l1, m1), (l2, m2) = (ms[int(i)] for i in rng.integers(len(ms), size=2))
            yield f"{b.name}: {l1} + {l2}", r, (lambda r, m1=m1, m2=m2: m2(m1(r)))


# --------------------------------------------------------------------------------------------------- worker

PLACEMENTS = [dict(gpu_layers=0), dict(gpu_backend="sim", cpu_moe=True), dict(gpu_backend="sim")]


def run_case(path: str, placement: dict) -> str:
    """'ok', 'typed <Error>: message', 'untyped <Error>: message' or 'nonfinite ...' for one file."""
    import warnings

    import moert

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = moert.load(path, context_size=16, warmup=False, progress=False, **placement)
        try:
            ids = [i % m.n_vocab for i in (1, 2, 3)]
            a = m.forward(ids)
            b = m.forward([4 % m.n_vocab])
            if m.tokenizer.has_vocab:
                m.tokenize("Hello, world")
            if not (np.isfinite(a).all() and np.isfinite(b).all()):
                return "nonfinite logits"
        finally:
            m.close()
        return "ok"
    except moert.MoertError as e:
        return f"typed {type(e).__name__}: {str(e)[:300]}"
    except Exception as e:  # noqa: BLE001 - an untyped exception is exactly what the fuzzer looks for
        return f"untyped {type(e).__name__}: {str(e)[:300]}"


def worker() -> None:
    """Read 'path<TAB>placement index' lines, answer one JSON line each."""
    import numba

    numba.set_num_threads(1)
    for line in sys.stdin:
        path, p = line.rstrip("\n").split("\t")
        out = run_case(path, PLACEMENTS[int(p)])
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


class Worker:
    """The worker process, with a per-case deadline; restarted after a signal or a hang."""

    def __init__(self):
        self.p = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        self.p = subprocess.Popen([sys.executable, "-c", "import semantic_fuzz; semantic_fuzz.worker()"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True, bufsize=1, env=env)

    def ask(self, path: Path, placement: int, timeout: float) -> str:
        if self.p is None or self.p.poll() is not None:
            self.start()
            timeout += 60.0                          # imports, and the kernels' first compile
        self.p.stdin.write(f"{path}\t{placement}\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], timeout)
        line = self.p.stdout.readline() if ready else ""
        if line:
            return json.loads(line)
        self.p.kill()
        code = self.p.wait()
        self.p = None
        return f"hang (no answer in {timeout:.0f} s)" if not ready else f"crash (exit {code}, signal {-code})"

    def close(self) -> None:
        if self.p is not None:
            self.p.stdin.close()
            self.p.wait(timeout=30)


def passed(outcome: str) -> bool:
    return outcome == "ok" or outcome.startswith("typed ")


def fuzz(n: int, seed: int = 0, bases: list[Path] | None = None, timeout: float = 120.0,
         progress: bool = False, quick: bool = False) -> list[tuple[str, str]]:
    """(case label, outcome) for n cases. Placements rotate over PLACEMENTS; quick=True runs retyped tensors
    on the all-sim placement only, where no new CPU kernel has to be compiled (a first compile of a type
    pair takes 20-60 s, more than a case may take in the suite)."""
    results = []
    w = Worker()
    with tempfile.TemporaryDirectory() as d:
        try:
            for k, (label, recipe, mutate) in enumerate(cases(bases or BASE_MODELS, n, seed)):
                path = Path(d) / f"case{k % 4}.gguf"
                try:
                    write_recipe(mutate(recipe), path)
                except Exception as e:  # noqa: BLE001 - gguf-py refused to write it: not a file moert can meet
                    results.append((label, f"unwritable {type(e).__name__}"))
                    continue
                p = len(PLACEMENTS) - 1 if quick and " as " in label else k % len(PLACEMENTS)
                results.append((label, w.ask(path, p, timeout)))
                if progress and k % 100 == 0:
                    print(f"{k}/{n} cases, {sum(not passed(o) for _, o in results)} failing", file=sys.stderr)
        finally:
            w.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", action="append", default=None, help="base GGUF (repeatable; default: the fixtures)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one case may take (a first compile of "
                    "a kernel for a new type pair takes 20-60 s)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    t0 = time.perf_counter()
    res = fuzz(a.cases, a.seed, [Path(m) for m in a.model] if a.model else None, a.timeout, progress=True)
    bad = [(lab, o) for lab, o in res if not passed(o) and not o.startswith("unwritable")]
    kinds: dict[str, int] = {}
    for _, o in res:
        k = o.split(":")[0] if not o.startswith(("hang", "crash")) else o.split(" ")[0]
        kinds[k] = kinds.get(k, 0) + 1
    if a.json:
        print(json.dumps({"cases": len(res), "seconds": time.perf_counter() - t0, "outcomes": kinds,
                          "failures": bad}, indent=1))
    else:
        print(f"{len(res)} cases in {time.perf_counter() - t0:.0f} s")
        for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"  {v:6d}  {k}")
        for lab, o in bad[:50]:
            print(f"FAIL {lab}\n     {o}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
