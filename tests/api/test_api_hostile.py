"""The Python API on hostile paths and options (docs/api.md, "Errors"): only the MatrixError
family for a wrong value, TypeError for a wrong Python type, and `verify` / `inspect` report
instead of raising. Before: ValueError for a NUL in a path, TypeError from a regex for a bytes
path, AttributeError for options of the wrong type, UnicodeEncodeError for lone surrogates."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import matrixctl
from matrixctl.errors import InputError, MatrixError, OutputError, UsageError

W = {"w": np.ones((2, 32), dtype=np.float32)}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Any]:
    ok = tmp_path / "ok.npz"
    np.savez(ok, **W)
    damaged = tmp_path / "damaged.zt"
    damaged.write_bytes(b"ZTEN1000" + b"\xff" * 50)
    folder = tmp_path / "folder"
    folder.mkdir()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(ok.read_bytes()[:100])
    return {
        "nul": str(tmp_path / "a\0b.zt"),
        "bytes": os.fsencode(ok),
        "undecodable": os.fsencode(tmp_path) + b"/\xff.zt",
        "missing": str(tmp_path / "missing.zt"),
        "folder": str(folder),
        "damaged": str(damaged),
        "cut": str(cut),
        "empty": "",
        "long": str(tmp_path / ("x" * 5000)),
        "devnull": "/dev/null",
    }


CALLS: dict[str, Callable[[Any, Path], Any]] = {
    "open": lambda p, d: matrixctl.open(p),
    "load": lambda p, d: matrixctl.load(p),
    "convert-from": lambda p, d: matrixctl.convert(p, d / "o.zt"),
    "convert-to": lambda p, d: matrixctl.convert(d / "ok.npz", p, to="ztensor"),
    "save": lambda p, d: matrixctl.save(p, W, format="ztensor"),
    "load_tokenizer": lambda p, d: matrixctl.load_tokenizer(p),
    "open_pack": lambda p, d: matrixctl.open_pack(p),
}
PATHS = ["nul", "bytes", "undecodable", "missing", "folder", "damaged", "cut", "empty", "long"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_hostile_paths_raise_only_matrix_errors(
    tmp_path: Path, files: dict[str, Any], call: str, path: str
) -> None:
    try:
        CALLS[call](files[path], tmp_path)
    except MatrixError as err:
        assert err.code and err.one_line()
    # anything else (ValueError, TypeError from a regex, UnicodeError...) fails the test


@pytest.mark.parametrize("path", [*PATHS, "devnull"])
def test_verify_and_inspect_report_and_never_raise(files: dict[str, Any], path: str) -> None:
    report = matrixctl.verify(files[path])
    doc = matrixctl.inspect(files[path])
    assert "path" in doc["files"][0]
    if path == "bytes":
        assert report.ok() and doc["ok"]
    else:
        assert not report.ok() and not doc["ok"]
        assert report.findings


def test_a_nul_in_a_path_is_the_missing_file_it_names(
    files: dict[str, Any], tmp_path: Path
) -> None:
    with pytest.raises(InputError) as err:
        matrixctl.open(files["nul"])
    assert err.value.code == "IO_NOT_FOUND"
    with pytest.raises(OutputError):
        matrixctl.save(files["nul"], W)
    report = matrixctl.verify(files["nul"])
    assert report.unreadable and report.exit_code() == 2


@pytest.mark.parametrize(
    ("function", "kwargs"),
    [
        ("save", {"compress": 5}),
        ("save", {"per_file": "16"}),
        ("save", {"dtype": 16}),  # a str or a list of str (docs/api.md)
        ("save", {"format": 3}),
        ("convert", {"select": b"w"}),
        ("convert", {"select": [1]}),
        ("convert", {"meta": [1]}),
        ("convert", {"meta": {"k": 1}}),
        ("convert", {"compress": ["zstd"]}),
        ("convert", {"atoms": 5}),
        ("convert", {"per_file": True}),
    ],
)
def test_options_of_the_wrong_type_are_type_errors(
    tmp_path: Path, function: str, kwargs: dict[str, Any]
) -> None:
    src = tmp_path / "ok.npz"
    np.savez(src, **W)
    out = tmp_path / "o.stb"
    with pytest.raises(TypeError):
        if function == "save":
            matrixctl.save(out, W, **kwargs)
        else:
            matrixctl.convert(src, out, **kwargs)
    with pytest.raises(TypeError):
        matrixctl.save(out, [np.ones(3)])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        matrixctl.inspect(src, ids=5)  # type: ignore[arg-type]
    assert not out.exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda d: matrixctl.save(d / "o.safetensors", W, metadata={"k": "\ud800"}),
        lambda d: matrixctl.save(d / "o.zt", W, metadata={"k": ["a", "\udcff"]}),
        lambda d: matrixctl.save(d / "o.zt", {"\ud800": np.ones(3)}),
        lambda d: matrixctl.save(d / "o.gguf", W, meta=["k=\udcff"]),
        lambda d: matrixctl.load_tokenizer().encode("a\ud800b"),
    ],
)
def test_text_that_utf8_cannot_encode_is_a_usage_error(tmp_path: Path, call: Any) -> None:
    with pytest.raises(UsageError) as err:
        call(tmp_path)
    assert "surrogate" in err.value.message or "UTF-8" in err.value.message
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("o.")]


def test_token_ids_must_be_integers() -> None:
    tok = matrixctl.load_tokenizer()
    for ids in (["a"], [1.5], None):
        with pytest.raises(TypeError):
            tok.decode(ids)
    assert tok.decode(tok.encode("hello")) == "hello"
