"""More of what a learner asks of a model (`moert explain --view ...`, `moert experts`):

    attention_view(m, prompt, token=-1)   which earlier tokens the token attended to, per layer and KV head group
    logit_lens(m, prompt, token=-1)       what the residual after each layer alone would predict (the final norm
                                          and output projection applied to it: nostalgebraist's logit lens)
    routing_view(m, prompt)               the experts each prompt token chose: a row per token, a column per layer
    expert_classes(m, text, layer)        the demo's "what the experts learned" table, for any model and text

Each returns a dict (what --json prints) and has a format_* for the terminal. The attention probabilities are
read, not guessed: while the token runs alone (a decode step), the shared GQA attention (models/blocks.py) is
called through a wrapper that computes softmax(q K^T * scale) over the cache it has just written, exactly the
reference attention's (its fused CPU decode kernel is bypassed for that one step, the same numbers to 1e-6).
DeepSeek's latent attention (MLA, layers.latent_attention) is read the same way: every head attends with one
shared key, [latent, rotated key], so its one "KV head" groups all H query heads. Dimension legend: H query
heads, Hk KV heads, G = H / Hk, S keys, R latent rank, P rotated dims.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from moert.errors import MoertError
from moert.explain.walk import Recorder, host_array, prompt_ids
from moert.layers import rms_norm, softmax


def _text(m, t: int) -> str:
    return m.tokenizer.detokenize([int(t)], special=True) if m.tokenizer.has_vocab else str(int(t))


@contextmanager
def _recording_attention(m, out: dict):
    """blocks.attention wrapped for one step: the last query's probabilities over the keys, per layer -> out."""
    from moert.kvcache import load
    from moert.models import blocks, deepseek2

    attention, cpu_arrays, latent = blocks.attention, blocks.cpu_arrays, deepseek2.latent_attention
    layer = {"il": None}
    opens = type(m).attention_device.__get__(m)

    def attention_device(il: int):                                        # each block opens its layer here
        layer["il"] = il
        return opens(il)

    def rec(q, k, v, k_cache, v_cache, pos0, xp=np, *, scale=None, window=None, sinks=None, **kw):
        y = attention(q, k, v, k_cache, v_cache, pos0, xp, scale=scale, window=window, sinks=sinks, **kw)
        T, H, Dh = q.shape
        S = pos0 + T
        K = host_array(m, load(k_cache, 0, S))                                  # (S, Hk, Dh), now holding this step
        qh = host_array(m, q)[-1]                                               # (H, Dh) the last query
        G = H // K.shape[1]
        s = np.einsum("hd,shd->hs", qh, np.repeat(K, G, axis=1))           # (H, S)
        s *= 1.0 / np.sqrt(Dh) if scale is None else scale
        if window is not None:
            s[:, : max(0, S - window)] = -np.inf                          # keys `window` or more positions back
        if sinks is not None:                                              # a sink logit joins each denominator
            s = np.concatenate([host_array(m, sinks).reshape(H, 1), s], axis=1)
        p = softmax(s)[:, 1:] if sinks is not None else softmax(s)        # (H, S)
        out[layer["il"]] = p.reshape(K.shape[1], G, S).mean(axis=1)       # (Hk, S): each KV head's query group
        return y

    def rec_latent(q_lat, q_pe, c_kv, k_pe, cache, pos0, scale, xp=np, **kw):
        y = latent(q_lat, q_pe, c_kv, k_pe, cache, pos0, scale, xp, **kw)   # (H, T, R)
        S = pos0 + c_kv.shape[0]
        kv = host_array(m, load(cache, 0, S))[:, 0]                          # (S, R + P), now holding this step
        q = np.concatenate([host_array(m, q_lat)[:, -1], host_array(m, q_pe)[:, -1]], axis=-1)   # (H, R + P)
        p = softmax((q @ kv.T) * scale)                                    # (H, S): the last query sees every key
        out[layer["il"]] = p.mean(axis=0, keepdims=True)                   # (1, S): the one shared key's group
        return y

    blocks.attention, blocks.cpu_arrays = rec, (lambda *a: False)        # the reference path, for this step
    deepseek2.latent_attention = rec_latent
    m.attention_device = attention_device
    fused, m.fused_decode = m.fused_decode, False                        # the block, not one call (moert/fused.py)
    try:
        yield
    finally:
        blocks.attention, blocks.cpu_arrays, deepseek2.latent_attention = attention, cpu_arrays, latent
        del m.attention_device                                            # the class's method again
        m.fused_decode = fused


