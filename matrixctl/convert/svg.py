"""Render an SVG-Tensor as an SVG picture a person can open in a browser.

Deterministic: the same file and range give the same bytes. Each token is one square cell whose
color comes from a hash of its id (docs/formats/svgt.md gives the function), each atom is a
grid with its index written above it, and atoms are laid out left to right, top to bottom, in a
roughly square arrangement. Hovering over a cell shows its token id and position.
"""

from __future__ import annotations

import math
from typing import Any

from matrixctl.convert import Result
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats import svgt
from matrixctl.io import Source, atomic_output

CELL = 8
GAP = 12
LABEL = 14
DEFAULT_MAX_ATOMS = 256


def token_color(token_id: int) -> str:
    """`#rrggbb` from a 32-bit integer hash of the id; channels kept in 64..255 for contrast."""
    x = (token_id * 0x9E3779B1) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x ^= x >> 13
    r, g, b = (64 + ((x >> shift) & 0xFF) * 191 // 255 for shift in (0, 8, 16))
    return f"#{r:02x}{g:02x}{b:02x}"


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
    grids = svgt.atoms_view(src.buf, h)[start:stop]
    with atomic_output(dst_path, what="SVG") as fp:
        for piece in render(grids, start, h.rows, h.cols):
            fp.write(piece.encode("utf-8"))
    return result


def render(grids: Any, first_index: int, rows: int, cols: int) -> Any:
    n = len(grids)
    per_row = max(1, math.ceil(math.sqrt(n)))
    layout_rows = max(1, math.ceil(n / per_row))
    box_w = cols * CELL + GAP
    box_h = rows * CELL + LABEL + GAP
    width = per_row * box_w + GAP
    height = layout_rows * box_h + GAP
    yield (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="11">\n'
        f"<!-- SVG-Tensor atoms {first_index}:{first_index + n}, grid {rows}x{cols}, "
        "rendered by matrixctl -->\n"
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>\n'
    )
    colors: dict[int, str] = {}
    for k in range(n):
        atom = first_index + k
        ox = GAP + (k % per_row) * box_w
        oy = GAP + (k // per_row) * box_h
        parts = [f'<g id="atom-{atom}"><text x="{ox}" y="{oy + LABEL - 4}">atom {atom}</text>\n']
        grid = grids[k].tolist()
        top = oy + LABEL
        for r in range(rows):
            row = grid[r]
            y = top + r * CELL
            for c in range(cols):
                tid = row[c]
                color = colors.get(tid)
                if color is None:
                    color = colors[tid] = token_color(tid)
                title = f"id {tid} (atom {atom}, row {r}, col {c})"
                parts.append(
                    f'<rect x="{ox + c * CELL}" y="{y}" width="{CELL}" height="{CELL}" '
                    f'fill="{color}"><title>{title}</title></rect>\n'
                )
        parts.append("</g>\n")
        yield "".join(parts)
    yield "</svg>\n"
