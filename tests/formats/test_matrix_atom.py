"""MATRIX-ATOM v1: golden bytes, round trips, every finding, truncation and bit flips."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl.codes import Severity
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats import matrix_atom
from matrixctl.validate.engine import examine
from tests.helpers import golden_bytes
from tests.helpers.cli import run_cli


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def verify_bytes(tmp_path: Path, data: bytes, name: str = "f.bin"):
    path = tmp_path / name
    path.write_bytes(data)
    return examine(str(path), scan=True)[0]


def reseal(data: bytes) -> bytes:
    """Recompute header_crc32 so a test isolates one other field's finding."""
    buf = bytearray(data)
    buf[0x30:0x34] = bytes(4)
    buf[0x30:0x34] = struct.pack("<I", zlib.crc32(bytes(buf[:64])))
    return bytes(buf)


def patch(data: bytes, offset: int, fmt: str, value: object) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, value)
    return reseal(bytes(buf))


# Golden files -------------------------------------------------------------------------------


def test_golden_file_on_disk_is_the_hand_written_bytes() -> None:
    assert (
        Path(__file__).resolve().parents[1] / "golden/matrix_atom_v1.bin"
    ).read_bytes() == golden_bytes.MATRIX_ATOM


def test_writer_produces_the_golden_bytes() -> None:
    out = io.BytesIO()
    header = matrix_atom.write_atoms(
        out, np.array(golden_bytes.IDS), atom_size=4, vocab_size=100, pad_id=0
    )
    assert out.getvalue() == golden_bytes.MATRIX_ATOM
    assert header.token_count == 8 and header.atom_count == 2


def test_header_parse_matches_spec_table() -> None:
    h = matrix_atom.AtomHeader.parse(golden_bytes.MATRIX_ATOM)
    assert (h.magic, h.version, h.header_bytes, h.dtype_id, h.flags) == (b"MTRXATOM", 1, 64, 1, 0)
    assert (h.vocab_size, h.atom_size, h.atom_count, h.token_count, h.data_offset) == (
        100,
        4,
        2,
        8,
        64,
    )
    assert h.header_crc32 == struct.unpack_from("<I", golden_bytes.MATRIX_ATOM, 0x30)[0]


def test_golden_verifies_clean(tmp_path: Path) -> None:
    report = verify_bytes(tmp_path, golden_bytes.MATRIX_ATOM)
    assert report.findings == []
    assert report.ok(strict=True)
    assert "payload_crc32" in report.checks and "token ids < vocab_size" in report.checks


def test_header_crc_covers_payload_crc_field() -> None:
    """Decision: header_crc32 covers bytes 0..63 with only 0x30..0x33 zeroed."""
    assert (
        matrix_atom.header_crc(golden_bytes.MATRIX_ATOM)
        == struct.unpack_from("<I", golden_bytes.MATRIX_ATOM, 0x30)[0]
    )
    changed = bytearray(golden_bytes.MATRIX_ATOM)
    changed[0x34] ^= 1
    assert matrix_atom.header_crc(bytes(changed)) != matrix_atom.header_crc(
        golden_bytes.MATRIX_ATOM
    )


def test_reference_tool_crc_variant_is_accepted_with_a_warning(tmp_path: Path) -> None:
    report = verify_bytes(tmp_path, golden_bytes.MATRIX_ATOM_LEGACY)
    assert [f.code for f in report.findings] == [matrix_atom.ATOM_HEADER_CRC_LEGACY]
    assert report.findings[0].severity is Severity.WARNING
    assert report.ok() and not report.ok(strict=True)


def test_token_count_includes_padding() -> None:
    """Decision: token_count counts the padded payload, so atom_count * atom_size == token_count."""
    out = io.BytesIO()
    writer = matrix_atom.AtomWriter(out, atom_size=4, vocab_size=10, pad_id=7)
    writer.write(np.array([1, 2, 3, 4, 5]))
    h = writer.finish()
    assert (h.token_count, h.atom_count, writer.padding) == (8, 2, 3)
    ids = np.frombuffer(out.getvalue()[64:], dtype="<u2")
    assert ids.tolist() == [1, 2, 3, 4, 5, 7, 7, 7]


# dtype choice and never wrapping -----------------------------------------------------------


