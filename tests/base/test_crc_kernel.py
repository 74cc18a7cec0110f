"""The compiled CRC-32C (matrixctl/_crc_kernel.c) against google_crc32c, an independent
implementation: every length around the kernel's block and alignment edges, continued values,
the portable table loop, and buffers google_crc32c refuses (mapped-file slices)."""

from __future__ import annotations

import mmap
import random
from pathlib import Path

import google_crc32c
import pytest

from matrixctl import _crc_kernel, crc

BLOCK = 4096
DATA = random.Random(7).randbytes(5 * 3 * BLOCK + 123)


def reference(data: bytes, value: int = 0) -> int:
    return int(google_crc32c.extend(value, bytes(data)))


def test_check_value() -> None:
    # The catalogue check value of CRC-32C ("123456789").
    assert crc.crc32c(b"123456789") == 0xE3069283
    assert _crc_kernel.crc32c_table(b"123456789") == 0xE3069283
    assert crc.crc32c(b"") == 0


LENGTHS = [0, 1, 7, 8, 9, 63, 3 * BLOCK - 1, 3 * BLOCK, 3 * BLOCK + 1, 6 * BLOCK + 9, len(DATA) - 9]


@pytest.mark.parametrize("start", [0, 1, 3, 7, 8])
@pytest.mark.parametrize("length", LENGTHS)
def test_matches_google_crc32c(start: int, length: int) -> None:
    piece = DATA[start : start + length]
    for value in (0, 0xFFFFFFFF, 0x12345678):
        want = reference(piece, value)
        assert crc.crc32c(memoryview(DATA)[start : start + length], value) == want
        assert _crc_kernel.crc32c_table(piece, value) == want


def test_continuing_equals_one_pass() -> None:
    rng = random.Random(3)
    value = 0
    pos = 0
    while pos < len(DATA):
        step = rng.randrange(1, 20000)
        value = crc.crc32c(DATA[pos : pos + step], value)
        pos += step
    assert value == reference(DATA)


def test_takes_a_mapped_file_slice(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    with path.open("rb") as fp, mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            assert crc.crc32c(view[5:70000]) == reference(DATA[5:70000])
            assert crc.crc32c(mm) == reference(DATA)
        finally:
            view.release()


def test_refuses_what_is_not_a_buffer() -> None:
    with pytest.raises(TypeError):
        crc.crc32c("text")  # type: ignore[arg-type]
