"""`moert explain`: follow one token through the model, layer by layer, as a learner would want to see it.

    trace = explain(m, prompt, token=-1)     the prompt before the token is prefilled, then the token runs
                                             alone (a decode step) while a Recorder watches the runtime
    format_trace(trace)                      per layer: the residual, what attention and the FFN added, the
                                             router's probabilities (a bar chart), the chosen experts, where
                                             they live, bytes read, time and transfers per device

The Recorder never touches an architecture's math: it wraps, on one Model instance and for one forward
call, the runtime methods every architecture calls (moert/model.py: `attention_device` opens a layer,
`to` moves the residual in, `experts` runs the routed FFN, `output` takes the last residual) and keeps
references to what passes through. The router's probabilities are recomputed on the host from the
recorded normed hidden state and `ffn_gate_inp.weight` (the same softmax as qwen3moe's `route`); the
chosen experts are the ones the runtime really ran. Reading recorded arrays back to the host afterwards
is not counted as a transfer of the token.

Dimension legend: D hidden, E experts, K used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from moert import devices as _devices
from moert.errors import MoertError
from moert.layers import softmax


@dataclass
class LayerTrace:
    """What one layer did to the token."""

    layer: int
    attention_device: str
    residual_norm: float = 0.0            # |x| entering the layer
    attention_update: float = 0.0         # |attention's addition to x| / |x|
    ffn_update: float = 0.0               # |the FFN's (experts') addition| / |x|
    ffn: str = "dense"                    # "moe" or "dense"
    probs: list[float] | None = None      # (E,) softmax of the router logits (the architecture's router_scores)
    router: str = ""                      # how probs are made, when not qwen3moe's softmax
    experts: list[int] = field(default_factory=list)      # (K,) the experts the runtime ran
    weights: list[float] = field(default_factory=list)    # (K,) their weights
    expert_device: str | None = None
    bytes_read: dict[str, int] = field(default_factory=dict)               # device -> weight bytes read
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)    # phase -> device -> s
    transfers: list[tuple[str, str, str, int]] = field(default_factory=list)  # (what, from, to, bytes)


@dataclass
class Trace:
    """One token's walk through the model."""

    prompt: str
    position: int
    token_id: int
    token: str
    placement: str
    layers: list[LayerTrace]
    next_tokens: list[tuple[int, str, float]]     # the model's top predictions after this token
    seconds: float
    transfers: dict[str, dict]                     # device -> counts and bytes of the whole step
    hardware: str = ""                             # the virtual clock's: sim GPU and link times are predicted

    def to_dict(self) -> dict:
        return asdict(self)


class Recorder:
    """`with Recorder(m) as rec: m.forward([t])`: references to each layer's residual, FFN input and output."""

    def __init__(self, m):
        self.m, self.layers, self.final, self._cur = m, [], None, None

    def __enter__(self) -> Recorder:
        m, cls = self.m, type(self.m)
        self._orig = {name: getattr(cls, name).__get__(m) for name in
                      ("attention_device", "to", "_moving", "experts", "output", "_add_time", "_add_predicted")}
        m.attention_device, m.to, m._moving, m.experts = self._attention_device, self._to, self._moving, self._experts
        m.output, m._add_time, m._add_predicted = self._output, self._add_time, self._add_predicted
        self._fused, m.fused_decode = m.fused_decode, False    # the block, whose calls it watches (moert/fused.py)
        return self

    def __exit__(self, *exc) -> None:
        for name in self._orig:
            delattr(self.m, name)      # the class's methods again
        self.m.fused_decode = self._fused

    def host(self, x) -> np.ndarray:
        """A recorded array on the host, float64 (the read is not counted as a transfer of the model's)."""
        return host_array(self.m, x)

    def _attention_device(self, il: int):
        dev = self._orig["attention_device"](il)
        self._cur = {"layer": il, "dev": dev, "x": None, "y": None, "time": {}, "moves": []}
        self.layers.append(self._cur)
        return dev

    def _to(self, x, dev, what: str = "", **kw):
        cur = self._cur
        if cur is not None and what == "hidden" and cur["x"] is None:
            cur["x"] = x.copy()                                # (T, D) the residual entering the layer
        if cur is not None and what == "ffn output":
            cur["y"] = x.copy()                                # (T, D) a dense FFN's addition (gemma3)
        return self._orig["to"](x, dev, what, **kw)

    def _moving(self, src, dev, nbytes: int, what: str = ""):
        """Every transfer of the step (ModelRuntime.to's and a pinned crossing's), with what it carries."""
        if self._cur is not None:
            self._cur["moves"].append((what, src.name, dev.name, int(nbytes)))
        return self._orig["_moving"](src, dev, nbytes, what)

    def _experts(self, il: int, x, ids, weights, names, **semantics):
        y = self._orig["experts"](il, x, ids, weights, names, **semantics)    # logits, act, biases
        self._cur.update(h=x.copy(), ids=ids.copy(), w=weights.copy(), y=y.copy(), names=names)
        return y

    def _output(self, norm_name: str, name: str, x):
        self.final, self._cur = x.copy(), None                 # (T, D) the residual after the last layer
        return self._orig["output"](norm_name, name, x)

    def _add_time(self, phase: str, dev: str, s: float, replaced: bool = False) -> None:
        self._orig["_add_time"](phase, dev, s, replaced)
        if self._cur is not None and not replaced:
            t = self._cur["time"].setdefault(phase, {})
            t[dev] = t.get(dev, 0.0) + s

    def _add_predicted(self, phase: str, dev: str, s: float) -> None:      # the virtual clock's (vclock.py)
        self._orig["_add_predicted"](phase, dev, s)
        if self._cur is not None:
            t = self._cur["time"].setdefault(phase, {})
            t[dev] = t.get(dev, 0.0) + s


