"""The set-aside name a replacement leaves when it is killed between its two renames (old
version aside, new one in): `verify` of the folder holding it reports it as STALE_TEMP, and
the next run writing the same output puts it back (when the output is missing) or removes it.
Both writers that replace a folder use the one name `.NAME.old.mxPID-START-HOST-RANDOM.tmp`
(`matrixctl.io.aside_name`): SCX shard folders and, where the file system cannot exchange,
ingest packs (`ingest/swap.py`). docs/reliability.md, "Crash consistency"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, run_cli

CORPUS = ROOT / "fixtures" / "corpus"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _aside(folder: Path, base: str) -> Path:
    from matrixctl import io as mio

    return folder / f".{base}.old.mx{_dead_pid()}-1-{mio._host_tag()}-{'a' * 12}.tmp"


def _stale(folder: Path) -> dict[str, str]:
    res = run_cli("verify", "--json", str(folder))
    doc = json.loads(res.out)
    return {
        f["field"]: f["message"] for f in doc["files"][0]["findings"] if f["code"] == "STALE_TEMP"
    }


def _hidden(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


@pytest.mark.parametrize("missing", [True, False], ids=["dest-missing", "dest-present"])
def test_a_packs_set_aside_copy_is_reported_then_restored_or_removed(
    tmp_path: Path, missing: bool
) -> None:
    """An ingest pack whose replacement (the fallback without RENAME_EXCHANGE) was killed
    between its renames (pack missing), or after it (pack present; with a set-aside name of
    earlier versions, `.NAME.PID-START.RANDOM.old`, too)."""
    dest = tmp_path / "pack"
    assert run_cli("ingest", "docs", str(CORPUS), "-o", str(dest)).code == 0
    previous = (dest / "ingest_manifest.json").read_bytes()
    aside = _aside(tmp_path, "pack")
    legacy = tmp_path / f".pack.{_dead_pid()}-1.{'b' * 12}.old"
    if missing:
        os.rename(dest, aside)
    else:
        aside.mkdir()
        legacy.mkdir()
    stale = _stale(tmp_path)
    assert set(stale) == ({aside.name} if missing else {aside.name, legacy.name}), stale
    assert "the previous pack" in stale[aside.name] and "pid" in stale[aside.name]
    from matrixctl.ingest import swap

    swap.clean_stale(str(dest))  # what every run writing the pack does first
    assert _hidden(tmp_path) == []
    assert (dest / "ingest_manifest.json").read_bytes() == previous
    assert run_cli("verify", str(dest)).code == 0


def test_an_scx_folders_set_aside_copy_is_reported_and_restored(tmp_path: Path) -> None:
    from tests.helpers import scx_golden

    key = tmp_path / "k.key"
    assert run_cli("tokenize", "scx", "keygen", "-o", str(key)).code == 0
    src = tmp_path / "src.json"
    src.write_text(json.dumps(scx_golden.SOURCE))
    reg = tmp_path / "reg.scxr"
    assert run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(key)).code == 0
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)))
    work = tmp_path / "w"
    work.mkdir()
    out = work / "sh"
    argv = ["pack", "shards", str(blob), "-o", str(out), "-r", str(reg),
            "--trust", str(key) + ".pub", "--force"]  # fmt: skip
    assert run_cli(*argv).code == 0
    previous = (out / "manifest.json").read_bytes()
    aside = _aside(work, "sh")
    os.rename(out, aside)  # killed after moving the old folder aside
    stale = _stale(work)
    assert list(stale) == [aside.name] and "the previous sh" in stale[aside.name]
    assert run_cli(*argv).code == 0  # restores it first, then replaces it
    assert _hidden(work) == []
    assert (out / "manifest.json").read_bytes() == previous  # same input, same bytes
    assert _stale(work) == {}
