"""The layers (docs/architecture.md, "Layers") and the helpers that moved to the base."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from matrixctl.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_layer_contract_is_kept() -> None:
    """Decision: the layer contract in pyproject.toml ([tool.importlinter]) holds, imports
    inside functions included; `make lint` and CI run the same check."""
    exe = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert "BROKEN" not in result.stdout


def _readers() -> list[object]:
    from matrixctl.epoch import source_date_text
    from matrixctl.formats import embd, npy
    from matrixctl.ingest import pack
    from matrixctl.tokenizers.scx import manifest

    return [
        source_date_text,
        npy.zip_date,
        embd.created_at_now,
        pack.created_stamp,
        lambda: manifest.created_at_from(None),
    ]


@pytest.mark.parametrize("value", ["x", "-5", "1.5", "٣"])
def test_source_date_epoch_one_message(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Decision: SOURCE_DATE_EPOCH is read in one place (matrixctl/epoch.py): every writer
    that records a time refuses the same bad values with the same message."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", value)
    messages = set()
    for read in _readers():
        with pytest.raises(UsageError) as err:
            read()  # type: ignore[operator]
        messages.add(str(err.value))
    assert messages == {f"SOURCE_DATE_EPOCH must be a whole number of seconds, got {value!r}"}


def test_source_date_epoch_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", " 86400 ")
    from matrixctl.formats import npy

    texts = {read() for read in _readers() if read is not npy.zip_date}  # type: ignore[operator]
    assert texts == {"1970-01-02T00:00:00Z"}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000001")
    assert npy.zip_date() == (2023, 11, 14, 22, 13, 20)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "")
    assert {read() for read in _readers() if read is not npy.zip_date} == {None}  # type: ignore[operator]
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert npy.zip_date() == npy.ZIP_DATE


def test_sha256_file_in_the_base(tmp_path: Path) -> None:
    """sha256_file has one home (matrixctl.io); the ingest builders and validators share it."""
    from matrixctl import io
    from matrixctl.ingest import pack

    path = tmp_path / "f"
    path.write_bytes(b"abc")
    assert io.sha256_file(str(path)) == (
        "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
    assert not hasattr(pack, "sha256_file") or pack.sha256_file is io.sha256_file


def test_one_place_sniffs_and_opens() -> None:
    """Decision: only matrixctl/opening.py tells a path's format (folder sniff, then bytes);
    the CLI, the engine, convert and the API open through it (atoms.open_valid requires a
    named format of a file it opened and checks it through opening.open_checked)."""
    callers = {}
    for path in sorted((ROOT / "matrixctl").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for needle in ("sniff_dir(", "registry.sniff(", "run_rules("):
            for line in text.splitlines():
                if needle in line and not line.lstrip().startswith("def "):
                    callers.setdefault(needle, set()).add(path.relative_to(ROOT).as_posix())
        for line in text.splitlines():  # the registry's sniff imported by name
            if line.strip().startswith("from matrixctl.formats.registry import ") and (
                "sniff" in line.split(" import ", 1)[1].replace(",", " ").split()
            ):
                callers.setdefault("registry.sniff(", set()).add(path.relative_to(ROOT).as_posix())
    assert callers["sniff_dir("] == {"matrixctl/opening.py"}
    assert callers["registry.sniff("] == {"matrixctl/opening.py", "matrixctl/atoms.py"}
    assert callers["run_rules("] == {"matrixctl/opening.py", "matrixctl/validate/engine.py"}


def test_sources_take_their_checked_parse(tmp_path: Path) -> None:
    """A codec's TensorSource is built from the checked parse the opening module hands it;
    a damaged file is refused by opening (the code verify reports) before the codec runs."""
    from matrixctl.errors import FormatError
    from matrixctl.formats import npy
    from matrixctl.io import Source
    from matrixctl.opening import open_checked, open_tensors

    path = tmp_path / "a.npy"
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"
    header += b" " * (64 - 10 - len(header) - 1) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(12))
    with Source.open(str(path)) as src:
        source = npy.NpySource(src, open_checked(src, npy.NPY))
        assert [(i.name, i.shape) for i in source.tensors()] == [("a", (3,))]
    with open_tensors(str(path)) as opened:
        assert [i.dtype for i in opened.tensors()] == ["f32"]
    path.write_bytes(path.read_bytes()[:-4])  # cut: the payload is short
    with pytest.raises(FormatError) as err, open_tensors(str(path)):
        pass
    assert err.value.code.startswith("NPY_")


def test_one_problem_type() -> None:
    """Decision: a codec's lenient parser records `matrixctl.findings.Problem`, the one type
    for it (docs/architecture.md, "Where a format's checks live"); no other module defines a
    problem class of its own."""
    import ast

    defined = set()
    for path in sorted((ROOT / "matrixctl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Problem"):
                defined.add((path.relative_to(ROOT).as_posix(), node.name))
    assert defined == {("matrixctl/findings.py", "Problem")}


def test_problems_become_findings_by_rule() -> None:
    """A problem keeps its code, offset and field as a finding, takes its code's severity, and
    is reported only under the rule it names."""
    from matrixctl.codes import Severity
    from matrixctl.findings import Problem, findings_of, has_error
    from matrixctl.formats import embd

    warn = Problem(embd.EMBD_VERSION_NEWER, "newer minor", 6, "version_minor", rule="header")
    err = Problem(embd.EMBD_META, "bad entry", 72, "metadata", rule="meta")
    assert [f.to_json() for f in findings_of([warn, err], "meta")] == [
        {
            "code": "EMBD_META",
            "severity": "error",
            "message": "bad entry",
            "offset": 72,
            "field": "metadata",
        }
    ]
    assert [f.severity for f in findings_of([warn, err])] == [Severity.WARNING, Severity.ERROR]
    assert not has_error([warn]) and not has_error([warn, err], "header")
    assert has_error([warn, err]) and has_error([warn, err], "header", "meta")


# Files whose short aliases wait for the end of the session (other branches are editing them);
# each line goes when its files are renamed.
ALIASES_DEFERRED: tuple[str, ...] = ()


def test_no_cryptic_import_aliases() -> None:
    """Decision: a module imported under another name gets a readable one (`numpy as np`
    apart); one or two letters (`ma`, `tk`, `st`) say nothing at the place of use."""
    import ast

    short = []
    for folder in ("matrixctl", "bench", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ALIASES_DEFERRED):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    short += [
                        f"{rel}: {a.name} as {a.asname}"
                        for a in node.names
                        if a.asname
                        and len(a.asname) <= 2
                        and a.asname.islower()
                        and a.asname != "np"
                    ]
    assert short == []


def test_shared_rule_helpers() -> None:
    """The engine's helpers that EMBD, STB and zTensor 2 share: the first non-zero padding
    byte across chunk edges, and a cause rule's cut-file finding."""
    from matrixctl.validate.engine import cut_short, first_nonzero

    buf = bytes(10) + b"\x07" + bytes(5)
    assert first_nonzero(buf, 0, len(buf), chunk=4) == 10
    assert first_nonzero(buf, 0, 10, chunk=3) is None
    assert first_nonzero(buf, 12, 4) is None
    assert list(cut_short("EMBD_FILE_SIZE", 100, 100, "total_file_size")) == []
    (cut,) = cut_short("EMBD_FILE_SIZE", 99, 1000, "total_file_size")
    assert (cut.offset, cut.field, cut.message) == (
        99,
        "total_file_size",
        "file is 99 bytes; total_file_size says 1,000 (cut at byte 99)",
    )


def test_modules_read_version_and_data_from_the_base_module() -> None:
    """Decision: the version and the data folder live in `matrixctl.package` (the lowest
    layer); no module of the package imports the root package for them (`import matrixctl`,
    `from matrixctl import __version__`), and `matrixctl.__version__` is the same value."""
    import ast

    import matrixctl
    from matrixctl import package

    offenders = []
    for path in sorted((ROOT / "matrixctl").rglob("*.py")):
        if path == ROOT / "matrixctl" / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                root = any(a.name == "matrixctl" for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module == "matrixctl":
                root = any(a.name == "__version__" for a in node.names)
            else:
                root = False
            if root:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
    assert matrixctl.__version__ == package.__version__
    assert Path(package.data_path("pi_symbol_map.json")).is_file()