def host_array(m, x) -> np.ndarray:
    """x on the host as float64, without counting the read as one of the token's transfers."""
    dev = _devices.device_of(x, m.plan.devices)
    snap = dev.stats.copy()
    h = dev.to_host(x) if dev.is_gpu else x
    dev.stats.reset_to(snap)
    return np.asarray(h, dtype=np.float64)


def _norm(x: np.ndarray) -> float:
    return float(np.linalg.norm(x))


def _layer_bytes(m, il: int, experts: list[int], expert_names) -> dict[str, int]:
    """Weight bytes layer il reads for one token, per device: every tensor of the layer, but only the
    chosen experts' slices of the stacked expert tensors."""
    out: dict[str, int] = {}
    n_expert = getattr(m.config, "n_expert", 0)
    for name, t in m.gguf.tensors.items():
        if not name.startswith(f"blk.{il}."):
            continue
        n = t.nbytes
        if expert_names and name in expert_names:
            n = n * len(set(experts)) // n_expert
        d = m.plan.device(name).name
        out[d] = out.get(d, 0) + n
    return out


def prompt_ids(m, prompt: str | list[int], token: int, what: str = "") -> tuple[list[int], int]:
    """The prompt's token ids and the index of its token `token` (negative from the end), or a MoertError saying
    what to give; `what` prefixes the message ("explain")."""
    ids = m.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    head = f"{what}: " if what else ""
    if not ids:
        raise MoertError(f"{head}the prompt has no tokens; give a non-empty prompt with -p TEXT")
    if not -len(ids) <= token < len(ids):
        raise MoertError(f"{head}--token {token} is outside the prompt's {len(ids)} tokens; give an index from "
                         f"{-len(ids)} to {len(ids) - 1}")
    return ids, token % len(ids)


def explain(m, prompt: str | list[int], token: int = -1, top: int = 5) -> Trace:
    """Run `prompt` and trace its token `token` (an index into the prompt's ids, negative from the end)."""
    ids, i = prompt_ids(m, prompt, token, "explain")
    m.reset()
    if i:
        m.forward(ids[:i], last_only=True)                     # the context before the token
    with Recorder(m) as rec:
        logits = m.forward(ids[i:i + 1])                       # (1, V): the token alone, a decode step
    call = m.stats.last
    layers = [_layer_trace(m, r) for r in rec.layers]
    xs = [host_array(m, r["x"])[0] for r in rec.layers] + [host_array(m, rec.final)[0]]        # residuals, (D,) each
    for k, lt in enumerate(layers):                            # attention's addition = total - the FFN's
        total = xs[k + 1] - xs[k]
        ffn = host_array(m, rec.layers[k]["y"])[0] if rec.layers[k]["y"] is not None else np.zeros_like(total)
        lt.residual_norm = _norm(xs[k])
        lt.attention_update = _norm(total - ffn) / max(lt.residual_norm, 1e-30)
        lt.ffn_update = _norm(ffn) / max(lt.residual_norm, 1e-30)
    p = softmax(np.asarray(logits[-1], np.float64))
    best = np.argsort(-p, kind="stable")[:top]
    tok = m.tokenizer
    text = (lambda t: tok.detokenize([t], special=True)) if tok.has_vocab else str
    return Trace(prompt=prompt if isinstance(prompt, str) else " ".join(map(str, ids)), position=i,
                 token_id=ids[i], token=text(ids[i]), placement=m.plan.overrides_string() or "(defaults)",
                 layers=layers, next_tokens=[(int(t), text(int(t)), float(p[t])) for t in best],
                 seconds=call.seconds, transfers={d: t.as_dict() for d, t in call.transfers.items()},
                 hardware=call.hardware)


def _layer_trace(m, r: dict) -> LayerTrace:
    il = r["layer"]
    lt = LayerTrace(layer=il, attention_device=r["dev"].name, seconds=r["time"], transfers=r["moves"])
    names = r.get("names")
    if names is not None:
        h = host_array(m, r["h"])[0]                                                    # (D,) ffn_norm(x)
        w_router = m.gguf.dequantize(f"blk.{il}.ffn_gate_inp.weight").astype(np.float64)   # (E, D)
        logits = w_router @ h                                                      # (E,)
        if f"blk.{il}.ffn_gate_inp.bias" in m.gguf.tensors:                        # gpt-oss's router bias
            logits = logits + m.gguf.dequantize(f"blk.{il}.ffn_gate_inp.bias").astype(np.float64)
        scores = getattr(m.arch, "router_scores", None)        # an architecture whose router is not qwen3moe's
        p, lt.router = scores(m.config, logits) if scores else (softmax(logits), "")   # (E,)
        lt.ffn, lt.probs = "moe", np.asarray(p).tolist()
        lt.experts = [int(e) for e in host_array(m, r["ids"])[0]]
        lt.weights = [float(w) for w in host_array(m, r["w"])[0]]
        lt.expert_device = m.plan.device(names[0]).name
    lt.bytes_read = _layer_bytes(m, il, lt.experts, names)
    return lt


