"""`convert PACKDIR OUT --to megatron | mds | hf-parquet` (matrixctl/converters/training.py):
each export read back by its real reader document for document, its bytes equal to what the
format's own writer makes of the same documents, deterministic, atomic."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

import matrixctl
from matrixctl.errors import OutputError
from tests.helpers.cli import FIXTURES, run_cli
from tests.helpers.consumers import megatron_indexed, streaming


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("exports") / "pack"
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(out), "--atom-size", "16")
    assert res.code == 0, res.stderr
    return out


def _docs(pack: Path) -> list[np.ndarray]:
    ds = matrixctl.open_pack(pack)
    return [np.array(ds.document(j)) for j in range(ds.documents)]


def _convert(pack: Path, dst: Path, to: str) -> None:
    res = run_cli("convert", str(pack), str(dst), "--to", to)
    assert res.code == 0, res.stderr


def test_megatron_export_is_read_by_megatron_core_and_is_its_builders_bytes(
    pack: Path, tmp_path: Path
) -> None:
    indexed = megatron_indexed()
    import torch

    _convert(pack, tmp_path / "ours", "megatron")
    docs = _docs(pack)
    ds = indexed.IndexedDataset(str(tmp_path / "ours"))
    assert len(ds) == len(docs)
    for i, doc in enumerate(docs):
        assert ds[i].dtype == np.uint16
        np.testing.assert_array_equal(ds[i], doc)
    assert list(ds.document_indices) == list(range(len(docs) + 1))  # one sequence a document
    builder = indexed.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for doc in docs:
        builder.add_document(torch.from_numpy(doc.astype(np.int64)), [len(doc)])
    builder.finalize(str(tmp_path / "ref.idx"))
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"ref{ext}").read_bytes()


def test_megatron_idx_bytes_by_the_documented_layout(pack: Path, tmp_path: Path) -> None:
    """Read by hand from docs/formats/megatron.md, without megatron-core."""
    _convert(pack, tmp_path / "p", "megatron")
    docs = _docs(pack)
    idx = (tmp_path / "p.idx").read_bytes()
    magic, version, code, seqs, ndocs = struct.unpack_from("<9sQBQQ", idx)
    assert (magic, version, code, seqs, ndocs) == (b"MMIDIDX\0\0", 1, 8, len(docs), len(docs) + 1)
    lengths = np.frombuffer(idx, "<i4", seqs, 34)
    pointers = np.frombuffer(idx, "<i8", seqs, 34 + 4 * seqs)
    indices = np.frombuffer(idx, "<i8", ndocs, 34 + 12 * seqs)
    assert len(idx) == 34 + 12 * seqs + 8 * ndocs
    assert lengths.tolist() == [len(d) for d in docs]
    assert pointers.tolist() == np.concatenate([[0], np.cumsum(lengths[:-1]) * 2]).tolist()
    assert indices.tolist() == list(range(seqs + 1))
    assert (tmp_path / "p.bin").read_bytes() == b"".join(d.astype("<u2").tobytes() for d in docs)


def test_mds_export_is_read_by_streaming_and_is_its_writers_bytes(
    pack: Path, tmp_path: Path
) -> None:
    sm = streaming()
    _convert(pack, tmp_path / "ours", "mds")
    docs = _docs(pack)
    ds = sm.StreamingDataset(local=str(tmp_path / "ours"), shuffle=False, batch_size=1)
    assert ds.num_samples == len(docs)
    for i, doc in enumerate(docs):
        np.testing.assert_array_equal(ds[i]["input_ids"], doc)
    with sm.MDSWriter(
        out=str(tmp_path / "ref"), columns={"input_ids": "ndarray:uint16"}, hashes=["sha1"]
    ) as writer:
        for doc in docs:
            writer.write({"input_ids": doc})
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "ref"))
    for name in os.listdir(tmp_path / "ref"):
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


def test_mds_shards_are_cut_where_streaming_cuts_them(
    pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sm = streaming()
    from matrixctl.formats import mds

    monkeypatch.setattr(mds, "SIZE_LIMIT", 700)
    matrixctl.convert(pack, tmp_path / "ours", to="mds")
    docs = _docs(pack)
    with sm.MDSWriter(
        out=str(tmp_path / "ref"),
        columns={"input_ids": "ndarray:uint16"},
        hashes=["sha1"],
        size_limit=700,
    ) as writer:
        for doc in docs:
            writer.write({"input_ids": doc})
    names = sorted(os.listdir(tmp_path / "ref"))
    assert len(names) > 3 and sorted(os.listdir(tmp_path / "ours")) == names
    for name in names:
        assert (tmp_path / "ours" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    ds = sm.StreamingDataset(local=str(tmp_path / "ours"), shuffle=False, batch_size=1)
    assert [ds[i]["input_ids"].tolist() for i in range(ds.num_samples)] == [
        d.tolist() for d in docs
    ]


def test_hf_parquet_export_is_loaded_by_datasets(pack: Path, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    _convert(pack, tmp_path / "hf", "hf-parquet")
    docs = _docs(pack)
    files = sorted(str(p) for p in (tmp_path / "hf").glob("*.parquet"))
    assert [os.path.basename(f) for f in files] == ["data-00000-of-00001.parquet"]
    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "cache")
    )
    assert len(ds) == len(docs)
    assert [row["input_ids"] for row in ds] == [d.tolist() for d in docs]


def test_hf_parquet_row_groups_and_files_split_documents_whole(
    pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from matrixctl.converters import training

    monkeypatch.setattr(training, "PARQUET_SHARD", 300)
    monkeypatch.setattr(training, "PARQUET_TOKENS", 100)
    matrixctl.convert(pack, tmp_path / "hf", to="hf-parquet")
    files = sorted((tmp_path / "hf").glob("*.parquet"))
    assert len(files) > 1 and files[0].name.endswith(f"-of-{len(files):05}.parquet")
    rows = [r for f in files for r in pq.read_table(f).column("input_ids").to_pylist()]
    assert rows == [d.tolist() for d in _docs(pack)]
    assert max(pq.ParquetFile(files[0]).metadata.num_row_groups for _ in [0]) >= 1


@pytest.mark.parametrize("to", ["megatron", "mds", "hf-parquet"])
def test_exports_are_deterministic(pack: Path, tmp_path: Path, to: str) -> None:
    pytest.importorskip("pyarrow")
    outs = []
    for name in ("a", "b"):
        _convert(pack, tmp_path / name, to)
        if to == "megatron":
            outs.append([(tmp_path / f"{name}{e}").read_bytes() for e in (".bin", ".idx")])
        else:
            folder = tmp_path / name
            outs.append([(f.name, f.read_bytes()) for f in sorted(folder.iterdir())])
    assert outs[0] == outs[1]


def test_an_output_folder_that_is_not_empty_is_never_replaced(pack: Path, tmp_path: Path) -> None:
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = run_cli("convert", str(pack), str(out), "--to", "mds")
    assert res.code == 2 and "EXPORT_OUTPUT" in res.stderr and "Traceback" not in res.stderr
    assert os.listdir(out) == ["keep.txt"]
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []
    with pytest.raises(OutputError):
        matrixctl.convert(pack, out, to="hf-parquet")
    empty = tmp_path / "empty"
    empty.mkdir()
    matrixctl.convert(pack, empty, to="mds")  # an empty folder is filled
    assert (empty / "index.json").is_file()


def test_a_damaged_pack_is_refused_and_nothing_is_written(pack: Path, tmp_path: Path) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(pack, bad)
    atoms = bad / "matrix_atoms.bin"
    atoms.write_bytes(atoms.read_bytes()[:-8])  # cut: the manifest's size no longer matches
    for to in ("megatron", "mds", "hf-parquet"):
        res = run_cli("convert", str(bad), str(tmp_path / f"out-{to}"), "--to", to)
        assert res.code == 1 and res.stderr.count("error[") == 1, res.stderr
        assert "Traceback" not in res.stderr
    assert sorted(os.listdir(tmp_path)) == ["bad"]


def test_convert_json_summary(pack: Path, tmp_path: Path) -> None:
    res = run_cli("convert", "--json", str(pack), str(tmp_path / "m"), "--to", "megatron")
    doc = json.loads(res.stdout)
    assert doc["from"] == "ingest-pack" and doc["to"] == "megatron"
    assert doc["documents"] == matrixctl.open_pack(pack).documents
