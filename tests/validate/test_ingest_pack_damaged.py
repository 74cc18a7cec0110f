"""`verify` of an ingest pack whose atom file is damaged reports it and never raises
(docs/reliability.md, "Arguments"; the API's `verify` / `inspect` contract)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import matrixctl
from tests.helpers.cli import FIXTURES, run_cli


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pack") / "pk"
    assert run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(out)).code == 0
    return out


@pytest.mark.parametrize("data_offset", [0, 65, 1 << 40, (1 << 64) - 1])
def test_a_hostile_data_offset_in_the_atom_file_is_a_finding(
    pack: Path, tmp_path: Path, data_offset: int
) -> None:
    """The pack's consistency rule read the padding tokens at the header's data_offset after
    checking the size against the fixed 64: numpy's ValueError, exit 70 (INTERNAL)."""
    import shutil

    bad = tmp_path / "pk"
    shutil.copytree(pack, bad)
    atoms = bad / "matrix_atoms.bin"
    raw = bytearray(atoms.read_bytes())
    raw[0x28:0x30] = struct.pack("<Q", data_offset)
    atoms.write_bytes(bytes(raw))
    run = run_cli("verify", str(bad))
    assert run.code == 1, run.stderr
    assert "INTERNAL" not in run.stderr and "ATOM_DATA_OFFSET" in run.out + run.stderr
    report = matrixctl.verify(bad)
    assert not report.ok() and any("ATOM_DATA_OFFSET" in f.message for f in report.findings)
    assert not matrixctl.inspect(bad, full=True, stats=True)["ok"]


@pytest.mark.parametrize(
    ("offset", "length"), [((1 << 64) - 1000, 5), (0, (1 << 64) - 1), ((1 << 63) + 7, 1 << 63)]
)
def test_index_records_beyond_the_payload_are_a_finding(
    pack: Path, tmp_path: Path, offset: int, length: int
) -> None:
    """A record's token_offset + token_length, each a u64, wrapped negative as int64 and
    indexed the tokens from the end: IndexError, exit 70."""
    import shutil

    from matrixctl.formats import doc_index

    bad = tmp_path / "pk"
    shutil.copytree(pack, bad)
    index = bad / "doc_index.bin"
    raw = bytearray(index.read_bytes())
    at = doc_index.HEADER_SIZE
    raw[at : at + 16] = struct.pack("<QQ", offset, length)
    index.write_bytes(bytes(raw))
    run = run_cli("verify", str(bad))
    assert run.code == 1, run.stderr
    assert "INTERNAL" not in run.stderr and "PACK_INDEX" in run.stderr
    assert not matrixctl.verify(bad).ok()
