"""The project speaks of itself: no text narrates who did what in which sitting.

README.md, docs/*.md, bench/RESULTS.md, bench/HISTORY.md and the comments, docstrings and messages of bench/,
moert/, kernels/ and tests/ say when something was measured by its date, commit and command, and what a piece of
work is by what it does ("the 512-bit kernels, 2026-11-25"), never by a working session ("the seventh session"),
a helper's id ("h31d") or an internal issue number ("issue 31"). External references stay: llama.cpp issue 20934,
ik_llama.cpp PR 829, llamafile issue 765.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PATTERNS = {
    "a session by its order": re.compile(
        r"\b(the )?(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this|that|an earlier|a later"
        r"|earlier|later|next|previous) sessions?\b", re.I),
    "a session": re.compile(r"\bsessions?\b", re.I),
    "a helper": re.compile(r"\bhelpers? h\w+", re.I),
    "a helper's id": re.compile(r"\bh\d\d[a-z]?\b"),
    "an issue number": re.compile(r"\bissue #?\d+\b", re.I),
}

# "session" in the senses these words have outside the project's own history: pytest's fixture scope and its run,
# a terminal's, and moert.Model as an inference session (a model, its context and its position).
SESSION_PHRASES = ('scope="session"', "pytest session", "shell session", "This file is the session",
                   "the session, forward and context")

# An issue number is someone else's when the project it belongs to is named just before it.
EXTERNAL = re.compile(r"(llama\.cpp|ik_llama\.cpp|ggml|vLLM|GitHub|llamafile|Ollama|ray-project)", re.I)

# Files whose owners have not finished their rewrite yet. Each must still have a hit (the test says when one is clean,
# so that it leaves this list); the list is empty when the whole tree speaks of itself.
PENDING: set[str] = set()


def files() -> list[Path]:
    """Every file the rule covers, this one excepted."""
    found = [ROOT / "README.md", ROOT / "bench" / "RESULTS.md", ROOT / "bench" / "HISTORY.md"]
    found += sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "bench").glob("*.py"))
    found += sorted((ROOT / "moert").rglob("*.py")) + sorted((ROOT / "kernels").glob("*.py"))
    found += [p for p in sorted((ROOT / "tests").glob("*.py")) if p.name != Path(__file__).name]
    return [p for p in found if p.is_file()]


def _flat(text: str) -> str:
    """Line breaks, with the indentation and comment marks that follow them, read as one space."""
    return re.sub(r"\s*\n[\s#]*", " ", text)


def hits(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the words) for each mention of a session, a helper or an internal issue in text."""
    out = []
    for what, rx in PATTERNS.items():
        for m in rx.finditer(text):
            near = _flat(text[max(0, m.start() - 60):m.end() + 60])
            if what.startswith("a session") and any(p in near for p in SESSION_PHRASES):
                continue
            if what == "an issue number" and EXTERNAL.search(_flat(text[max(0, m.start() - 40):m.start()])):
                continue
            out.append((text.count("\n", 0, m.start()) + 1, what, m.group(0)))
    return sorted(set(out))


def test_the_patterns_catch_what_they_name_and_let_the_rest_through():
    caught = ["The seventh session's quiet runs", "helper h31d's branch", "a rule of h32", "issue 31, part 1",
              "issue #32", "earlier sessions", "(issue 6: as long as)"]
    passed = ['@pytest.fixture(scope="session")', "llama.cpp issue 20934", "ik_llama.cpp discussion #758",
              "llamafile issue 765", "(llama.cpp\n# issue 4763)", "an H100 and an h100", "rule #0 exps=CPU",
              "started once per pytest\nsession"]
    assert [s for s in caught if not hits(s)] == []
    assert [s for s in passed if hits(s)] == []


def test_no_text_narrates_sessions_helpers_or_internal_issues():
    bad, clean_pending = [], []
    for path in files():
        rel = path.relative_to(ROOT).as_posix()
        found = hits(path.read_text(encoding="utf-8"))
        if rel in PENDING:
            if not found:
                clean_pending.append(rel)
            continue
        bad += [f"{rel}:{line}: {what}: {words!r}" for line, what, words in found]
    assert not bad, ("say it by date, commit, command or what the thing is (an external project's issue is fine when "
                     "the project is named before it):\n" + "\n".join(bad))
    assert not clean_pending, f"clean now, take them out of PENDING: {clean_pending}"
