"""Placement rules: values saying "tensors whose name matches this regex live on that device".

    TensorOverride.cpu(r"\\.ffn_.*_exps\\.weight")     LM-Kit.NET's TensorOverride.Cpu(pattern)
    TensorOverride.gpu(r"blk\\.(0|1)\\.attn", 0)       LM-Kit.NET's TensorOverride.Gpu(pattern, gpuIndex)
    TensorOverride.gpu(r"_exps", 0, experts=range(32)) experts 0-31 of every expert tensor on GPU 0
    parse_overrides("pat1=CPU,pat2=CUDA0@0-31+40")    llama.cpp's -ot / --override-tensor syntax (+ expert sets)
    moe_rules(cpu_moe=True) / moe_rules(n_cpu_moe=N)  llama.cpp's --cpu-moe / --n-cpu-moe

A new placement strategy is a function that returns rules; moert/placement.py turns rules into a plan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import regex as _regex

from moert.errors import PlacementError

# A pattern is user input matched against names from a (possibly hostile) file, so it runs on the
# `regex` engine, which takes a timeout (Python's `re` cannot be interrupted): a pattern with
# catastrophic backtracking is a PlacementError instead of a hang. A sane pattern takes microseconds.
MATCH_TIMEOUT_S = 0.1


_SEEN: dict[tuple[str, int, str], bool] = {}   # (pattern, flags, name) -> matched: strategies re-plan a file


def search(pattern: Any, name: str, what: Any) -> bool:
    """Whether compiled `pattern` matches somewhere in `name`, within MATCH_TIMEOUT_S; `what` names the rule
    (anything whose str() does: it is formatted only for the error)."""
    k = (pattern.pattern, pattern.flags, name)
    hit = _SEEN.get(k)
    if hit is not None:
        return hit
    try:
        hit = pattern.search(name, timeout=MATCH_TIMEOUT_S) is not None
    except TimeoutError:
        raise PlacementError(f"{what}: matching {name!r} took over {MATCH_TIMEOUT_S} s (the pattern backtracks "
                             f"catastrophically, e.g. nested repeats like (a{{1,30}}){{1,30}}); simplify it, e.g. "
                             f"r'blk\\.(1[0-9])\\.ffn_.*_exps'") from None
    if len(_SEEN) > 1 << 20:
        _SEEN.clear()
    _SEEN[k] = hit
    return hit


class _Named:
    """A label formatted only when an error needs it ("rule " + str(rule))."""

    def __init__(self, prefix: str, obj: Any):
        self.prefix, self.obj = prefix, obj

    def __str__(self) -> str:
        return f"{self.prefix}{self.obj}"


_LITERAL = re.compile(r"\^((?:\\[^A-Za-z0-9]|[A-Za-z0-9_:@/-])+)\$")


def literal_name(pattern: str) -> str | None:
    """The one name `pattern` can match when it is ^<escaped literal>$ (as re.escape writes a tensor name;
    strategies emit such rules by the hundred), else None; build.py looks those up instead of searching."""
    m = _LITERAL.fullmatch(pattern)
    return None if m is None else re.sub(r"\\(.)", r"\1", m.group(1))


def compile_pattern(pattern: str, what: str) -> Any:
    """`pattern` compiled for `search`; a PlacementError naming `what` if it is not a regex."""
    if not isinstance(pattern, str) or not pattern:
        raise PlacementError(f"{what}: the pattern must be a non-empty regex string such as "
                             f"r'\\.ffn_.*_exps\\.weight'")
    try:
        return _regex.compile(pattern)
    except (_regex.error, re.error, ValueError, TypeError) as e:
        raise PlacementError(f"{what}: the pattern is not a valid regex ({e}); escape literal dots and brackets, "
                             f"e.g. r'blk\\.1\\.ffn_.*_exps'") from None

# common/common.h: LLM_FFN_EXPS_REGEX (the routed-expert tensors, fused gate_up and chunked variants too)
EXPERT_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
DEVICE_NAMES = "CPU, CUDA<N>, GPU<N>, cuda:N, gpu:N, sim:N, RAY<N> (ray:N, a worker of a Ray cluster)"

_DEVICE_RE = re.compile(r"^(cpu|cuda|gpu|sim|ray)(?::?(\d+))?$", re.IGNORECASE)


def expert_layer_regex(il: int) -> str:
    """The routed-expert tensors of layer il (common/common.h: llm_ffn_exps_block_regex)."""
    return rf"blk\.{il}{EXPERT_REGEX}"


def _parse_device(spec: str | int) -> tuple[str, str | None]:
    """('cpu' | 'gpu:N' | 'ray:N', backend named by the spelling or None) from CPU / CUDA0 / gpu:1 / sim:0 /
    RAY1 / -1 / 2."""
    if isinstance(spec, int) and not isinstance(spec, bool):
        return ("cpu", None) if spec < 0 else (f"gpu:{spec}", None)  # LM-Kit's DeviceIndex: -1 is the CPU
    m = _DEVICE_RE.match(str(spec).strip())
    if not m or (m.group(1).lower() == "cpu" and m.group(2) is not None):
        raise PlacementError(f"unknown device {spec!r}; valid device names: {DEVICE_NAMES} (case-insensitive)")
    kind, index = m.group(1).lower(), int(m.group(2) or 0)
    if kind == "cpu":
        return "cpu", None
    if kind == "ray":                    # a worker of a Ray cluster (moert/cluster/actors.py), not a GPU
        return f"ray:{index}", "ray"
    return f"gpu:{index}", {"cuda": "cuda", "sim": "sim", "gpu": None}[kind]


@dataclass(frozen=True)
class TensorOverride:
    """One rule: tensors whose name matches `pattern` (re.search) go to `device` ("cpu" or "gpu:N")."""

    pattern: str
    device: str = "cpu"
    backend: str | None = None    # "cuda" / "sim" / "ray" when spelled CUDA0 / sim:0 / RAY0; None = any GPU
    source: str = "user"          # who made it: user, cpu_moe, n_cpu_moe, fit, hot_experts, ...
    experts: Any = None           # None: whole tensors; else expert ids (any iterable: range(32), [3, 17]),
    #                               kept as a sorted tuple; a rule with a set decides only those experts
    regex: Any = field(init=False, repr=False, compare=False)   # compiled by the `regex` engine

    def __post_init__(self):
        if self.experts is not None:
            object.__setattr__(self, "experts", _expert_set(self.experts, f"rule {self.pattern!r}"))
        device, backend = _parse_device(self.device)
        object.__setattr__(self, "device", device)
        if self.backend is None:
            object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "regex", compile_pattern(self.pattern, f"rule {self.pattern!r} -> {self.device}"))

    @classmethod
    def cpu(cls, pattern: str, experts: Iterable[int] | None = None) -> TensorOverride:
        """Tensors matching `pattern` (only experts `experts` of expert tensors, if given) go to the CPU."""
        return cls(pattern, "cpu", experts=experts)

    @classmethod
    def gpu(cls, pattern: str, index: int = 0, experts: Iterable[int] | None = None) -> TensorOverride:
        """Tensors matching `pattern` (only experts `experts` of expert tensors, if given) go to GPU `index`."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise PlacementError(f"rule {pattern!r}: GPU index must be an int >= 0, got {index!r}")
        return cls(pattern, f"gpu:{index}", experts=experts)

    @property
    def remote(self) -> bool:
        """Whether the rule names a Ray worker (RAY<N>)."""
        return self.device.startswith("ray:")

    @property
    def device_index(self) -> int:
        """-1 for the CPU, else the GPU (or Ray worker) index (LM-Kit's DeviceIndex)."""
        return -1 if self.device == "cpu" else int(self.device.split(":")[1])

    def matches(self, name: str) -> bool:
        """Whether the pattern matches somewhere in `name` (a PlacementError if it backtracks for too long)."""
        return search(self.regex, name, _Named("rule ", self))

    def device_spelling(self) -> str:
        """The device as -ot spells it: CPU, CUDA0, sim:1, GPU0."""
        if self.device == "cpu":
            return "CPU"
        i = self.device_index
        return {"cuda": f"CUDA{i}", "sim": f"sim:{i}", "ray": f"RAY{i}"}.get(self.backend or "", f"GPU{i}")

    def __str__(self) -> str:
        at = "" if self.experts is None else "@" + format_experts(self.experts)
        return f"{self.pattern}={self.device_spelling()}{at}"


