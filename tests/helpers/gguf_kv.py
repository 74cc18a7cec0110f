"""A GGUF file's key-value metadata as plain Python values (what the model tokenizers'
`from_gguf_kv` take), read with the `gguf` package's `GGUFReader`.

Strings come back as `str` (bytes that are not UTF-8 as surrogate escapes, so nothing is lost),
arrays as lists, scalars as `int`, `float` or `bool`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf


def _string(part: Any) -> str:
    return bytes(part.tobytes()).decode("utf-8", errors="surrogateescape")


def _scalar(kind: gguf.GGUFValueType, part: Any) -> Any:
    value = part.tolist()[0]
    if kind == gguf.GGUFValueType.BOOL:
        return bool(value)
    return value


def field_value(field: Any) -> Any:
    """One `ReaderField`'s value as a plain Python value."""
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [_string(field.parts[i]) for i in field.data]
        if sub == gguf.GGUFValueType.ARRAY:
            raise ValueError(f"{field.name}: nested arrays are not read")
        return [_scalar(sub, field.parts[i]) for i in field.data]
    if kind == gguf.GGUFValueType.STRING:
        return _string(field.parts[field.data[0]])
    return _scalar(kind, field.parts[field.data[0]])


def gguf_kv(path: str | Path) -> dict[str, Any]:
    """Every metadata key of the GGUF at `path` (the GGUF.* header pseudo-keys left out)."""
    reader = gguf.GGUFReader(str(path))
    return {
        name: field_value(field)
        for name, field in reader.fields.items()
        if not name.startswith("GGUF.")
    }
