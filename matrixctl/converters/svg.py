"""Render an SVG-Tensor as an SVG picture a person can open in a browser.

Deterministic: the same file and range give the same bytes. Each token is one square cell, each
atom is a grid with its index written above it, and atoms are laid out left to right, top to
bottom, in a roughly square arrangement; a legend on the right says what the colours mean.
A cell's hue says which id range its id is in (BANDS, one colour each) and a hash of the id
shades it lighter or darker, so neighbouring different ids stay apart (docs/formats/svgt.md
gives both functions). When the file is the projection of an ingest pack (its manifest beside
it names the file), the pack says what the ids cannot: end-of-document tokens are drawn dark,
padding light grey, and a red bar marks where each document starts. Hovering over a cell shows
its token id, position and role.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

from matrixctl.converters import Result
from matrixctl.errors import FormatError, MatrixError, UsageError
from matrixctl.formats import svgt
from matrixctl.io import Source, atomic_output

CELL = 8
GAP = 12
LABEL = 14
DEFAULT_MAX_ATOMS = 256
LEGEND_W = 190
SWATCH = 10
LINE = 16

# Id ranges and their base colours (Paul Tol's "bright" scheme, readable with colour blindness).
BANDS: tuple[tuple[int, int, tuple[int, int, int]], ...] = (
    (0, 255, (0x44, 0x77, 0xAA)),
    (256, 1023, (0x66, 0xCC, 0xEE)),
    (1024, 4095, (0x22, 0x88, 0x33)),
    (4096, 16383, (0xCC, 0xBB, 0x44)),
    (16384, 65535, (0xAA, 0x33, 0x77)),
)
EOS_FILL = "#1b1b1b"
PAD_FILL = "#e4e4e4"
DOC_MARK = "#e8202a"


def _hash(token_id: int) -> int:
    x = (token_id * 0x9E3779B1) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    return x


def band_of(token_id: int) -> int:
    return next((i for i, (_, hi, _) in enumerate(BANDS) if token_id <= hi), len(BANDS) - 1)


def token_color(token_id: int) -> str:
    """`#rrggbb`: the base colour of the id's band, mixed with white by 0 to 45 percent as byte
    0 of a 32-bit hash of the id says (so ids of one band differ in shade)."""
    base = BANDS[band_of(token_id)][2]
    t = (_hash(token_id) & 0xFF) * 45 // 255  # percent of white
    r, g, b = (c + (255 - c) * t // 100 for c in base)
    return f"#{r:02x}{g:02x}{b:02x}"


@dataclass
class Roles:
    """What an ingest pack says about the payload: its eos and pad ids, where the documents'
    tokens end (padding follows) and where each document starts."""

    eos_id: int | None = None
    pad_id: int | None = None
    tokens: int | None = None
    starts: set[int] = field(default_factory=set)
    known: bool = False


def pack_roles(path: str, atom_count: int, atom_size: int) -> tuple[Roles, str | None]:
    """The roles from the ingest pack around `path`, if it is one's projection; else empty
    roles and, when a pack was there but unreadable, a note saying why."""
    from matrixctl.atoms import open_valid
    from matrixctl.formats import doc_index, ingest_pack

    folder = os.path.dirname(os.path.abspath(path)) if path != "-" else None
    manifest_path = os.path.join(folder, ingest_pack.MANIFEST) if folder else None
    if manifest_path is None or not os.path.isfile(manifest_path):
        return Roles(), None
    try:
        with open(manifest_path, "rb") as fp:
            doc = json.loads(fp.read(16 << 20))
        entry = doc.get("svgt") if isinstance(doc, dict) else None
        if not isinstance(entry, dict) or entry.get("file") != os.path.basename(path):
            return Roles(), None
        eos, pad, tokens = doc.get("eos_id"), doc.get("pad_id"), doc.get("tokens")
        index_name = doc.get("doc_index")
        if not isinstance(tokens, int) or not isinstance(index_name, str) or "/" in index_name:
            raise ValueError("the manifest lacks tokens or doc_index")
        src, index = open_valid(os.path.join(folder or "", index_name), doc_index.FORMAT)
        with src:
            offsets = doc_index.records_view(src.buf, index.header)["token_offset"].tolist()
    except (OSError, ValueError, MatrixError) as exc:
        reason = exc.message if isinstance(exc, MatrixError) else str(exc)
        return Roles(), f"the ingest pack beside it cannot be read ({reason}): no role marks"
    total = atom_count * atom_size
    roles = Roles(
        eos_id=eos if isinstance(eos, int) else None,
        pad_id=pad if isinstance(pad, int) else None,
        tokens=min(tokens, total),
        starts={o for o in offsets if 0 < o < total},
        known=True,
    )
    return roles, None


def parse_range(text: str | None, atom_count: int) -> tuple[int, int, bool]:
    """`A:B` (either side optional) -> (start, stop, explicit)."""
    if text is None:
        return 0, min(atom_count, DEFAULT_MAX_ATOMS), False
    start_s, sep, stop_s = text.partition(":")
    try:
        start = int(start_s) if start_s.strip() else 0
        stop = int(stop_s) if (sep and stop_s.strip()) else (atom_count if sep else start + 1)
    except ValueError:
        raise UsageError(f"--atoms must look like A:B (atom indexes), got {text!r}") from None
    if not 0 <= start < stop <= atom_count:
        raise UsageError(f"--atoms {text} is outside the file's atoms 0:{atom_count} or empty")
    return start, stop, True


def svgt_to_svg(src: Source, dst_path: str, options: dict[str, Any]) -> Result:
    from matrixctl.validate.svgt import load

    subject = load(src)
    h = subject.header
    if not subject.payload_ok:
        raise FormatError(
            svgt.SVGT_TRUNCATED,
            "the SVG-Tensor's header and size disagree; run `matrixctl verify` on it",
            path=src.name,
        )
    start, stop, explicit = parse_range(options.get("atoms"), h.atom_count)
    result = Result(
        summary={"atoms": [start, stop], "atom_count": h.atom_count, "grid": f"{h.rows}x{h.cols}"}
    )
    if not explicit and stop < h.atom_count:
        result.notes.append(
            f"rendered atoms {start}:{stop} of {h.atom_count}; choose others with --atoms A:B"
        )
    roles, note = pack_roles(src.path, h.atom_count, h.atom_size)
    if note:
        result.notes.append(note)
    result.summary["roles"] = "ingest pack" if roles.known else None
    grids = svgt.atoms_view(src.buf, h)[start:stop]
    with atomic_output(dst_path, what="SVG") as fp:
        for piece in render(grids, start, h.rows, h.cols, roles):
            fp.write(piece.encode("utf-8"))
    return result


def _legend(x: int, roles: Roles) -> str:
    """Swatches for the id bands, then the roles the pack gave (or a line saying none)."""
    out = [f'<g id="legend"><text x="{x}" y="{GAP + 10}" font-weight="bold">legend</text>\n']
    y = GAP + LINE

    def entry(fill: str, label: str, kind: str) -> None:
        nonlocal y
        out.append(
            f'<rect class="swatch" data-kind="{kind}" x="{x}" y="{y}" width="{SWATCH}" '
            f'height="{SWATCH}" fill="{fill}" stroke="#888888" stroke-width="0.5"/>'
            f'<text x="{x + SWATCH + 6}" y="{y + SWATCH - 1}">{label}</text>\n'
        )
        y += LINE

    for lo, hi, base in BANDS:
        label = f"ids {lo:,}-{hi:,}"
        entry("#{:02x}{:02x}{:02x}".format(*base), label, "band")
    if roles.known:
        if roles.eos_id is not None:
            entry(EOS_FILL, f"end of document (id {roles.eos_id})", "eos")
        if roles.pad_id is not None:
            entry(PAD_FILL, f"padding (id {roles.pad_id})", "pad")
        out.append(
            f'<rect class="swatch" data-kind="doc" x="{x}" y="{y}" width="2" height="{SWATCH}" '
            f'fill="{DOC_MARK}"/><text x="{x + SWATCH + 6}" y="{y + SWATCH - 1}">'
            "document starts</text>\n"
        )
        y += LINE
    else:
        for line in (
            "shade: the id in its range",
            "EOS, padding and document",
            "starts need the ingest pack",
        ):
            out.append(f'<text x="{x}" y="{y + SWATCH - 1}" fill="#666666">{line}</text>\n')
            y += LINE - 3
    out.append("</g>\n")
    return "".join(out)


def legend_height(roles: Roles) -> int:
    return GAP + LINE * (len(BANDS) + 1) + (3 * LINE if roles.known else 3 * (LINE - 3)) + GAP


def render(grids: Any, first_index: int, rows: int, cols: int, roles: Roles | None = None) -> Any:
    roles = roles or Roles()
    n = len(grids)
    per_row = max(1, math.ceil(math.sqrt(n)))
    layout_rows = max(1, math.ceil(n / per_row))
    label_w = 7 * len(f"atom {first_index + max(n - 1, 0)}")  # 11 px monospace: < 7 px a glyph
    box_w = max(cols * CELL, label_w) + GAP
    box_h = rows * CELL + LABEL + GAP
    atoms_w = per_row * box_w + GAP * 2
    width = atoms_w + LEGEND_W
    height = max(layout_rows * box_h + GAP, legend_height(roles))
    yield (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">\n'
        f"<!-- SVG-Tensor atoms {first_index}:{first_index + n}, grid {rows}x{cols}, "
        "rendered by matrixctl -->\n"
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>\n'
    )
    yield _legend(atoms_w, roles)
    colors: dict[int, str] = {}
    atom_size = rows * cols
    tokens = roles.tokens if roles.tokens is not None else math.inf
    for k in range(n):
        atom = first_index + k
        ox = GAP + (k % per_row) * box_w
        oy = GAP + (k // per_row) * box_h
        parts = [f'<g id="atom-{atom}"><text x="{ox}" y="{oy + LABEL - 4}">atom {atom}</text>\n']
        marks = []
        grid = grids[k].tolist()
        top = oy + LABEL
        for r in range(rows):
            row = grid[r]
            y = top + r * CELL
            for c in range(cols):
                tid = row[c]
                pos = atom * atom_size + r * cols + c
                x = ox + c * CELL
                role = ""
                if pos >= tokens:
                    fill, role = PAD_FILL, "pad"
                elif roles.known and tid == roles.eos_id:
                    fill, role = EOS_FILL, "eos"
                else:
                    fill = colors.get(tid) or colors.setdefault(tid, token_color(tid))
                title = f"id {tid} (atom {atom}, row {r}, col {c})"
                extra = ""
                if role:
                    title += f" {'end of document' if role == 'eos' else 'padding'}"
                    extra = f' class="{role}" data-pos="{pos}"'
                if pos in roles.starts:
                    title += " document starts"
                    marks.append(
                        f'<rect class="doc-start" data-pos="{pos}" x="{x}" y="{y - 1}" '
                        f'width="2" height="{CELL + 2}" fill="{DOC_MARK}"/>\n'
                    )
                parts.append(
                    f'<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="{fill}"{extra}>'
                    f"<title>{title}</title></rect>\n"
                )
        parts.extend(marks)  # drawn over the cells
        parts.append("</g>\n")
        yield "".join(parts)
    yield "</svg>\n"
