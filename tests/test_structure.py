"""The tree's shape, enforced: no import cycle among moert/ and kernels/ (every import, function-level too), the
runtime importing none of the wings above it, every package saying what it is, no source file over 400 lines,
argparse only under moert/cli/, ruff clean, and the CLI builds a plan once."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ((ROOT / "moert", "moert"), (ROOT / "kernels", "moert.kernels"))   # kernels/ installs as moert.kernels
MAX_LINES = 400


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__)."""
    mods = {}
    for base, pkg in PACKAGES:
        for f in base.rglob("*.py"):
            parts = [p for p in f.relative_to(base).with_suffix("").parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = (f, f.name == "__init__.py")
    return mods


def _imports(mods: dict) -> dict[str, set[str]]:
    """Module -> the moert modules it imports anywhere in its code (module or function level, absolute or
    relative; `from pkg import sub` counts the module sub, `from mod import name` the module mod)."""

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for m, (f, is_pkg) in mods.items():
        pkg = m if is_pkg else m.rpartition(".")[0]
        out = edges.setdefault(m, set())
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            out.update(t for t in (known(x) for x in targets if x.startswith("moert")) if t and t != m)
    return edges


def _a_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}                       # 1: on the current path, 2: done
    for start in sorted(edges):
        if start in state:
            continue
        path, stack = [start], [iter(sorted(edges[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(edges[nxt])))
    return None


def test_the_cycle_finder_finds_a_cycle_and_passes_a_tree():
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles():
    mods = _modules()
    assert len(mods) > 50 and "moert.kernels.matmul" in mods
    cycle = _a_cycle(_imports(mods))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_source_file_over_400_lines():
    big = {str(f.relative_to(ROOT)): n for f, _ in _modules().values()
           if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not big, f"over {MAX_LINES} lines (split by what each part is about): {big}"


def test_only_the_cli_imports_argparse():
    cli = ROOT / "moert" / "cli"
    users = [str(f.relative_to(ROOT)) for f, _ in _modules().values() if cli not in f.parents
             and any(isinstance(n, (ast.Import, ast.ImportFrom)) and "argparse" in
                     ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""])
                     for n in ast.walk(ast.parse(f.read_text())))]
    assert not users, f"argparse outside moert/cli/: {users}"


# The wings above the runtime, and the few modules that compose the two (a front door: `moert.load` applies the
# cluster and the virtual clock as passes, `moert demo` shows an explain view, dynamic placement's predict and
# compare price caches with the cost model). Everything else is the runtime, which imports no wing.
WINGS = ("moert.serve", "moert.cluster", "moert.explain", "moert.cost", "moert.cli")
COMPOSERS = {"moert", "moert.__main__", "moert.loader", "moert.demo", "moert.dynamic.compare", "moert.dynamic.predict"}


def _in(m: str, packages: tuple[str, ...]) -> bool:
    return any(m == p or m.startswith(p + ".") for p in packages)


def test_the_runtime_imports_no_wing():
    mods = _modules()
    edges = _imports(mods)
    runtime = [m for m in mods if not _in(m, WINGS) and m not in COMPOSERS]
    assert {"moert.model", "moert.experts", "moert.weights", "moert.devices.base", "moert.devices.sim",
            "moert.kvcache", "moert.text.generate", "moert.models.qwen3moe"} <= set(runtime)
    bad = {m: sorted(t for t in edges[m] if _in(t, WINGS)) for m in runtime}
    assert not {m: t for m, t in bad.items() if t}, "the runtime imports a wing (serve, cluster, explain, cost, cli)"


def test_the_wings_do_not_import_each_other_but_the_cost_model():
    """serve, cluster and explain stand side by side over the runtime; the CLI drives them all, and any may ask the
    cost model (a prediction is data)."""
    edges = _imports(_modules())
    for wing in ("moert.serve", "moert.cluster", "moert.explain"):
        others = tuple(w for w in WINGS if w not in (wing, "moert.cost"))
        bad = {m: sorted(t for t in ts if _in(t, others)) for m, ts in edges.items() if _in(m, (wing,))}
        assert not {m: t for m, t in bad.items() if t}, wing


def test_every_package_says_what_it_is_and_may_import():
    for pkg in [d for d in (ROOT / "moert").rglob("__init__.py")] + [ROOT / "kernels" / "__init__.py"]:
        doc = ast.get_docstring(ast.parse(pkg.read_text())) or ""
        assert len(doc.split()) >= 15, f"{pkg.relative_to(ROOT)}: a docstring saying what the package is"


def test_the_top_level_is_the_pipeline():
    """moert/ keeps the stages a learner reads and what they share; a subsystem is a package, not a file prefix."""
    top = sorted(f.stem for f in (ROOT / "moert").glob("*.py"))
    prefixes = [p for p in ("server", "cluster", "explain", "tokenizer", "device") if any(
        t.startswith(p + "_") or t == p for t in top)]
    assert not prefixes, f"file-name prefixes standing in for packages: {prefixes}"
    assert len(top) <= 26, top


@pytest.mark.skipif(shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                    capture_output=True).returncode != 0, reason="ruff is in the dev extra")
def test_ruff_is_clean():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "moert", "kernels", "tests", "bench"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


@pytest.mark.parametrize("fit", [False, True])
def test_the_cli_builds_each_plan_once(monkeypatch, fit):
    """`moert run -v [--fit on]`: one plan, printed (-v) and loaded; with --fit on the plan is fit's own
    (fit searches with build(); no plan() call after it). Before, -v built the plan twice."""
    import importlib

    from moert.cli.main import main
    from moert.demo import demo_model_path

    build = importlib.import_module("moert.placement.build")       # the modules (the package names functions so)
    fit_module = importlib.import_module("moert.placement.fit")

    calls = {"plan": 0, "fit": 0}
    real_plan, real_fit = build.plan, fit_module.fit

    def counting_plan(*a, **k):
        calls["plan"] += 1
        return real_plan(*a, **k)

    def counting_fit(*a, **k):
        calls["fit"] += 1
        return real_fit(*a, **k)

    monkeypatch.setattr(build, "plan", counting_plan)
    monkeypatch.setattr(fit_module, "fit", counting_fit)
    monkeypatch.setattr("moert.placement.strategies.fit", counting_fit)
    args = ["run", str(demo_model_path()), "-v", "-p", "1 2 3", "-n", "1", "-t", "1", "--gpu-backend", "sim",
            "--gpu-mem", "64MiB", "--no-warmup"] + (["--fit", "on"] if fit else [])
    assert main(args) == 0
    assert calls == ({"plan": 0, "fit": 1} if fit else {"plan": 1, "fit": 0}), calls


def test_the_bench_scripts_import_no_cycle():
    """bench/*.py import each other as plain modules (`import common`); those imports form no cycle either."""
    bench = ROOT / "bench"
    names = {f.stem for f in bench.glob("*.py")}
    edges = {}
    for f in bench.glob("*.py"):
        out = edges.setdefault(f.stem, set())
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module in names:
                out.add(node.module)
        out.discard(f.stem)
    assert {"common"} <= edges["e2e"] and "common" in edges["llama_quantized"]
    cycle = _a_cycle(edges)
    assert cycle is None, "import cycle in bench/: " + " -> ".join(cycle)