def _expert_set(experts: Any, what: str) -> tuple[int, ...]:
    """A sorted tuple of distinct expert ids >= 0 from any iterable of ints."""
    import numbers

    try:
        ids = list(experts)
    except TypeError:
        raise PlacementError(f"{what}: experts must be an iterable of expert ids (range(0, 32), [3, 17]), "
                             f"got {experts!r:.60}") from None
    if not ids or not all(isinstance(e, numbers.Integral) and not isinstance(e, bool) and e >= 0 for e in ids):
        raise PlacementError(f"{what}: experts must be a non-empty set of ids >= 0, got {ids!r:.80}")
    return tuple(sorted({int(e) for e in ids}))


def format_experts(ids: Iterable[int]) -> str:
    """Expert ids compactly, as the -ot spelling writes them: (0..31, 40, 41) -> '0-31+40-41'."""
    ids = sorted(ids)
    runs, start = [], None
    for i, e in enumerate(ids):
        if start is None:
            start = e
        if i + 1 == len(ids) or ids[i + 1] != e + 1:
            runs.append(str(e) if start == e else f"{start}-{e}")
            start = None
    return "+".join(runs)


def parse_experts(text: str, what: str) -> tuple[int, ...]:
    """'0-31+40+41' -> (0, ..., 31, 40, 41): ranges and ids joined by '+' (no commas: -ot lists split on them)."""
    ids: list[int] = []
    for part in text.split("+"):
        a, sep, b = part.strip().partition("-")
        if not a.isdigit() or (sep and not b.isdigit()) or (sep and int(b) < int(a)):
            raise PlacementError(f"{what}: expert set {text!r} is not ids and ranges joined by '+', e.g. "
                                 f"'0-31+40+41'")
        ids.extend(range(int(a), int(b) + 1) if sep else [int(a)])
    return _expert_set(ids, what)


