"""`--jobs 1` under `--on-error fail`: a unit's tokens past MEM_TOKENS go straight into the
atoms (the serial executor's `WriteThrough` sink) instead of a spill file the writer copies
again (docs/inputs.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from matrixctl.ingest import step as ingest_step
from matrixctl.ingest import tokenizer as ingest_tokenizer
from matrixctl.ingest import units as ingest_units
from matrixctl.ingest import writer
from tests.helpers.cli import run_cli

ROWS = [{"text": f"record {i} " + "caf\u00e9 the quick brown fox " * (i % 9)} for i in range(600)]


def small_units(monkeypatch: pytest.MonkeyPatch, mem: int) -> None:
    monkeypatch.setattr(ingest_step, "MEM_TOKENS", mem)
    monkeypatch.setattr(ingest_tokenizer, "TEXT_BATCH", 256)
    monkeypatch.setattr(ingest_units, "SPLIT_MIN", 4096)
    monkeypatch.setattr(ingest_units, "PIECE_BYTES", 2048)


def built(out: Path) -> dict[str, bytes]:
    """The pack's token-bearing artifacts (the manifest records the options, which differ)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix != ".json"}


@pytest.fixture
def sunk(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of tokens each call of the sink wrote."""
    calls: list[int] = []
    real = writer.TokenBuffer.write_through

    def spy(self: writer.TokenBuffer, parts: list) -> None:
        calls.append(sum(int(p.size) for p in parts))
        real(self, parts)

    monkeypatch.setattr(writer.TokenBuffer, "write_through", spy)
    return calls


def test_tokens_written_through_give_the_bytes_of_the_spill_and_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sunk: list[int]
) -> None:
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    small = tmp_path / "small.txt"  # a whole small file before the pieces, held in memory
    small.write_text("a small document before the big one\n", encoding="utf-8")
    packs = {}
    for name, mem, policy in (
        ("memory", 1 << 22, "fail"),  # everything in memory: no sink, no spill
        ("through", 50, "fail"),  # the sink
        ("spill", 50, "skip"),  # --on-error skip: the spill file, as before
    ):
        small_units(monkeypatch, mem)
        sunk.clear()
        out = tmp_path / name
        run = run_cli("ingest", "docs", str(small), str(src), "-o", str(out), "--on-error", policy)
        assert run.code == 0, run.stderr
        packs[name] = built(out)
        if name == "through":
            assert len(sunk) > 10 and all(n >= 50 for n in sunk)
        else:
            assert sunk == []
    assert packs["through"] == packs["memory"] == packs["spill"]


def test_parquet_row_groups_written_through_give_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sunk: list[int]
) -> None:
    pyarrow = pytest.importorskip("pyarrow")
    from pyarrow import parquet

    src = tmp_path / "r.parquet"
    parquet.write_table(pyarrow.table({"text": [r["text"] for r in ROWS]}), src, row_group_size=200)
    packs = []
    for mem in (1 << 22, 40):
        small_units(monkeypatch, mem)
        sunk.clear()
        out = tmp_path / f"p{mem}"
        run = run_cli("ingest", "docs", str(src), "-o", str(out))
        assert run.code == 0, run.stderr
        packs.append(built(out))
        assert bool(sunk) == (mem == 40)
    assert packs[0] == packs[1]


def test_a_failure_after_tokens_were_written_through_leaves_no_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sunk: list[int]
) -> None:
    """The sink is sound because a failure ends the build: the pack's temporary folder, with
    the atoms written so far, is removed, and an earlier pack at the destination is kept."""
    lines = [json.dumps(r) for r in ROWS]
    lines[450] = '{"text": "broken'
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    small_units(monkeypatch, 50)
    out = tmp_path / "pack"
    run = run_cli("ingest", "docs", str(src), "-o", str(out))
    assert run.code == 1 and "INGEST_JSON" in run.stderr and "line 451" in run.stderr
    assert sunk  # tokens of earlier pieces had gone into the atoms
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]
