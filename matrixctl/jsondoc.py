"""The `--json` contract's shared pieces (docs/json.md): the schema version every document
starts with and the encoder's fallback for values JSON has no type for. The CLI prints
documents with them; the Python API (`matrixctl.inspect`) returns the same documents."""

from __future__ import annotations

import json
from typing import Any

SCHEMA_VERSION = 1


def json_default(obj: Any) -> Any:
    """bytes as hex text, numpy scalars as Python numbers; anything else is a bug."""
    if isinstance(obj, bytes):
        return obj.hex()
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def document(doc: dict[str, Any], *, ok: bool) -> dict[str, Any]:
    """The document as the CLI prints it (`schema_version`, `ok`, then `doc`), passed through
    JSON so it holds exactly what a reader of the printed text gets."""
    head: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "ok": ok}
    head.update((k, v) for k, v in doc.items() if k != "schema_version")
    loaded: dict[str, Any] = json.loads(json.dumps(head, ensure_ascii=False, default=json_default))
    return loaded
