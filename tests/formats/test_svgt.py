"""SVG-Tensor: golden bytes, packing from atoms, refusing ids above 65535, SVG rendering."""

from __future__ import annotations

import io
import json
import re
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from matrixctl.atoms import write_svgt
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats import matrix_atom, svgt
from matrixctl.io import Source
from matrixctl.validate.engine import examine
from tests.helpers import golden_bytes


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_golden_file_on_disk_is_the_hand_written_bytes() -> None:
    assert (
        Path(__file__).resolve().parents[1] / "golden/svgt_v1.svgt"
    ).read_bytes() == golden_bytes.SVGT


def test_pack_svgt_produces_the_golden_bytes(tmp_path: Path) -> None:
    atoms = write(tmp_path, "a.bin", golden_bytes.MATRIX_ATOM)
    out = tmp_path / "a.svgt"
    summary = write_svgt(atoms, str(out), grid="2x2")
    assert out.read_bytes() == golden_bytes.SVGT
    assert summary["atom_count"] == 2


def test_header_parse_matches_spec_table() -> None:
    h = svgt.SvgtHeader.parse(golden_bytes.SVGT)
    assert (h.magic, h.version, h.header_bytes, h.rows, h.cols) == (b"SVGTENSR", 1, 32, 2, 2)
    assert (h.atom_count, h.data_offset) == (2, 32)
    assert svgt.atoms_view(golden_bytes.SVGT, h).tolist() == [[[5, 17], [99, 0]], [[42, 0], [0, 0]]]


def test_ids_above_65535_are_refused_not_masked(tmp_path: Path) -> None:
    """Decision: an id above 65535 is an error naming the token; nothing is written."""
    buf = io.BytesIO()
    matrix_atom.write_atoms(buf, np.array([1, 2, 3, 70000]), atom_size=4)
    atoms = write(tmp_path, "wide.bin", buf.getvalue())
    out = tmp_path / "wide.svgt"
    with pytest.raises(FormatError) as info:
        write_svgt(atoms, str(out), grid="2x2")
    assert info.value.code == svgt.SVGT_ID_OVERFLOW and info.value.field == "token[3]"
    assert not out.exists()


def test_uint32_atoms_whose_ids_fit_project_fine(tmp_path: Path) -> None:
    buf = io.BytesIO()
    matrix_atom.write_atoms(buf, np.array([1, 2, 3, 65535]), atom_size=4, dtype="uint32")
    out = tmp_path / "ok.svgt"
    write_svgt(write(tmp_path, "w.bin", buf.getvalue()), str(out), grid="1x4")
    h = svgt.SvgtHeader.parse(out.read_bytes())
    assert svgt.atoms_view(out.read_bytes(), h).reshape(-1).tolist() == [1, 2, 3, 65535]


def test_corrupt_atom_payload_is_caught_while_projecting(tmp_path: Path) -> None:
    data = bytearray(golden_bytes.MATRIX_ATOM)
    data[70] ^= 0x01
    out = tmp_path / "x.svgt"
    with pytest.raises(FormatError) as info:
        write_svgt(write(tmp_path, "bad.bin", bytes(data)), str(out), grid="2x2")
    assert info.value.code == matrix_atom.ATOM_PAYLOAD_CRC
    assert not out.exists()


@pytest.mark.parametrize(("grid", "atom_size"), [("3x2", 4), ("2x", 4), ("0x4", 4), ("ax2", 4)])
def test_bad_grids_are_usage_errors(grid: str, atom_size: int) -> None:
    with pytest.raises(UsageError):
        svgt.parse_grid(grid, atom_size)


