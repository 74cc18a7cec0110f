"""`--jobs 1` reads the pieces of a Parquet file through one decoder that runs ahead from
piece to piece (`columnar._Reader`), starts the next file's decoder while the last piece of
the file before is tokenized (`columnar.prefetch`), and takes the file's hash once its last
piece is tokenized (docs/inputs.md)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from matrixctl.ingest import step, units
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.ingest.kinds import columnar
from tests.helpers.cli import run_cli

pyarrow = pytest.importorskip("pyarrow", reason="the parquet extra is not installed")
from pyarrow import parquet  # noqa: E402

ROWS = [f"row {i} " + "caf\u00e9 the quick brown fox\r\n" * (i % 11) for i in range(1500)]


def shard(path: Path, rows: list[str], group: int) -> Path:
    parquet.write_table(pyarrow.table({"text": rows}), path, row_group_size=group)
    return path


def pack(out: Path, *srcs: Path, jobs: int = 1) -> dict[str, bytes]:
    run = run_cli("ingest", "docs", *map(str, srcs), "-o", str(out), "-j", str(jobs))
    assert run.code == 0, run.stderr
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def decoders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "matrixctl-columns"]


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row group a piece of its own, every file cut (as 64 MiB row groups are)."""
    monkeypatch.setattr(units, "PIECE_BYTES", 1)
    monkeypatch.setattr(units, "SPLIT_MIN", 1)
    monkeypatch.setattr(units, "UNIT_MAX_BYTES", 1)  # every file a unit of its own
    monkeypatch.setattr(columnar, "AHEAD_BATCHES", 2)
    monkeypatch.setattr(columnar, "BATCH_ROWS", 16)


def test_pieces_read_through_one_decoder_give_the_pack_of_the_files_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None
) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    for i in range(3):
        shard(folder / f"train-{i}.parquet", ROWS[i * 500 : (i + 1) * 500], 90)
    made: list[int] = []
    real = columnar._Reader.__init__

    def count(self: columnar._Reader, table: columnar.Table, first: int) -> None:
        made.append(first)
        real(self, table, first)

    monkeypatch.setattr(columnar._Reader, "__init__", count)
    prefetched: list[str] = []
    real_prefetch = columnar.prefetch

    def spy(path: str, name: str, field: str, first: int) -> None:
        prefetched.append(Path(path).name)
        real_prefetch(path, name, field, first)

    monkeypatch.setattr(columnar, "prefetch", spy)
    cut = pack(tmp_path / "cut", folder)
    assert made == [0, 0, 0]  # one decoder per file, not one per piece (6 row groups each)
    assert prefetched == ["train-1.parquet", "train-2.parquet"]  # started ahead of their turn
    assert decoders() == [] and columnar._SHARED == []
    monkeypatch.setattr(units, "SPLIT_MIN", 1 << 40)  # not cut: one unit per file
    whole = pack(tmp_path / "whole", folder)
    assert cut == whole
    assert pack(tmp_path / "j2", folder, jobs=2) == whole


def test_a_damaged_row_group_fails_in_its_own_piece_and_stops_the_decoders(
    tmp_path: Path, small_pieces: None
) -> None:
    good = shard(tmp_path / "a.parquet", ROWS[:600], 100)
    meta = parquet.ParquetFile(good).metadata
    start = meta.row_group(4).column(0).data_page_offset
    data = bytearray(good.read_bytes())
    data[start + 8 : start + 40] = b"\xff" * 32  # inside row group 4's first page
    bad = tmp_path / "b.parquet"
    bad.write_bytes(bytes(data))
    run = run_cli("ingest", "docs", str(bad), "-o", str(tmp_path / "p"))
    assert run.code == 1 and "INGEST_COLUMNAR" in run.stderr, run.stderr
    assert not (tmp_path / "p").exists()
    assert decoders() == [] and columnar._SHARED == []
    # Read piece by piece, the rows of row groups 0-3 come before the error, none after.
    texts: list[int] = []
    counters = kinds_base.Counters()
    with pytest.raises(Exception, match="not a readable Parquet file"):
        for first in range(6):
            for row, _ in columnar.texts(
                "parquet", str(bad), "b", kinds_base.Options(), counters, (first, first + 1),
                first * 100, ahead=True,
            ):  # fmt: skip
                texts.append(row)
    assert texts == list(range(400))
    assert decoders() == [] and columnar._SHARED == []


def test_a_caller_that_stops_between_pieces_leaves_no_decoder(
    tmp_path: Path, small_pieces: None
) -> None:
    path = shard(tmp_path / "a.parquet", ROWS[:600], 100)
    rows = list(
        columnar.texts(
            "parquet",
            str(path),
            "a",
            kinds_base.Options(),
            kinds_base.Counters(),
            (0, 1),
            0,
            ahead=True,
        )
    )
    assert [r for r, _ in rows] == list(range(100))
    assert len(decoders()) == 1  # kept for the piece that starts at row group 1
    columnar.release_readers()
    assert decoders() == [] and columnar._SHARED == []


def test_the_last_pieces_file_hash_is_taken_after_it_is_tokenized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None
) -> None:
    """`--jobs 1`: the file's SHA-256 runs on its helper thread while the pieces are
    tokenized and is read once the last one is done: the manifest's hash is the file's."""
    import hashlib
    import json

    path = shard(tmp_path / "a.parquet", ROWS, 100)
    order: list[str] = []
    from matrixctl import io as mio

    real_result = mio.FileHash.result

    def result(self: mio.FileHash) -> str:
        order.append("hash")
        return real_result(self)

    real_tokenize = step._tokenize

    def tokenize(*args: object, **kwargs: object) -> None:
        order.append("piece")
        real_tokenize(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mio.FileHash, "result", result)
    monkeypatch.setattr(step, "_tokenize", tokenize)
    out = tmp_path / "p"
    pack(out, path)
    # The Parquet file's hash is taken after its 15 pieces (then the pack's atoms' hash).
    assert order[:16] == ["piece"] * 15 + ["hash"]
    manifest = json.loads((out / "ingest_manifest.json").read_text())
    want = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["sources"][0]["sha256"] == want