def test_auto_is_uint16_exactly_up_to_65536_vocab() -> None:
    assert matrix_atom.choose_dtype("auto", 65536) == "uint16"
    assert matrix_atom.choose_dtype("auto", 65537) == "uint32"
    assert matrix_atom.choose_dtype("auto", None) is None
    assert matrix_atom.choose_dtype("uint32", 10) == "uint32"


def test_uint16_never_wraps_70000() -> None:
    assert np.array([70000]).astype(np.uint16)[0] == 4464  # what silent wrapping would give
    out = io.BytesIO()
    writer = matrix_atom.AtomWriter(out, atom_size=2, dtype="uint16")
    with pytest.raises(FormatError) as info:
        writer.write(np.array([1, 70000]))
    assert info.value.code == matrix_atom.ATOM_ID_OVERFLOW
    assert info.value.field == "token[1]"


def test_auto_without_vocab_widens_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix_atom.AtomWriter, "CHUNK", 3)  # force several widening passes
    out = io.BytesIO()
    writer = matrix_atom.AtomWriter(out, atom_size=4)
    first = np.arange(10)
    writer.write(first)
    writer.write(np.array([70000, 5]))
    h = writer.finish()
    assert h.dtype_name == "uint32" and h.vocab_size == 70001
    ids = np.frombuffer(out.getvalue()[64:], dtype="<u4")
    assert ids.tolist() == [*range(10), 70000, 5]
    assert zlib.crc32(out.getvalue()[64:]) == h.payload_crc32
    assert matrix_atom.header_crc(out.getvalue()) == h.header_crc32


def test_largest_id_is_two_below_2_to_the_32() -> None:
    """Decision: vocab_size is a u32, so id 2**32 - 1 can never be below it."""
    writer = matrix_atom.AtomWriter(io.BytesIO(), atom_size=1)
    writer.write(np.array([2**32 - 2]))
    assert writer.finish().vocab_size == 2**32 - 1
    with pytest.raises(FormatError) as info:
        matrix_atom.AtomWriter(io.BytesIO(), atom_size=1).write(np.array([2**32 - 1]))
    assert info.value.code == matrix_atom.ATOM_ID_OVERFLOW


def test_ids_at_or_above_vocab_are_refused() -> None:
    writer = matrix_atom.AtomWriter(io.BytesIO(), atom_size=2, vocab_size=10)
    writer.write(np.array([9]))
    with pytest.raises(FormatError) as info:
        writer.write(np.array([3, 10]))
    assert info.value.code == matrix_atom.ATOM_ID_RANGE and info.value.field == "token[2]"


def test_negative_ids_are_refused() -> None:
    with pytest.raises(FormatError):
        matrix_atom.AtomWriter(io.BytesIO(), atom_size=2).write(np.array([1, -1]))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"atom_size": 0},
        {"atom_size": 2, "dtype": "int8"},
        {"atom_size": 2, "vocab_size": 0},
        {"atom_size": 2, "vocab_size": 5, "pad_id": 5},
        {"atom_size": 2, "dtype": "uint16", "pad_id": 70000},
        {"atom_size": 2, "flags": 4},
    ],
)
def test_bad_writer_options_are_usage_errors(kwargs: dict) -> None:
    with pytest.raises(UsageError):
        matrix_atom.AtomWriter(io.BytesIO(), **kwargs)


def test_empty_input_gives_a_valid_empty_file(tmp_path: Path) -> None:
    out = io.BytesIO()
    h = matrix_atom.write_atoms(out, np.array([], dtype=np.int64), atom_size=8, vocab_size=5)
    assert (h.token_count, h.atom_count) == (0, 0)
    assert verify_bytes(tmp_path, out.getvalue()).ok(strict=True)


@settings(max_examples=60, deadline=None)
@given(
    ids=strategies.lists(strategies.integers(0, matrix_atom.MAX_ID), max_size=200),
    atom_size=strategies.integers(1, 17),
    pad_id=strategies.integers(0, 3),
)
def test_round_trip_property(ids: list[int], atom_size: int, pad_id: int) -> None:
    out = io.BytesIO()
    h = matrix_atom.write_atoms(
        out, np.array(ids, dtype=np.int64), atom_size=atom_size, pad_id=pad_id
    )
    data = out.getvalue()
    parsed = matrix_atom.AtomHeader.parse(data)
    assert parsed == h
    view = matrix_atom.token_view(data, parsed)
    padding = (-len(ids)) % atom_size
    assert view.tolist() == ids + [pad_id] * padding
    assert h.dtype_name == ("uint16" if max([*ids, pad_id]) < 65536 else "uint32")
    assert h.atom_count * h.atom_size == h.token_count
    assert zlib.crc32(data[64:]) == h.payload_crc32


