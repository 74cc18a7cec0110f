"""The one copy loop of every sink (`matrixctl.tensors.copy_stream`): the kernel copy of stored
bytes, its fallbacks, the checksummed loop, the byte count, and an input cut underneath."""

from __future__ import annotations

import errno
import os
import zlib
from pathlib import Path

import pytest

from matrixctl import io, tensors
from matrixctl.errors import FormatError, InputError
from matrixctl.tensors import StoredBytes, copy_stream, mapped_chunks

DATA = bytes(range(256)) * 4099  # not a multiple of a page or a chunk
CODE = "ST_LENGTH"


def mapped(tmp_path: Path) -> io.Source:
    path = tmp_path / "in.bin"
    path.write_bytes(DATA)
    return io.Source.open(str(path))


def copy_to(tmp_path: Path, stream: object, n: int, **kw: object) -> tuple[bytes, int]:
    out = tmp_path / "out.bin"
    with out.open("w+b") as fp:
        fp.write(b"head")
        got = copy_stream(fp, stream, n, where="t", code=CODE, **kw)  # type: ignore[arg-type]
        pos = fp.tell()
        fp.write(b"tail")
    return out.read_bytes(), got if pos == 4 + got else -1


def test_stored_bytes_are_copied_by_the_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.copy_file_range

    def spy(*args: int) -> int:
        calls.append(args[2])
        return real(*args)

    monkeypatch.setattr(os, "copy_file_range", spy)
    ticks: list[int] = []
    with mapped(tmp_path) as src:
        stream = mapped_chunks(src.buf, 100, 500_000, 1 << 16)
        stream.tick = ticks.append
        data, got = copy_to(tmp_path, stream, 500_000)
    assert calls, "the kernel copy was not used"
    assert data == b"head" + DATA[100:500_100] + b"tail"
    assert got == 500_000 and sum(ticks) == 500_000


