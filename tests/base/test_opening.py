"""The one sniff-and-open (`matrixctl.opening`): what it leaves open, and what it opens."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

from matrixctl import codes
from matrixctl.errors import FormatError, InputError
from matrixctl.formats.ztensor2 import save_file
from matrixctl.io import _MAPPED, Source
from matrixctl.opening import open_path, open_sniffed, open_tensors


def _open_on(path: Path) -> int:
    """How many of this process's descriptors are open on `path`. Only those: other tests
    leave objects whose descriptors the collector may close at any time, so a count of every
    descriptor of the process is not this test's to check."""
    target = os.path.realpath(path)
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # listdir's own descriptor, closed by now
            n += os.readlink(f"/proc/self/fd/{fd}") == target
    return n


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.zt"
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(path))
    return path


def test_open_tensors_closes_the_file_when_the_block_ends(model: Path) -> None:
    with open_tensors(str(model)) as source:
        arr = source.array(source.tensors()[0], verify=True)
        assert arr.tolist() == [0, 1, 2, 3, 4, 5]  # the stored elements, flat
        del arr
        assert _open_on(model) == 2  # the file and the mapping's own descriptor
    assert _open_on(model) == 0
    assert not [s for s in _MAPPED if s.path == str(model)]


def test_open_tensors_closes_the_file_it_refuses(model: Path) -> None:
    data = model.read_bytes()
    model.write_bytes(data[:-3])  # the footer cut: refused by the structural rules
    with pytest.raises(FormatError), open_tensors(str(model)):
        pass
    assert _open_on(model) == 0
    assert not [s for s in _MAPPED if s.path == str(model)]


def test_open_tensors_closes_a_file_that_is_no_tensor_container(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"plain words, no container\n")
    with pytest.raises(FormatError) as err, open_tensors(str(path)):
        pass
    assert err.value.code == codes.UNKNOWN_FORMAT
    assert _open_on(path) == 0


def test_open_tensors_closes_the_file_when_the_block_raises(model: Path) -> None:
    with pytest.raises(KeyError), open_tensors(str(model)):
        raise KeyError("the caller's own error")
    assert _open_on(model) == 0


def test_a_file_is_opened_unbuffered_and_stamped_once(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is mapped, never read through a buffer; its status is taken once, from the
    opened descriptor (the stamp `changed` compares with)."""
    calls: list[str] = []
    real_fstat, real_stat = os.fstat, os.stat

    def fstat(fd: int) -> os.stat_result:
        calls.append("fstat")
        return real_fstat(fd)

    def stat(path: object, *a: object, **k: object) -> os.stat_result:
        calls.append("stat")
        return real_stat(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fstat", fstat)
    monkeypatch.setattr(os, "stat", stat)
    with Source.open(str(model)) as src:
        assert calls == ["fstat"]
        assert type(src._fp).__name__ == "FileIO"
        assert src.changed() is None
    os.utime(model, ns=(1, 1))
    with Source.open(str(model)) as src:
        os.utime(model, ns=(2, 2))
        assert src.changed() == "rewritten in place while it was read"


def test_a_folder_is_sniffed_as_a_folder_and_a_bare_one_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "empty"
    bare.mkdir()
    with pytest.raises(InputError) as err, open_sniffed(str(bare)):
        pass
    assert err.value.code == "UNKNOWN_FOLDER"
    with pytest.raises(InputError) as err:
        Source.open(str(bare))
    assert err.value.code == codes.IO_IS_DIR


def test_a_missing_path_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err, open_path(str(tmp_path / "nothing.zt")):
        pass
    assert err.value.code == codes.IO_NOT_FOUND


def test_a_fifo_is_read_through_like_a_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # the writer
        try:
            with open(fifo, "wb") as fp:
                fp.write(b"MTRX" * 1000)
        finally:
            os._exit(0)
    try:
        with Source.open(str(fifo)) as src:
            assert src.size == 4000
            assert bytes(src.buf[:8]) == b"MTRXMTRX"
    finally:
        os.waitpid(pid, 0)
