"""JSON input: one document, or an array of documents; each document's text is the
--text-field of an object. A JSON file is parsed whole (at most --max-doc-size bytes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.ingest.kinds.base import (
    INGEST_JSON,
    Counters,
    Doc,
    Kind,
    Options,
    crlf,
    decode_whole,
    read_whole,
    text_field,
)


def documents(fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    text = decode_whole(read_whole(fp, name, "JSON", opts.max_doc), name, opts)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = None
        if exc.msg == "Extra data":
            hint = "it holds several JSON values: JSON Lines? name it .jsonl"
        raise FormatError(
            INGEST_JSON,
            f"not valid JSON: {exc.msg} (line {exc.lineno})",
            path=name,
            offset=len(text[: exc.pos].encode("utf-8")),
            field=f"line {exc.lineno}",
            hint=hint,
        ) from None
    except RecursionError:
        raise FormatError(INGEST_JSON, "JSON nested too deeply", path=name) from None
    items = doc if isinstance(doc, list) else [doc]
    for n, obj in enumerate(items):
        value = text_field(obj, opts, name, f"element {n}", counters)
        if value is not None:
            yield (n if isinstance(doc, list) else 0), iter([crlf(value)])


def sniff(body: bytes) -> bool:
    """A leading `[` or `{` (JSON Lines' sniff, asked first, takes a complete object line)."""
    return body.startswith((b"[", b"{"))


KINDS = (Kind("json", 4, hints=(".json",), sniff=sniff, documents=documents),)