# -- text --------------------------------------------------------------------------------------------

_BAR = 30   # characters of the widest bar
_SPARK = "▁▂▃▄▅▆▇█"


def _size(n: float) -> str:
    return _devices.format_size(int(n))


def _bars(lt: LayerTrace, max_rows: int = 32) -> list[str]:
    """The router's probabilities as bars; all experts when E <= max_rows, else a sparkline and the top ones."""
    p = np.asarray(lt.probs)
    chosen = dict(zip(lt.experts, lt.weights))
    rows = range(len(p)) if len(p) <= max_rows else np.argsort(-p, kind="stable")[:max_rows // 2]
    out = []
    if len(p) > max_rows:
        out.append("    all: " + "".join(_SPARK[min(7, int(v / p.max() * 8))] for v in p))
    for e in rows:
        mark = f"  <- chosen, weight {chosen[int(e)]:.3f}" if int(e) in chosen else ""
        out.append(f"    e{int(e):<3d} {'█' * int(round(p[e] / p.max() * _BAR)):<{_BAR}} {p[e]:.3f}{mark}")
    return out


def format_layer(lt: LayerTrace) -> list[str]:
    """One layer of `format_trace`."""
    lines = [f"layer {lt.layer}   attention on {lt.attention_device}, FFN "
             + (f"= {len(lt.experts)} routed experts on {lt.expert_device}" if lt.ffn == "moe" else "dense"),
             f"  residual |x| = {lt.residual_norm:.2f};  attention added a vector of norm "
             f"{lt.attention_update * lt.residual_norm:.2f} ({lt.attention_update:.2f} |x|), "
             f"{'the experts' if lt.ffn == 'moe' else 'the FFN'} one of "
             f"{lt.ffn_update * lt.residual_norm:.2f} ({lt.ffn_update:.2f} |x|)"]
    if lt.ffn == "moe":
        how = lt.router or "softmax(ffn_gate_inp . ffn_norm(x))"
        lines.append(f"  router: {how} over {len(lt.probs)} experts, top {len(lt.experts)}"
                     + ("" if lt.router else ", renormalized to sum to 1"))
        lines += _bars(lt)
        lines.append("  chosen: " + ", ".join(f"e{e} x {w:.3f}" for e, w in zip(lt.experts, lt.weights))
                     + f"   (their gate/up/down slices live on {lt.expert_device})")
    lines.append("  weights read: " + ", ".join(f"{d} {_size(n)}" for d, n in sorted(lt.bytes_read.items())))
    per: dict[str, list[str]] = {}
    for phase, by_dev in lt.seconds.items():
        for d, s in by_dev.items():   # transfers are timed on "src->dst"
            key = "transfers" if phase == "transfers" else d
            per.setdefault(key, []).append(f"{d if phase == 'transfers' else phase} {s * 1e3:.2f} ms")
    lines.append("  time: " + ";  ".join(f"{d}: {', '.join(v)}" for d, v in sorted(per.items())))
    if lt.transfers:
        lines.append("  transfers: " + ", ".join(f"{what} {a}->{b} {_size(n)}" for what, a, b, n in lt.transfers))
    else:
        lines.append("  transfers: none (everything on one device)")
    return lines


def format_trace(t: Trace, layer: int | None = None) -> str:
    """The walk as text: the token, then each layer (or only `layer`), then what the model predicts next."""
    lines = [f"token {t.position} of the prompt: {t.token!r} (id {t.token_id}), run alone as a decode step "
             f"in {t.seconds * 1e3:.1f} ms", f"placement: {t.placement}", ""]
    if t.hardware:
        lines[2:2] = [f"time: sim GPU and transfer times predicted for {t.hardware} (moert/cost/vclock.py), "
                      f"CPU measured"]
    for lt in t.layers:
        if layer is None or lt.layer == layer:
            lines += format_layer(lt) + [""]
    moves = ", ".join(f"{d}: {v['h2d_count']} h2d ({_size(v['h2d_bytes'])}), {v['d2h_count']} d2h "
                      f"({_size(v['d2h_bytes'])})" for d, v in sorted(t.transfers.items()))
    lines.append(f"whole step: transfers {moves or 'none'}")
    lines.append("next token: " + ",  ".join(f"{s!r} {p:.3f}" for _, s, p in t.next_tokens))
    return "\n".join(lines)


def plot_trace(t: Trace, path) -> object:
    """Per layer: router probabilities (chosen experts outlined) and the residual updates; returns the path."""
    from moert.plots import explain_plot

    return explain_plot(t, path)
