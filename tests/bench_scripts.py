"""bench/'s scripts as modules, for the tests that check them (bench/ is not a package: its scripts import each
other as plain modules, `import common`)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench_module(name: str):
    """bench/NAME.py imported (once per process, as any module), bench/ on the path only while it imports."""
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
