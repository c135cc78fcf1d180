"""A machine from a name (`preset`: preset parts joined by '+') or from JSON files: one part, or a whole machine.

    moert compare zoo:gpt-oss-120b --hardware my-3080.json+ryzen-7950x     # a GPU file beside a preset CPU
    moert hardware calibrate --json > here.json                              # this CPU, measured, as a part
    moert compare zoo:qwen3-30b-a3b --hardware rtx3090+here.json
    moert compare zoo:qwen3-30b-a3b --hardware box.json                      # {"cpu": ..., "gpus": [...], "link": ...}

A part is the fields of moert.CPU, moert.GPU or moert.Link (`moert hardware list --json` prints every preset's),
told apart by its keys: "cores" makes a CPU, "mem_gib" a GPU, "latency_us" or a lone "bw_gbs" a link. A machine
is {"cpu": CPU fields or a preset name, "gpus": [GPU fields or preset names], "link": fields, a name or null}
(null or absent: the slower PCIe of the card's slot and the CPU's platform, as for presets).
Every field is checked (unknown names, wrong types, missing figures) and the file is capped at 1 MiB.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, fields, replace
from pathlib import Path

from moert.cost.hardware import CPU, GPU, MAX_GPUS, MAX_SOCKETS, Hardware, HardwareError, Link, sockets
from moert.cost.presets import CPUS, GPUS, LINKS, preset_link

MAX_BYTES = 1 << 20          # a machine is a few hundred bytes; a bigger file is not one
_KINDS = {"cpu": CPU, "gpu": GPU, "link": Link}


def read(path: str | Path):
    """The JSON file at path as a CPU, GPU, Link or Hardware (HardwareError saying what is wrong where)."""
    p = Path(path)
    try:
        with open(p, "rb") as f:                 # at most the cap + 1 bytes, whatever stat says (a pipe, /dev/zero)
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise HardwareError(f"hardware file {str(p)!r} is over {MAX_BYTES:,} bytes; a description of a "
                                f"machine is a few hundred")
        d = json.loads(raw.decode("utf-8"))
    except OSError as e:
        raise HardwareError(f"hardware file {str(p)!r}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise HardwareError(f"hardware file {str(p)!r} is not JSON: {str(e) or 'nested too deeply'}") from None
    if not isinstance(d, dict):
        raise HardwareError(f"hardware file {str(p)!r} holds a {type(d).__name__}; give an object: a CPU, a GPU, "
                            f"a link, or {{\"cpu\": ..., \"gpus\": [...]}}")
    where = f"hardware file {str(p)!r}"
    if "cpu" in d or "gpus" in d:
        return machine(d, where)
    return part(d, _kind(d, where), where)


def machine(d: dict, where: str = "hardware") -> Hardware:
    """{"name"?, "cpu", "gpus"?, "link"?} -> Hardware; each part given by its fields or a preset's name."""
    _only(d, {"name", "cpu", "gpus", "link"}, where)
    if "cpu" not in d:
        raise HardwareError(f"{where}: a machine needs a \"cpu\" (fields, or a preset name: {', '.join(CPUS)})")
    gpus = d.get("gpus")
    gpus = [] if gpus is None else gpus
    if not isinstance(gpus, list):
        raise HardwareError(f"{where}: \"gpus\" must be a list, got {type(gpus).__name__}")
    if len(gpus) > MAX_GPUS:
        raise HardwareError(f"{where}: {len(gpus):,} GPUs; one machine has at most {MAX_GPUS}")
    cpu = _named_or_fields(d["cpu"], "cpu", CPUS, where)
    cards = tuple(_named_or_fields(g, "gpu", GPUS, f"{where}, gpus[{i}]") for i, g in enumerate(gpus))
    link = None if d.get("link") is None else _named_or_fields(d["link"], "link", LINKS, where)
    name = d.get("name")
    if name is not None and not isinstance(name, str):
        raise HardwareError(f"{where}: \"name\" must be a string, got {name!r:.40}")
    if link is None and cards:                                  # the presets' rule: the slower PCIe
        link = preset_link(cpu, cards)
    return Hardware(cpu, cards, link, name=name or "")


def part(d: dict, kind: str, where: str = "hardware"):
    """A CPU, GPU or Link from its fields, each checked against the dataclass's."""
    cls = _KINDS[kind]
    known = {f.name: f for f in fields(cls)}
    _only(d, set(known), f"{where} ({kind})")
    missing = [n for n, f in known.items() if f.default is MISSING and n not in d]
    if missing:
        raise HardwareError(f"{where} ({kind}): missing {', '.join(missing)}")
    kw = {n: _value(v, known[n].type, f"{where} ({kind}) {n}") for n, v in d.items()}
    try:
        return cls(**kw)
    except HardwareError as e:                                  # a figure out of range: say which file
        raise HardwareError(f"{where}: {e}") from None


def _kind(d: dict, where: str) -> str:
    if "cores" in d:
        return "cpu"
    if "mem_gib" in d:
        return "gpu"
    if "latency_us" in d or set(d) <= {"bw_gbs", "name", "efficiency"} and "bw_gbs" in d:
        return "link"
    raise HardwareError(f"{where}: cannot tell what part this is: a CPU has \"cores\" and \"mem_bw_gbs\", a GPU "
                        f"\"mem_gib\", \"bw_gbs\" and \"fp16_tflops\", a link \"bw_gbs\" (and \"latency_us\")")


