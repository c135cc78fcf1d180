"""e2e.py -d: the speed at depth, as llama-bench -d measures it: the context filled with `depth` tokens, then a
`--prompt`-token prompt (pp) and `--decode` single-token steps (tg) continuing at that depth.

    python bench/e2e.py -d 0,4096,16384,32768 [--prompt 512] [--decode 32] [--rounds 3] [--plot depth.png]

After an untimed warm-up (a prompt and 3 steps per engine), per depth, ascending, each engine's context is filled
once (a forward of the tokens up to `depth`, continuing the previous depth's fill); then each round rewinds it to
`depth` before pp and again before tg, so every round measures the same positions (llama-bench re-runs its depth
prompt per repetition instead; the work timed is the same). Engines take turns each round, the order alternating,
with a pause between them (e2e.py's rounds).
Reported: tokens/s per engine and depth (median of rounds; best in parentheses), moert / llama.cpp where
llama-cpp-python is installed, one table and, with --plot, tok/s against depth with error bars (the rounds'
min..max). --variants adds moert engines with a kernel choice switched off, each round in turn with the others:
`one-thread-attention` (decode attention at depth on one thread, as the stall guard left it before its depth
fix), `no-tiles` (float prompts' matmuls on the batch kernels instead of kernels/matmul_tiles.py) and
`no-prompt-attention` (prompts' attention on kernels/flash.py or the NumPy twin instead of kernels/flash_prompt.py).
Without llama.cpp the ratios are moert's over each variant's.
"""

from __future__ import annotations

import statistics
import time

import common
import numpy as np

# moert variants: (module, attribute, value while that engine runs)
VARIANTS = {"one-thread-attention": ("moert.kernels.flash_decode", "PARALLEL_MIN_WORK", 1 << 62),
            "no-tiles": ("moert.kernels.matmul_tiles", "MIN_TOKENS", 1 << 62),
            "no-prompt-attention": ("moert.kernels.flash_prompt", "available", lambda: False)}


def _is_moert(e) -> bool:
    return hasattr(e, "m")


def _rewind(e, depth: int) -> None:
    """The context back to its first `depth` tokens."""
    if _is_moert(e):
        e.m.position = depth
    else:
        e.llm.n_tokens = depth          # llama-cpp-python's eval() drops the KV cache past n_tokens first


def _extend(e, tokens) -> np.ndarray:
    """Continue the context with `tokens` (a prompt chunk): the last position's logits."""
    if _is_moert(e):
        return e.m.forward(np.asarray(tokens), last_only=True)
    e.llm.eval(list(map(int, tokens)))
    return e._logits()


class _Switch:
    """A moert variant's kernel choice set while its engine runs (module attribute, put back after)."""

    def __init__(self, name: str | None):
        self.spec = VARIANTS.get(name) if name else None

    def __enter__(self):
        if self.spec:
            import importlib

            mod, attr, value = self.spec
            self.mod = importlib.import_module(mod)
            self.before = getattr(self.mod, attr)
            setattr(self.mod, attr, value)

    def __exit__(self, *exc):
        if self.spec:
            setattr(self.mod, self.spec[1], self.before)


def _filler(n: int, n_ids: int) -> list[int]:
    """n token ids for the context (not the benchmark prompt's)."""
    return (np.arange(n) * 4567 % n_ids + 10).tolist()


def sweep(args, path, engines: list, n_moert: int, make_moert, llama_note: str, n_ids: int, mach: dict) -> dict:
    """e2e.py -d: one more moert engine per --variants name (make_moert() builds one, placed after e2e.py's
    n_moert moert engines), then `run`."""
    variants: dict[str, str | None] = {e.name: None for e in engines}
    for v in args.variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
        e = make_moert()
        e.name = f"{engines[0].name} {v}"
        engines.insert(n_moert, e)
        variants[e.name] = v
    if llama_note:
        print(f"# {llama_note}")
    return run(args, path, engines, variants, n_ids, mach)


