"""Plain text input: the whole file is one document, streamed in pieces (UTF-8, CRLF and
lone CR as LF, the BOM dropped). A large file may be cut into pieces at line ends where the
tokenizer says a cut changes no id (`ingest/units.py`, `Tokenizer.cut_followers`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.ingest.kinds.base import Counters, Doc, Kind, Options, iter_decoded


def documents(fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    yield 0, iter_decoded(fp, name, opts)


KINDS = (Kind("text", 0, names=(".txt", ".text", ".rst"), documents=documents, cut="text"),)
