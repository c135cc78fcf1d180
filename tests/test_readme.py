"""The documentation's snippets run: every fenced Python block, and every command line (`$ moert ...` in a
shell session, and the `moert` / `python -c` lines of a bash block), of README.md and of every docs/*.md, in the
suite, on the shipped demo model or a zoo twin; and every relative link between them points at a file that
exists (and, for a `#anchor` into a Markdown file, at one of its headings).

A block the suite cannot run carries an HTML comment on the line before its fence, invisible when rendered:

    <!-- test: skip: needs a running server (tests/test_serve.py drives these routes) -->
    <!-- test: synopsis: every command with its flags, placeholders in capitals -->   (not run, by design)
    <!-- test: model.gguf=zoo:qwen3-30b-a3b -->          the file names a block uses, mapped to a zoo twin

Unmapped, "model.gguf" and "Qwen3-30B-A3B-Q4_K_M.gguf" are the demo model (a real qwen3moe). A line of a
Python block written `expression   # literal` (a comment that is a Python literal and nothing else) is
checked: the expression must equal the literal, so the documents' stated results stay true. Test ids are
`FILE:LINE` (the line of the block's opening fence), so a failure names the place to fix.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import warnings
from pathlib import Path

import pytest

import moert
from moert import zoo
from moert.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEMO = Path(moert.__file__).parent / "data" / "demo-qwen3moe.gguf"
DEFAULT_FILES = {"model.gguf": str(DEMO), "Qwen3-30B-A3B-Q4_K_M.gguf": str(DEMO)}
DIRECTIVE = re.compile(r"<!--\s*test:\s*(.*?)\s*-->")
# what the documents executed when the README was split into docs/ (2026-11-28): the count may grow, never drop
EXECUTED_AT_SPLIT = {"python": 7, "commands": 21}


def name(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(path: Path) -> list[tuple[str, int, str, str, str]]:
    """(file, line of the opening fence, language, text, directive) of every fenced block in a document."""
    lines, out, i = path.read_text(encoding="utf-8").split("\n"), [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start, lang = i, lines[i][3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            d = DIRECTIVE.search(lines[i - 1]) if i else None
            out.append((name(path), start + 1, lang, "\n".join(lines[i + 1:end]), d.group(1) if d else ""))
            i = end
        i += 1
    return out


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a document's lines outside fenced blocks: where its links and headings are."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def files_of(directive: str) -> dict[str, str]:
    """The file-name mapping a block runs with: the defaults, then the directive's name=zoo:NAME pairs."""
    files = dict(DEFAULT_FILES)
    for file, target in re.findall(r"(\S+)=zoo:(\S+)", directive):
        files[file] = str(zoo.path(target))
    return files


def commands(lang: str, text: str) -> list[str]:
    """The command lines of a block: `$ ...` lines of a shell session (after them, output), and in a bash block the
    moert and python -c commands. A block in no language is output or a synopsis (placeholders in capitals)."""
    out = []
    for line in text.split("\n"):
        if not line.startswith("$ ") and lang != "bash":
            continue
        line = line[2:] if line.startswith("$ ") else line
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith(("moert ", "python -c ")) or part == "moert":
                out.append(part)
    return out


def checked(code: str, where: str = "block", first: int = 0) -> str:
    """Python source with each `expression   # literal` line turned into a check of the expression; a failed
    check names `where` and the line, counted from `first` (the document line before the block's first)."""
    out = []
    for n, line in enumerate(code.split("\n"), 1):
        m = re.match(r"^(\s*)(.+?)\s+#\s*(.+?)\s*$", line)
        if m:
            indent, expr, comment = m.groups()
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    expected = ast.literal_eval(comment)
                ast.parse(expr, mode="eval")
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass
            else:
                line = f"{indent}__check__(({expr}), {expected!r}, {f'{where}:{first + n}'!r}, {expr!r})"
        out.append(line)
    return "\n".join(out)


def check(value, expected, where: str, expr: str) -> None:
    assert value == expected, f"{where}: {expr} is {value!r}, the document says {expected!r}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for _, line in prose(path) if (m := re.match(r"^#{1,6}\s+(.*)$", line))}


def links() -> list[tuple[str, int, str]]:
    """(file, line, target) of every relative link and image in the documents' prose."""
    out = []
    for path in DOCS:
        for n, line in prose(path):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if not re.match(r"^[a-z][a-z0-9+.-]*:", target):             # http:, https:, mailto: are not ours
                    out.append((name(path), n, target))
    return out


BLOCKS = [b for path in DOCS for b in blocks(path)]
RUNNABLE = [b for b in BLOCKS if not b[4].startswith(("skip", "synopsis"))]
PYTHON = [b for b in RUNNABLE if b[2] == "python"]
COMMANDS = [(b[0], b[1], c, b[4]) for b in RUNNABLE for c in commands(b[2], b[3])]
LINKS = links()