# Findings: one per rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "code"),
    [
        (0x08, "<H", 2, matrix_atom.ATOM_VERSION),
        (0x0A, "<H", 32, matrix_atom.ATOM_HEADER_BYTES),
        (0x0C, "<B", 3, matrix_atom.ATOM_DTYPE),
        (0x0D, "<B", 0x80, matrix_atom.ATOM_FLAGS),
        (0x0E, "<H", 1, matrix_atom.ATOM_RESERVED),
        (0x38, "<Q", 1, matrix_atom.ATOM_RESERVED),
        (0x10, "<I", 0, matrix_atom.ATOM_VOCAB_SIZE),
        (0x14, "<I", 0, matrix_atom.ATOM_ATOM_SIZE),
        (0x18, "<Q", 3, matrix_atom.ATOM_COUNT),
        (0x28, "<Q", 72, matrix_atom.ATOM_DATA_OFFSET),
        (0x10, "<I", 50, matrix_atom.ATOM_ID_RANGE),
        (0x34, "<I", 0, matrix_atom.ATOM_PAYLOAD_CRC),
    ],
)
def test_each_header_field_is_checked(
    tmp_path: Path, offset: int, fmt: str, value: int, code: str
) -> None:
    report = verify_bytes(tmp_path, patch(golden_bytes.MATRIX_ATOM, offset, fmt, value))
    assert code in codes_of(report)
    hit = next(f for f in report.findings if f.code == code)
    assert hit.offset is not None and hit.field


def test_id_range_finding_points_at_first_bad_token(tmp_path: Path) -> None:
    report = verify_bytes(tmp_path, patch(golden_bytes.MATRIX_ATOM, 0x10, "<I", 50))
    hit = next(f for f in report.findings if f.code == matrix_atom.ATOM_ID_RANGE)
    assert hit.field == "token[2]" and hit.offset == 64 + 2 * 2  # id 99 is token 2


def test_token_count_that_overruns_the_file(tmp_path: Path) -> None:
    data = patch(patch(golden_bytes.MATRIX_ATOM, 0x20, "<Q", 12), 0x18, "<Q", 3)
    report = verify_bytes(tmp_path, data)
    assert matrix_atom.ATOM_TRUNCATED in codes_of(report)


def test_trailing_bytes(tmp_path: Path) -> None:
    assert matrix_atom.ATOM_TRAILING in codes_of(
        verify_bytes(tmp_path, golden_bytes.MATRIX_ATOM + b"\0\0")
    )


def test_narrow_and_wide_dtype_notes(tmp_path: Path) -> None:
    narrow = verify_bytes(tmp_path, patch(golden_bytes.MATRIX_ATOM, 0x10, "<I", 70000), "n.bin")
    assert matrix_atom.ATOM_DTYPE_NARROW in codes_of(narrow) and narrow.ok()
    out = io.BytesIO()
    matrix_atom.write_atoms(out, np.array([1, 2]), atom_size=2, dtype="uint32", vocab_size=10)
    wide = verify_bytes(tmp_path, out.getvalue(), "w.bin")
    assert [f.code for f in wide.findings] == [matrix_atom.ATOM_DTYPE_WIDE]
    assert wide.ok(strict=True)  # info findings never fail a file


def test_huge_token_count_does_not_allocate(tmp_path: Path) -> None:
    data = patch(patch(golden_bytes.MATRIX_ATOM, 0x20, "<Q", 2**63), 0x18, "<Q", 2**61)
    report = verify_bytes(tmp_path, data)
    assert matrix_atom.ATOM_TRUNCATED in codes_of(report)


