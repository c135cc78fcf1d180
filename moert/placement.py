"""Placement: an ordered list of regex rules (moert/rules.py) gives every GGUF tensor a device; first match wins.

    rules = parse_overrides(r"\\.ffn_.*_exps=CPU")      # llama.cpp's -ot syntax, or TensorOverride.cpu(...)
    p = plan("model.gguf", rules, gpu_layers="all", gpu_backend="sim")
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
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from moert.device_config import accepts_device_config
from moert.devices import CPU, Device, format_size, get_devices
from moert.errors import PlacementError, PlacementWarning
from moert.rules import (  # noqa: F401  (rules are re-exported: moert.placement is their public home too)
    EXPERT_REGEX,
    TensorOverride,
    expert_layer_regex,
    format_overrides,
    moe_rules,
    normalize_overrides,
    parse_overrides,
)

SPLIT_MODES = ("layer", "none")
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
    experts: tuple[int, int] | None = None  # None = the whole tensor (expert ranges: room to grow)
    tied_to: str | None = None            # output.weight duplicated from token_embd.weight when absent

    @property
    def decided_by(self) -> str:
        return f"rule #{self.rule_index} {self.rule}" if self.rule is not None else f"default: {self.reason}"


@dataclass
class _Model:
    path: str
    arch: str
    metadata: dict
    tensors: dict[str, tuple[str, tuple[int, ...], int]]  # name -> (type, shape, nbytes)
    n_layer: int


def _model_info(model: Any, n_layer: int | None = None) -> _Model:
    if isinstance(model, _Model):
        return model
    if isinstance(model, (str, Path)):
        from moert import gguf

        with gguf.open(model) as g:
            return _model_info(g, n_layer)
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
                 shares: tuple[float, ...] | None = None):
        self.model = model
        self.path, self.arch, self.metadata, self.n_layer = model.path, model.arch, model.metadata, model.n_layer
        self.rules = rules
        self.entries = entries
        self.devices = devices            # the GPU devices (cpu is moert.devices.CPU)
        self.gpu_layers = gpu_layers      # layers (of n_layer + 1) whose default device is a GPU
        self.gpu_backend = gpu_backend    # "cupy", "sim" or "none" (what is actually used)
        self.split = split                # "layer" or "none"
        self.tensor_split = shares        # the GPUs' shares of the GPU layers (capacities unless given)
        self.messages = messages          # the warnings raised while planning

    # -- questions
    def __getitem__(self, name: str) -> Placement:
        try:
            return self.entries[name]
        except KeyError:
            raise KeyError(f"the plan has no tensor {name!r} ({len(self.entries)} tensors; "
                           f"Plan.explain() lists them)") from None

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __iter__(self):
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def device_of(self, name: str) -> str:
        """The device name of a tensor: "cpu", "cuda:0", "sim:1"."""
        return self[name].device

    def device(self, name: str) -> Device:
        """The Device object for a tensor name or a device name ("cpu", "sim:0")."""
        dev = self.entries[name].device if name in self.entries else name
        if dev == "cpu":
            return CPU
        for d in self.devices:
            if d.name == dev:
                return d
        raise KeyError(f"{name!r} is neither a tensor of the plan nor one of its devices "
                       f"({', '.join(self.device_names())})")

    def device_names(self) -> list[str]:
        return ["cpu", *(d.name for d in self.devices)]

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
        w = max([len(e.name) for e in self] + [6])
        lines.append(f"{'tensor':<{w}}  {'type':<6} {'shape':<18} {'bytes':>11}  {'device':<7} decided by")
        shown = [e for e in self if only is None or re.search(only, e.name)]
        for e in shown:
            shape = "x".join(map(str, e.shape))
            tied = f" (tied to {e.tied_to})" if e.tied_to else ""
            lines.append(f"{e.name:<{w}}  {e.type:<6} {shape:<18} {format_size(e.nbytes):>11}  {e.device:<7} "
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
                       "source": r.source} for r in self.rules],
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
        entries = dict(self.entries)
        dev = "cpu" if rule.device == "cpu" else self.devices[rule.device_index].name
        for n in names:
            entries[n] = replace(entries[n], device=dev, rule=rule, rule_index=len(rules) - 1)
        return Plan(self.model, rules, entries, self.devices, self.gpu_layers, self.gpu_backend, self.split,
                    self.messages, self.tensor_split)


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


def _gpu_layers(gpu_layers: Any, n_layer: int) -> int:
    if gpu_layers == "all":
        return n_layer + 1
    if isinstance(gpu_layers, str) and gpu_layers.strip().isdigit():
        gpu_layers = int(gpu_layers)
    if isinstance(gpu_layers, bool) or not isinstance(gpu_layers, int) or gpu_layers < 0:
        raise PlacementError(f"gpu_layers must be 'all', 'auto' or an int >= 0, got {gpu_layers!r}")
    return min(gpu_layers, n_layer + 1)  # -ngl 999 means all, as in llama.cpp


@accepts_device_config
def plan(model: Any, overrides: Any = None, gpu_layers: int | str = "all", cpu_moe: bool = False,
         n_cpu_moe: int | None = None, gpu_backend: str = "auto", gpu_memory: Any = None,
         split: str = "layer", strict: bool = False, *, n_cpu_moe_from: str = "first",
         tensor_split: Sequence[float] | None = None, main_gpu: int = 0, context_size: int = 0,
         devices: list[Device] | None = None, n_layer: int | None = None) -> Plan:
    """Decide every tensor's device (nothing is loaded); see the module docstring for the semantics.

    `model`: a GGUF path, an open GGUFFile, or a list of tensor names. `gpu_layers="auto"` runs `fit`
    for `context_size` (0: the largest that fits). `tensor_split` gives the GPUs' shares of the layers
    (llama.cpp's -ts; default: their capacities); `main_gpu` with split="none" is the GPU that takes every
    GPU layer (llama.cpp's -mg). `devices` reuses GPU devices from get_devices().
    """
    info = _model_info(model, n_layer)
    user = normalize_overrides(overrides)
    split, devices = main_gpu_split(_split(split, tensor_split), main_gpu, devices, gpu_backend, gpu_memory)
    if gpu_layers == "auto":
        from moert.memory import fit

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            r = fit(info, context_size=context_size, overrides=user, gpu_layers="auto", cpu_moe=cpu_moe,
                    n_cpu_moe=n_cpu_moe, n_cpu_moe_from=n_cpu_moe_from, gpu_backend=gpu_backend,
                    gpu_memory=gpu_memory, split=split, devices=devices)
        if not r.success:
            raise PlacementError(f"gpu_layers='auto': {r.message}")
        if strict and r.plan.messages:
            raise PlacementError("strict placement: " + "; ".join(r.plan.messages))
        for w in caught:
            warnings.warn(w.message, w.category, stacklevel=3)  # past accepts_device_config
        return r.plan
    rules = user + moe_rules(cpu_moe, n_cpu_moe, info.n_layer, n_cpu_moe_from)
    return _build(info, rules, _gpu_layers(gpu_layers, info.n_layer), gpu_backend, gpu_memory, split, strict,
                  devices, stacklevel=3)  # past accepts_device_config


def _split(split: str, tensor_split: Sequence[float] | None) -> str | tuple[float, ...]:
    """"layer", "none", or explicit shares (a tuple) when tensor_split is given."""
    if split not in SPLIT_MODES:
        raise PlacementError(f"split={split!r} is not supported; use one of {', '.join(SPLIT_MODES)}")
    if tensor_split is None or split == "none":
        return split
    shares = tuple(float(x) for x in tensor_split)
    if not shares or any(x < 0 for x in shares) or sum(shares) <= 0:
        raise PlacementError(f"tensor_split={list(tensor_split)!r}: give one share >= 0 per GPU, not all zero "
                             f"(e.g. 3,1)")
    return shares


def main_gpu_split(split: str | tuple[float, ...], main_gpu: int, devices: list[Device] | None, gpu_backend: str,
                   gpu_memory: Any) -> tuple[str | tuple[float, ...], list[Device] | None]:
    """llama.cpp's -mg: with split "none", every GPU layer on GPU `main_gpu` (as one-hot layer shares)."""
    if not main_gpu:
        return split, devices
    gpus = list(devices) if devices is not None else get_devices(gpu_backend, gpu_memory)
    if isinstance(main_gpu, bool) or not isinstance(main_gpu, int) or not 0 <= main_gpu < len(gpus):
        raise PlacementError(f"main_gpu={main_gpu!r}: there is no GPU {main_gpu}; GPUs that exist: "
                             f"{', '.join(f'{i} ({g.name})' for i, g in enumerate(gpus)) or 'none'}")
    if split != "none":  # llama.cpp uses the main GPU only without a layer split
        return split, gpus
    return tuple(1.0 if i == main_gpu else 0.0 for i in range(len(gpus))), gpus


def _build(info: _Model, rules: list[TensorOverride], n_gpu: int, gpu_backend: str, gpu_memory: Any,
           split: str | tuple[float, ...], strict: bool, devices: list[Device] | None, stacklevel: int = 2,
           warn: bool = True) -> Plan:
    for r in rules:
        if r.experts is not None:
            raise PlacementError(f"rule {r}: expert-range rules (experts={r.experts}) are not supported yet; "
                                 f"place whole *_exps tensors")
    backend = (gpu_backend or "auto").lower()
    gpus = list(devices) if devices is not None else get_devices(backend, gpu_memory)
    messages: list[str] = []

    tensors = dict(info.tensors)
    tied: dict[str, str] = {}
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        # llama.cpp loads token_embd a second time as the output layer's matrix (TENSOR_DUPLICATED)
        tensors["output.weight"] = tensors["token_embd.weight"]
        tied["output.weight"] = "token_embd.weight"

    # which GPU backend is really in use, and whether anything asks for a GPU
    wants_gpu = any(r.device != "cpu" for r in rules) or (n_gpu > 0 and any(
        _layer_of(n, info.n_layer) is not None for n in tensors))
    fallback = False
    if not gpus:
        if wants_gpu and backend == "auto":
            from moert import _cuda

            _cuda.device_count()
            messages.append(f"no usable GPU backend ({_cuda.why_unavailable()}): every tensor is placed on the "
                            f"CPU; pass gpu_backend='sim' to simulate a GPU, or gpu_layers=0 to plan for "
                            f"the CPU only")
            fallback = True
        elif wants_gpu:
            raise PlacementError(f"the plan puts tensors on a GPU (gpu_layers={n_gpu} or a GPU rule) but "
                                 f"gpu_backend={gpu_backend!r} has no GPU; use gpu_layers=0, "
                                 f"gpu_backend='auto' to fall back to the CPU, or gpu_backend='sim'")
    used_backend = gpus[0].kind.replace("cuda", "cupy") if gpus else "none"
    if gpus:
        for i, r in enumerate(rules):
            if r.device != "cpu" and r.device_index >= len(gpus):
                raise PlacementError(f"rule #{i} {r}: there is no {r.device} (GPU index {r.device_index}); "
                                     f"devices that exist: {', '.join(['cpu', *(g.name for g in gpus)])}")
            if r.backend is not None and r.backend != gpus[0].kind:
                raise PlacementError(f"rule #{i} {r} names a {r.backend} device but the GPU backend is "
                                     f"{used_backend}; pass gpu_backend="
                                     f"{'sim' if r.backend == 'sim' else 'cupy'!r} or spell it GPU{r.device_index}")
    n_gpu_eff = n_gpu if gpus else 0
    if isinstance(split, tuple):
        if gpus and len(split) != len(gpus):
            raise PlacementError(f"tensor_split has {len(split)} shares but there are {len(gpus)} GPUs "
                                 f"({', '.join(g.name for g in gpus)}); give one share per GPU")
        shares, split = split, "layer"
    else:
        shares = tuple(float(g.capacity) for g in gpus) if split == "layer" else None

    entries: dict[str, Placement] = {}
    matched = [0] * len(rules)
    decided = [0] * len(rules)
    shadowed_by: list[int | None] = [None] * len(rules)
    for name, (typ, shape, nbytes) in tensors.items():
        layer = _layer_of(name, info.n_layer)
        hits = [i for i, r in enumerate(rules) if r.regex.search(name)]
        for i in hits:
            matched[i] += 1
            if i != hits[0] and shadowed_by[i] is None:
                shadowed_by[i] = hits[0]
        if hits:
            i = hits[0]
            r = rules[i]
            decided[i] += 1
            dev = "cpu" if (r.device == "cpu" or fallback) else gpus[r.device_index].name
            reason = f"rule #{i}" + (" (no GPU: CPU fallback)" if fallback and r.device != "cpu" else "")
            entries[name] = Placement(name, typ, shape, nbytes, dev, r, i, reason, layer, tied_to=tied.get(name))
        else:
            dev, reason = _default(layer, info.n_layer, n_gpu, n_gpu_eff, gpus, shares, fallback)
            entries[name] = Placement(name, typ, shape, nbytes, dev, None, None, reason, layer,
                                      tied_to=tied.get(name))

    for i, r in enumerate(rules):
        if matched[i] == 0:
            example = next(iter(info.tensors), "?")
            messages.append(f"rule #{i} {r} ({r.source}) matches no tensor of this model; tensor names look "
                            f"like {example!r} (Plan.explain() lists them all)")
        elif decided[i] == 0:
            j = shadowed_by[i]
            messages.append(f"rule #{i} {r} ({r.source}) never decides: each of the {matched[i]} tensors it "
                            f"matches was already taken by an earlier rule (first by rule #{j} {rules[j]}); "
                            f"reorder the rules or remove one")
    if strict and messages:
        raise PlacementError("strict placement: " + "; ".join(messages))
    if warn:
        for m in messages:
            warnings.warn(m, PlacementWarning, stacklevel=stacklevel + 1)
    return Plan(info, rules, entries, gpus, n_gpu_eff, used_backend, split, messages, shares)


def _layer_of(name: str, n_layer: int) -> int | None:
    m = _LAYER_RE.match(name)
    if m:
        return int(m.group(1))
    return n_layer if _OUTPUT_RE.match(name) else None


def _default(layer: int | None, n_layer: int, n_gpu: int, n_gpu_eff: int, gpus: list[Device],
             shares: tuple[float, ...] | None, fallback: bool) -> tuple[str, str]:
    what = "output layer" if layer == n_layer else f"layer {layer}"
    if layer is None:
        return "cpu", "input layer, kept on the CPU (a row lookup; llama.cpp never offloads it)"
    i_gpu_start = n_layer + 1 - n_gpu
    if layer < i_gpu_start:
        return "cpu", f"{what} is not among the last {n_gpu} of {n_layer + 1} layers (gpu_layers={n_gpu})"
    if fallback or not n_gpu_eff:
        return "cpu", f"{what} is a GPU layer, but there is no GPU (CPU fallback)"
    dev = _layer_gpu(layer, n_layer, n_gpu_eff, gpus, shares)
    return dev.name, f"{what} is among the last {n_gpu} of {n_layer + 1} layers (gpu_layers={n_gpu})"


__all__ = [
    "EXPERT_REGEX", "Placement", "Plan", "TensorOverride", "expert_layer_regex", "format_overrides",
    "main_gpu_split", "moe_rules", "normalize_overrides", "parse_overrides", "plan",
]