def run(args, path, engines: list, variants: dict[str, str | None], n_ids: int, mach: dict) -> dict:
    """The depth sweep over `engines` (e2e.py's Moert / LlamaCpp objects); variants: engine name -> its VARIANTS
    key (None: as built). Prints the table; returns the results."""
    depths = sorted(set(args.depth))
    prompt = (np.arange(args.prompt) * 7919 % n_ids + 10).tolist()
    fill = _filler(max(depths), n_ids)
    filled = {e.name: 0 for e in engines}
    res: dict = {e.name: {} for e in engines}
    for e in engines:                                                   # untimed: each kernel's first call
        with _Switch(variants.get(e.name)):
            _rewind(e, 0)
            tok = int(np.argmax(_extend(e, prompt)))
            for _ in range(3):
                e.step(tok)
    for d in depths:
        for e in engines:                                               # each context up to d, once
            with _Switch(variants.get(e.name)):
                t0 = time.perf_counter()
                _rewind(e, filled[e.name])
                for a in range(filled[e.name], d, 512):
                    _extend(e, fill[a:min(d, a + 512)])
                filled[e.name] = d
            print(f"depth {d}: {e.name} filled in {time.perf_counter() - t0:.1f} s", flush=True)
        for e in engines:
            res[e.name][d] = dict(pp=[], tg=[])
        for r in range(args.rounds):
            for e in engines if r % 2 == 0 else engines[::-1]:
                time.sleep(0.3)                                         # the other engine's threads go idle
                with _Switch(variants.get(e.name)):
                    _rewind(e, d)
                    t0 = time.perf_counter()
                    logits = _extend(e, prompt)
                    pp = time.perf_counter() - t0
                    _rewind(e, d)
                    tok, steps = int(np.argmax(logits)), []
                    for _ in range(args.decode):
                        t0 = time.perf_counter()
                        out = e.step(tok)
                        steps.append(time.perf_counter() - t0)
                        tok = int(np.argmax(out))
                res[e.name][d]["pp"].append(args.prompt / pp)
                res[e.name][d]["tg"].append(1 / statistics.median(steps))
                print(f"depth {d} round {r + 1} {e.name:22s}: pp{args.prompt} {args.prompt / pp:7.1f} tok/s, "
                      f"tg{args.decode} {1 / statistics.median(steps):6.2f} tok/s", flush=True)
        for e in engines:
            _rewind(e, d)
    return _report(args, path, engines, res, depths, mach)


def _cell(v: list[float]) -> str:
    return f"{statistics.median(v):.1f} ({max(v):.1f})"


def _report(args, path, engines, res: dict, depths: list[int], mach: dict) -> dict:
    names = [e.name for e in engines]
    if "llama.cpp" in res:                                              # (engine, over): each over llama.cpp
        pairs = [(n, "llama.cpp") for n in names if n != "llama.cpp"]
    else:                                                               # moert over each variant
        pairs = [(names[0], n) for n in names[1:]]
    rows = []
    for d in depths:
        for n in names:
            row = [d, n, _cell(res[n][d]["pp"]), _cell(res[n][d]["tg"])]
            for a, b in pairs:
                row += [f"{statistics.median(res[a][d][k]) / statistics.median(res[b][d][k]):.2f}x"
                        if n == a else "" for k in ("pp", "tg")]
            rows.append(row)
    heads = ["depth", "engine", f"pp{args.prompt} tok/s", f"tg{args.decode} tok/s"]
    for a, b in pairs:
        heads += [f"pp {a} / {b}", f"tg {a} / {b}"]
    print()
    print(f"# {path.name}: speed at depth (the context filled with `depth` tokens, then pp{args.prompt} and "
          f"tg{args.decode} continuing there); median of {args.rounds} rounds (best in parentheses)")
    print(f"# {common.machine_line(mach)}")
    if "llama.cpp" not in res:
        print("# llama-cpp-python is not installed: no llama.cpp column (pip install llama-cpp-python, then re-run)")
    print(common.table(heads, rows))
    print(f"# command: {common.command()}")
    out = dict(depths=depths, results=res, ratios=pairs)
    if args.plot:
        plot(res, depths, args, path, args.plot)
        print(f"# plot: {args.plot}")
    return out


def plot(res: dict, depths: list[int], args, path, out_png) -> None:
    """Two panels, pp and tg tok/s against depth, one line per engine: median, error bars over the rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "pp", f"pp{args.prompt}"), (axes[1], "tg", f"tg{args.decode}")):
        for name, by_depth in res.items():
            med = np.array([statistics.median(by_depth[d][key]) for d in depths])
            lo = med - np.array([min(by_depth[d][key]) for d in depths])
            hi = np.array([max(by_depth[d][key]) for d in depths]) - med
            ax.errorbar(depths, med, yerr=[lo, hi], marker="o", capsize=3, label=name)
        ax.set_xlabel("depth (tokens in the context)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{label} at depth")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{path.name}, {args.threads} threads, median of {args.rounds} rounds (bars: min..max)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
