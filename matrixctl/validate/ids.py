"""Id previews for `inspect`: the ids of a token stream or MATRIX-ATOM file a person can read.

`inspect` shows ids `START` to `START + COUNT` (`--ids START:COUNT`, default the first
`DEFAULT_COUNT`) under `ids` (`start`, `count` in the file, `shown`, `items`), and with
`--symbols MAP` each id's kind and text under `id_text`. Previews read only bytes inside the
file: a header or frame that claims more than the file holds ends the preview there with a
note (`stopped`), never a read past the end. Numbers come from `struct`, so a preview needs no
numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl.errors import UsageError

if TYPE_CHECKING:
    from matrixctl.tokenizers.pi import SymbolMap

DEFAULT_COUNT = 32
MAX_COUNT = 4096


@dataclass(frozen=True)
class IdPreview:
    """What `inspect` asks to see: a range of token indexes and, optionally, a symbol map."""

    start: int = 0
    count: int = DEFAULT_COUNT
    symbols: SymbolMap | None = None


def parse_range(text: str | None) -> tuple[int, int]:
    """`START:COUNT`, `START` or `:COUNT` (token indexes) -> (start, count)."""
    if text is None:
        return 0, DEFAULT_COUNT
    start_s, sep, count_s = text.partition(":")
    try:
        start = int(start_s) if start_s.strip() else 0
        count = int(count_s) if sep and count_s.strip() else DEFAULT_COUNT
    except ValueError:
        raise UsageError(
            f"--ids must look like START:COUNT (token index and number of ids), got {text!r}"
        ) from None
    if start < 0 or not 1 <= count <= MAX_COUNT:
        raise UsageError(f"--ids {text}: START must be >= 0 and COUNT between 1 and {MAX_COUNT:,}")
    return start, count


class SymbolView:
    """Kind and text of ids under one π symbol map."""

    def __init__(self, smap: SymbolMap) -> None:
        self.map = smap
        self.text = dict(smap.symbols)

    def show(self, token_id: int) -> tuple[str, str | None]:
        """(kind, text): pad, eos, unk, special, symbol, byte (text `<0xNN>`) or none."""
        m = self.map
        text = self.text.get(token_id)
        if token_id == m.pad_id:
            return "pad", text
        if m.eos_id is not None and token_id == m.eos_id:
            return "eos", text
        if token_id == m.unk_id:
            return "unk", text
        if text is not None:
            return ("special" if token_id in m.specials else "symbol"), text
        base = m.byte_base_id
        if m.byte_fallback and base is not None and base <= token_id < base + 256:
            return "byte", f"<0x{token_id - base:02X}>"
        return "none", None


def describe_ids(
    ids: list[int],
    start: int,
    of: int | None,
    preview: IdPreview,
    *,
    atom_size: int | None = None,
    stopped: str | None = None,
    vocab_size: int | None = None,
) -> dict[str, Any]:
    """The `ids` section (and `id_text` with a symbol map) of a description, a sample in the
    --json contract's words: `count` ids in the file (None when unknown), `shown` of them in
    `items`, from token index `start`. `vocab_size` is the file's declared vocabulary size
    (None or 0: not declared)."""
    section: dict[str, Any] = {"start": start, "count": of, "shown": len(ids)}
    if stopped:
        section["stopped"] = stopped
    if preview.symbols is not None:
        section["symbol_map"] = preview.symbols.canonical_hash()
        if vocab_size and vocab_size != preview.symbols.vocab_size:
            section["map_mismatch"] = (
                f"the map has vocab_size {preview.symbols.vocab_size}, the file declares "
                f"{vocab_size}: the ids were probably not made with this map"
            )
    section["items"] = ids
    out: dict[str, Any] = {"ids": section}
    if preview.symbols is not None:
        view = SymbolView(preview.symbols)
        rows = []
        for k, token_id in enumerate(ids):
            kind, text = view.show(token_id)
            row: dict[str, Any] = {"token": start + k}
            if atom_size:
                row["atom"] = (start + k) // atom_size
            row.update({"id": token_id, "kind": kind, "text": text})
            rows.append(row)
        out["id_text"] = rows
    return out
