"""inspect/verify of an MDS folder (matrixctl/validate/mds.py): what MosaicML's own writer
makes passes, with any hash it records; cut shards, wrong hashes, hostile counts and names and
broken samples are each one error with its code, never a traceback."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import run_cli
from tests.helpers.consumers import streaming

DOCS = [np.arange(1, n + 1, dtype=np.uint16) for n in (3, 1, 300, 7, 2)]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    sm = streaming()
    out = tmp_path / "mds"
    with sm.MDSWriter(
        out=str(out), columns={"input_ids": "ndarray:uint16"}, hashes=["sha1", "xxh64"]
    ) as writer:
        for doc in DOCS:
            writer.write({"input_ids": doc})
    return out


def _codes(path: Path, cmd: str = "verify") -> tuple[int, list[str]]:
    res = run_cli(cmd, "--json", str(path))
    assert "Traceback" not in res.stderr
    doc = res.json()["files"][0]
    return res.code, [f["code"] for f in doc["findings"]]


def _index(folder: Path) -> dict:
    return json.loads((folder / "index.json").read_text())


def test_mosaicmls_own_folder_passes_with_every_hash_checked(folder: Path) -> None:
    assert _codes(folder) == (0, [])
    res = run_cli("inspect", "--json", str(folder))
    desc = res.json()["files"][0]
    assert desc["format"] == "mds" and desc["samples"] == len(DOCS)
    assert desc["columns"] == {"input_ids": "ndarray:uint16"}


def test_a_cut_shard_is_the_one_finding(folder: Path) -> None:
    shard = folder / "shard.00000.mds"
    data = shard.read_bytes()
    for n in (0, 3, 10, len(data) // 2, len(data) - 1):
        shard.write_bytes(data[:n])
        code, found = _codes(folder)
        assert code == 1 and found == ["MDS_SHARD"], (n, found)
    shard.unlink()
    assert _codes(folder, "inspect") == (1, ["MDS_SHARD"])


def test_a_changed_byte_fails_the_recorded_hashes(folder: Path) -> None:
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01  # the last id: sizes and headers stay right
    shard.write_bytes(bytes(data))
    assert _codes(folder, "inspect") == (0, [])
    assert _codes(folder) == (1, ["MDS_HASH", "MDS_HASH"])


def test_broken_sample_header_is_found(folder: Path) -> None:
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    first = struct.unpack_from("<I", data, 4)[0]  # sample 0's offset
    data[first + 4] = 2 << 2  # ndim 2 instead of 1
    shard.write_bytes(bytes(data))
    index = _index(folder)
    index["shards"][0]["raw_data"]["hashes"] = {}
    (folder / "index.json").write_text(json.dumps(index))
    assert _codes(folder) == (1, ["MDS_SAMPLE"])


@pytest.mark.parametrize(
    "change",
    [
        lambda e: e["raw_data"].update(basename="../escape.mds"),
        lambda e: e.update(samples="five"),
        lambda e: e.update(compression=None, format="csv"),
        lambda e: e["raw_data"].pop("bytes"),
    ],
)
def test_hostile_index_entries(folder: Path, change: object) -> None:
    index = _index(folder)
    change(index["shards"][0])  # type: ignore[operator]
    (folder / "index.json").write_text(json.dumps(index))
    code, found = _codes(folder)
    assert code == 1 and found[0] == "MDS_INDEX", found


def test_hostile_sample_counts_are_checked_against_the_shard_size(folder: Path) -> None:
    shard = folder / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    struct.pack_into("<I", data, 0, 0xFFFFFFFF)
    shard.write_bytes(bytes(data))
    index = _index(folder)
    index["shards"][0]["samples"] = 0xFFFFFFFF
    index["shards"][0]["raw_data"]["hashes"] = {}
    (folder / "index.json").write_text(json.dumps(index))
    assert _codes(folder) == (1, ["MDS_SHARD"])


def test_an_index_that_is_not_json(folder: Path) -> None:
    (folder / "index.json").write_bytes(b'{"shards": [{"format": "mds"')
    code, found = _codes(folder)
    assert code == 1 and found == ["MDS_INDEX"]


def test_config_embedded_in_the_shard_must_match_the_entry(folder: Path) -> None:
    index = _index(folder)
    index["shards"][0]["size_limit"] = 123
    (folder / "index.json").write_text(json.dumps(index))
    assert _codes(folder, "inspect") == (1, ["MDS_SHARD"])
