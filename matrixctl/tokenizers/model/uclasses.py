"""Unicode general-category classes for Python's `re`, as the model tokenizers' pre-tokenizers
need them (`\\p{L}`, `\\p{N}`, ... are not in `re`).

Two tables (docs/tokenizers.md, "Byte-level BPE"):

- "llama": llama.cpp's own tables (its `unicode-data.cpp`), which are Unicode 15.1. Python 3.11's
  `unicodedata` is Unicode 14.0; the code points Unicode 15.0 and 15.1 assigned (5,116 of them)
  are listed below by category group. With them the table equals llama.cpp's, code point for
  code point (tests/tokenizers/model/test_bpe.py checks the count).
- "unicodedata": Python's Unicode 14.0 as it is.

White space is llama.cpp's set: Unicode's White_Space property (Python's `str.isspace` and
`re`'s `\\s` also take U+001C..U+001F, which are not white space here).
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# The white space class body for `re` (inside [...]).
WS = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"

# Code points unassigned in Unicode 14.0 and assigned by 15.0 or 15.1: (first, last, group),
# group the first letter of the general category.
UNICODE_15_1_ADDED: tuple[tuple[int, int, str], ...] = (
    (0x00CF3, 0x00CF3, "M"),
    (0x00ECE, 0x00ECE, "M"),
    (0x02FFC, 0x02FFF, "S"),
    (0x031EF, 0x031EF, "S"),
    (0x10EFD, 0x10EFF, "M"),
    (0x1123F, 0x11240, "L"),
    (0x11241, 0x11241, "M"),
    (0x11B00, 0x11B09, "P"),
    (0x11F00, 0x11F01, "M"),
    (0x11F02, 0x11F02, "L"),
    (0x11F03, 0x11F03, "M"),
    (0x11F04, 0x11F10, "L"),
    (0x11F12, 0x11F33, "L"),
    (0x11F34, 0x11F3A, "M"),
    (0x11F3E, 0x11F42, "M"),
    (0x11F43, 0x11F4F, "P"),
    (0x11F50, 0x11F59, "N"),
    (0x1342F, 0x1342F, "L"),
    (0x13439, 0x1343F, "C"),
    (0x13440, 0x13440, "M"),
    (0x13441, 0x13446, "L"),
    (0x13447, 0x13455, "M"),
    (0x1B132, 0x1B132, "L"),
    (0x1B155, 0x1B155, "L"),
    (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"),
    (0x1E030, 0x1E06D, "L"),
    (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"),
    (0x1E4EC, 0x1E4EF, "M"),
    (0x1E4F0, 0x1E4F9, "N"),
    (0x1F6DC, 0x1F6DC, "S"),
    (0x1F774, 0x1F776, "S"),
    (0x1F77B, 0x1F77F, "S"),
    (0x1F7D9, 0x1F7D9, "S"),
    (0x1FA75, 0x1FA77, "S"),
    (0x1FA87, 0x1FA88, "S"),
    (0x1FAAD, 0x1FAAF, "S"),
    (0x1FABB, 0x1FABD, "S"),
    (0x1FABF, 0x1FABF, "S"),
    (0x1FACE, 0x1FACF, "S"),
    (0x1FADA, 0x1FADB, "S"),
    (0x1FAE8, 0x1FAE8, "S"),
    (0x1FAF7, 0x1FAF8, "S"),
    (0x2B739, 0x2B739, "L"),
    (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
)
UNICODE_15_1_ADDED_COUNT = 5116

GROUPS = "LMNPSZC"


@cache
def _groups(table: str) -> bytes:
    """One byte per code point: the first letter of its general category ("C" for unassigned,
    surrogates and private use)."""
    if table not in ("llama", "unicodedata"):
        raise ValueError(f"unknown Unicode table {table!r}")
    cat = unicodedata.category
    out = bytearray(b"C" * 0x110000)
    for cp in range(0x110000):
        c = cat(chr(cp))
        if c != "Cn":
            out[cp] = ord(c[0])
    if table == "llama":
        for first, last, group in UNICODE_15_1_ADDED:
            out[first : last + 1] = group.encode() * (last - first + 1)
    return bytes(out)


def _escape(cp: int) -> str:
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


@cache
def char_class(groups: str, table: str = "llama") -> str:
    """The body of a `re` character class (what goes inside [...]) matching every code point
    whose category group is one of `groups` (e.g. "L", "LM", "N")."""
    if not groups or any(g not in GROUPS for g in groups):
        raise ValueError(f"unknown category groups {groups!r}")
    data = _groups(table)
    want = {ord(g) for g in groups}
    parts: list[str] = []
    cp = 0
    n = len(data)
    while cp < n:
        if data[cp] in want:
            start = cp
            while cp + 1 < n and data[cp + 1] in want:
                cp += 1
            parts.append(_escape(start) if start == cp else f"{_escape(start)}-{_escape(cp)}")
        cp += 1
    return "".join(parts)


def group_ranges(group: str, table: str = "llama") -> list[tuple[int, int]]:
    """The (first, last) code point ranges whose category group is `group` (e.g. "M")."""
    if group not in GROUPS or len(group) != 1:
        raise ValueError(f"unknown category group {group!r}")
    runs = re.finditer(re.escape(group.encode()) + b"+", _groups(table))
    return [(m.start(), m.end() - 1) for m in runs]


def group_of(cp: int, table: str = "llama") -> str:
    """The category group letter of code point `cp`."""
    return chr(_groups(table)[cp])
