"""kernels/jit.drop_stale_cache: Numba's cached kernels go when kernels/*.py changed since they were compiled (a
fused kernel's cached copy would otherwise keep an old callee from another file), and stay otherwise."""

from __future__ import annotations

from moert.kernels import jit


def test_cached_kernels_of_other_sources_go_and_those_of_these_sources_stay(tmp_path):
    files = [tmp_path / "decode._fused-68.py311.nbi", tmp_path / "decode._fused-68.py311.1.nbc"]
    keep = tmp_path / "decode.cpython-311.pyc"                           # Python's own bytecode: not Numba's
    for f in [*files, keep]:
        f.write_bytes(b"x")
    assert jit.drop_stale_cache(tmp_path, "aaaa") == 2                   # no stamp yet: compiled from unknown sources
    assert not any(f.exists() for f in files) and keep.exists()
    assert (tmp_path / jit.STAMP).read_text() == "aaaa"
    for f in files:
        f.write_bytes(b"x")
    assert jit.drop_stale_cache(tmp_path, "aaaa") == 0 and all(f.exists() for f in files)   # same sources: kept
    assert jit.drop_stale_cache(tmp_path, "bbbb") == 2 and not any(f.exists() for f in files)


def test_the_package_cache_is_stamped_with_the_current_sources():
    folder = jit.Path(jit.__file__).parent / "__pycache__"
    assert (folder / jit.STAMP).read_text() == jit._SOURCE
