"""Train moert's demo model: a small qwen3moe on Python's standard library, exported as Q4_K_M GGUF.

    nice -n 10 python tests/reference/train_demo_moe.py            # ~15-40 min on one CPU thread (700 steps)

Deterministic from --seed on one thread: the corpus is the stdlib's .py files (PSF licence; every 20th
file in sorted order is held out), the tokenizer is a byte-level BPE trained by `moert.testing.
gpt2_vocab_metadata` (llama.cpp's `qwen2` pre-tokenizer), the model computes exactly Qwen3-MoE's math
(moert/models/qwen3moe.py, HF Qwen3MoeForCausalLM) plus the router's load-balancing loss, and the file is
written by moert's own quantizer in llama.cpp's Q4_K_M layout (llama-quant.cpp). torch is needed here only.

Writes moert/data/demo-qwen3moe.gguf, tests/fixtures/demo_moe/{train_log.csv, loss.png, train.json}
and, outside the tree, the float checkpoint (--work) that tests/reference/make_demo_moe_refs.py reads.
"""

from __future__ import annotations

import argparse
import json
import math
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "demo_moe"
GGUF_PATH = ROOT / "moert" / "data" / "demo-qwen3moe.gguf"
SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "pydoc_data", "encodings", "__pycache__"}
HOLDOUT_EVERY = 20   # file i (sorted) is held out when i % 20 == 7
ARCH = dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_expert=16, n_expert_used=2,
            n_ff_exp=128, n_vocab=2048, rope_base=1e6, rms_eps=1e-6, context_length=256)
EVAL_TOKENS = 16384  # held-out tokens scored, in windows of context_length


