"""The manifest's SHA-256 of an input and its tokens come from the same bytes under `--jobs N`
(docs/reliability.md, "Inputs that change underneath"): the planner hashes a large file as
it cuts it into byte ranges and the workers read their ranges again, so a file rewritten in
place in between gave tokens of the new bytes under the old hash, and `verify` passed. Now
both sides check the file's (size, mtime_ns, inode): IO_CHANGED, as `--jobs 1` gives."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from matrixctl.errors import InputError
from matrixctl.ingest import units
from tests.helpers.cli import run_cli


def _small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(units, "SPLIT_MIN", 64 << 10)
    monkeypatch.setattr(units, "PIECE_BYTES", 16 << 10)


def _jsonl(path: Path, n: int = 3000) -> bytes:
    lines = [json.dumps({"text": f"alpha beta matrix {i} " * 6}) for i in range(n)]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    return data


def _rewrite_in_place(path: Path, data: bytes) -> None:
    """Same size, other bytes, a later modification time (surely, whatever the clock tick)."""
    with open(path, "r+b") as fp:
        fp.write(data.replace(b"alpha", b"ALPHA"))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def _step() -> Any:
    from matrixctl.ingest.kinds import base as kinds_base
    from matrixctl.ingest.step import Step
    from matrixctl.ingest.tokenizer import PiRecipe
    from matrixctl.tokenizers import pi

    smap, _ = pi.load_symbol_map(pi.default_map_path())
    raw = pi.read_map_bytes(pi.default_map_path())
    opts = kinds_base.Options("text", "skip", "error", kinds_base.MAX_WHOLE, "auto")
    step = Step(None, smap.eos_id, opts, "", "<u2")
    step.tok = PiRecipe(pi.check_map_bytes(raw, "map"), raw).build()
    return step


def _plan(path: Path, step: Any) -> Iterator[Any]:
    from matrixctl.ingest import executors
    from matrixctl.ingest.executors import processes
    from matrixctl.ingest.sources import enumerate_sources

    files, _ = enumerate_sources([str(path)], exclude=[])
    return executors.plan(files, step, 2, processes.CUTTING)


def test_a_worker_reads_its_range_only_from_the_file_that_was_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matrixctl.ingest.step import process_piece

    _small_pieces(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _jsonl(src)
    step = _step()
    step.spill_dir = str(tmp_path)
    first = next(_plan(src, step))
    assert isinstance(first, units.Piece) and first.length and first.identity is not None
    _rewrite_in_place(src, data)
    with pytest.raises(InputError) as err:
        process_piece(first, step)
    assert err.value.code == "IO_CHANGED" and err.value.path == str(src)


def test_the_planner_refuses_a_hash_of_two_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _small_pieces(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _jsonl(src)
    pieces = _plan(src, _step())
    next(pieces)
    _rewrite_in_place(src, data)
    with pytest.raises(InputError) as err:
        list(pieces)
    assert err.value.code == "IO_CHANGED" and err.value.path == str(src)


def test_jobs_2_fails_with_io_changed_on_an_input_rewritten_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole build: the file is rewritten in place once its first piece is cut. Before,
    exit 0 with the old file's SHA-256 over tokens of the new bytes."""
    _small_pieces(monkeypatch)
    src = tmp_path / "big.jsonl"
    data = _jsonl(src)
    real = units._split_stored

    def rewriting(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for i, piece in enumerate(real(*args, **kwargs)):
            yield piece
            if i == 0:
                _rewrite_in_place(src, data)

    monkeypatch.setattr(units, "_split_stored", rewriting)
    out = tmp_path / "pack"
    run = run_cli("ingest", "docs", str(src), "-o", str(out), "--jobs", "2")
    assert run.code == 2, run.stderr
    assert "error[IO_CHANGED]" in run.stderr and str(src) in run.stderr
    assert "Traceback" not in run.stderr and not out.exists()


def test_a_parquet_piece_is_read_only_from_the_file_that_was_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row-group pieces are read by path (pyarrow): the worker checks the file's identity
    before and after, and the planner after its hash, as for byte ranges."""
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow

    from matrixctl.ingest.step import process_piece

    _small_pieces(monkeypatch)
    src = tmp_path / "big.parquet"
    texts = [f"alpha beta matrix {i} " * 20 for i in range(4000)]
    pq.write_table(pyarrow.table({"text": texts}), src, row_group_size=200)
    assert src.stat().st_size > 64 << 10
    step = _step()
    step.spill_dir = str(tmp_path)
    pieces = _plan(src, step)
    first = next(pieces)
    assert isinstance(first, units.Piece) and first.kind == "parquet"
    assert first.identity is not None
    st = src.stat()
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # rewritten, same bytes
    with pytest.raises(InputError) as err:
        process_piece(first, step)
    assert err.value.code == "IO_CHANGED" and err.value.path == str(src)
    with pytest.raises(InputError) as err:
        list(pieces)  # the last piece: its hash is checked against the file cut
    assert err.value.code == "IO_CHANGED"
