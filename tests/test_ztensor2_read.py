"""zTensor 2 read path: zstd-seekable parts decode straight into the array with every frame
check of the streaming decoder (magic, content checksum, sizes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from matrixctl.convert.tensors import open_source
from matrixctl.errors import FormatError
from matrixctl.formats import ztensor2 as z2


def _file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(7)
    arr = (rng.integers(0, 64, (3 << 20) // 4 + 123) * 0.5).astype(np.float32)  # 4 frames
    path = tmp_path / "z.zt"
    z2.save_file({"w": arr}, str(path), compress="zstd")
    return path, arr


def _frames(path: Path) -> tuple[int, list[tuple[int, int, int]]]:
    with open_source(str(path)) as src:
        part = src.zt.objects["w"].parts["data"]  # type: ignore[attr-defined]
        blob = bytes(src.src.buf[part.offset : part.end])  # type: ignore[attr-defined]
    return part.offset, z2.seek_table(blob)


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
    assert err.value.code == z2.ZT2_ZSTD
    assert "frame 2" in str(err.value)


def test_damaged_frame_magic_is_refused(tmp_path: Path) -> None:
    path, _ = _file(tmp_path)
    base, frames = _frames(path)
    _damage(path, base + frames[1][0])
    with pytest.raises(FormatError) as err:
        _read(path)
    assert err.value.code == z2.ZT2_ZSTD
    assert "frame 1" in str(err.value)
