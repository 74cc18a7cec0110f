"""JSON input: one document, or an array of documents; each document's text is the
--text-field of an object. A JSON file is parsed whole (at most --max-doc-size bytes)."""

from __future__ import annotations

import json
import re
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
    int_limit,
    no_surrogates,
    read_whole,
    text_field,
    too_many_digits,
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
    except ValueError:  # an integer longer than Python's int-string limit
        raise _too_many_digits(text, name) from None
    except RecursionError:
        raise FormatError(INGEST_JSON, "JSON nested too deeply", path=name) from None
    items = doc if isinstance(doc, list) else [doc]
    for n, obj in enumerate(items):
        where = f"element {n}"
        value = text_field(obj, opts, name, where, counters)
        if value is not None:
            value = no_surrogates(value, opts, name, where, None)
            yield (n if isinstance(doc, list) else 0), iter([crlf(value)])


def _too_many_digits(text: str, name: str) -> FormatError:
    """The integer error of a JSON file, at the first run of that many digits (the parser
    does not say where: a run inside a string before it would be named instead)."""
    found = re.search(f"[0-9]{{{int_limit() + 1}}}", text)
    if found is None:
        return too_many_digits(name, "the document", None)
    line = text.count("\n", 0, found.start()) + 1
    offset = len(text[: found.start()].encode("utf-8"))
    return too_many_digits(name, f"line {line}", offset)


def sniff(body: bytes) -> bool:
    """A leading `[` or `{` (JSON Lines' sniff, asked first, takes a complete object line)."""
    return body.startswith((b"[", b"{"))


KINDS = (Kind("json", 4, hints=(".json",), sniff=sniff, documents=documents),)