@pytest.mark.parametrize("refused", [("copy_file_range",), ("copy_file_range", "sendfile")])
def test_the_kernel_copy_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: tuple[str, ...]
) -> None:
    """A file system that refuses copy_file_range gets sendfile, then pread/write: same bytes."""

    def refuse(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    for name in refused:
        monkeypatch.setattr(os, name, refuse)
    with mapped(tmp_path) as src:
        data, got = copy_to(tmp_path, mapped_chunks(src.buf, 7, len(DATA) - 7), len(DATA) - 7)
    assert data == b"head" + DATA[7:] + b"tail" and got == len(DATA) - 7


def test_a_checksum_sees_every_byte_once_and_the_file_gets_them(tmp_path: Path) -> None:
    seen: list[int] = [0]

    def update(piece: object) -> None:
        seen[0] = zlib.crc32(piece, seen[0])  # type: ignore[arg-type]

    with mapped(tmp_path) as src:
        data, got = copy_to(
            tmp_path, mapped_chunks(src.buf, 0, len(DATA), 1 << 16), len(DATA), update=update
        )
    assert seen[0] == zlib.crc32(DATA)
    assert data == b"head" + DATA + b"tail" and got == len(DATA)


def test_plain_streams_and_wrappers_take_the_loop(tmp_path: Path) -> None:
    """A generator (decoded or cast data) and a file object that is not a plain file go
    through the loop; numpy arrays and memoryviews of other formats are written as bytes."""
    import numpy as np

    arr = np.arange(10, dtype=np.complex64)
    pieces = iter([memoryview(b"ab"), arr, b"cd"])
    n = 2 + arr.nbytes + 2
    data, got = copy_to(tmp_path, pieces, n)
    assert data == b"head" + b"ab" + arr.tobytes() + b"cd" + b"tail" and got == n


@pytest.mark.parametrize("declared", [99, 101])
def test_a_count_other_than_declared_is_the_sinks_error(tmp_path: Path, declared: int) -> None:
    with pytest.raises(FormatError) as info:
        copy_to(tmp_path, iter([bytes(100)]), declared)
    assert info.value.code == CODE and info.value.field == "t"
    assert f"100 bytes arrived, shape and dtype give {declared}" in str(info.value)


def test_stored_bytes_of_the_wrong_length_are_not_copied_blind(tmp_path: Path) -> None:
    with mapped(tmp_path) as src, pytest.raises(FormatError):
        copy_to(tmp_path, mapped_chunks(src.buf, 0, 1000), 999)


def test_an_input_cut_underneath_the_kernel_copy_is_io_changed(tmp_path: Path) -> None:
    with mapped(tmp_path) as src:
        stream = mapped_chunks(src.buf, 0, len(DATA))
        os.truncate(tmp_path / "in.bin", 1000)
        with pytest.raises(InputError) as info:
            copy_to(tmp_path, stream, len(DATA))
    assert info.value.code == io.IO_CHANGED


def test_a_check_runs_before_the_first_byte_is_copied(tmp_path: Path) -> None:
    def check() -> None:
        raise FormatError("ZT_DIGEST", "damaged")

    with mapped(tmp_path) as src:
        stream = StoredBytes(src.buf, 0, 10, tensors.CHUNK_BYTES, check)
        with pytest.raises(FormatError):
            copy_to(tmp_path, stream, 10)
    assert (tmp_path / "out.bin").read_bytes() == b"head"


@pytest.mark.parametrize("durable", [True, False])
def test_a_durable_output_starts_its_write_out_as_it_grows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    """Every WRITEBACK_STEP bytes the copy loop asks the kernel to start writing the output
    out (the fsync before the rename then waits for the tail only); never under
    MATRIXCTL_NO_FSYNC, where nothing is fsynced either."""
    calls: list[tuple[int, ...]] = []
    monkeypatch.setattr(io, "_SYNC_FILE_RANGE", None)
    monkeypatch.setattr(io, "_UNFLUSHED", {})
    monkeypatch.setattr(io, "WRITEBACK_STEP", 1 << 16)
    monkeypatch.setenv("MATRIXCTL_NO_FSYNC", "0" if durable else "1")
    monkeypatch.setattr(
        "ctypes.CDLL", lambda *a, **k: type("L", (), {"sync_file_range": _Recorder(calls)})()
    )
    pieces = iter([bytes(1 << 15)] * 8)
    data, got = copy_to(tmp_path, pieces, 1 << 18)
    assert got == 1 << 18 and data == b"head" + bytes(1 << 18) + b"tail"
    assert len(calls) == (4 if durable else 0)
    assert all(c[1:] == (0, 0, 2) for c in calls)


class _Recorder:
    def __init__(self, calls: list[tuple[int, ...]]) -> None:
        self.calls = calls

    def __call__(self, *args: int) -> int:
        self.calls.append(args)
        return 0


# Stored bytes a sink checksums, or that go to a member writer: read into a reused buffer --


class _MemberWriter:
    """A writer that is not a plain file and is done with each piece when `write` returns
    (zipfile's member writer): it keeps a copy of the bytes, never the piece itself."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, piece: object) -> int:
        view = memoryview(piece)  # type: ignore[arg-type]
        self.data += view
        return view.nbytes


def test_checksummed_stored_bytes_are_read_by_pread_not_through_the_mapping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = os.preadv

    def spy(fd: int, buffers: list[memoryview], offset: int) -> int:
        reads.append(offset)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", spy)
    monkeypatch.setattr(tensors, "drop_pages", lambda *a: pytest.fail("the mapping was read"))
    seen = [0]
    ticks: list[int] = []

    def update(piece: object) -> None:
        seen[0] = zlib.crc32(piece, seen[0])  # type: ignore[arg-type]

    with mapped(tmp_path) as src:
        stream = mapped_chunks(src.buf, 5, len(DATA) - 5, 1 << 16)
        stream.tick = ticks.append
        data, got = copy_to(tmp_path, stream, len(DATA) - 5, update=update)
    assert reads[0] == 5 and len(reads) == -(-(len(DATA) - 5) // (1 << 16))
    assert seen[0] == zlib.crc32(DATA[5:]) and sum(ticks) == len(DATA) - 5
    assert data == b"head" + DATA[5:] + b"tail" and got == len(DATA) - 5


def test_a_member_writer_gets_every_byte_through_the_reused_buffer(tmp_path: Path) -> None:
    """Pieces share one buffer: a writer that copies (write_copies=True) sees each in turn."""
    out = _MemberWriter()
    with mapped(tmp_path) as src:
        got = copy_stream(
            out,
            mapped_chunks(src.buf, 0, len(DATA), 4096),
            len(DATA),
            where="t",
            code=CODE,
            write_copies=True,
        )
    assert got == len(DATA) and bytes(out.data) == DATA


def test_a_writer_that_may_keep_pieces_gets_views_of_the_mapping(tmp_path: Path) -> None:
    """Without write_copies a writer that is not a plain file (one that queues pieces to a
    helper thread) gets slices of the mapping, which stay valid, never the reused buffer."""
    kept: list[memoryview] = []

    class Keeper:
        def write(self, piece: memoryview) -> int:
            kept.append(piece)
            return piece.nbytes

    with mapped(tmp_path) as src:
        copy_stream(
            Keeper(), mapped_chunks(src.buf, 0, 3 * 4096, 4096), 3 * 4096, where="t", code=CODE
        )
        assert all(isinstance(k.obj, type(src.buf)) for k in kept)
        assert b"".join(bytes(k) for k in kept) == DATA[: 3 * 4096]
        kept.clear()


def test_an_input_cut_underneath_the_read_loop_is_io_changed(tmp_path: Path) -> None:
    with mapped(tmp_path) as src:
        stream = mapped_chunks(src.buf, 0, len(DATA), 1 << 16)
        os.truncate(tmp_path / "in.bin", 1000)
        with pytest.raises(InputError) as info:
            copy_to(tmp_path, stream, len(DATA), update=lambda piece: None)
    assert info.value.code == io.IO_CHANGED and info.value.path == str(tmp_path / "in.bin")


def _verified(src: io.Source, digest_ok: bool, calls: list[str]) -> StoredBytes:
    """Stored bytes with a source check (CRC-32 of the whole range) in both forms."""
    want = zlib.crc32(DATA) ^ (0 if digest_ok else 1)

    def verify() -> tuple[object, object]:
        state = [0]

        def update(piece: object) -> None:
            state[0] = zlib.crc32(piece, state[0])  # type: ignore[arg-type]

        def finish() -> None:
            calls.append("finish")
            if state[0] != want:
                raise FormatError("ZT_DIGEST", "damaged")

        return update, finish

    def check() -> None:
        calls.append("check")
        update, finish = verify()
        update(DATA)
        finish()

    return StoredBytes(src.buf, 0, len(DATA), 1 << 16, check, verify)  # type: ignore[arg-type]


@pytest.mark.parametrize("digest_ok", [True, False])
def test_a_checksummed_copy_checks_the_source_in_the_same_pass(
    tmp_path: Path, digest_ok: bool
) -> None:
    """Stored bytes with a source check going to a sink that checksums them: one read, the
    check fed as the bytes go by, its failure raised before copy_stream returns."""
    calls: list[str] = []
    with mapped(tmp_path) as src:
        stream = _verified(src, digest_ok, calls)
        if digest_ok:
            data, got = copy_to(tmp_path, stream, len(DATA), update=lambda piece: None)
            assert data == b"head" + DATA + b"tail" and got == len(DATA)
        else:
            with pytest.raises(FormatError):
                copy_to(tmp_path, stream, len(DATA), update=lambda piece: None)
    assert calls == ["finish"]


@pytest.mark.parametrize("digest_ok", [True, False])
def test_a_copy_into_a_member_writer_checks_the_source_in_the_same_pass(
    tmp_path: Path, digest_ok: bool
) -> None:
    """Stored bytes with a source check going to a writer that checksums them itself
    (zipfile's member writer, `write_copies`; no `update`): read once through the buffer too,
    the check fed as the bytes go by (a .zt into .npz read its source twice)."""
    calls: list[str] = []
    with mapped(tmp_path) as src:
        stream = _verified(src, digest_ok, calls)
        written: list[bytes] = []

        class Member:  # not a plain file: copy_stream cannot copy inside the kernel
            def write(self, piece: object) -> int:
                written.append(bytes(piece))  # type: ignore[call-overload]
                return len(written[-1])

        run = lambda: copy_stream(  # noqa: E731
            Member(), stream, len(DATA), where="t", code=CODE, write_copies=True
        )
        if digest_ok:
            assert run() == len(DATA) and b"".join(written) == DATA
        else:
            with pytest.raises(FormatError):
                run()
    assert calls == ["finish"]


@pytest.mark.parametrize("digest_ok", [True, False])
def test_a_checked_source_is_read_once_where_the_kernel_could_copy_it(
    tmp_path: Path, digest_ok: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored bytes with a source check that can run as they are read, going to a plain file
    with no checksum of its own: read once through the buffer, the check fed on the way, not
    checked first and then copied by the kernel (two reads of the source)."""
    kernel: list[int] = []
    monkeypatch.setattr(os, "copy_file_range", lambda *args: kernel.append(1) or 0)
    calls: list[str] = []
    with mapped(tmp_path) as src:
        stream = _verified(src, digest_ok, calls)
        if digest_ok:
            data, got = copy_to(tmp_path, stream, len(DATA))
            assert data == b"head" + DATA + b"tail" and got == len(DATA)
        else:
            with pytest.raises(FormatError):
                copy_to(tmp_path, stream, len(DATA))
    assert calls == ["finish"] and not kernel


def test_the_kernel_copy_checks_a_source_first_when_the_check_cannot_be_split(
    tmp_path: Path,
) -> None:
    calls: list[str] = []
    with mapped(tmp_path) as src, pytest.raises(FormatError):
        whole = _verified(src, False, calls)
        stream = StoredBytes(src.buf, 0, len(DATA), 1 << 16, whole._check)  # no verify
        copy_to(tmp_path, stream, len(DATA))
    assert calls == ["check", "finish"]
    assert (tmp_path / "out.bin").read_bytes() == b"head"