def patch(offset: int, fmt: str, value: int) -> bytes:
    buf = bytearray(golden_bytes.SVGT)
    struct.pack_into(fmt, buf, offset, value)
    return bytes(buf)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (patch(0x08, "<H", 2), svgt.SVGT_VERSION),
        (patch(0x0A, "<H", 64), svgt.SVGT_HEADER_BYTES),
        (patch(0x0C, "<H", 0), svgt.SVGT_GRID),
        (patch(0x0E, "<H", 0), svgt.SVGT_GRID),
        (patch(0x18, "<Q", 40), svgt.SVGT_DATA_OFFSET),
        (patch(0x10, "<Q", 3), svgt.SVGT_TRUNCATED),
        (patch(0x10, "<Q", 2**62), svgt.SVGT_TRUNCATED),
        (golden_bytes.SVGT + b"\0\0", svgt.SVGT_TRAILING),
    ],
)
def test_each_header_problem_has_its_code(tmp_path: Path, data: bytes, code: str) -> None:
    report = examine(write(tmp_path, "s.svgt", data), scan=True)[0]
    assert code in {f.code for f in report.findings}


def test_truncation_at_every_length_is_reported(tmp_path: Path) -> None:
    for n in range(len(golden_bytes.SVGT)):
        report = examine(write(tmp_path, "t.svgt", golden_bytes.SVGT[:n]), scan=True)[0]
        assert not report.ok(), n


