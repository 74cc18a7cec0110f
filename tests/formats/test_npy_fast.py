"""The fast paths of .npy/.npz: the header's parse (numpy's canonical spelling) gives what
ast.literal_eval gives, every other spelling still goes to ast.literal_eval; the members' CRC-32
by matrixctl's CRC gives zipfile's own bytes and leaves zipfile as it was."""

from __future__ import annotations

import ast
import io
import threading
import zipfile
import zlib

import numpy as np
import pytest

from matrixctl.formats import npy


@pytest.mark.parametrize(
    ("dtype", "shape", "fortran"),
    [
        ("<f4", (65536,), False),
        ("<f8", (), False),
        ("|u1", (0,), False),
        ("<i8", (2, 3), True),
        (">f2", (1, 2, 3, 4), False),
        ("|b1", (10, 0), False),
        ("<c16", (12345678901,), False),
    ],
)
def test_numpy_headers_parse_as_literal_eval_reads_them(
    dtype: str, shape: tuple[int, ...], fortran: bool
) -> None:
    buf = io.BytesIO()
    header = {"descr": dtype, "fortran_order": fortran, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    text = buf.getvalue()[10:].decode("latin1")
    fast = npy._canonical_header(text)
    assert fast is not None, text
    assert fast == ast.literal_eval(text)
    assert type(fast["shape"]) is tuple


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (1, 0, 5)])
def test_matrixctl_headers_take_the_fast_parse(shape: tuple[int, ...]) -> None:
    head = npy.header_bytes("f32", shape)
    text = head[10:].decode("latin1")
    assert npy._canonical_header(text) == ast.literal_eval(text)
    assert npy.parse_header(head).shape == shape


@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }\n",  # an int, not a tuple
        "{'descr': '<f4', 'fortran_order': False, 'shape': (02,), }\n",  # leading zero
        "{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}\n",  # another key order
        "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }\n",
        "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }\n",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2,),}\n",
    ],
)
def test_other_spellings_go_to_literal_eval(text: str) -> None:
    assert npy._canonical_header(text) is None


def _zip_with_one_member(data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        info = zipfile.ZipInfo("m.npy", date_time=(1980, 1, 1, 0, 0, 0))
        info.file_size = len(data)
        with zf.open(info, "w") as fp:
            fp.write(data[:5])
            fp.write(memoryview(data)[5:])
    return buf.getvalue()


def test_members_written_under_fast_zip_crc_are_zipfiles_own_bytes() -> None:
    data = bytes(range(256)) * 1000 + b"tail"
    plain = _zip_with_one_member(data)
    own = zipfile.crc32  # type: ignore[attr-defined]
    with npy.fast_zip_crc():
        assert zipfile.crc32 is not own  # type: ignore[attr-defined]
        fast = _zip_with_one_member(data)
    assert zipfile.crc32 is own  # type: ignore[attr-defined]
    assert fast == plain
    assert zlib.crc32(data) == zipfile.ZipFile(io.BytesIO(fast)).getinfo("m.npy").CRC


def test_fast_zip_crc_is_put_back_after_the_last_of_overlapping_blocks() -> None:
    own = zipfile.crc32  # type: ignore[attr-defined]
    inside = threading.Event()
    release = threading.Event()

    def other() -> None:
        with npy.fast_zip_crc():
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=other)
    with npy.fast_zip_crc():
        worker.start()
        assert inside.wait(10)
    assert zipfile.crc32 is not own  # type: ignore[attr-defined]
    release.set()
    worker.join()
    assert zipfile.crc32 is own  # type: ignore[attr-defined]


def test_an_npz_output_starts_its_write_out_as_its_members_grow(tmp_path, monkeypatch) -> None:
    """The stored members go to the output file through `started_writeback` (as a plain
    output's copy does): every byte of every member is counted, so the fsync at the commit
    has only the last step left; the file is the one numpy reads."""
    from matrixctl.cli.app import main

    seen: list[tuple[int, int]] = []
    monkeypatch.setattr(npy, "started_writeback", lambda fd, n: seen.append((fd, n)))
    arrays = {f"t{i}": np.arange(1000 * (i + 1), dtype=np.float32) for i in range(3)}
    src = tmp_path / "in.npz"
    np.savez(src, **arrays)
    out = tmp_path / "out.npz"
    assert main(["convert", str(src), str(out), "-q"]) == 0
    with np.load(out) as got:
        for name, arr in arrays.items():
            np.testing.assert_array_equal(got[name], arr)
    with zipfile.ZipFile(out) as zf:
        stored = sum(info.file_size for info in zf.infolist())
    assert len({fd for fd, _ in seen}) == 1
    assert sum(n for _, n in seen) == stored  # npy headers and data, every member