def attention_view(m, prompt, token: int = -1, top: int = 5) -> dict:
    """Per layer and KV head group: the `top` earlier positions the token attended to, with their weights."""
    ids, i = prompt_ids(m, prompt, token)
    m.reset()
    if i:
        m.forward(ids[:i], last_only=True)
    probs: dict[int, np.ndarray] = {}
    with _recording_attention(m, probs):
        m.forward(ids[i:i + 1], last_only=True)
    layers = []
    for il in range(m.config.n_layer):
        if il not in probs:
            layers.append({"layer": il, "groups": None})                  # a layer that did not run (MTP)
            continue
        groups = []
        for g, row in enumerate(probs[il]):
            best = np.argsort(-row, kind="stable")[:top]
            groups.append({"kv_head": g, "top": [[int(s), _text(m, ids[s]), float(row[s])] for s in best]})
        layers.append({"layer": il, "groups": groups})
    return {"view": "attention", "position": i, "token": _text(m, ids[i]), "layers": layers}


def logit_lens(m, prompt, token: int = -1, top: int = 5) -> dict:
    """Per layer: the top predictions of the residual after that layer, through the final norm and output."""
    from moert.quants.dequant import dequantize_rows

    ids, i = prompt_ids(m, prompt, token)
    m.reset()
    if i:
        m.forward(ids[:i], last_only=True)
    with Recorder(m) as rec:
        m.forward(ids[i:i + 1], last_only=True)
    xs = [host_array(m, r["x"])[0] for r in rec.layers[1:]] + [host_array(m, rec.final)[0]]   # after layer 0 .. L-1
    norm = m.gguf.dequantize("output_norm.weight").astype(np.float64)             # (D,)
    out = "output.weight" if "output.weight" in m.gguf.tensors else "token_embd.weight"   # tied
    h = rms_norm(np.stack(xs), norm, m.config.rms_eps)                            # (L, D)
    t = m.gguf.tensors[out]
    logits = np.zeros((len(xs), t.shape[0]))
    rows = max(1, (1 << 24) // t.shape[1])
    for r in range(0, t.shape[0], rows):                                          # the output weight in row chunks
        w = dequantize_rows(m.gguf.raw(out), t.type, t.shape, r, min(r + rows, t.shape[0]))     # (rows, D)
        logits[:, r:r + len(w)] = h @ w.astype(np.float64).T
    layers = []
    for il, row in enumerate(logits):
        p = softmax(row)
        best = np.argsort(-p, kind="stable")[:top]
        layers.append({"layer": il, "top": [[int(b), _text(m, b), float(p[b])] for b in best]})
    return {"view": "lens", "position": i, "token": _text(m, ids[i]), "layers": layers}


def routing_view(m, prompt) -> dict:
    """For every prompt token, per layer, the experts the router chose (in the router's order)."""
    ids, _ = prompt_ids(m, prompt, -1)
    if not getattr(m.config, "n_expert", 0):
        raise MoertError("this model has no routed experts (a dense model): there is no routing to show")
    m.reset()
    m.trace_start()
    try:
        m.forward(ids, last_only=True)
    finally:
        t = m.trace_stop()
    return {"view": "routing", "layers": int(t.ids.shape[1]),
            "tokens": [{"position": int(p), "token": _text(m, ids[p]), "experts": t.ids[n].tolist()}
                       for n, p in enumerate(t.positions)]}


def expert_classes(m, text: str, layer: int | None = None, top: int = 3) -> dict:
    """For each kind of token in `text` (moert.demo.classify): how many, and the experts of `layer` (default:
    the last) that took most of its picks, with their share."""
    from moert.demo import CLASSES, classify

    if not getattr(m.config, "n_expert", 0):
        raise MoertError("this model has no routed experts (a dense model): no expert table to make")
    layer = m.config.n_layer - 1 if layer is None else layer
    if not 0 <= layer < m.config.n_layer:
        raise MoertError(f"--layer {layer}: the model has layers 0 to {m.config.n_layer - 1}")
    ids = m.tokenize(text, add_bos=False)[: m.context_size]
    if not ids:
        raise MoertError("the text has no tokens; give some text with -p TEXT or -f FILE")
    m.reset()
    with Recorder(m) as rec:
        m.forward(ids, last_only=True)
    r = next((x for x in rec.layers if x["layer"] == layer), None)
    if r is None or "ids" not in r:
        raise MoertError(f"--layer {layer} has no routed experts (a dense layer); pick another")
    picks = rec.host(r["ids"]).astype(np.int64)                                 # (T, K)
    cls = np.array(classify([m.detokenize([t]) for t in ids]))
    E, rows = m.config.n_expert, []
    for c in CLASSES:
        sel = picks[cls == c]
        if len(sel):
            n = np.bincount(sel.reshape(-1), minlength=E)
            best = np.argsort(-n, kind="stable")[:top]
            rows.append({"class": c, "tokens": int(len(sel)),
                         "top": [[int(e), float(n[e] / n.sum())] for e in best]})
    return {"view": "experts", "layer": layer, "tokens": len(ids), "experts": E, "k": int(picks.shape[1]),
            "classes": rows}


def format_view(d: dict) -> str:
    """One of the dicts above as text for the terminal."""
    q = repr
    if d["view"] == "attention":
        lines = [f"attention of token {d['position']} {q(d['token'])}: the earlier tokens it attended to most, per "
                 f"layer and KV head (the mean over that head's query heads; position token weight)"]
        for lt in d["layers"]:
            for g in lt["groups"] or [None]:
                what = ("  ".join(f"{s}:{q(t)} {w:.2f}" for s, t, w in g["top"]) if g else
                        "(not run: a next-token-prediction layer)")
                lines.append(f"  layer {lt['layer']:>2} kv{g['kv_head'] if g else '-'}  {what}")
        return "\n".join(lines)
    if d["view"] == "lens":
        lines = [f"logit lens at token {d['position']} {q(d['token'])}: what the residual after each layer would "
                 f"predict through the final norm and output (token probability)"]
        lines += [f"  after layer {lt['layer']:>2}  " + "  ".join(f"{q(t)} {p:.2f}" for _, t, p in lt["top"])
                  for lt in d["layers"]]
        return "\n".join(lines)
    if d["view"] == "routing":
        width = max(len(",".join(map(str, e))) for t in d["tokens"] for e in t["experts"])
        lines = ["experts chosen per token (rows) and layer (columns), in the router's order:",
                 "  pos token          " + " ".join(f"L{il:<{width - 1}}" for il in range(d["layers"]))]
        for t in d["tokens"]:
            cells = [",".join(map(str, e)) if min(e) >= 0 else "-" for e in t["experts"]]
            lines.append(f"  {t['position']:>3} {q(t['token'])[:14]:<14} " + " ".join(f"{c:<{width}}" for c in cells))
        return "\n".join(lines)
    lines = [f"which experts of layer {d['layer']} each kind of token goes to ({d['tokens']} tokens, top {d['k']} "
             f"of {d['experts']} per token; share of the class's picks):",
             f"  {'class':<12} {'tokens':>6}   top experts"]
    lines += [f"  {r['class']:<12} {r['tokens']:>6}   " + "  ".join(f"e{e:<2d} {s:4.0%}" for e, s in r["top"])
              for r in d["classes"]]
    return "\n".join(lines)


__all__ = ["attention_view", "expert_classes", "format_view", "logit_lens", "routing_view"]
