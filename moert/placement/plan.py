"""The plan: an ordered list of regex rules (rules.py) gives every GGUF tensor a device; first match wins.

    p = plan("model.gguf", rules, gpu_layers="all", gpu_backend="sim")      # build.py makes it
    print(p.explain())                                  # tensor, type, bytes, device, deciding rule

Semantics are llama.cpp's, so a command line carries over:
  * a rule matches with `re.search` on the tensor name (substring, unanchored), as `-ot` does
    (llama-model-loader.cpp: std::regex_search over tensor_buft_overrides, first match wins);
  * `cpu_moe` / `n_cpu_moe` add llama.cpp's expert rules (common/common.h: LLM_FFN_EXPS_REGEX and
    llm_ffn_exps_block_regex, used by --cpu-moe / --n-cpu-moe in common/arg.cpp) after the user's rules;
  * a tensor no rule matches goes to its layer's default device, `-ngl`'s meaning (llama-model.cpp,
    llama_model::load_tensors): the last `gpu_layers` of the n_layer + 1 layers (the output layer is
    layer n_layer) are on the GPU, the input layer (token_embd) always on the CPU, and with several GPUs
    layer il goes to upper_bound(cumulative split, (il - i_gpu_start) / act_gpu_layers).

A plan is a value: nothing is loaded, `explain()` / `to_json()` print it, `device_of(name)` answers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moert.devices import CPU, Device, format_size
from moert.errors import PlacementError
from moert.placement.rules import (
    EXPERT_REGEX,
    TensorOverride,
    compile_pattern,
    format_experts,
    format_overrides,
    search,
)

_LAYER_RE = re.compile(r"^blk\.(\d+)\.")
_OUTPUT_RE = re.compile(r"^output(_norm)?\.")  # the output layer: llama.cpp's dev_output (layer n_layer)


# ------------------------------------------------------------------------------------------- the plan

@dataclass(frozen=True)
class Placement:
    """Where one tensor lives and why."""

    name: str
    type: str
    shape: tuple[int, ...]
    nbytes: int
    device: str                           # "cpu", "sim:0", "cuda:1"
    rule: TensorOverride | None           # the rule that decided; None = the default
    rule_index: int | None
    reason: str                           # in words, for explain()
    layer: int | None                     # repeating block index, n_layer for the output layer, None for input
    experts: tuple[int, ...] | None = None  # None = the whole tensor; else the expert ids this piece holds
    tied_to: str | None = None            # output.weight duplicated from token_embd.weight when absent

    @property
    def decided_by(self) -> str:
        return f"rule #{self.rule_index} {self.rule}" if self.rule is not None else f"default: {self.reason}"

    @property
    def label(self) -> str:
        """The tensor name, with the expert set of a piece: blk.0.ffn_up_exps.weight[0-31]."""
        return self.name if self.experts is None else f"{self.name}[{format_experts(self.experts)}]"


@dataclass
class _Model:
    path: str
    arch: str
    metadata: dict
    tensors: dict[str, tuple[str, tuple[int, ...], int]]  # name -> (type, shape, nbytes)
    n_layer: int


_INFO: dict[tuple, _Model] = {}


def model_info(model: Any, n_layer: int | None = None) -> _Model:
    if isinstance(model, _Model):
        return model
    if isinstance(model, (str, Path)):
        from moert import gguf

        st = os.stat(model)
        k = (os.path.realpath(model), st.st_ino, st.st_size, st.st_mtime_ns, n_layer)
        if k not in _INFO:                       # strategies plan one file hundreds of times
            with gguf.open(model) as g:
                _INFO.clear() if len(_INFO) > 16 else None
                _INFO[k] = model_info(g, n_layer)
        return replace(_INFO[k], path=str(model))
    if hasattr(model, "tensors") and hasattr(model, "metadata"):  # an open GGUFFile
        # scalars and short per-layer lists; not the tokenizer's vocabulary
        md = {k: v for k, v in model.metadata.items() if not hasattr(v, "__len__") or isinstance(v, str)
              or len(v) <= 1024}
        arch = str(md.get("general.architecture", "?"))
        tensors = {n: (t.type, tuple(t.shape), int(t.nbytes)) for n, t in model.tensors.items()}
        if n_layer is None:
            key = f"{arch}.block_count"
            if key not in md:
                raise PlacementError(f"{model.path}: metadata key {key!r} is missing; placement needs the "
                                     f"layer count")
            n_layer = int(md[key])
        return _Model(str(getattr(model, "path", "?")), arch, md, tensors, n_layer)
    if isinstance(model, Mapping):  # name -> (type, shape, nbytes)
        tensors = {n: (str(t), tuple(s), int(b)) for n, (t, s, b) in model.items()}
    elif isinstance(model, Sequence):  # bare names, for a quick look (or a unit test)
        tensors = {str(n): ("?", (), 0) for n in model}
    else:
        raise PlacementError(f"plan() needs a GGUF path, an open GGUFFile or a list of tensor names, "
                             f"got {type(model).__name__}")
    if n_layer is None:
        layers = [int(m.group(1)) for n in tensors if (m := _LAYER_RE.match(n))]
        n_layer = max(layers) + 1 if layers else 0
    return _Model("<names>", "?", {}, tensors, n_layer)


class Plan:
    """Every tensor's device, the rules that decided, and the devices themselves. Nothing is loaded."""

    def __init__(self, model: _Model, rules: list[TensorOverride], entries: dict[str, Placement],
                 devices: list[Device], gpu_layers: int, gpu_backend: str, split: str, messages: list[str],
                 shares: tuple[float, ...] | None = None,
                 split_tensors: dict[str, tuple[Placement, ...]] | None = None, remote: list[Device] | None = None):
        self.model = model
        self.path, self.arch, self.metadata, self.n_layer = model.path, model.arch, model.metadata, model.n_layer
        self.rules = rules
        self.entries = entries            # whole tensors: name -> Placement
        self.split_tensors = split_tensors or {}   # tensors split over experts: name -> pieces, each a Placement
        self.devices = devices            # the GPU devices (cpu is moert.devices.CPU)
        self.remote = list(remote or [])  # ray:N workers holding experts (moert/devices/remote.py; load connects them)
        self.gpu_layers = gpu_layers      # layers (of n_layer + 1) whose default device is a GPU
        self.gpu_backend = gpu_backend    # "cupy", "sim" or "none" (what is actually used)
        self.split = split                # "layer" or "none"
        self.tensor_split = shares        # the GPUs' shares of the GPU layers (capacities unless given)
        self.messages = messages          # the warnings raised while planning

    # -- questions
    def __getitem__(self, name: str) -> Placement:
        """The placement of a whole tensor (a tensor split over experts: see `pieces`)."""
        if name in self.split_tensors:
            raise PlacementError(f"{name} is split over experts ({self._split_summary(name)}); ask "
                                 f"plan.pieces(name) or plan.device_of(name, expert=e)")
        try:
            return self.entries[name]
        except KeyError:
            raise KeyError(f"the plan has no tensor {name!r} ({len(self.entries) + len(self.split_tensors)} "
                           f"tensors; Plan.explain() lists them)") from None

    def __contains__(self, name: str) -> bool:
        return name in self.entries or name in self.split_tensors

    def __iter__(self):
        """Every placed piece: whole tensors, then the expert slices of split tensors."""
        yield from self.entries.values()
        for pieces in self.split_tensors.values():
            yield from pieces

    def __len__(self) -> int:
        return len(self.entries) + sum(len(p) for p in self.split_tensors.values())

    def names(self) -> list[str]:
        """Every tensor name of the plan, split or whole."""
        return [*self.entries, *self.split_tensors]

    def pieces(self, name: str) -> tuple[Placement, ...]:
        """The placed pieces of a tensor: one (experts=None) unless it is split over experts."""
        if name in self.split_tensors:
            return self.split_tensors[name]
        return (self[name],)

    def _split_summary(self, name: str) -> str:
        return ", ".join(f"experts {format_experts(p.experts)} on {p.device}" for p in self.split_tensors[name])

    def device_of(self, name: str, expert: int | None = None) -> str:
        """The device name of a tensor ("cpu", "cuda:0", "sim:1"); of one expert of it with expert=e."""
        if expert is None or name not in self.split_tensors:
            if expert is not None:
                self._check_expert(name, expert)
            return self[name].device
        self._check_expert(name, expert)
        return next(p.device for p in self.split_tensors[name] if expert in p.experts)

    def _check_expert(self, name: str, expert: int) -> None:
        e = self.pieces(name)[0]
        if not _has_expert_axis(name, e.shape) or not 0 <= expert < e.shape[0]:
            raise PlacementError(f"{name} {e.shape} has no expert {expert}")

    def expert_devices(self, name: str) -> list[str]:
        """The device of each expert of an expert tensor, by expert id."""
        pieces = self.pieces(name)
        out = [pieces[0].device] * pieces[0].shape[0]
        for p in pieces:
            for e in p.experts or ():
                out[e] = p.device
        return out

    def device(self, name: str, expert: int | None = None) -> Device:
        """The Device object for a tensor name (of expert `expert` of it) or a device name ("cpu", "sim:0")."""
        dev = self.device_of(name, expert) if name in self else name
        if dev == "cpu":
            return CPU
        for d in (*self.devices, *self.remote):
            if d.name == dev:
                return d
        raise KeyError(f"{name!r} is neither a tensor of the plan nor one of its devices "
                       f"({', '.join(self.device_names())})")

    def device_names(self) -> list[str]:
        return ["cpu", *(d.name for d in self.devices), *(d.name for d in self.remote)]

    def rule_of(self, name: str) -> str:
        """Which rule decided (e.g. 'rule #0 \\.ffn_.*_exps=CPU'), or 'default: <why>'."""
        return self[name].decided_by

    def attention_device(self, layer: int) -> Device:
        """Where layer `layer`'s attention runs and its KV cache lives: the device of its K projection."""
        for suffix in ("attn_k.weight", "attn_kv_a_mqa.weight", "attn_qkv.weight", "attn_q.weight"):
            name = f"blk.{layer}.{suffix}"
            if name in self.entries:
                return self.device(name)
        return self.device(self.default_device(layer))

    def default_device(self, layer: int | None) -> str:
        """The device a tensor of `layer` gets when no rule matches (None: input layer, the CPU)."""
        if layer is None or not self.devices or layer < self.n_layer + 1 - self.gpu_layers:
            return "cpu"
        return _layer_gpu(layer, self.n_layer, self.gpu_layers, self.devices, self.tensor_split).name

    def bytes_by_device(self) -> dict[str, int]:
        """Weight bytes per device (every device of the plan, zeros included)."""
        out = dict.fromkeys(self.device_names(), 0)
        for e in self:
            out[e.device] += e.nbytes
        return out

    def bytes_by_rule(self) -> dict[str, int]:
        """Weight bytes each rule (and the default) decided."""
        out: dict[str, int] = {f"#{i} {r}": 0 for i, r in enumerate(self.rules)}
        for e in self:
            key = f"#{e.rule_index} {e.rule}" if e.rule is not None else f"default -> {e.device}"
            out[key] = out.get(key, 0) + e.nbytes
        return out

    def overrides_string(self) -> str:
        """The -ot equivalent of the plan's rules (user, shortcut and fit rules, in order)."""
        return format_overrides(self.rules)

    # -- printing
    def explain(self, only: str | None = None) -> str:
        """A table: tensor, type, shape, bytes, device, deciding rule; then totals per device and rule.

        `only`: a regex; the per-tensor table lists just the tensors it matches (totals stay whole).
        """
        gpus = ", ".join(f"{d.name} ({format_size(d.capacity)})" for d in self.devices) or "none"
        lines = [f"plan for {Path(self.path).name} ({self.arch}, {self.n_layer} layers + output): "
                 f"gpu_layers={self.gpu_layers} of {self.n_layer + 1}, backend {self.gpu_backend}, GPUs: {gpus}",
                 ""]
        lines.append("rules (first match wins):" if self.rules else "rules: none (every tensor on its default)")
        count: dict[int, list[int]] = {i: [0, 0] for i in range(len(self.rules))}
        for e in self:
            if e.rule_index is not None:
                count[e.rule_index][0] += 1
                count[e.rule_index][1] += e.nbytes
        for i, r in enumerate(self.rules):
            n, b = count[i]
            lines.append(f"  #{i:<3} {str(r):<48} {r.source:<9} {n:>5} tensors {format_size(b):>12}")
        lines.append("")
        w = max([len(e.label) for e in self] + [6])
        lines.append(f"{'tensor':<{w}}  {'type':<6} {'shape':<18} {'bytes':>11}  {'device':<7} decided by")
        pat = None if only is None else compile_pattern(only, "explain(only=...)")
        shown = [e for e in self if pat is None or search(pat, e.name, f"explain(only={only!r})")]
        for e in shown:
            shape = "x".join(map(str, e.shape))
            tied = f" (tied to {e.tied_to})" if e.tied_to else ""
            lines.append(f"{e.label:<{w}}  {e.type:<6} {shape:<18} {format_size(e.nbytes):>11}  {e.device:<7} "
                         f"{e.decided_by}{tied}")
        if len(shown) < len(self):
            lines.append(f"... {len(self) - len(shown)} more tensors (all of them: moert inspect MODEL --plan)")
        lines += ["", "weights per device:"]
        n_by = {d: 0 for d in self.device_names()}
        for e in self:
            n_by[e.device] += 1
        for d, b in self.bytes_by_device().items():
            lines.append(f"  {d:<8} {format_size(b):>12}  {n_by[d]:>5} tensors")
        lines += ["", "weights per rule:"]
        for k, b in self.bytes_by_rule().items():
            lines.append(f"  {k:<56} {format_size(b):>12}")
        for m in self.messages:
            lines.append(f"warning: {m}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The plan as plain data (no device objects)."""
        return {
            "model": self.path, "architecture": self.arch, "n_layer": self.n_layer,
            "gpu_layers": self.gpu_layers, "gpu_backend": self.gpu_backend, "split": self.split,
            "tensor_split": list(self.tensor_split) if self.tensor_split else None,
            "devices": {d: (None if d == "cpu" else self.device(d).capacity) for d in self.device_names()},
            "rules": [{"pattern": r.pattern, "device": r.device, "spelling": r.device_spelling(),
                       "source": r.source, **({"experts": list(r.experts)} if r.experts else {})}
                      for r in self.rules],
            "overrides": self.overrides_string(),
            "tensors": [{"name": e.name, "type": e.type, "shape": list(e.shape), "bytes": e.nbytes,
                         "device": e.device, "rule": e.rule_index, "decided_by": e.decided_by,
                         **({"tied_to": e.tied_to} if e.tied_to else {}),
                         **({"experts": list(e.experts)} if e.experts else {})} for e in self],
            "bytes_by_device": self.bytes_by_device(),
            "warnings": list(self.messages),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def __repr__(self) -> str:
        per = ", ".join(f"{d}={format_size(b)}" for d, b in self.bytes_by_device().items())
        return f"<Plan {Path(self.path).name}: {len(self)} tensors, {len(self.rules)} rules; {per}>"

    # -- used by fit: re-decide some default-placed tensors with an appended rule, without re-matching
    def _with_rule(self, rule: TensorOverride, names: Iterable[str]) -> Plan:
        rules = [*self.rules, rule]
        entries, split_tensors = dict(self.entries), dict(self.split_tensors)
        dev = "cpu" if rule.device == "cpu" else self.devices[rule.device_index].name
        for n in names:
            if n in split_tensors:     # only the experts no rule decided
                split_tensors[n] = tuple(replace(p, device=dev, rule=rule, rule_index=len(rules) - 1)
                                         if p.rule is None else p for p in split_tensors[n])
            else:
                entries[n] = replace(entries[n], device=dev, rule=rule, rule_index=len(rules) - 1)
        return Plan(self.model, rules, entries, self.devices, self.gpu_layers, self.gpu_backend, self.split,
                    self.messages, self.tensor_split, split_tensors, self.remote)


def _layer_gpu(il: int, n_layer: int, gpu_layers: int, devices: list[Device],
               shares: tuple[float, ...] | None) -> Device:
    # llama-model.cpp, load_tensors: splits are cumulative shares normalized to 1 (by free memory when no
    # tensor_split is given); layer_gpu = upper_bound(splits, float(il - i_gpu_start) / act_gpu_layers)
    if shares is None or len(devices) == 1:
        return devices[0]
    i_gpu_start = max(n_layer + 1 - gpu_layers, 0)
    act = min(gpu_layers, n_layer + 1)
    total = float(sum(shares))
    x = (il - i_gpu_start) / act
    acc = 0.0
    for d, share in zip(devices, shares):
        acc += share / total
        if x < acc:  # upper_bound: first split point strictly greater than x
            return d
    return devices[-1]


_EXPERT_TENSOR_RE = re.compile(r"_(ch|)exps\.")


def _has_expert_axis(name: str, shape: tuple[int, ...]) -> bool:
    """Whether axis 0 of this tensor indexes experts (blk.N.ffn_*_exps.weight / .bias)."""
    return _EXPERT_TENSOR_RE.search(name) is not None and len(shape) >= 2


__all__ = ["EXPERT_REGEX", "Placement", "Plan", "model_info"]