def _named_or_fields(v, kind: str, presets: dict, where: str):
    if isinstance(v, str):
        if v.lower() not in presets:
            raise HardwareError(f"{where}: unknown {kind} {v!r}; known: {', '.join(presets)}")
        return presets[v.lower()]
    if isinstance(v, dict):
        return part(v, kind, where)
    raise HardwareError(f"{where}: a {kind} is a preset name or an object of fields, got {type(v).__name__}")


def _only(d: dict, known: set, where: str) -> None:
    unknown = sorted(set(d) - known)
    if unknown:
        raise HardwareError(f"{where}: unknown field(s) {', '.join(map(repr, unknown))}; known: "
                            f"{', '.join(sorted(known))}")


def _finite(v) -> bool:
    """A finite float (an integer too big for one is not)."""
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _value(v, annotation: str, where: str):
    """v checked against a field's annotation ("float", "int", "str", or a tuple of (name, rate) pairs)."""
    if annotation in ("float", "int"):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _finite(v):
            raise HardwareError(f"{where} must be a number, got {v!r:.40}")
        if annotation == "int" and v != int(v):
            raise HardwareError(f"{where} must be a whole number, got {v!r}")
        return int(v) if annotation == "int" else float(v)
    if annotation == "str":
        if not isinstance(v, str):
            raise HardwareError(f"{where} must be a string, got {v!r:.40}")
        return v
    # kernel_gbs / kernel_gflops: [[name, rate], ...] as JSON writes the tuples
    ok = isinstance(v, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and not isinstance(p[1], bool)
        and isinstance(p[1], (int, float)) and _finite(p[1]) and p[1] > 0 for p in v)
    if not ok:
        raise HardwareError(f"{where} must be a list of [name, rate > 0] pairs, got {v!r:.60}")
    return tuple((str(a), float(b)) for a, b in v)


__all__ = ["MAX_BYTES", "machine", "part", "read"]


def preset(name: str) -> Hardware:
    """A Hardware from preset part names: "rtx3090+ryzen-7950x", "ryzen-9950x", "2x rtx3090+epyc-9554",
    "rtx4090+ryzen-7950x+pcie4x16", "...+local" (this machine's CPU, calibrate()d), or JSON files for parts
    or a whole machine: "my-3080.json+ryzen-7950x", "box.json" (moert/cost/machines.py)."""
    gpus: list[GPU] = []
    cpu: CPU | None = None
    link: Link | None = None
    parts = [p.strip() for p in name.split("+")]
    label = []                                                  # the name, a file's part by its own name
    for raw in parts:
        part = raw if raw.lower().endswith(".json") else raw.lower()
        m = re.match(r"^(\d+)x\s+(\S.*)$", part)     # "2x rtx3090": a count of GPUs; "2x epyc-9374f": of sockets
        count, bare = (int(m.group(1)), m.group(2)) if m else (None, part)
        item = _json_part(bare, name, len(parts)) if bare.lower().endswith(".json") else None
        is_gpu = bare in GPUS or isinstance(item, GPU)
        is_cpu = bare in CPUS or isinstance(item, CPU)
        if count is not None and not (is_gpu and 1 <= count <= MAX_GPUS or is_cpu and 1 <= count <= MAX_SOCKETS):
            raise HardwareError(f"hardware {name!r}: {part!r}: a count ('2x ') goes before a GPU, from 1 to "
                                f"{MAX_GPUS}, or before a CPU, its sockets, from 1 to {MAX_SOCKETS}")
        if isinstance(item, Hardware):
            return item
        label.append(raw if item is None else f"{'' if count is None else f'{count}x '}{item.name or bare}")
        if is_gpu:
            gpus += [item or GPUS[bare]] * (count or 1)
        elif bare in CPUS or bare == "local" or isinstance(item, CPU):
            if cpu is not None:
                raise HardwareError(f"hardware {name!r} names two CPUs ({cpu.name}, {bare}); give one")
            cpu = item or (_calibrate() if bare == "local" else CPUS[bare])
            cpu = sockets(cpu, count) if count else cpu
        elif bare in LINKS or isinstance(item, Link):
            link = item or LINKS[bare]
        else:
            raise HardwareError(f"hardware {name!r}: unknown part {part!r}; known GPUs: {', '.join(GPUS)}; "
                                f"CPUs: {', '.join(CPUS)}, local; links: {', '.join(LINKS)} "
                                f"(`moert hardware list` shows their figures), or a .json file of one")
    if cpu is None:
        raise HardwareError(f"hardware {name!r} names no CPU; add one, e.g. {name}+ryzen-7950x")
    if gpus and link is None:
        link = preset_link(cpu, gpus)
    return Hardware(cpu, tuple(gpus), link, name="+".join(label))


def _json_part(path: str, name: str, n_parts: int):
    item = read(path)
    if isinstance(item, Hardware) and n_parts > 1:
        raise HardwareError(f"hardware {name!r}: {path} describes a whole machine; give it alone, or make it "
                            f"one part (a CPU, a GPU or a link)")
    return item


def with_cpu(hw: Hardware, cpu: CPU) -> Hardware:
    """The same machine with another CPU (e.g. a calibrated one)."""
    return replace(hw, cpu=cpu, name=f"{'+'.join(g.name for g in hw.gpus) + '+' if hw.gpus else ''}{cpu.name}")


def _calibrate() -> CPU:
    from moert.cost.calibrate import calibrate

    return calibrate()
