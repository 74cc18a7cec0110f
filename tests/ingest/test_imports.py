"""`convert PREFIX.idx PACKDIR --to pack` and `convert MDSDIR PACKDIR --to pack`
(matrixctl/ingest/imports.py): a pack exported and converted back has the same documents; what
the real writers make converts; ids outside the π map and damaged inputs are refused with one
error line and nothing written."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

import matrixctl
from tests.helpers.cli import FIXTURES, run_cli
from tests.helpers.consumers import megatron_indexed, streaming


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("imports") / "pack"
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(out), "--atom-size", "16")
    assert res.code == 0, res.stderr
    return out


def _docs(path: Path) -> list[list[int]]:
    ds = matrixctl.open_pack(path)
    return [ds.document(j).tolist() for j in range(ds.documents)]


@pytest.mark.parametrize(("to", "src"), [("megatron", "m.idx"), ("mds", "mds")])
def test_an_exported_pack_converts_back_to_the_same_documents(
    pack: Path, tmp_path: Path, to: str, src: str
) -> None:
    out = tmp_path / ("m" if to == "megatron" else "mds")
    assert run_cli("convert", str(pack), str(out), "--to", to).code == 0
    back = tmp_path / "back"
    res = run_cli("convert", str(tmp_path / src), str(back), "--to", "pack")
    assert res.code == 0, res.stderr
    assert run_cli("verify", str(back)).code == 0
    assert _docs(back) == _docs(pack)
    original, again = matrixctl.open_pack(pack), matrixctl.open_pack(back)
    assert again.eos_id == original.eos_id and again.vocab_size == original.vocab_size
    assert again.atom_size == 256  # ingest docs' default: the export does not carry one


def test_megatron_cores_dataset_converts_and_keeps_its_documents(tmp_path: Path) -> None:
    indexed = megatron_indexed()
    import torch

    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.int32)
    builder.add_document(torch.tensor([5, 6, 7, 8]), [2, 2])  # one document, two sequences
    builder.add_document(torch.tensor([9]), [1])
    builder.finalize(str(tmp_path / "ref.idx"))
    res = run_cli("convert", str(tmp_path / "ref.idx"), str(tmp_path / "p"), "--to", "pack")
    assert res.code == 0, res.stderr
    assert _docs(tmp_path / "p") == [[5, 6, 7, 8], [9]]
    assert matrixctl.open_pack(tmp_path / "p").eos_id is None  # they do not end with eos
    assert run_cli("verify", str(tmp_path / "p")).code == 0


def test_mosaicmls_dataset_converts(tmp_path: Path) -> None:
    sm = streaming()
    with sm.MDSWriter(
        out=str(tmp_path / "mds"), columns={"input_ids": "ndarray:int64", "n": "int"}
    ) as writer:
        writer.write({"input_ids": np.array([3, 4, 5]), "n": 1})
        writer.write({"input_ids": np.array([7]), "n": 2})
    res = run_cli("convert", str(tmp_path / "mds"), str(tmp_path / "p"), "--to", "pack")
    assert res.code == 0, res.stderr
    assert _docs(tmp_path / "p") == [[3, 4, 5], [7]]


def test_ids_outside_the_map_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    head = struct.pack("<9sQBQQ", b"MMIDIDX\0\0", 1, 4, 1, 2)
    idx = head + struct.pack("<i", 2) + struct.pack("<q", 0) + struct.pack("<qq", 0, 1)
    (tmp_path / "big.idx").write_bytes(idx)
    (tmp_path / "big.bin").write_bytes(np.array([1, 1 << 30], "<i4").tobytes())
    res = run_cli("convert", str(tmp_path / "big.idx"), str(tmp_path / "p"), "--to", "pack")
    assert res.code == 1 and "error[IMPORT_IDS]" in res.stderr and "Traceback" not in res.stderr
    assert sorted(os.listdir(tmp_path)) == ["big.bin", "big.idx"]


def test_damaged_inputs_are_refused_with_the_code_verify_reports(
    pack: Path, tmp_path: Path
) -> None:
    assert run_cli("convert", str(pack), str(tmp_path / "m"), "--to", "megatron").code == 0
    idx = bytearray((tmp_path / "m.idx").read_bytes())
    struct.pack_into("<q", idx, 34 + 4 * 3 + 8 * 1, 5)  # a pointer into another sequence
    (tmp_path / "m.idx").write_bytes(bytes(idx))
    res = run_cli("convert", str(tmp_path / "m.idx"), str(tmp_path / "p"), "--to", "pack")
    assert res.code == 1 and "error[MEGATRON_POINTERS]" in res.stderr
    (tmp_path / "m.idx").write_bytes(bytes(idx[:-3]))
    res = run_cli("convert", str(tmp_path / "m.idx"), str(tmp_path / "p"), "--to", "pack")
    assert res.code == 1 and "error[MEGATRON_SIZE]" in res.stderr
    assert not (tmp_path / "p").exists()
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []
