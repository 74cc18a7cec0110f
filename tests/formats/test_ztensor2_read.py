"""zTensor 2 read path: zstd-seekable parts decode straight into the array with every frame
check of the streaming decoder (magic, content checksum, sizes); verify reads parts in shard
files found beside the root, after the identity ladder of spec 7.3."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from matrixctl.converters.tensors import open_source
from matrixctl.errors import FormatError
from matrixctl.formats import ztensor2
from matrixctl.validate.engine import examine
from tests.helpers.zt2craft import MAGIC, A, dense, make, part, xxh


def _file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(7)
    arr = (rng.integers(0, 64, (3 << 20) // 4 + 123) * 0.5).astype(np.float32)  # 4 frames
    path = tmp_path / "z.zt"
    ztensor2.save_file({"w": arr}, str(path), compress="zstd")
    return path, arr


def _frames(path: Path) -> tuple[int, list[tuple[int, int, int]]]:
    with open_source(str(path)) as src:
        part = src.zt.objects["w"].parts["data"]  # type: ignore[attr-defined]
        blob = bytes(src.src.buf[part.offset : part.end])  # type: ignore[attr-defined]
    return part.offset, ztensor2.seek_table(blob)


def _read(path: Path, verify: bool = False) -> np.ndarray:
    with open_source(str(path)) as src:
        (info,) = src.tensors()
        return np.array(src.array(info, verify=verify))


@pytest.mark.parametrize("verify", [False, True])
def test_zstd_part_decodes_into_the_array(tmp_path: Path, verify: bool) -> None:
    path, arr = _file(tmp_path)
    _, frames = _frames(path)
    assert len(frames) == 4
    got = _read(path, verify)
    assert got.dtype == np.float32
    assert np.array_equal(got, arr)


def _damage(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x5A
    path.write_bytes(bytes(data))


def test_damaged_frame_checksum_is_refused(tmp_path: Path) -> None:
    path, _ = _file(tmp_path)
    base, frames = _frames(path)
    pos, size, _ = frames[2]
    _damage(path, base + pos + size - 2)  # inside frame 2's content checksum
    with pytest.raises(FormatError) as err:
        _read(path)
    assert err.value.code == ztensor2.ZT2_ZSTD
    assert "frame 2" in str(err.value)


def test_damaged_frame_magic_is_refused(tmp_path: Path) -> None:
    path, _ = _file(tmp_path)
    base, frames = _frames(path)
    _damage(path, base + frames[1][0])
    with pytest.raises(FormatError) as err:
        _read(path)
    assert err.value.code == ztensor2.ZT2_ZSTD
    assert "frame 1" in str(err.value)


# Shards (spec 7): verify reads parts from <stem>-<shard>.zt beside the root ------------------

SHARD_DATA = np.arange(4, dtype="<f4").tobytes()


def _data_shard(blob: bytes) -> bytes:
    """Magic, the blob at 4096, the all-zero manifest footer of a data shard (spec 7.2)."""
    body = MAGIC + bytes(A - len(MAGIC)) + blob
    return body + struct.pack("<QQQII", 0, 0, 0, 2, 0) + MAGIC


def _sharded(
    tmp_path: Path,
    shard: bytes,
    *,
    size: int | None = None,
    digest: str | None = None,
    data_digest: str | None = None,
) -> Path:
    p = part(SHARD_DATA, A, shard="00001")
    if data_digest is not None:
        p["digest"] = data_digest
    root = make(
        {},
        {
            "objects": {"s": dense([4], p)},
            "shards": {
                "00001": {
                    "size": len(shard) if size is None else size,
                    "digest": xxh(shard) if digest is None else digest,
                }
            },
        },
    )
    path = tmp_path / "model.zt"
    path.write_bytes(root)
    (tmp_path / "model-00001.zt").write_bytes(shard)
    return path


def _codes(path: Path, scan: bool = True) -> list[str]:
    report, _ = examine(str(path), scan=scan)
    return [f.code for f in report.findings]


def test_verify_reads_parts_in_a_shard_beside_the_root(tmp_path: Path) -> None:
    path = _sharded(tmp_path, _data_shard(SHARD_DATA))
    report, _ = examine(str(path), scan=True)
    assert report.ok()
    assert "shard files: identity and part data" in report.checks
    messages = [f.message for f in report.findings if f.code == ztensor2.ZT2_SHARD_EXTERNAL]
    assert not any("not found" in m for m in messages)


def test_damaged_part_in_a_shard_is_found(tmp_path: Path) -> None:
    path = _sharded(tmp_path, _data_shard(SHARD_DATA), data_digest="xxh3:0000000000000000")
    assert ztensor2.ZT2_DIGEST in _codes(path)
    assert ztensor2.ZT2_DIGEST not in _codes(path, scan=False)  # inspect does not read shards


def test_shard_identity_ladder(tmp_path: Path) -> None:
    good = _data_shard(SHARD_DATA)
    assert ztensor2.ZT2_SHARD in _codes(_sharded(tmp_path, good, size=len(good) + 1))
    assert ztensor2.ZT2_DIGEST in _codes(_sharded(tmp_path, good, digest="xxh3:0000000000000000"))
    assert ztensor2.ZT2_MAGIC in _codes(_sharded(tmp_path, good[:-8] + b"NOTMAGIC"))


def test_missing_shard_is_a_warning(tmp_path: Path) -> None:
    path = _sharded(tmp_path, _data_shard(SHARD_DATA))
    (tmp_path / "model-00001.zt").unlink()
    report, _ = examine(str(path), scan=True)
    assert report.ok()
    assert any(
        f.code == ztensor2.ZT2_SHARD_EXTERNAL and "model-00001.zt not found" in f.message
        for f in report.findings
    )
