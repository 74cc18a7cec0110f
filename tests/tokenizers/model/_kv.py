"""A GGUF file's metadata as plain Python values keyed by GGUF key name (what the model
tokenizers' `from_gguf_kv` take), read with the `gguf` package's reader (an independent
parser, not matrixctl's)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any


@lru_cache(maxsize=8)
def _read(path: str) -> dict[str, Any]:
    import gguf

    reader = gguf.GGUFReader(path)
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = field.contents()
    return out


def gguf_kv(path: Path | str) -> dict[str, Any]:
    """A fresh copy (the lists are shared: do not mutate them)."""
    return dict(_read(str(path)))
