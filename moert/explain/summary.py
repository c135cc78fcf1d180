"""What is in a GGUF file, for `moert inspect`: hyperparameters, tensors, totals by type, layer and role."""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from moert.devices import format_size
from moert.gguf import GGUFFile

EXPERT_RE = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps\.")  # llama.cpp's --cpu-moe pattern
LAYER_RE = re.compile(r"^blk\.(\d+)\.")


def layer_of(name: str) -> str:
    """'blk.3.attn_q.weight' -> '3'; tensors outside the repeating blocks -> 'other'."""
    m = LAYER_RE.match(name)
    return m.group(1) if m else "other"


def _json_value(v: object) -> object:
    if isinstance(v, np.ndarray):
        return v.tolist() if v.size <= 16 else {"array": str(v.dtype), "length": int(v.size)}
    if isinstance(v, list):
        return v if len(v) <= 16 else {"array": "string", "length": len(v)}
    return v


def summarize(f: GGUFFile) -> dict:
    """A JSON-ready description of the file: metadata (long arrays summarized), tensors, totals."""
    by_type: dict[str, int] = defaultdict(int)
    by_layer: dict[str, int] = defaultdict(int)
    by_role = {"experts": 0, "other": 0}
    tensors = []
    for t in f.tensors.values():
        tensors.append({"name": t.name, "type": t.type, "shape": list(t.shape), "nbytes": t.nbytes,
                        "offset": t.offset})
        by_type[t.type] += t.nbytes
        by_layer[layer_of(t.name)] += t.nbytes
        by_role["experts" if EXPERT_RE.search(t.name) else "other"] += t.nbytes
    arch = f.metadata.get("general.architecture")
    return {
        "check": check(f),
        "path": str(f.path),
        "gguf_version": f.version,
        "file_size": f.file_size,
        "architecture": arch,
        "name": f.metadata.get("general.name"),
        "hyperparameters": {k[len(arch) + 1:]: _json_value(v) for k, v in f.metadata.items()
                            if isinstance(arch, str) and k.startswith(arch + ".")},
        "metadata": {k: _json_value(v) for k, v in f.metadata.items()},
        "tensors": tensors,
        "totals": {
            "bytes": sum(by_type.values()),
            "by_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
            "by_layer": dict(sorted(by_layer.items(), key=lambda kv: (kv[0] == "other", int(kv[0])
                                                                       if kv[0].isdigit() else 0))),
            "by_role": by_role,
        },
    }


def check(f: GGUFFile) -> str:
    """Whether the file is a model moert can run: every key and tensor against its architecture's declaration."""
    from moert import models
    from moert.errors import MoertError

    try:
        _, config = models.read(f)
    except models.UnsupportedArchitectureError:
        return f"not checked: moert does not implement architecture {f.metadata.get('general.architecture')!r}"
    except MoertError as e:
        return f"does not match its declaration: {e}"
    return f"every key and tensor matches the {config.arch} declaration ({len(f.tensors)} tensors)"


def format_summary(s: dict, tensors: bool = True) -> str:
    """The human-readable table `moert inspect` prints."""
    out = [f"{s['path']}: GGUF v{s['gguf_version']}, {format_size(s['file_size'])}, {len(s['tensors'])} tensors",
           f"architecture: {s['architecture']}" + (f"   name: {s['name']}" if s["name"] else ""),
           f"check: {s['check']}"]
    if s["hyperparameters"]:
        out.append("hyperparameters:")
        out += [f"  {k:<40} {v:.7g}" if isinstance(v, float) else f"  {k:<40} {v}"
                for k, v in s["hyperparameters"].items()]
    tok = {k: v for k, v in s["metadata"].items() if k in ("tokenizer.ggml.model", "tokenizer.ggml.pre")}
    if tok:
        out.append("tokenizer: " + ", ".join(f"{k.rsplit('.', 1)[1]}={v}" for k, v in tok.items()))
    if tensors:
        w = max([len(t["name"]) for t in s["tensors"]] + [4])
        out += ["", f"{'tensor':<{w}}  {'type':<6} {'shape':<20} {'bytes':>12}"]
        out += [f"{t['name']:<{w}}  {t['type']:<6} {'x'.join(map(str, t['shape'])):<20} {t['nbytes']:>12,}"
                for t in s["tensors"]]
    tot = s["totals"]["bytes"] or 1

    def table(title: str, rows: dict) -> list[str]:
        return ["", f"{title:<12} {'bytes':>14} {'size':>11} {'share':>7}"] + [
            f"{k:<12} {v:>14,} {format_size(v):>11} {100 * v / tot:6.1f}%" for k, v in rows.items()]

    out += table("by type", s["totals"]["by_type"])
    out += table("by layer", s["totals"]["by_layer"])
    out += table("by role", s["totals"]["by_role"])
    out.append(f"\ntotal        {s['totals']['bytes']:>14,} {format_size(s['totals']['bytes']):>11}")
    return "\n".join(out)