def test_inspect_does_not_scan_the_payload(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(patch(golden_bytes.MATRIX_ATOM, 0x34, "<I", 0))
    report, desc = examine(str(path), scan=False, describe=True)
    assert report.findings == []  # the payload CRC is not looked at
    assert "payload_crc32" in report.skipped
    assert desc is not None and desc["preview"]["items"][0]["tokens"] == "5 17 99 0"


# Hostile and damaged files -----------------------------------------------------------------


def test_inspect_preview_stays_inside_the_file_when_fields_disagree(tmp_path: Path) -> None:
    """Found by fuzzing: an atom_size far above token_count made the preview read past the
    end of the file (an internal error); the preview now stops at the tokens and the bytes
    there are, and the disagreement is a finding."""
    path = tmp_path / "f.bin"
    path.write_bytes(patch(golden_bytes.MATRIX_ATOM, 0x14, "<I", 0x10010))
    report, desc = examine(str(path), scan=False, describe=True)
    assert not report.ok()
    assert desc is not None
    token_count = struct.unpack_from("<Q", golden_bytes.MATRIX_ATOM, 0x20)[0]
    for row in desc.get("preview", {}).get("items", []):
        assert row["tokens"].startswith("5 17 99 0")
        assert len(row["tokens"].removesuffix(" ...").split()) <= token_count
    run = run_cli("inspect", str(path))
    assert run.code == 1, run.stderr
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr


def test_truncation_at_every_length_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    for n in range(len(golden_bytes.MATRIX_ATOM)):
        path.write_bytes(golden_bytes.MATRIX_ATOM[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n
        assert report.exit_code() == 1, n


def test_every_single_bit_flip_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "flip.bin"
    for bit in range(len(golden_bytes.MATRIX_ATOM) * 8):
        data = bytearray(golden_bytes.MATRIX_ATOM)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), f"flip of bit {bit % 8} in byte {bit // 8} went unnoticed"


def test_large_and_small_scans_agree(tmp_path: Path) -> None:
    """Files above 1 MiB are scanned with numpy in chunks, small ones without; same findings."""
    from matrixctl.validate import matrix_atom as rules

    ids = np.arange(3_000_000, dtype=np.int64) % 1000
    ids[2_999_990] = 5000  # one bad id near the end, in the last chunk
    out = io.BytesIO()
    matrix_atom.write_atoms(out, ids, atom_size=100, vocab_size=6000)
    data = bytearray(out.getvalue())
    struct.pack_into("<I", data, 0x10, 1000)  # now 5000 is out of range
    data = bytearray(reseal(bytes(data)))
    big = rules.scan_payload(bytes(data), matrix_atom.AtomHeader.parse(bytes(data)))
    small = rules._scan_small(bytes(data), matrix_atom.AtomHeader.parse(bytes(data)))
    assert big == small
    assert (big.first_bad, big.bad_count, big.max_id) == (2_999_990, 1, 5000)
    assert big.crc == zlib.crc32(bytes(data[64:]))
    report = verify_bytes(tmp_path, bytes(data))
    assert [f.code for f in report.findings] == [matrix_atom.ATOM_ID_RANGE]
    assert report.findings[0].offset == 64 + 2 * 2_999_990


def test_append_file_gives_the_bytes_of_write(tmp_path: Path) -> None:
    """`AtomWriter.append_file` (ingest workers' token files, copied file to file with the
    producer's CRC-32 and largest id) writes the same file as `write` of the same ids, before
    and after ids written the ordinary way; a file whose ids the checks refuse goes through
    `write` and names the bad token."""
    rng = np.random.default_rng(7)
    parts = [rng.integers(0, 1000, size=n, dtype=np.uint16) for n in (5, 3000, 1, 777)]

    def build(via_file: bool) -> bytes:
        out = io.BytesIO() if not via_file else open(tmp_path / "a.bin", "w+b")  # noqa: SIM115
        with out:
            w = matrix_atom.AtomWriter(out, atom_size=64, dtype="uint16", vocab_size=1000)
            for i, part in enumerate(parts):
                if via_file and i % 2:
                    spill = tmp_path / f"s{i}.raw"
                    spill.write_bytes(part.astype("<u2").tobytes())
                    crc = zlib.crc32(part.astype("<u2").tobytes())
                    w.append_file(str(spill), part.size, int(part.max()), crc)
                else:
                    w.write(part)
            w.finish()
            out.seek(0)
            return out.read()

    assert build(True) == build(False)
    bad = tmp_path / "bad.raw"
    bad.write_bytes(np.array([1, 2, 1000], dtype="<u2").tobytes())
    w = matrix_atom.AtomWriter(io.BytesIO(), atom_size=4, dtype="uint16", vocab_size=1000)
    w.write(np.array([9], dtype=np.uint16))
    with pytest.raises(FormatError, match=r"token 3 \(id 1000\)"):
        w.append_file(str(bad), 3, 1000, zlib.crc32(bad.read_bytes()))
