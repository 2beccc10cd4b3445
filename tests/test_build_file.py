"""The Bazel BUILD file at the repository top is what tools/gen_build.py makes of the tree.

Also checks, without going through the generator, that BUILD names every source file: each .py
under tfplaceto/ (except generated *_pb2.py), each tests/test_*.py and benchmarks/*.py, and each
protos/*.proto.
"""

from __future__ import annotations

from conftest import ROOT, load_script

gen_build = load_script("tools/gen_build.py")


def _build_text() -> str:
    path = ROOT / "BUILD"
    assert path.is_file(), "BUILD is missing: run `make build-file`"
    return path.read_text(encoding="utf-8")


def _expected_sources() -> list[str]:
    files = [
        p
        for p in (ROOT / "tfplaceto").rglob("*.py")
        if "__pycache__" not in p.parts and not p.name.endswith("_pb2.py")
    ]
    files += (ROOT / "tests").glob("test_*.py")
    files += (ROOT / "benchmarks").glob("*.py")
    files += (ROOT / "protos").rglob("*.proto")
    return sorted(p.relative_to(ROOT).as_posix() for p in files)


def test_build_file_is_up_to_date() -> None:
    assert _build_text() == gen_build.render_build(ROOT), "BUILD is stale: run `make build-file`"


def test_build_file_names_every_source() -> None:
    text = _build_text()
    sources = _expected_sources()
    assert "tfplaceto/cluster.py" in sources  # the tree walk found the package
    missing = [path for path in sources if f'"{path}"' not in text]
    assert not missing, f"BUILD does not mention {missing}: run `make build-file`"


def test_build_file_skips_generated_protos() -> None:
    text = _build_text()
    generated = sorted((ROOT / "tfplaceto" / "protos").glob("*_pb2.py"))
    listed = [p.name for p in generated if f'"{p.relative_to(ROOT).as_posix()}"' in text]
    assert not listed, f"BUILD lists generated modules {listed}; py_proto_library makes them"


def test_build_targets_have_no_dependency_cycles():
    # Bazel refuses cyclic deps; data flows one way through the stages.
    assert gen_build.dependency_cycles(ROOT) == []
