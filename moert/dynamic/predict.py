"""Predicted speed with an expert cache: `moert.predict(plan, hw, cache=cache, trace=trace)`.

The plan is the static placement the cache works in: the routed experts of some MoE layers on the CPU (all of
them with cpu_moe=True / --cpu-moe, the first N with n_cpu_moe=N) and those layers' other tensors on the cache's
GPU, as `moert.load(..., expert_cache=cache)` runs it; the layers whose experts the plan put on a GPU are no
business of the cache and keep their static terms. The trace is the workload: the cache is replayed over it
(moert/dynamic/replay.py) and each of its forward chunks costed as the runtime runs it, per cached MoE layer:
  hits      the chunk's distinct experts served from the cache, on the GPU: the cost model's expert term for
            them and the tokens that chose them (CostModel.expert_load, as the virtual clock charges them);
  misses    the others on the CPU, as the static plan: their expert term there, the hidden state and the
            selection crossing the link both ways (as predict's static terms);
  copies    each admitted expert's tensors copied over the link after the layer ran, one copy per tensor
            (latency + bytes): nothing overlaps them;
  prefetch  (prefetch="next-router") the experts layer l + 1's router predicted, copied while layer l's experts
            run: the link's time for them less that layer's expert compute (the hits' and misses' terms above:
            the overlap window), never below 0. A wrong prediction costs its copy and hits nothing.
Decode is the mean over the trace's decode tokens. Prefill: the trace's prompt chunks (their size is the run's
n_batch) per prompt token, times n_prompt; a trace without prompt tokens leaves prefill as predicted statically
(llama.cpp's op offload, which copies a prompt's used experts to the GPU for B >= 32). Everything else (attention,
router, output) is `moert.predict`'s static prediction of the plan on the trace's selection counts.
The prefetches are the ones the run made, recorded in the trace (Trace.prefetch: load the model with the
prefetching cache and trace=True); a trace without them is refused, not guessed. They do not depend on the
cache's size or policy, so one recorded run predicts every size. Link time is not shared: a prefetch copy and
the activations crossing for the misses do not slow each other (a PCIe link is full duplex; the expert copies
are one direction).
Its virtual-clock twin: the sim GPU's "experts" time, the weight copies and the exposed prefetch time of a run
with the cache equal these terms for the same tokens (tests/test_dynamic_predict.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from moert.dynamic.policies import CacheError
from moert.dynamic.requests import cacheable, chunks, decisions


def cache_cost_model(plan, hardware, device: str, **kw):
    """A CostModel of `plan` with every routed expert on `device` (the cache's GPU): the terms of hits."""
    from moert.cost.predict import CostModel
    from moert.cost.shape import expert_sets

    sets = {name: {device: sorted(i for ids in per.values() for i in ids)} for name, per in expert_sets(plan).items()}
    return CostModel(plan, hardware, experts=sets, **kw)


def overlap(copy_s: float, window_s: float) -> float:
    """Seconds a prefetch copy of copy_s adds when it runs beside window_s of compute: what does not fit."""
    return max(0.0, copy_s - window_s)


def predict_with_cache(plan, hardware, cache, trace, n_prompt: int = 512, n_gen: int = 128,
                       depth: int = 0, **options):
    """moert.predict for `plan` on `hardware` with `cache` over the chunks of `trace` (module docstring)."""
    from moert.cost.predict import CostModel, Part, predict

    if trace is None or not hasattr(trace, "ids"):
        raise CacheError("predict with a cache needs the routing trace it replays: trace=moert.Trace (moert run "
                         "--trace FILE), not selection counts")
    dev = cache.device if isinstance(cache.device, str) else cache.device.name
    mask = cacheable(plan, trace.n_layer, int(trace.n_expert))
    layers = _check_plan(plan, dev, mask)
    base = predict(plan, hardware, n_prompt, n_gen, depth, trace=trace.counts(), **options)
    cpu_m = CostModel(plan, hardware, options.get("threads"), act_quant=options.get("act_quant"))
    gpu_m = cache_cost_model(plan, hardware, dev, act_quant=options.get("act_quant"))
    acc, hit, admitted, early = decisions(trace, cache, cacheable=mask)
    chunk, pre = chunks(trace), np.asarray(trace.prefill, bool)
    size = np.bincount(chunk) if len(chunk) else np.zeros(0, np.int64)       # tokens per chunk
    first = np.searchsorted(chunk, np.arange(len(size)))                      # each chunk's first token
    phase_of = np.where(pre[first], "prefill", "decode") if len(size) else np.zeros(0, str)
    L, E, link = acc.n_layer, acc.n_expert, hardware.link
    D, K = cpu_m.shape.D, cpu_m.shape.K
    copy_s = [_copy_seconds(plan, il, link) for il in range(L)]
    sums = {"decode": defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, ""]),          # (device, layer, stage) -> totals
            "prefill": defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, ""])}
    busy: dict[tuple, float] = {}                                             # (chunk, layer) -> overlap window
    memo: dict[tuple, Part] = {}
    group = acc.step * L + acc.layer                                           # one (chunk, layer) per group
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]]) if len(group) else np.zeros(0, np.int64)
    for a, b in zip(starts, np.r_[starts[1:], len(group)]):
        step, il = int(acc.step[a]), int(acc.keys[a] // E)
        phase, B, out = str(phase_of[step]), int(size[step]), sums[str(phase_of[step])]
        ids = trace.ids[first[step]:first[step] + B, il].reshape(-1)
        tokens = np.bincount(ids[ids >= 0], minlength=E)                       # (E,) tokens choosing each expert
        hits = np.zeros(E, bool)
        hits[acc.keys[a:b][hit[a:b]] % E] = True
        missed = np.zeros(E, bool)
        missed[acc.keys[a:b][~hit[a:b]] % E] = True
        took = 0.0
        for on, model, sel in ((dev, gpu_m, hits), ("cpu", cpu_m, missed)):
            if not sel.any():
                continue
            key = (on, il, int(sel.sum()))     # one token: its n experts there cost the same whichever they are
            part = memo.get(key) if B == 1 else None
            if part is None:
                items, used = model.expert_load(il, B, counts=np.where(sel, tokens, 0))[on]
                part = model.stage(phase, on, il, "experts", items, len(items), B, used)
                if B == 1:
                    memo[key] = part
            _add(out, part)
            took += part.seconds
        busy[step, il] = took
        if missed.any() and link is not None:                                   # the CPU experts' inputs and output
            for nbytes in (B * D * 4.0, B * K * 4.0):
                _add(out, Part(phase, "link", il, "transfer", 2 * nbytes, 0, 2, link.seconds(2 * nbytes, 2),
                               "latency"))
        n_adm = int(admitted[a:b].sum())
        if n_adm and link is not None:
            _add(out, Part(phase, "link", il, "cache copy", n_adm * _expert_bytes(plan, il), 0,
                           n_adm * copy_s[il][1], n_adm * copy_s[il][0], "bandwidth"))
    for (step, il), n_pf in early.items():                                    # copies made during layer il - 1
        if n_pf and link is not None:
            phase, s = str(phase_of[step]), n_pf * copy_s[il][0]
            _add(sums[phase], Part(phase, "link", il - 1, "prefetch copy", n_pf * _expert_bytes(plan, il), 0,
                                   n_pf * copy_s[il][1], overlap(s, busy.get((step, il - 1), 0.0)), "bandwidth"))
    n_dec = max(int((phase_of == "decode").sum()), 1)
    n_pre = int(size[phase_of == "prefill"].sum()) if len(size) else 0
    scale = {"decode": 1.0 / n_dec, "prefill": n_prompt / n_pre if n_pre else 0.0}
    phases = ("decode", "prefill") if n_pre else ("decode",)
    kept = [p for p in base.parts if not (p.phase in phases and p.layer in layers and _expert_term(p))]
    new = [Part(ph, d, il, st, v[0] * scale[ph], v[1] * scale[ph], v[2] * scale[ph], v[3] * scale[ph], v[4])
           for ph in phases for (d, il, st), v in sums[ph].items()]
    parts = kept + new + _hops(plan, hardware, layers, phases, n_prompt, options.get("n_ubatch", 512), D)
    decode_s = sum(p.seconds for p in parts if p.phase == "decode")
    prefill_s = sum(p.seconds for p in parts if p.phase == "prefill")
    is_dec = np.isin(acc.step, np.flatnonzero(phase_of == "decode"))
    dec_hits, dec_total = int(hit[is_dec].sum()), int(is_dec.sum())
    settings = {**base.settings, "cache": {"device": dev, "slots": int(cache.slots), "policy": cache.policy,
                                           "per_layer": cache.per_layer, "prefetch": cache.prefetch,
                                           "decode_tokens": int((phase_of == "decode").sum()),
                                           "prefill_tokens": n_pre, "cached_layers": sorted(layers),
                                           "decode_hit_rate": dec_hits / dec_total if dec_total else 0.0,
                                           "prefill": "the trace's prompt chunks" if n_pre else "static",
                                           "overlap": "prefetch copies beside the layer's expert compute; "
                                                      "admissions after the layer's experts, exposed"}}
    return replace(base, parts=parts, decode_s=decode_s, decode_tok_s=1.0 / decode_s if decode_s else float("inf"),
                   prefill_s=prefill_s, prefill_tok_s=n_prompt / prefill_s if prefill_s else 0.0, settings=settings)


def _expert_term(p) -> bool:
    """A static part the cache's terms replace: a layer's experts, and the link's moves in it (the hidden
    state's move into the layer is added back by `_hops`)."""
    return p.stage == "experts" or (p.device == "link" and p.stage in ("transfer", "offload"))


def _hops(plan, hardware, layers: set, phases, n_prompt: int, n_ubatch: int, D: int) -> list:
    """The hidden state's move into each cached layer whose attention is not where the previous layer's was
    (the embedding's rows are on the CPU), as predict's static `hop` counts it, per phase."""
    from moert.cost.predict import Part

    link, out = hardware.link, []
    if link is None:
        return out
    full, rest = divmod(n_prompt, n_ubatch)
    runs = {"decode": [(1, 1)], "prefill": [(B, n) for B, n in ((n_ubatch, full), (rest, 1)) if B and n]}
    for il in sorted(layers):
        before = plan.attention_device(il - 1).name if il else "cpu"
        if plan.attention_device(il).name == before:
            continue
        for ph in phases:
            for B, n in runs[ph]:
                s, lat = link.seconds(B * D * 4.0 * n, n), n * link.latency_us * 1e-6
                out.append(Part(ph, "link", il, "transfer", B * D * 4.0 * n, 0, n, s,
                                "latency" if lat > s - lat else "bandwidth"))
    return out


def _add(sums: dict, p) -> None:
    acc = sums[(p.device, p.layer, p.stage)]
    acc[0] += p.bytes
    acc[1] += p.flops
    acc[2] += p.ops
    acc[3] += p.seconds
    acc[4] = p.bound


def _expert_bytes(plan, il: int) -> float:
    from moert.placement.memory import EXPERT_TENSORS

    return sum(e.nbytes / e.shape[0] for e in plan if e.layer == il and EXPERT_TENSORS.search(e.name))


def _copy_seconds(plan, il: int, link) -> tuple[float, int]:
    """Seconds and copies to admit one expert of layer il: one copy per tensor (gate, up, down, biases)."""
    from moert.placement.memory import EXPERT_TENSORS

    sizes = [e.nbytes / e.shape[0] for e in plan if e.layer == il and EXPERT_TENSORS.search(e.name)]
    return (sum(link.seconds(b, 1) for b in sizes) if link is not None else 0.0), len(sizes)


def _check_plan(plan, dev: str, mask: np.ndarray) -> set:
    """The cached layers (every routed expert on the CPU); CacheError unless their other tensors are on dev and
    every other MoE layer's experts are all off the CPU."""
    from moert.placement.memory import EXPERT_TENSORS

    if dev not in plan.device_names():
        raise CacheError(f"the cache's device {dev} is not in the plan ({', '.join(plan.device_names()) or 'CPU only'}"
                         f"); plan with gpu_backend='sim' and that GPU")
    moe = {e.layer for e in plan if EXPERT_TENSORS.search(e.name)}
    layers = {il for il in moe if mask[il].all()}
    if not layers:
        raise CacheError("the plan puts no MoE layer's experts on the CPU, so the cache has nothing to hold: plan "
                         "with cpu_moe=True (--cpu-moe) or n_cpu_moe=N")
    for il in sorted(moe - layers):
        if mask[il].any():
            raise CacheError(f"layer {il}'s experts are split between the CPU and a GPU: predict with a cache takes "
                             f"whole layers of experts on the CPU (cpu_moe=True or n_cpu_moe=N)")
    for e in plan:
        if e.layer in layers and not EXPERT_TENSORS.search(e.name) and e.device != dev:
            raise CacheError(f"{e.name} is on {e.device}, not on the cache's {dev}: predict with a cache takes the "
                             f"cached layers' other tensors on that GPU (-ngl all)")
    return layers


__all__ = ["cache_cost_model", "overlap", "predict_with_cache"]
