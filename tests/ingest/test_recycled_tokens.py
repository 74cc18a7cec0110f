"""Dask workers overwrite the token files of units the client has merged already instead of
writing new ones (`executors.dask_staging.StagingSink`, `step.UnitTokens`; docs/scale-out.md):
the bytes, counts and CRC-32 must be exactly those of a new file, whatever the recycled file
held."""

from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np
import pytest

from matrixctl.crc import crc32
from matrixctl.ingest import step
from matrixctl.ingest.executors import dask as dask_ex
from matrixctl.ingest.executors import dask_staging
from matrixctl.ingest.sources import SourceFile


def tokens_through_acc(
    tmp_path: Path, name: str, parts: list[np.ndarray], recycle: str | None
) -> step.FileResult:
    work = tmp_path / name
    work.mkdir()
    sink = dask_staging.StagingSink(recycle if recycle is not None else str(tmp_path / "none"))
    acc = step.UnitTokens(str(work), 0, "<u2", sink)
    for part in parts:
        acc.add(part)
    result = step.FileResult(SourceFile(0, "x", "x", 0, True), "")
    acc.close(result)
    return result


@pytest.mark.parametrize("old_size", [0, 10, 1 << 16])  # empty, shorter, longer than ours
def test_a_recycled_file_holds_exactly_the_new_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_size: int
) -> None:
    monkeypatch.setattr(step, "MEM_TOKENS", 100)  # several spills into the one file
    rng = np.random.default_rng(7)
    parts = [rng.integers(0, 60000, size=n, dtype=np.uint32) for n in (90, 40, 300, 7, 1)]
    expected = np.concatenate(parts).astype("<u2").tobytes()

    folder = tmp_path / "recycle"
    folder.mkdir()
    (folder / "old.tokens").write_bytes(b"\xab" * old_size)
    fresh = tokens_through_acc(tmp_path, "fresh", parts, None)
    reused = tokens_through_acc(tmp_path, "reused", parts, str(folder))

    assert list(folder.iterdir()) == []  # taken, so no other worker can take it
    assert reused.raw_ids is not None and fresh.raw_ids is not None
    assert Path(reused.raw_ids).read_bytes() == Path(fresh.raw_ids).read_bytes() == expected
    assert (reused.raw_count, reused.raw_max, reused.raw_crc) == (
        fresh.raw_count,
        fresh.raw_max,
        fresh.raw_crc,
    )
    assert reused.raw_crc == crc32(expected)
    assert reused.raw_count == len(expected) // 2


def test_no_file_to_recycle_writes_a_new_one(tmp_path: Path) -> None:
    parts = [np.arange(50, dtype=np.uint32)]
    for folder in (tmp_path / "empty", tmp_path / "missing"):
        if folder.name == "empty":
            folder.mkdir()
        res = tokens_through_acc(tmp_path, folder.name + "-work", parts, str(folder))
        assert res.raw_ids is not None
        assert Path(res.raw_ids).read_bytes() == parts[0].astype("<u2").tobytes()


def test_two_claims_never_take_the_same_file(tmp_path: Path) -> None:
    folder = tmp_path / "recycle"
    folder.mkdir()
    (folder / "a.tokens").write_bytes(b"a")
    assert dask_staging._claim(str(folder), str(tmp_path / "first"))
    assert not dask_staging._claim(str(folder), str(tmp_path / "second"))
    assert (tmp_path / "first").read_bytes() == b"a" and not (tmp_path / "second").exists()


def test_the_client_keeps_a_few_files_per_worker_and_removes_the_rest(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    (staging / dask_staging.RECYCLE).mkdir(parents=True)
    client = types.SimpleNamespace(staging=str(staging), jobs=2)
    made = []
    for i in range(dask_staging.RECYCLE_FILES * 2 + 3):
        path = staging / f"u{i}.tokens"
        path.write_bytes(b"t" * (i + 1))
        made.append(path)
        dask_ex.DaskExecutor._recycle(client, str(path))  # type: ignore[arg-type]
    kept = sorted(os.listdir(staging / dask_staging.RECYCLE))
    assert kept == sorted(p.name for p in made[: dask_staging.RECYCLE_FILES * 2])
    assert not any(p.exists() for p in made)  # every merged file left the staging folder


def test_links_in_the_recycle_folder_are_never_written_through(tmp_path: Path) -> None:
    """The staging folder may be on a shared file system: a symbolic link or a hard link put
    into `recycle/` must not have a worker's tokens written over the file it points at."""
    folder = tmp_path / "recycle"
    folder.mkdir()
    victim = tmp_path / "precious.bin"
    victim.write_bytes(b"keep me" * 100)
    os.symlink(victim, folder / "a.tokens")
    os.link(victim, folder / "b.tokens")
    parts = [np.arange(300, dtype=np.uint32)]
    res = tokens_through_acc(tmp_path, "work", parts, str(folder))
    assert victim.read_bytes() == b"keep me" * 100
    assert res.raw_ids is not None
    assert Path(res.raw_ids).read_bytes() == parts[0].astype("<u2").tobytes()
    assert victim.stat().st_nlink == 1  # the hard link taken was dropped, not written
    assert os.path.islink(folder / "a.tokens")  # the symbolic link is left where it was