def corpus_files() -> tuple[list[Path], list[Path]]:
    """(train, held-out) .py files of this Python's standard library, sorted by relative path."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(lib).parts[:-1]))
    held = [p for i, p in enumerate(files) if i % HOLDOUT_EVERY == 7]
    return [p for i, p in enumerate(files) if i % HOLDOUT_EVERY != 7], held


def read(p: Path) -> str:
    """A source file as text (a few stdlib files are not UTF-8: undecodable bytes are replaced)."""
    return p.read_bytes().decode("utf-8", errors="replace")


def eval_windows(tok, held: list[Path], n: int, T: int) -> np.ndarray:
    """The first n held-out tokens (files concatenated in order) as (n // T, T) windows."""
    ids: list[int] = []
    for p in held:
        ids += tok.tokenize(read(p), add_bos=False)
        if len(ids) >= n:
            break
    return np.asarray(ids[: n - n % T], np.int64).reshape(-1, T)


# -- the model: Qwen3-MoE ----------------------------------------------------------------------------
# T tokens, D hidden, H query heads, Hk KV heads, Dh head dim, E experts, K used, F expert hidden


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_neox(x, base):
    """NEOX RoPE on (B, H, T, Dh): the two halves of each head are the pairs (llama.cpp rope type 2)."""
    T, Dh = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, Dh, 2, dtype=torch.float32) / Dh)             # (Dh/2,)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None]                 # (T, Dh/2)
    cos, sin = ang.cos(), ang.sin()
    a, b = x[..., : Dh // 2], x[..., Dh // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class Layer(torch.nn.Module):
    def __init__(s, a):
        super().__init__()
        D, H, Hk, Dh, E, Fe = a["n_embd"], a["n_head"], a["n_head_kv"], a["head_dim"], a["n_expert"], a["n_ff_exp"]
        s.a = a
        p = lambda *shape, std=0.02: torch.nn.Parameter(torch.randn(*shape) * std)
        one = lambda n: torch.nn.Parameter(torch.ones(n))
        s.attn_norm, s.ffn_norm, s.q_norm, s.k_norm = one(D), one(D), one(Dh), one(Dh)
        s.wq, s.wk, s.wv = p(H * Dh, D), p(Hk * Dh, D), p(Hk * Dh, D)
        s.wo = p(D, H * Dh, std=0.02 / math.sqrt(2 * a["n_layer"]))
        s.router = p(E, D)
        s.gate, s.up = p(E, Fe, D), p(E, Fe, D)
        s.down = p(E, D, Fe, std=0.02 / math.sqrt(2 * a["n_layer"]))

    def forward(s, x):
        a = s.a
        B, T, D = x.shape
        H, Hk, Dh, eps = a["n_head"], a["n_head_kv"], a["head_dim"], a["rms_eps"]
        h = rms_norm(x, s.attn_norm, eps)
        q = rms_norm((h @ s.wq.T).view(B, T, H, Dh), s.q_norm, eps).transpose(1, 2)      # (B, H, T, Dh)
        k = rms_norm((h @ s.wk.T).view(B, T, Hk, Dh), s.k_norm, eps).transpose(1, 2)     # (B, Hk, T, Dh)
        v = (h @ s.wv.T).view(B, T, Hk, Dh).transpose(1, 2)
        q, k = rope_neox(q, a["rope_base"]), rope_neox(k, a["rope_base"])
        k, v = k.repeat_interleave(H // Hk, 1), v.repeat_interleave(H // Hk, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)                     # (B, H, T, Dh)
        x = x + o.transpose(1, 2).reshape(B, T, H * Dh) @ s.wo.T
        y, aux = s.moe(rms_norm(x, s.ffn_norm, eps).view(B * T, D))
        return x + y.view(B, T, D), aux

    def moe(s, h):
        """softmax router -> top-k -> renormalize -> SwiGLU experts; and the Switch load-balancing loss."""
        E, K = s.a["n_expert"], s.a["n_expert_used"]
        probs = torch.softmax(h @ s.router.T, -1)                                      # (T, E)
        w, ids = probs.topk(K, -1)                                                      # (T, K)
        w = w / w.sum(-1, keepdim=True)
        y = torch.zeros_like(h)
        for e in range(E):
            t, j = (ids == e).nonzero(as_tuple=True)
            if len(t):
                xe = h[t]                                                               # (n, D)
                ye = (F.silu(xe @ s.gate[e].T) * (xe @ s.up[e].T)) @ s.down[e].T
                y.index_add_(0, t, ye * w[t, j, None])
        frac = torch.bincount(ids.flatten(), minlength=E).float() / ids.numel()         # (E,) share of picks
        return y, E * (frac * probs.mean(0)).sum()


class MoE(torch.nn.Module):
    def __init__(s, a):
        super().__init__()
        s.a = a
        s.embd = torch.nn.Parameter(torch.randn(a["n_vocab"], a["n_embd"]) * 0.02)
        s.layers = torch.nn.ModuleList(Layer(a) for _ in range(a["n_layer"]))
        s.out_norm = torch.nn.Parameter(torch.ones(a["n_embd"]))
        s.out = torch.nn.Parameter(torch.randn(a["n_vocab"], a["n_embd"]) * 0.02)

    def forward(s, ids):
        x, aux = s.embd[ids], 0.0
        for layer in s.layers:
            x, a = layer(x)
            aux = aux + a
        return rms_norm(x, s.out_norm, s.a["rms_eps"]) @ s.out.T, aux / len(s.layers)


@torch.no_grad()
def perplexity(model, windows: np.ndarray, batch: int = 8) -> float:
    """exp(mean NLL) of tokens 1.. of each window given the ones before it."""
    nll, n = 0.0, 0
    for i in range(0, len(windows), batch):
        x = torch.from_numpy(windows[i:i + batch])
        logits, _ = model(x)
        nll += F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum").item()
        n += x[:, 1:].numel()
    return math.exp(nll / n)


# -- export: llama.cpp's names, keys and Q4_K_M types ---------------------------------------------------


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp: the layers Q4_K_M gives Q6_K for attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def export(model, a: dict, vocab: dict, path: Path, qtype: str = "Q4_K_M") -> None:
    """The model as GGUF: qtype "Q4_K_M" (llama.cpp's mix) or "F32" (for the float oracle)."""
    from moert.testing import tensor_type, write_gguf

    n = a["n_layer"]
    more = "|".join(str(i) for i in range(n) if use_more_bits(i, n))
    types = {r"^output\.weight$": "Q6_K", rf"^blk\.({more})\.(attn_v|ffn_down_exps)\.weight$": "Q6_K"}
    base, types = ("Q4_K", types) if qtype == "Q4_K_M" else (qtype, {})
    A = "qwen3moe"
    md = {"general.name": "moert demo qwen3moe (Python stdlib)",
          "general.file_type": 15 if qtype == "Q4_K_M" else 0,  # LLAMA_FTYPE_MOSTLY_Q4_K_M / ALL_F32
          "general.quantization_version": 2,
          "general.description": "trained by moert/tests/reference/train_demo_moe.py on Python's standard library",
          f"{A}.block_count": n, f"{A}.context_length": a["context_length"], f"{A}.embedding_length": a["n_embd"],
          f"{A}.feed_forward_length": a["n_ff_exp"] * a["n_expert_used"],
          f"{A}.expert_feed_forward_length": a["n_ff_exp"], f"{A}.expert_count": a["n_expert"],
          f"{A}.expert_used_count": a["n_expert_used"], f"{A}.attention.head_count": a["n_head"],
          f"{A}.attention.head_count_kv": a["n_head_kv"], f"{A}.attention.key_length": a["head_dim"],
          f"{A}.attention.value_length": a["head_dim"],
          f"{A}.attention.layer_norm_rms_epsilon": float(a["rms_eps"]), f"{A}.rope.freq_base": float(a["rope_base"]),
          f"{A}.vocab_size": a["n_vocab"], **vocab}
    f = lambda t: t.detach().float().numpy()
    ts = [("token_embd.weight", f(model.embd))]
    for i, L in enumerate(model.layers):
        b = f"blk.{i}."
        ts += [(b + "attn_norm.weight", f(L.attn_norm)), (b + "attn_q.weight", f(L.wq)), (b + "attn_k.weight", f(L.wk)),
               (b + "attn_v.weight", f(L.wv)), (b + "attn_output.weight", f(L.wo)),
               (b + "attn_q_norm.weight", f(L.q_norm)), (b + "attn_k_norm.weight", f(L.k_norm)),
               (b + "ffn_norm.weight", f(L.ffn_norm)), (b + "ffn_gate_inp.weight", f(L.router)),
               (b + "ffn_gate_exps.weight", f(L.gate)), (b + "ffn_up_exps.weight", f(L.up)),
               (b + "ffn_down_exps.weight", f(L.down))]
    ts += [("output_norm.weight", f(model.out_norm)), ("output.weight", f(model.out))]
    write_gguf(path, A, md, ((name, x, tensor_type(name, x.shape, base, types)) for name, x in ts))


def plot(log: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    s = [r["step"] for r in log]
    ax.plot(s, [r["loss"] for r in log], lw=0.8, label="train loss (tokens, nats)")
    ev = [r for r in log if r["eval_loss"] is not None]
    ax.plot([r["step"] for r in ev], [r["eval_loss"] for r in ev], "o-", label="held-out loss")
    ax.plot(s, [r["aux"] for r in log], lw=0.8, label="load-balancing loss (1 = balanced)")
    ax.set_xlabel("step")
    ax.set_ylim(0, 8.5)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("moert demo qwen3moe on the Python standard library")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=4e-3)
    ap.add_argument("--aux", type=float, default=0.01, help="load-balancing loss coefficient")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/moert-demo-train", help="checkpoint and token cache (not committed)")
    ap.add_argument("--bench", action="store_true", help="time 5 steps and stop")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    a, T = ARCH, ARCH["context_length"]

    from moert.testing import gpt2_vocab_metadata
    from moert.text.tokenizer import Tokenizer

    train, held = corpus_files()
    t0 = time.time()
    vocab = gpt2_vocab_metadata(n_vocab=a["n_vocab"], pre="qwen2", corpus="".join(read(p) for p in train))
    tok = Tokenizer(vocab)
    data = np.concatenate([np.asarray(tok.tokenize(read(p), add_bos=False), np.int64) for p in train])
    windows = eval_windows(tok, held, EVAL_TOKENS, T)
    print(f"{len(train)} train files, {len(data)} tokens; {len(held)} held out, {windows.size} scored; "
          f"tokenizer {time.time() - t0:.0f} s", flush=True)

    model = MoE(a)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(args.seed)
    warm = 50
    log, t0 = [], time.time()
    for step in range(1, (5 if args.bench else args.steps) + 1):
        lr = args.lr * min(step / warm, 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warm) / (args.steps - warm)))))
        lr = max(lr, args.lr * 0.05) if step > warm else lr
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, len(data) - T - 1, (args.batch,), generator=gen).numpy()
        x = torch.from_numpy(np.stack([data[s:s + T + 1] for s in starts]))              # (B, T+1)
        logits, aux = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, a["n_vocab"]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + args.aux * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ev = None
        if step % 100 == 0 or step == args.steps:
            ev = math.log(perplexity(model, windows[:16]))
        log.append(dict(step=step, loss=round(loss.item(), 4), aux=round(aux.item(), 4), lr=lr,
                        eval_loss=None if ev is None else round(ev, 4), seconds=round(time.time() - t0, 1)))
        if step % 25 == 0 or args.bench or ev is not None:
            print(json.dumps(log[-1]), flush=True)
    if args.bench:
        return

    ppl = perplexity(model, windows)
    torch.save({"arch": a, "state": model.state_dict(), "vocab": vocab}, work / "demo_moe.pt")
    FIXTURES.mkdir(parents=True, exist_ok=True)
    with open(FIXTURES / "train_log.csv", "w") as fh:
        fh.write("step,loss,aux,lr,eval_loss,seconds\n")
        for r in log:
            fh.write(f"{r['step']},{r['loss']},{r['aux']},{r['lr']:.6g},{r['eval_loss'] or ''},{r['seconds']}\n")
    plot(log, FIXTURES / "loss.png")
    export(model, a, vocab, GGUF_PATH)
    info = {"arch": a, "steps": args.steps, "batch": args.batch, "lr": args.lr, "aux_coef": args.aux,
            "seed": args.seed, "train_files": len(train), "train_tokens": int(len(data)),
            "held_out_files": [str(p.relative_to(sysconfig.get_paths()["stdlib"])) for p in held],
            "eval_tokens": int(windows.size), "eval_window": T, "float_perplexity": round(ppl, 4),
            "train_seconds": round(time.time() - t0, 1), "torch": torch.__version__}
    (FIXTURES / "train.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"float perplexity on {windows.size} held-out tokens: {ppl:.3f}; wrote {GGUF_PATH}", flush=True)


if __name__ == "__main__":
    main()
