"""inspect/verify of a Megatron .idx/.bin pair (matrixctl/validate/megatron.py): what
megatron-core's own builder writes passes; every cut, hostile count and broken array is one
error line with its code, never a traceback."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import run_cli

DOCS = [[5, 6, 7], [8], [9, 10, 11, 12], [1, 2]]


def _write(prefix: Path, docs: list[list[int]] = DOCS, code: int = 8) -> None:
    """The documented layout (docs/formats/megatron.md), written by hand."""
    dtype = {8: "<u2", 4: "<i4"}[code]
    lengths = np.array([len(d) for d in docs], "<i4")
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype("<i8") * item
    head = struct.pack("<9sQBQQ", b"MMIDIDX\0\0", 1, code, len(docs), len(docs) + 1)
    idx = head + lengths.tobytes() + pointers.tobytes()
    idx += np.arange(len(docs) + 1, dtype="<i8").tobytes()
    prefix.with_suffix(".idx").write_bytes(idx)
    prefix.with_suffix(".bin").write_bytes(b"".join(np.array(d, dtype).tobytes() for d in docs))


def _codes(path: Path, cmd: str = "verify") -> tuple[int, list[str], str]:
    res = run_cli(cmd, "--json", str(path))
    assert "Traceback" not in res.stderr
    doc = res.json()["files"][0]
    return res.code, [f["code"] for f in doc["findings"]], doc["format"]


def test_megatron_cores_own_files_pass(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    import torch

    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.int32)
    for doc in DOCS:
        builder.add_document(torch.tensor(doc), [len(doc)])
    builder.finalize(str(tmp_path / "ref.idx"))
    assert _codes(tmp_path / "ref.idx") == (0, [], "megatron")
    res = run_cli("inspect", "--json", str(tmp_path / "ref.idx"))
    desc = res.json()["files"][0]
    assert desc["header"]["dtype"] == "int32" and desc["header"]["sequence_count"] == 4


def test_hand_written_pair_passes_and_describes(tmp_path: Path) -> None:
    _write(tmp_path / "d")
    assert _codes(tmp_path / "d.idx") == (0, [], "megatron")


def test_every_cut_of_the_idx_is_one_error(tmp_path: Path) -> None:
    _write(tmp_path / "d")
    whole = (tmp_path / "d.idx").read_bytes()
    for n in range(len(whole)):
        (tmp_path / "d.idx").write_bytes(whole[:n])
        code, found, _ = _codes(tmp_path / "d.idx")
        assert code == 1, n
        if n >= 9:  # a cut magic is no Megatron file at all (UNKNOWN_FORMAT)
            assert found in (["MEGATRON_HEADER"], ["MEGATRON_SIZE"]), (n, found)


def test_a_cut_or_missing_bin(tmp_path: Path) -> None:
    _write(tmp_path / "d")
    data = (tmp_path / "d.bin").read_bytes()
    (tmp_path / "d.bin").write_bytes(data[:-1])
    assert _codes(tmp_path / "d.idx", "inspect")[1] == ["MEGATRON_SIZE"]
    (tmp_path / "d.bin").unlink()
    assert _codes(tmp_path / "d.idx")[1] == ["MEGATRON_MISSING"]


def test_hostile_counts_are_refused_before_anything_is_read(tmp_path: Path) -> None:
    _write(tmp_path / "d")
    idx = bytearray((tmp_path / "d.idx").read_bytes())
    struct.pack_into("<Q", idx, 0x12, 1 << 60)  # sequence_count
    (tmp_path / "d.idx").write_bytes(bytes(idx))
    assert _codes(tmp_path / "d.idx")[:2] == (1, ["MEGATRON_SIZE"])


@pytest.mark.parametrize(
    ("offset", "value", "fmt", "code"),
    [
        (0x11, 99, "<B", "MEGATRON_DTYPE"),
        (0x09, 2, "<Q", "MEGATRON_HEADER"),
        (34 + 4 * 4 + 8 * 2, 3, "<q", "MEGATRON_POINTERS"),  # sequence 2's pointer
        (34 + 4 * 1, -1, "<i", "MEGATRON_POINTERS"),  # sequence 1's length
        (34 + 12 * 4 + 8 * 2, 0, "<q", "MEGATRON_DOCUMENTS"),  # document index 2 goes back
        (34 + 12 * 4, 1, "<q", "MEGATRON_DOCUMENTS"),  # does not start at 0
        (34 + 12 * 4 + 8 * 4, 3, "<q", "MEGATRON_DOCUMENTS"),  # does not end at the count
    ],
)
def test_broken_fields(tmp_path: Path, offset: int, value: int, fmt: str, code: str) -> None:
    _write(tmp_path / "d")
    idx = bytearray((tmp_path / "d.idx").read_bytes())
    struct.pack_into(fmt, idx, offset, value)
    (tmp_path / "d.idx").write_bytes(bytes(idx))
    rc, found, _ = _codes(tmp_path / "d.idx")
    assert rc == 1 and found[0] == code, found