def test_every_header_bit_flip_is_reported(tmp_path: Path) -> None:
    """The payload has no checksum (docs/formats/svgt.md decision 4); the header is covered."""
    for bit in range(svgt.HEADER_SIZE * 8):
        data = bytearray(golden_bytes.SVGT)
        data[bit // 8] ^= 1 << (bit % 8)
        assert not examine(write(tmp_path, "f.svgt", bytes(data)), scan=True)[0].ok(), bit


# SVG rendering ------------------------------------------------------------------------------


def render(tmp_path: Path, atoms: str | None) -> str:
    from matrixctl.converters.svg import svgt_to_svg

    out = tmp_path / "o.svg"
    with Source.open(write(tmp_path, "g.svgt", golden_bytes.SVGT)) as src:
        svgt_to_svg(src, str(out), {"atoms": atoms})
    return out.read_text()


def test_svg_has_one_cell_per_token_and_labels(tmp_path: Path) -> None:
    text = render(tmp_path, None)
    assert text.startswith("<svg ") and text.rstrip().endswith("</svg>")
    assert text.count("<rect x=") == 8
    assert "atom 0</text>" in text and "atom 1</text>" in text
    assert "<title>id 99 (atom 0, row 1, col 0)</title>" in text


def test_svg_is_deterministic_and_colors_follow_the_documented_hash(tmp_path: Path) -> None:
    from matrixctl.converters.svg import token_color

    assert render(tmp_path, None) == render(tmp_path, None)
    # Worked by hand from docs/formats/svgt.md for id 1:
    # x = 0x9E3779B1; x ^= x >> 16 -> 0x9E37E786; x = x * 0x85EBCA6B mod 2^32; x ^= x >> 13.
    x = 0x9E3779B1
    x ^= x >> 16
    assert x == 0x9E37E786
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    # id 1 is in the first band (ids 0-255, base #4477aa), whitened by byte 0 of x * 45 // 255 %.
    t = (x & 0xFF) * 45 // 255
    r, g, b = (c + (255 - c) * t // 100 for c in (0x44, 0x77, 0xAA))
    assert token_color(1) == f"#{r:02x}{g:02x}{b:02x}"
    fills = set(re.findall(r'fill="(#[0-9a-f]{6})"><title>id 5 ', render(tmp_path, None)))
    assert fills == {token_color(5)}


def test_svg_atom_range(tmp_path: Path) -> None:
    text = render(tmp_path, "1:2")
    assert "atom 1</text>" in text and "atom 0</text>" not in text
    assert text.count("<rect x=") == 4
    with pytest.raises(UsageError):
        render(tmp_path, "2:5")
    with pytest.raises(UsageError):
        render(tmp_path, "x")


def test_svg_bands_and_legend(tmp_path: Path) -> None:
    """Decision: the hue says the id's range (ids 0-255, 256-1,023, 1,024-4,095, 4,096-16,383,
    16,384-65,535), the hash only the shade; the legend lists every range."""
    from matrixctl.converters.svg import BANDS, band_of, token_color

    assert [band_of(i) for i in (0, 255, 256, 1023, 1024, 4096, 16383, 16384, 65535)] == [
        0, 0, 1, 1, 2, 3, 3, 4, 4
    ]  # fmt: skip
    for lo, hi, base in BANDS:
        for tid in (lo, (lo + hi) // 2, hi):
            r, g, b = (int(token_color(tid)[i : i + 2], 16) for i in (1, 3, 5))
            # Mixed with white: every channel between the base and 45 % of the way to white.
            for got, c in zip((r, g, b), base, strict=True):
                assert c <= got <= c + (255 - c) * 45 // 100
    svg = ET.fromstring(render(tmp_path, None))
    kinds = [e.get("data-kind") for e in svg.iter(f"{NS}rect") if e.get("class") == "swatch"]
    assert kinds == ["band"] * len(BANDS)  # no pack beside it: no role swatches
    assert "starts need the ingest pack" in render(tmp_path, None)


NS = "{http://www.w3.org/2000/svg}"
CELL_TITLE = re.compile(r"id (\d+) \(atom (\d+), row (\d+), col (\d+)\)")


def test_svg_of_a_pack_marks_eos_padding_and_document_starts(tmp_path: Path) -> None:
    """Decision: the SVG-Tensor and MATRIX-ATOM headers hold no eos id, pad id or document
    boundary, so the renderer takes them from the ingest pack whose manifest names the file:
    cells past the manifest's `tokens` are padding, cells holding `eos_id` before it are ends of
    documents, and each document index offset (but 0) gets a start bar on its cell."""
    from matrixctl.converters.svg import PAD_FILL, token_color
    from tests.helpers.cli import FIXTURES, run_cli

    pack = tmp_path / "pack"
    args = ["--atom-size", "64", "--svgt", "8x8", "-q"]
    assert run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(pack), *args).code == 0
    manifest = json.loads((pack / "ingest_manifest.json").read_text())
    eos, tokens = manifest["eos_id"], manifest["tokens"]
    ids = np.frombuffer((pack / "matrix_atoms.bin").read_bytes(), "<u2", offset=64)
    record = np.dtype([("offset", "<u8"), ("length", "<u8"), ("pad", "<u8"), ("item", "<u8")])
    index = (pack / "doc_index.bin").read_bytes()
    starts = {int(o) for o in np.frombuffer(index, record, offset=48)["offset"]} - {0}
    assert tokens < ids.size and len(starts) >= 5  # padding and several documents to see
    out = tmp_path / "p.svg"
    assert run_cli("convert", str(pack / "atoms.svgt"), str(out), "-q").code == 0
    text = out.read_text()
    root = ET.fromstring(text)
    cells: dict[int, ET.Element] = {}
    for rect in root.iter(f"{NS}rect"):
        title = rect.find(f"{NS}title")
        if title is None:
            continue
        tid, atom, row, col = map(int, CELL_TITLE.match(title.text or "").groups())  # type: ignore[union-attr]
        pos = atom * 64 + row * 8 + col
        assert tid == ids[pos]
        cells[pos] = rect
    assert sorted(cells) == list(range(ids.size))
    for pos, rect in cells.items():
        role = rect.get("class")
        if pos >= tokens:
            assert role == "pad" and rect.get("fill") == PAD_FILL, pos
        elif ids[pos] == eos:
            assert role == "eos", pos
        else:
            assert role is None and rect.get("fill") == token_color(int(ids[pos])), pos
    marks = [r for r in root.iter(f"{NS}rect") if r.get("class") == "doc-start"]
    assert {int(m.get("data-pos", -1)) for m in marks} == starts
    for m in marks:
        cell = cells[int(m.get("data-pos", -1))]
        assert m.get("x") == cell.get("x")  # on the left edge of the document's first cell
    kinds = [r.get("data-kind") for r in root.iter(f"{NS}rect") if r.get("class") == "swatch"]
    assert kinds[-3:] == ["eos", "pad", "doc"]
    again = tmp_path / "q.svg"
    assert run_cli("convert", str(pack / "atoms.svgt"), str(again), "-q").code == 0
    assert again.read_bytes() == out.read_bytes()
