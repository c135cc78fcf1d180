"""moert vs llama.cpp on the full-size file: the 48-layer Qwen3-30B-A3B Q4_K_M twin (18.6 GB, random valid blocks).

    python bench/e2e_full.py [--act-quant none,int8] [--threads 2] [--prompt 512] [--decode 32] [--rounds 3]
                             [--json out.json]

e2e.py runs its engines in one process; at this size they do not fit together in 24 GiB: llama.cpp copies its
Q4_K weights into a repacked buffer at load (its CPU "REPACK" extra buffer, ~13 GB here) while moert reads the
file's pages in place (18.6 GB of page cache). So each round runs each engine in a process of its own, one after
the other, the order alternating (moert first in odd rounds): `e2e.py --full --no-llama` with every moert mode,
then `e2e.py --full --no-moert`. Each process runs two of e2e.py's rounds and keeps the second: the first pages
the file in again after the other engine's process (and is llama.cpp's warm-up). Reported per engine: the median
over rounds of the kept round (best in parentheses), tokens/s, and moert / llama.cpp of the medians and of each
round's pair (the range). The file is written once (`e2e.py --full`, about a minute to the page cache, 140 s to
this box's disk).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent


def one_process(engine: str, args, out: Path) -> dict:
    """One e2e.py process with moert's modes or llama.cpp alone: {engine name: (pp s, tg s)} of its second round."""
    cmd = [sys.executable, str(HERE / "e2e.py"), "--full", "--rounds", "2", "-t", str(args.threads),
           *(["--model", str(args.model)] if args.model else []),
           "--prompt", str(args.prompt), "--decode", str(args.decode), "--json", str(out)]
    cmd += ["--no-llama", "--act-quant", ",".join(args.act_quant)] if engine == "moert" else ["--no-moert"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL if not args.verbose else None)
    res = json.loads(out.read_text())["results"]
    return {name: (d["pp"][-1], d["tg"][-1]) for name, d in res.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--act-quant", default="none,int8", type=lambda s: s.split(","),
                    help="moert's modes (e2e.py --act-quant), each an engine")
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--model", type=Path, help="another GGUF instead of the full-size twin")
    ap.add_argument("--verbose", action="store_true", help="show each process's own output")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(HERE))
    import e2e

    path = args.model or e2e.full_twin_path()
    mach = common.machine(args.threads)
    runs: dict[str, list[tuple[float, float]]] = {}
    engines = ["moert", "llama.cpp"] if importlib.util.find_spec("llama_cpp") is not None else ["moert"]
    if len(engines) == 1:
        print("# llama-cpp-python is not installed: moert only", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for engine in (engines if r % 2 == 0 else engines[::-1]):
                got = one_process(engine, args, Path(tmp) / f"{engine}-{r}.json")
                for name, (pp, tg) in got.items():
                    runs.setdefault(name, []).append((pp, tg))
                    print(f"round {r + 1} {name:10s}: pp{args.prompt} {args.prompt / pp:7.1f} tok/s, "
                          f"tg{args.decode} {1 / tg:6.2f} tok/s", flush=True)

    def speeds(name):                                   # (pp tok/s list, tg tok/s list) over rounds
        return [args.prompt / pp for pp, _ in runs[name]], [1 / tg for _, tg in runs[name]]

    rows, out = [], dict(machine=mach, model=str(path), args=vars(args) | {"json": str(args.json)}, engines={})
    for name in runs:
        pp, tg = speeds(name)
        out["engines"][name] = dict(pp_tok_s=pp, tg_tok_s=tg)
        rows.append([name, f"{statistics.median(pp):.1f} ({max(pp):.1f})",
                     f"{statistics.median(tg):.2f} ({max(tg):.2f})"])
    if "llama.cpp" in runs:
        lpp, ltg = speeds("llama.cpp")
        for name in [n for n in runs if n != "llama.cpp"]:
            pp, tg = speeds(name)
            rpp = [a / b for a, b in zip(pp, lpp)]
            rtg = [a / b for a, b in zip(tg, ltg)]
            out["engines"][name]["ratio"] = dict(pp=statistics.median(pp) / statistics.median(lpp),
                                                 tg=statistics.median(tg) / statistics.median(ltg),
                                                 pp_rounds=rpp, tg_rounds=rtg)
            rows.append([f"{name} / llama.cpp", f"{statistics.median(pp) / statistics.median(lpp):.2f}x "
                         f"({min(rpp):.2f}-{max(rpp):.2f}x)", f"{statistics.median(tg) / statistics.median(ltg):.2f}x "
                         f"({min(rtg):.2f}-{max(rtg):.2f}x)"])
    print()
    print(f"# moert vs llama.cpp, {path.name}: {path.stat().st_size / 1e9:.2f} GB, every tensor on the CPU, "
          f"{args.threads} threads; each engine in its own process per round; median of {args.rounds} rounds "
          f"(best, or the rounds' range of ratios, in parentheses)")
    print(f"# {common.machine_line(mach)}")
    print(common.table(["engine", f"pp{args.prompt} tok/s", f"tg{args.decode} tok/s"], rows))
    print(f"# command: {common.command()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
