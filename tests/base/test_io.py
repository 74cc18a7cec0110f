"""I/O helpers: short reads, spooled pipes, sniffing by bytes, atomic writes."""

from __future__ import annotations

import io
import os
import random
import stat
from pathlib import Path

import pytest

from matrixctl import codes
from matrixctl.errors import FormatError, InputError, OutputError
from matrixctl.formats import registry
from matrixctl.io import Source, atomic_output, read_exact
from tests.helpers import golden_bytes


class ShortReader:
    """A stream whose read(n) returns a random shorter length, like a pipe."""

    def __init__(self, data: bytes, seed: int = 0) -> None:
        self._buf = io.BytesIO(data)
        self._rng = random.Random(seed)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            return self._buf.read()
        if n == 0:
            return b""
        return self._buf.read(self._rng.randint(1, n))


def test_read_exact_loops_on_short_reads() -> None:
    data = bytes(range(256)) * 10
    reader = ShortReader(data)
    got = b"".join(read_exact(reader, 100, "chunk") for _ in range(25))
    assert got == data[:2500]


def test_read_exact_names_what_was_cut_and_where() -> None:
    with pytest.raises(FormatError) as info:
        read_exact(ShortReader(b"abc"), 8, "frame header", offset=40)
    err = info.value
    assert err.code == codes.TRUNCATED
    assert err.offset == 43 and err.field == "frame header"
    assert "expected 8 bytes, got 3" in err.message


