"""Whole-file checks of STB and EMBD sources left to the copy of a conversion
(`matrixctl.tensors.FileCheck`): the same errors as a check at open, the input read once."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from matrixctl import tensors
from matrixctl.errors import FormatError
from matrixctl.formats import stb
from matrixctl.formats.embd import layout
from matrixctl.io import Source
from tests.helpers.cli import run_cli

META = [
    f"--meta={k}=1"
    for k in (
        "embedding_dim",
        "vocab_size",
        "num_layers",
        "num_attention_heads",
        "hidden_size",
        "intermediate_size",
        "max_position_emb",
    )
] + ["--meta=model_name=m"]
OUTS = ["o.safetensors", "o.zt", "o.npz", "o.stb", "o.weights"]


def inputs(tmp_path: Path) -> dict[str, Path]:
    """The same tensors as .stb (with its sidecar) and .weights."""
    src = tmp_path / "t.npz"
    rng = np.random.default_rng(1)
    np.savez(
        src, **{f"w{i}": rng.standard_normal(1000 + 37 * i, dtype=np.float32) for i in range(6)}
    )
    made = {"stb": tmp_path / "in.stb", "weights": tmp_path / "in.weights"}
    for ext, path in made.items():
        extra = META if ext == "weights" else []
        assert run_cli("convert", "-q", str(src), str(path), *extra).code == 0
    return made


def data_offset(path: Path) -> int:
    raw = path.read_bytes()
    if path.suffix == ".stb":
        return stb.Header.parse(raw).data_offset
    return layout.Header.parse(raw).tensor_data_offset


def damaged(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def outs_for(ext: str) -> list[str]:
    return [o for o in OUTS if not o.endswith("." + ext)]


def convert(src: Path, out: Path, *words: str) -> tuple[int, str]:
    extra = META if out.suffix == ".weights" else []
    done = run_cli("convert", "-q", str(src), str(out), *words, *extra)
    return done.code, done.stderr


@pytest.mark.parametrize("ext", ["stb", "weights"])
def test_a_damaged_tensor_is_refused_by_every_sink(tmp_path: Path, ext: str) -> None:
    """A flipped bit inside the tensor data: the file's check fails whether the copy read the
    bytes (a checksumming sink) or the kernel copied them (safetensors), with the code and
    exit status of the check at open, and nothing is written."""
    src = inputs(tmp_path)[ext]
    damaged(src, data_offset(src) + 4 * 1500)
    code = stb.STB_SIDECAR_FILE if ext == "stb" else layout.EMBD_DATA_CRC
    for out in outs_for(ext):
        status, err = convert(src, tmp_path / out)
        assert status == 1 and code in err, (out, err)
        assert not (tmp_path / out).exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")]


def test_a_damaged_byte_before_the_tensor_data_fails_the_file_checksum(tmp_path: Path) -> None:
    """EMBD: the file checksum covers the bytes before the tensor data too. A byte there that
    no structural rule reads (found with `verify`'s own rules) is caught by it alone."""
    from matrixctl.validate.engine import examine

    src = inputs(tmp_path)["weights"]
    good = src.read_bytes()
    header = layout.Header.parse(good)
    probe = tmp_path / "probe.weights"
    for at in range(header.metadata_offset, header.tensor_data_offset):
        data = bytearray(good)
        data[at] ^= 0x01
        probe.write_bytes(bytes(data))
        found = {f.code for f in examine(str(probe), scan=True)[0].findings}
        if found == {layout.EMBD_FILE_CRC}:
            break
    else:
        pytest.fail("no byte covered by the file checksum alone")
    for out in outs_for("weights"):
        status, err = convert(probe, tmp_path / out)
        assert status == 1 and layout.EMBD_FILE_CRC in err, (out, err)
        assert not (tmp_path / out).exists()


@pytest.mark.parametrize("ext", ["stb", "weights"])
def test_the_damaged_file_is_the_error_reported_whatever_else_fails(
    tmp_path: Path, ext: str
) -> None:
    """The check runs at the end of the copy, but a damaged input is still the error reported
    when something else fails first (here --select keeps no tensor), as when the open ran it."""
    src = inputs(tmp_path)[ext]
    damaged(src, data_offset(src) + 4 * 1500)
    code = stb.STB_SIDECAR_FILE if ext == "stb" else layout.EMBD_DATA_CRC
    status, err = convert(src, tmp_path / "o.zt", "--select", "zzz")
    assert status == 1 and code in err, err


@pytest.mark.parametrize("ext", ["stb", "weights"])
def test_a_conversion_reads_the_source_once(
    tmp_path: Path, ext: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's CRC is computed from the copy's pieces, into every sink (one that checksums
    what it writes, and safetensors, whose stored bytes then go through the copy's buffer
    instead of the kernel): what is read besides them is the headers, tables and padding."""
    src = inputs(tmp_path)[ext]
    read: list[int] = []
    real = tensors.crc_range

    def spy(buf: object, start: int, end: int, *args: object, **kw: object) -> int:
        read.append(end - start)
        return real(buf, start, end, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(tensors, "crc_range", spy)
    data = src.stat().st_size - data_offset(src)
    for out in outs_for(ext):
        read.clear()
        assert convert(src, tmp_path / out)[0] == 0
        assert 0 < sum(read) < data_offset(src) + 1024 < data, (out, read)


def test_outside_a_conversion_the_file_is_checked_when_opened(tmp_path: Path) -> None:
    src = inputs(tmp_path)["stb"]
    damaged(src, data_offset(src) + 8)
    from matrixctl.converters.tensors import open_source

    with pytest.raises(FormatError) as info, open_source(str(src)):
        pass
    assert info.value.code == stb.STB_SIDECAR_FILE


# FileCheck ----------------------------------------------------------------------------------

DATA = bytes(range(256)) * 400  # 102,400 bytes


def checker(tmp_path: Path, want: int | None = None) -> tuple[Source, tensors.FileCheck, list[int]]:
    path = tmp_path / "f.bin"
    path.write_bytes(DATA)
    src = Source.open(str(path))
    seen: list[int] = []
    expected = zlib.crc32(DATA[100:100_000]) if want is None else want

    def judge(value: int) -> None:
        seen.append(value)
        if value != expected:
            raise FormatError("X_CRC", "damaged")

    return src, tensors.FileCheck(src.buf, 100, 100_000, judge), seen


def feed(check: tensors.FileCheck, offset: int, length: int) -> None:
    update, finish = check.verifier(offset, length)
    for pos in range(offset, offset + length, 4096):
        update(DATA[pos : min(pos + 4096, offset + length)])
    finish()


def test_pieces_in_order_give_the_value_of_one_read(tmp_path: Path) -> None:
    src, check, seen = checker(tmp_path)
    with src:
        feed(check, 200, 5000)
        feed(check, 5000 + 200 + 64, 30_000)  # a gap between tensors, read by the check
        check.finish()
        check.check()  # settled: no second read
    assert seen == [zlib.crc32(DATA[100:100_000])]


def test_pieces_out_of_order_fall_back_to_one_read(tmp_path: Path) -> None:
    src, check, seen = checker(tmp_path)
    with src:
        feed(check, 50_000, 1000)
        feed(check, 200, 1000)  # before the running position: not used
        check.finish()
    assert seen == [zlib.crc32(DATA[100:100_000])]


def test_a_wrong_value_raises_every_time_it_is_asked(tmp_path: Path) -> None:
    src, check, seen = checker(tmp_path, want=1)
    with src:
        feed(check, 200, 5000)
        for settle in (check.finish, check.check, check.finish):
            with pytest.raises(FormatError):
                settle()
    assert len(seen) == 1


def test_stored_bytes_check_first_outside_a_conversion(tmp_path: Path) -> None:
    src, check, seen = checker(tmp_path)
    with src:
        assert check.stored(200, 1000).take_verify() is None  # no check left to the copy
        next(iter(check.stored(200, 1000)))  # handing out a byte runs the check first
        assert seen == [zlib.crc32(DATA[100:100_000])]
        with tensors.deferred_checks():
            made_inside = tensors.FileCheck(src.buf, 0, 10, lambda value: None)
        assert made_inside.deferred and not check.deferred
