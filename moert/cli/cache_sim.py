"""`moert cache-sim TRACE`: replay expert caches over a routing trace, for many sizes and policies at once."""

from __future__ import annotations

import argparse
import json
import sys

from moert.cli.common import UsageError


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give whole numbers separated by commas, e.g. {flag} 8,16,32") from None
    if not out or min(out) < 0:
        raise UsageError(f"{flag} {text!r}: give one or more numbers >= 0, e.g. {flag} 8,16,32")
    return out


def cmd_cache_sim(args: argparse.Namespace) -> int:
    from moert.dynamic import POLICIES, expert_bytes, sweep
    from moert.dynamic.formats import read

    slots = _ints(args.slots, "--slots")
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise UsageError(f"--policy {args.policy!r}: use some of {','.join(POLICIES)}")
    t = read(args.trace, args.format, args.n_expert)
    sizes = expert_bytes(args.model, t.n_layer) if args.model else None
    kw = dict(per_layer=not args.pool, expert_bytes=sizes, half_life=args.half_life)
    if args.prefetch:                          # the guesses the trace recorded; Belady takes none
        if getattr(t, "prefetch", None) is None:
            raise UsageError(f"--prefetch replays the next-router guesses a trace recorded, and {args.trace} has none: "
                             f"record one with `moert run ... --trace FILE --cache-slots N --prefetch next-router`")
        online = [p for p in policies if p != "belady"]
        runs = sweep(t, slots, online, prefetch="next-router", **kw) + sweep(t, slots, [p for p in policies
                                                                                     if p == "belady"], **kw)
        order = {p: i for i, p in enumerate(policies)}
        runs.sort(key=lambda r: order[r.cache.policy])
    else:
        runs = sweep(t, slots, policies, **kw)
    rows = [r.to_dict() for r in runs]
    if args.json:
        print(json.dumps({"trace": str(args.trace), "tokens": len(t), "layers": t.n_layer, "experts": t.n_expert,
                          "experts_per_token": int(t.ids.shape[2]), "per_layer": not args.pool,
                          "prefetch": "next-router" if args.prefetch else None,
                          "requests": int(runs[0].hits.sum() + runs[0].misses.sum()) if runs else 0,
                          "results": rows}, indent=1))
    else:
        print(format_table(t, rows, policies, slots, args.pool, args.prefetch))
    if args.plot:
        from moert.plots import hit_rate_plot

        title = (f"{t.header.get('model', args.trace)}: {len(t)} tokens, {t.n_expert} experts, "
                 f"top-{t.ids.shape[2]}")
        print(f"hit-rate plot: {hit_rate_plot(rows, args.plot, title)}", file=sys.stderr)
    return 0


def format_table(t, rows: list[dict], policies: list[str], slots: list[int], pool: bool,
                 prefetch: bool = False) -> str:
    """Hit rate per policy (rows) and size (columns); MiB copied per token where the expert size is known."""
    where = "in total" if pool else "per MoE layer"
    out = [f"{len(t)} tokens ({int(t.prefill.sum())} in prompts), {t.n_layer} layers, {t.n_expert} experts, "
           f"top-{t.ids.shape[2]}; slots {where}; every cache starts empty", "",
           "hit rate".ljust(10) + "".join(f"{s:>9}" for s in slots)]
    by = {(r["policy"], r["slots"]): r for r in rows}
    for p in policies:
        out.append(p.ljust(10) + "".join(f"{by[p, s]['hit_rate']:>9.1%}" for s in slots))
    if rows and rows[0]["bytes_per_token"] is not None:
        out += ["", "MiB copied to the cache per token (admitted misses" + (" and prefetches)" if prefetch else ")")]
        for p in policies:
            out.append(p.ljust(10) + "".join(f"{by[p, s]['bytes_per_token'] / 2**20:>9.2f}" for s in slots))
    out += ["", "belady is the offline optimum: no cache of that size can hit more often"
            + (" without prefetch (the others prefetch the trace's next-router guesses: they can beat it)"
               if prefetch else "")]
    return "\n".join(out)


def add_commands(sub) -> None:
    p = sub.add_parser("cache-sim", help="replay expert caches (lru, lfu, lfru, static, belady) over a routing "
                                         "trace for several sizes: hit rate per size and policy")
    p.add_argument("trace", help="a routing trace: moert's .npz (moert run --trace FILE) or a llama.cpp "
                                 "llama-moe-trace CSV (moert/dynamic/formats.py)")
    p.add_argument("--slots", default="8,16,32,64", help="cache sizes, experts per MoE layer (or in total with "
                                                         "--pool), comma-separated (default 8,16,32,64)")
    p.add_argument("--policy", default="lru,lfu,lfru,static,belady",
                   help="policies, comma-separated (default all: lru,lfu,lfru,static,belady)")
    p.add_argument("--pool", action="store_true", help="one cache of --slots experts shared by every layer")
    p.add_argument("--half-life", type=float, default=32.0, help="lfru's half-life in tokens (default 32)")
    p.add_argument("-m", "--model", default=None, help="the model (.gguf): adds the bytes copied per token")
    p.add_argument("--format", default="auto", choices=["auto", "moert", "llama-moe-trace", "phase-token-csv"],
                   help="the trace file's format (default: by its content)")
    p.add_argument("--n-expert", type=int, default=None, help="experts per layer, for foreign traces "
                                                              "(default: the largest id seen + 1)")
    p.add_argument("--prefetch", action="store_true", help="the caches prefetch the next-router guesses the trace "
                                                              "recorded (moert run --trace FILE --prefetch "
                                                              "next-router); belady stays without")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--plot", default=None, metavar="PNG", help="hit rate against slots per policy, Belady as "
                                                               "the ceiling (needs matplotlib)")
    p.set_defaults(func=cmd_cache_sim)