def test_source_maps_files_and_handles_empty(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(golden_bytes.MATRIX_ATOM)
    with Source.open(str(path)) as src:
        assert src.size == len(golden_bytes.MATRIX_ATOM) and src.head(8) == b"MTRXATOM"
    empty = tmp_path / "e"
    empty.write_bytes(b"")
    with Source.open(str(empty)) as src:
        assert src.size == 0 and src.head(8) == b""


def test_source_spools_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    os.write(w, golden_bytes.SVGT)
    os.close(w)

    class Stdin:
        buffer = os.fdopen(r, "rb")

    monkeypatch.setattr("sys.stdin", Stdin)
    with Source.open("-") as src:
        assert src.name == "<stdin>" and bytes(src.buf[:]) == golden_bytes.SVGT


def test_source_errors_are_typed(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        Source.open(str(tmp_path / "missing"))
    assert info.value.code == codes.IO_NOT_FOUND and info.value.exit_code == 2
    with pytest.raises(InputError) as info:
        Source.open(str(tmp_path))
    assert info.value.code == codes.IO_IS_DIR


def test_unreadable_file_is_a_permission_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"x")

    def deny(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("builtins.open", deny)  # works the same when the tests run as root
    with pytest.raises(InputError) as info:
        Source.open(str(path))
    assert info.value.code == codes.IO_PERMISSION and info.value.exit_code == 2


def test_sniffing_ignores_the_file_name(tmp_path: Path) -> None:
    wrong = tmp_path / "looks_like.svgt"
    wrong.write_bytes(golden_bytes.MATRIX_ATOM)
    with Source.open(str(wrong)) as src:
        assert registry.sniff(src) == "matrix-atom"
    assert registry.sniff_bytes(golden_bytes.SVGT, len(golden_bytes.SVGT)) == "svgt"
    assert (
        registry.sniff_bytes(golden_bytes.TOKEN_STREAM, len(golden_bytes.TOKEN_STREAM))
        == "token-stream"
    )
    assert registry.sniff_bytes(b"MTRXATO", 7) is None


def test_atomic_output_replaces_only_on_success(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    dest.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_output(str(dest)) as fp:
        fp.write(b"new but failing")
        raise RuntimeError("boom")
    assert dest.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]  # no temporary file left behind
    with atomic_output(str(dest)) as fp:
        fp.write(b"new")
    assert dest.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["out.bin"]


def test_atomic_output_on_keyboard_interrupt_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "never.bin"
    with pytest.raises(KeyboardInterrupt), atomic_output(str(dest)) as fp:
        fp.write(b"partial")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_atomic_output_respects_umask(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        with atomic_output(str(tmp_path / "f")) as fp:
            fp.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o640


def test_output_into_a_missing_folder_is_an_output_error(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as info, atomic_output(str(tmp_path / "no" / "f")):
        pass
    assert info.value.exit_code == 2
    assert info.value.code == "IO_WRITE"
    assert f"the output folder {tmp_path / 'no'} does not exist" in str(info.value)


def test_output_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(OutputError) as info, atomic_output(str(tmp_path)):
        pass
    assert info.value.code == codes.OUT_EXISTS_DIR


def test_output_path_equal_to_input_path_is_safe(tmp_path: Path) -> None:
    """The input's mapping survives the rename, and the input is only replaced at the end."""
    path = tmp_path / "same.bin"
    path.write_bytes(golden_bytes.MATRIX_ATOM)
    with Source.open(str(path)) as src, atomic_output(str(path)) as fp:
        fp.write(bytes(src.buf[: len(golden_bytes.MATRIX_ATOM)]) + b"")
        assert path.read_bytes() == golden_bytes.MATRIX_ATOM  # untouched until commit
    assert path.read_bytes() == golden_bytes.MATRIX_ATOM


def test_a_signal_right_after_the_temporary_is_created_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The temporary's name is recorded before it is created, so an interruption handled just
    after the creating call (found under load: `ingest docs` left `.pack.XXXX.tmp` behind when
    SIGTERM came right after mkdtemp) still removes it."""
    import matrixctl.io as mio

    real_fdopen = os.fdopen

    def interrupted_fdopen(fd: int, *args: object, **kwargs: object) -> object:
        os.close(fd)
        raise KeyboardInterrupt

    monkeypatch.setattr(mio.os, "fdopen", interrupted_fdopen)
    with pytest.raises(KeyboardInterrupt), atomic_output(str(tmp_path / "out.bin")):
        pass
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(mio.os, "fdopen", real_fdopen)

    real_mkdir = os.mkdir

    def interrupted_mkdir(path: str, mode: int = 0o777) -> None:
        real_mkdir(path, mode)
        raise KeyboardInterrupt

    monkeypatch.setattr(mio.os, "mkdir", interrupted_mkdir)
    made: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        mio.make_temp_dir(str(tmp_path / "pack"), made)
    assert len(made) == 1 and os.path.isdir(made[0])  # the caller can remove it: it has the name
    assert os.path.basename(made[0]).startswith(".pack.") and made[0].endswith(".tmp")


def test_a_removal_of_a_set_aside_version_cut_short_is_never_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision (io.discard_aside): the previous version a replacement set aside is renamed to
    a temporary name before it is removed, so a kill in the middle of the removal leaves a
    temporary folder, not a half-removed `.NAME.old...` that `restore_aside` would put back
    once the output is deleted."""
    import shutil

    from matrixctl.io import aside_name, aside_of, discard_aside, restore_aside

    dest = tmp_path / "pack"
    old = Path(aside_name(str(dest)))
    old.mkdir()
    for name in ("a", "b", "manifest.json"):
        (old / name).write_text(name)

    def killed(path: str, ignore_errors: bool = False) -> None:
        os.unlink(os.path.join(path, "manifest.json"))  # the removal got this far
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        discard_aside(str(old), str(dest))
    monkeypatch.undo()
    left = os.listdir(tmp_path)
    assert len(left) == 1 and aside_of(left[0]) is None  # a temporary name, not a set-aside
    assert restore_aside(str(dest)) is None
    assert not dest.exists()


def test_discard_aside_removes_the_set_aside_version(tmp_path: Path) -> None:
    from matrixctl.io import aside_name, discard_aside

    dest = tmp_path / "pack"
    old = Path(aside_name(str(dest)))
    (old / "sub").mkdir(parents=True)
    (old / "sub" / "x").write_text("x")
    discard_aside(str(old), str(dest))
    assert os.listdir(tmp_path) == []


def _first_claim(head: bytes, size: int) -> str | None:
    """The registry's rule, spelled out: the first format, in `FORMATS` order, that claims
    the bytes (folder formats claim no bytes)."""
    for fmt in registry.FORMATS:
        if fmt.directory is None and fmt.matches(head, size):
            return fmt.name
    return None


def test_sniffing_gives_the_first_format_in_registry_order() -> None:
    """`sniff_bytes` looks a magic up at once rather than asking every format in turn: the
    answer must be the one the registry's order gives, for every kind of head."""
    rng = random.Random(7)
    heads: list[bytes] = [b"", b"{", b"PK\x03\x04" + bytes(60), b"\x80\x04junk"]
    golden = Path(__file__).resolve().parents[1] / "golden"
    heads += [p.read_bytes()[: registry.SNIFF_BYTES] for p in sorted(golden.iterdir())]
    for fmt in registry.FORMATS:
        if fmt.magic is not None:
            heads.append(fmt.magic)
            heads.append(fmt.magic[:-1])
            heads.append(fmt.magic + bytes(rng.randrange(256) for _ in range(56)))
    # safetensors (told by a function) before a magic: a header size whose bytes spell one
    heads.append(b"GGUF\x00\x00\x00\x00{" + b'"a":1}'.ljust(55))
    heads += [bytes(rng.randrange(256) for _ in range(64)) for _ in range(200)]
    seen = set()
    for head in heads:
        for size in (len(head), 1 << 20):
            want = _first_claim(head, size)
            assert registry.sniff_bytes(head, size) == want, head[:16]
            seen.add(want)
    assert {"ztensor", "ztensor-v2", "gguf", "npy", "embd", "matrix-atom", None} <= seen
