"""`convert` never writes what `verify` rejects: every fixture and every differential case that
`verify` passes as intact (tests/validate/test_differential_*.py) is converted into every
destination container, and each output must pass `verify --strict` (no error, no warning).
A conversion `convert` refuses must be a clean refusal: exit 1 or 2 with one coded error line,
never a traceback or INTERNAL, and no output left behind (docs/reliability.md, "Verdict
classes")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, run_cli
from tests.validate import test_differential_numpy as numpy_cases
from tests.validate import test_differential_safetensors as st_cases
from tests.validate.differential import Case, verify_report

# Every tensor container `convert` writes: (label, output name, extra options).
DESTINATIONS = [
    ("ztensor", "out.zt", []),
    ("ztensor-v2", "out.zt", ["--zt-version", "2"]),
    ("ztensor-zstd", "out.zt", ["--compress", "zstd"]),
    ("safetensors", "out.safetensors", []),
    ("npy", "out.npy", []),
    ("npz", "out.npz", []),
    ("embd", "out.weights", []),
    ("stb", "out.stb", []),
    ("gguf", "out.gguf", []),
]

FIXTURES = [
    ROOT / "tests" / "golden" / "ztensor_v1_dense.zt",
    ROOT / "tests" / "golden" / "ztensor_v1_multi.zt",
    ROOT / "tests" / "golden" / "embd_v1_tiny.weights",
    ROOT / "tests" / "golden" / "stb_v01_tiny.stb",
    *sorted((ROOT / "fixtures" / "gguf").glob("*.gguf")),
]


def convert_then_verify(src: Path, out_dir: Path) -> list[str]:
    """Convert `src` into every destination; return what went wrong (empty: all is well)."""
    problems = []
    for label, name, extra in DESTINATIONS:
        folder = out_dir / label
        folder.mkdir()
        dst = folder / name
        done = run_cli("convert", str(src), str(dst), *extra)
        if done.code != 0:
            lines = [line for line in done.stderr.splitlines() if "error[" in line]
            if done.code not in (1, 2) or not lines or "INTERNAL" in done.stderr:
                problems.append(f"{label}: exit {done.code}: {done.stderr[-400:]}")
            if "Traceback" in done.stderr:
                problems.append(f"{label}: traceback")
            if list(folder.iterdir()):
                problems.append(f"{label}: refused, but left {sorted(folder.iterdir())}")
            continue
        report = verify_report(dst)
        if not report.ok(strict=True):
            found = [(f.code, f.severity.value, f.message[:120]) for f in report.findings]
            problems.append(f"{label}: the output does not verify: {found}")
    return problems


@pytest.mark.parametrize("fixture", FIXTURES, ids=[p.name for p in FIXTURES])
def test_every_fixture_converts_into_outputs_that_verify(tmp_path: Path, fixture: Path) -> None:
    assert fixture.exists()
    assert convert_then_verify(fixture, tmp_path) == []


# One case per dtype and layout is enough to reach every code path of the sinks: the numpy
# set's shapes (empty, rank 0, 1-D, C, Fortran, strided) for every dtype in both byte orders,
# and the trailing-bytes variant of one; the safetensors and zTensor sets whole.
DIFFERENTIAL = [
    c
    for c in numpy_cases.CASES
    if not c.id.endswith("-cut-by-one")
    and (not c.id.endswith("-trailing") or c.id.startswith("float32<"))
] + st_cases.CASES


@pytest.mark.parametrize("case", DIFFERENTIAL, ids=[c.id for c in DIFFERENTIAL])
def test_every_accepted_differential_case_converts_into_outputs_that_verify(
    tmp_path: Path, case: Case
) -> None:
    src = case.write(tmp_path)
    verdict = verify_report(src).verdict()
    if verdict != "intact":
        # Not something convert takes (damaged, or intact but not a tensor): it must refuse.
        done = run_cli("convert", str(src), str(tmp_path / "x.zt"))
        assert done.code in (1, 2) and "INTERNAL" not in done.stderr, done.stderr
        assert not (tmp_path / "x.zt").exists()
        if verdict == "unsupported":
            assert "CONVERT_NOT_TENSOR" in done.stderr, done.stderr
        return
    out = tmp_path / "out"
    out.mkdir()
    assert convert_then_verify(src, out) == []


def test_gguf_and_ztensor_cases_convert_into_outputs_that_verify(tmp_path: Path) -> None:
    """The GGUF writer's model (every quantized type dequantized) and the zTensor 1.1 files of
    both writers."""
    from tests.helpers import ggufcraft
    from tests.validate import test_differential_ztensor as zt_cases

    model = tmp_path / "model.gguf"
    ggufcraft.write_model(model)
    sources = [model]
    (tmp_path / "zt").mkdir()
    for case in zt_cases.v1_cases(tmp_path / "zt"):
        folder = tmp_path / "cases" / case.id
        folder.mkdir(parents=True)
        path = case.write(folder)
        if verify_report(path).verdict() == "intact":
            sources.append(path)
    assert len(sources) > 5
    for i, src in enumerate(sources):
        out = tmp_path / f"out{i}"
        out.mkdir()
        assert convert_then_verify(src, out) == [], src