def test_the_documents_are_found_and_keep_their_executed_snippets():
    assert name(DOCS[0]) == "README.md" and "docs/README.md" in {name(p) for p in DOCS} and len(DOCS) >= 10
    assert len(PYTHON) >= EXECUTED_AT_SPLIT["python"] and len(COMMANDS) >= EXECUTED_AT_SPLIT["commands"]
    readme = [b for b in RUNNABLE if b[0] == "README.md"]
    assert any(b[2] == "python" for b in readme) and any(commands(b[2], b[3]) for b in readme)


def test_every_skipped_block_says_why():
    for file, line, _, _, directive in BLOCKS:
        if directive.startswith(("skip", "synopsis")):
            assert len(directive.split(":", 1)[-1].strip()) > 10, f"{file}:{line}: a skip says why"


def test_a_block_of_command_lines_that_is_not_run_is_marked():
    # a block in no language that lists moert commands without `$ ` is a synopsis or output: it must say so
    command = re.compile(r"^moert (demo|run|chat|serve|bench|inspect|fit|trace|explain|compare|hardware|-)")
    for file, line, lang, text, directive in BLOCKS:
        lines = text.split("\n")
        if lang == "" and any(command.match(x) for x in lines) and not any(x.startswith("$ ") for x in lines):
            assert directive.startswith(("skip", "synopsis")), f"{file}:{line}: run it (`$ `) or mark it"


def test_checked_lines_compare_the_expression_with_the_comment():
    src = checked("x = 2\nx + 1   # 3\nx   # the number two", "doc.md", 10)
    with pytest.raises(AssertionError, match=r"doc\.md:12: x \+ 1 is 3, the document says 4"):
        exec(checked("x = 2\nx + 1   # 4", "doc.md", 10), {"__check__": check})
    exec(src, {"__check__": check})


def test_slugs_are_githubs():
    assert slug("Inside one MoE layer") == "inside-one-moe-layer"
    assert slug("`moert bench`") == "moert-bench"
    assert slug("The virtual clock: a real forward, timed as other hardware") == \
        "the-virtual-clock-a-real-forward-timed-as-other-hardware"


def test_every_page_is_linked_from_another():
    linked = {((ROOT / f).parent / t.partition("#")[0]).resolve() for f, _, t in LINKS if t.partition("#")[0]}
    assert [name(p) for p in DOCS if p.resolve() not in linked] == []


@pytest.mark.parametrize("file,line,target", LINKS, ids=[f"{f}:{n}:{t}" for f, n, t in LINKS])
def test_relative_link_resolves(file, line, target):
    path, _, anchor = target.partition("#")
    dest = (ROOT / file).parent / path if path else ROOT / file
    assert dest.exists(), f"{file}:{line}: the link {target!r} points at {dest}, which does not exist"
    if anchor and dest.suffix == ".md":
        assert anchor in anchors(dest), f"{file}:{line}: {name(dest)} has no heading for #{anchor}"


@pytest.mark.parametrize("file,line,lang,text,directive", PYTHON, ids=[f"{b[0]}:{b[1]}" for b in PYTHON])
def test_python_block_runs(file, line, lang, text, directive, tmp_path, monkeypatch, one_numba_thread):
    monkeypatch.chdir(tmp_path)                          # what a block writes (run.npz, plots) lands here
    code = text
    for fname, path in files_of(directive).items():
        code = code.replace(f'"{fname}"', repr(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ns = {"__check__": check, "__name__": "readme", "moert": moert}    # a page's `import moert`, implied
        exec(compile(checked(code, file, line), f"{file}:{line}", "exec"), ns)


@pytest.mark.parametrize("file,line,command,directive", COMMANDS, ids=[f"{c[0]}:{c[1]}:{c[2][:40]}" for c in COMMANDS])
def test_command_line_runs(file, line, command, directive, tmp_path, monkeypatch, capsys, one_numba_thread):
    monkeypatch.chdir(tmp_path)
    if command.startswith("python -c "):
        exec(shlex.split(command)[2], {"__name__": "readme"})
        return
    argv = [os.path.expanduser(a) for a in shlex.split(command, comments=True)[1:]]
    for fname, path in files_of(directive).items():
        argv = [path if a == fname else a for a in argv]
    argv = [str(DEMO) if a == "moert/data/demo-qwen3moe.gguf" else a for a in argv]
    rc = main(argv)
    out = capsys.readouterr()
    assert rc in (0, None), f"{file}:{line}: `{command}` exited {rc}\n{out.out[-2000:]}\n{out.err[-2000:]}"