def parse_overrides(text: str | Iterable[str]) -> list[TensorOverride]:
    """Rules from llama.cpp's -ot syntax: "pat1=CPU,pat2=CUDA0" (several strings are concatenated). moert's
    extension for expert sets: "pat=CUDA0@0-31+40+41" places only those experts of the matching tensors."""
    if not isinstance(text, str):
        return [r for t in text for r in parse_overrides(t)]
    # llama.cpp splits on every comma; a comma inside a regex ({1,2}) would break that, so a piece
    # without '=' is glued back onto the next one.
    items: list[str] = []
    pending = ""
    for piece in text.split(","):
        pending = f"{pending},{piece}" if pending else piece
        if "=" in piece:
            items.append(pending)
            pending = ""
    if pending.strip():
        raise PlacementError(f"-ot {text!r}: {pending!r} has no '=<device>'; write pattern=DEVICE, "
                             f"e.g. '\\.ffn_.*_exps=CPU' (devices: {DEVICE_NAMES})")
    rules = []
    for k, item in enumerate(items):
        pattern, _, device = item.rpartition("=")
        if not pattern:
            raise PlacementError(f"-ot item #{k} {item!r}: empty pattern; write pattern=DEVICE")
        try:
            device, at, expert_set = device.partition("@")      # DEVICE@0-31+40: only those experts
            experts = parse_experts(expert_set, f"-ot item #{k} {item!r}") if at else None
            rules.append(TensorOverride(pattern.strip(), device.strip(), experts=experts))
        except PlacementError as e:
            raise PlacementError(f"-ot item #{k} {item!r}: {e}") from None
    return rules


def format_overrides(rules: Iterable[TensorOverride]) -> str:
    """The -ot string of a rule list (parse_overrides reads it back)."""
    return ",".join(str(r) for r in rules)


def normalize_overrides(overrides: Any) -> list[TensorOverride]:
    """A rule list from None, an -ot string, or a list of TensorOverride / (pattern, device) / "pat=DEV"."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, TensorOverride)):
        overrides = [overrides]
    elif isinstance(overrides, Mapping):                  # {pattern: device}
        overrides = list(overrides.items())
    elif not isinstance(overrides, Iterable):
        raise PlacementError(f"overrides={overrides!r:.60}: expected an -ot string ('pattern=DEVICE,...'), a "
                             f"{{pattern: device}} dict, a list of rules, or None")
    rules: list[TensorOverride] = []
    for k, o in enumerate(overrides):
        if isinstance(o, TensorOverride):
            rules.append(o)
        elif isinstance(o, str):
            rules.extend(parse_overrides(o))
        elif isinstance(o, (tuple, list)) and len(o) == 2:
            rules.append(TensorOverride(o[0], o[1]))
        else:
            raise PlacementError(f"overrides[{k}] = {o!r:.60}: expected TensorOverride, (pattern, device) or "
                                 f"'pattern=DEVICE'")
    return rules


def moe_rules(cpu_moe: bool = False, n_cpu_moe: int | None = None, n_layer: int = 0,
              n_cpu_moe_from: str = "first") -> list[TensorOverride]:
    """llama.cpp's --cpu-moe / --n-cpu-moe rules (or the last-N variant that ik_llama.cpp found faster)."""
    if cpu_moe and n_cpu_moe:
        raise PlacementError("cpu_moe=True already puts every expert tensor on the CPU; drop n_cpu_moe "
                             "(or drop cpu_moe to keep only some layers' experts on the CPU)")
    if cpu_moe:
        return [TensorOverride(EXPERT_REGEX, "cpu", source="cpu_moe")]
    if not n_cpu_moe:
        return []
    if isinstance(n_cpu_moe, bool) or not isinstance(n_cpu_moe, int) or n_cpu_moe < 0:
        raise PlacementError(f"n_cpu_moe must be an int >= 0, got {n_cpu_moe!r}")
    if n_cpu_moe_from not in ("first", "last"):
        raise PlacementError(f"n_cpu_moe_from must be 'first' or 'last', got {n_cpu_moe_from!r}")
    n = min(n_cpu_moe, n_layer)  # -ncmoe 999 means "all layers", as in llama.cpp
    layers = range(n) if n_cpu_moe_from == "first" else range(n_layer - n, n_layer)
    return [TensorOverride(expert_layer_regex(i), "cpu", source="n_cpu_moe") for i in layers]
