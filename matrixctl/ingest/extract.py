"""Text extraction for `ingest docs`: HTML, JSON, JSON Lines, Markdown and plain text.

A source file's kind (docs/formats/ingest-pack.md, "Extraction"; docs/inputs.md): a NUL byte
in the first 8 KiB means binary. Then the name decides where it says what the file is:
`.md`, `.markdown`, `.mdown`, `.mkd` are Markdown, `.txt`, `.text`, `.rst` are text, `.html`,
`.htm`, `.xhtml` are HTML, whatever their first byte (a README that opens with `[![badge]` is
Markdown, not JSON). Only where the name says nothing do the leading bytes decide: a leading
`<` with an HTML tag in the first 4 KiB means HTML; a leading `[` means a JSON array; a
leading `{` means JSON Lines when the first line is a complete JSON object, else one JSON
document.

Each extractor yields documents as `(item, pieces)`: `item` locates the document in its source
(JSON Lines line number, JSON array index, 0 otherwise) and `pieces` is an iterator of text
pieces, so a 5 GB text file streams through with bounded memory. HTML and JSON files are parsed
whole and are limited to 256 MiB each.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from matrixctl import codes
from matrixctl.errors import FormatError

G = "ingest"
INGEST_BINARY = codes.define(
    "INGEST_BINARY", "A named source file is binary (a NUL byte in its first 8 KiB).", group=G
)
INGEST_UTF8 = codes.define(
    "INGEST_UTF8",
    "A source file is not valid UTF-8 (the error names the file and byte offset).",
    group=G,
)
INGEST_JSON = codes.define("INGEST_JSON", "A JSON or JSON Lines source is not valid JSON.", group=G)
INGEST_TOO_LARGE = codes.define(
    "INGEST_TOO_LARGE",
    "A document is larger than --max-doc-size (default 256 MiB): an HTML or JSON source "
    "(parsed whole), a JSON Lines line or a Parquet/Arrow cell.",
    group=G,
)
INGEST_COLUMNAR = codes.define(
    "INGEST_COLUMNAR",
    "A Parquet or Arrow input cannot be read: damaged, no such column, pyarrow missing, or "
    "given compressed or on stdin.",
    group=G,
)
INGEST_TEXT_FIELD = codes.define(
    "INGEST_TEXT_FIELD",
    "A JSON document lacks the text field (or it is not a string) under --missing-field error.",
    group=G,
)

MAX_WHOLE = 256 << 20
SNIFF = 8192
PIECE = 1 << 20
MARKDOWN_EXT = (".md", ".markdown", ".mdown", ".mkd")
# Names that say what a file is: the name decides for them, never the first byte.
NAMED_KINDS = {
    **dict.fromkeys(MARKDOWN_EXT, "markdown"),
    ".txt": "text",
    ".text": "text",
    ".rst": "text",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
}
KINDS = ("html", "json", "jsonl", "markdown", "text", "parquet", "arrow")
COLUMNAR = ("parquet", "arrow")
COMPRESSED_EXT = (".gz", ".gzip", ".zst", ".zstd", ".xz", ".bz2")
JSON_NAMES = {".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}
# Columnar containers, by magic: Parquet files start (and end) with PAR1; Arrow IPC files
# start with ARROW1, Arrow IPC streams (`datasets` save_to_disk) with a continuation marker.
COLUMNAR_MAGIC = ((b"PAR1", "parquet"), (b"ARROW1", "arrow"), (b"\xff\xff\xff\xff", "arrow"))

_HTML_TAG = re.compile(
    rb"<(?:!doctype\s+html|html|head|body|title|meta|p|div|h[1-6]|table|a)\b", re.I
)


@dataclass(frozen=True)
class Options:
    text_field: str = "text"
    missing_field: str = "skip"  # skip | error
    encoding_errors: str = "error"  # error | replace | skip-file
    max_doc: int = MAX_WHOLE  # --max-doc-size in bytes
    input_kind: str = "auto"  # --input-kind: auto (names and bytes) or a kind for every input


def sniff_kind(head: bytes, name: str) -> str:
    """`binary`, `html`, `json`, `jsonl`, `markdown` or `text`: the name where it states the
    kind, else the first bytes (a NUL byte means binary whatever the name)."""
    for magic, kind in COLUMNAR_MAGIC:
        if head.startswith(magic):
            return kind
    if b"\0" in head[:SNIFF]:
        return "binary"
    named = name_kind(name)
    if named is not None:
        return named
    hinted = json_hint(name)
    if hinted is not None:
        return hinted
    body = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if body.startswith(b"<") and _HTML_TAG.search(body[:4096]):
        return "html"
    if body.startswith(b"["):
        return "json"
    if body.startswith(b"{"):
        first = body.split(b"\n", 1)[0].strip()
        try:
            if isinstance(json.loads(first), dict):
                return "jsonl"
        except (ValueError, RecursionError):
            pass
        return "json"
    return "text"


def _suffix(name: str) -> str:
    base = name.replace("\\", "/").rsplit("/", 1)[-1].lower()
    dot = base.rfind(".")
    return base[dot:] if dot > 0 else ""


def name_kind(name: str) -> str | None:
    """The kind a file's name states (`NAMED_KINDS`), or None when the name says nothing."""
    return NAMED_KINDS.get(_suffix(name))


def json_hint(name: str) -> str | None:
    """`json` for `.json`, `jsonl` for `.jsonl` / `.ndjson`: hints the bytes must agree with."""
    return JSON_NAMES.get(_suffix(name))


def strip_compression(name: str) -> str:
    """`corpus.jsonl.gz` -> `corpus.jsonl`: the name a compressed file's content goes by."""
    suffix = _suffix(name)
    return name[: -len(suffix)] if suffix in COMPRESSED_EXT else name


def detect_kind(
    head: bytes, name: str, fp: Any, limit: int, forced: str = "auto"
) -> tuple[str, Any]:
    """The kind of a stream whose first bytes are `head` (already read back into `fp`).

    Where neither the name nor the first byte settle it (a leading `{` or `[` without a
    `.json`/`.jsonl` name), one complete record decides: the first non-blank line is read
    whole (at most `limit` bytes) and parsed. A JSON object is JSON Lines; another complete
    value is JSON; a line the parser rejects before its end (`[ This is a pointer`, `[Unit]`)
    is text; a line that ends before the value does (a pretty-printed `{`) is one JSON
    document. Returns the kind and the reader to extract from (the line given back)."""
    from matrixctl.ingest.inputs import Prefixed

    if forced != "auto":
        return ("binary" if b"\0" in head[:SNIFF] and forced not in COLUMNAR else forced), fp
    kind = sniff_kind(head, name)
    if kind not in ("json", "jsonl") or json_hint(name) is not None:
        return kind, fp
    lines: list[bytes] = []
    size = 0
    while size <= limit:
        line = fp.readline(limit + 1 - size)
        if not line:
            break
        lines.append(line)
        size += len(line)
        if line.strip() and line.endswith(b"\n"):
            break
    fp = Prefixed(b"".join(lines), fp)
    first = b"".join(lines).removeprefix(b"\xef\xbb\xbf").strip()
    if size > limit or not first:
        return "json", fp
    try:
        value = json.loads(first)
    except (ValueError, RecursionError) as exc:
        pos = getattr(exc, "pos", None)
        if (
            isinstance(exc, json.JSONDecodeError)
            and pos is not None
            and pos < len(first.decode("utf-8", "replace"))
        ):
            return "text", fp
        return "json", fp
    return ("jsonl" if isinstance(value, dict) else "json"), fp


class HashingReader:
    """Read a file while computing its SHA-256 and counting bytes (as stored); `on_bytes`, when
    given, hears the count after every read (progress within a file)."""

    def __init__(self, fp: BinaryIO, on_bytes: Callable[[int], None] | None = None) -> None:
        self.fp = fp
        self.sha = hashlib.sha256()
        self.size = 0
        self.on_bytes = on_bytes

    def read(self, n: int = -1) -> bytes:
        data = self.fp.read(n)
        self.sha.update(data)
        self.size += len(data)
        if self.on_bytes is not None:
            self.on_bytes(self.size)
        return data

    def readline(self, limit: int = -1) -> bytes:
        data = self.fp.readline(limit)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(PIECE):
            pass


def _utf8_error(name: str, offset: int, reason: str) -> FormatError:
    return FormatError(
        INGEST_UTF8,
        f"not valid UTF-8 ({reason})",
        path=name,
        offset=offset,
        hint="pass --encoding-errors replace (U+FFFD) or skip-file to go on",
    )


class SkipFile(Exception):
    """Raised by an extractor under --encoding-errors skip-file."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode_whole(data: bytes, name: str, opts: Options) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if opts.encoding_errors == "replace":
            text = data.decode("utf-8", "replace")
        elif opts.encoding_errors == "skip-file":
            raise SkipFile(f"not UTF-8 at byte {exc.start}") from None
        else:
            raise _utf8_error(name, exc.start, exc.reason) from None
    return text.removeprefix("\ufeff")


def iter_decoded(fp: Any, name: str, opts: Options, offset: int = 0) -> Iterator[str]:
    """Stream UTF-8 text in pieces with CRLF and lone CR turned into LF; BOM dropped. `offset`:
    where `fp` starts in its file (a piece of it), for the offsets errors give."""
    errors = "replace" if opts.encoding_errors == "replace" else "strict"
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    consumed = offset
    first = True
    held_cr = False
    while True:
        data = fp.read(PIECE)
        final = not data
        buffered = len(decoder.getstate()[0])
        try:
            text = decoder.decode(data, final=final)
        except UnicodeDecodeError as exc:
            offset = consumed - buffered + exc.start
            if opts.encoding_errors == "skip-file":
                raise SkipFile(f"not UTF-8 at byte {offset}") from None
            raise _utf8_error(name, offset, exc.reason) from None
        consumed += len(data)
        if first and text:
            first = False
            text = text.removeprefix("\ufeff")
        if held_cr:
            text = "\r" + text
            held_cr = False
        if not final and text.endswith("\r"):
            text = text[:-1]
            held_cr = True
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if text:
            yield text
        if final:
            return


# HTML ---------------------------------------------------------------------------------------

SKIP_TAGS = frozenset(
    [
        "script",
        "style",
        "noscript",
        "template",
        "iframe",
        "object",
        "embed",
        "svg",
        "math",
        "canvas",
        "select",
        "button",
        "-comment",
    ]
)
BLOCK_TAGS = frozenset(
    [
        "address",
        "article",
        "aside",
        "blockquote",
        "body",
        "caption",
        "dd",
        "details",
        "dialog",
        "div",
        "dl",
        "dt",
        "fieldset",
        "figcaption",
        "figure",
        "footer",
        "form",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "head",
        "header",
        "hgroup",
        "hr",
        "html",
        "legend",
        "li",
        "main",
        "nav",
        "ol",
        "p",
        "pre",
        "section",
        "summary",
        "table",
        "tbody",
        "tfoot",
        "thead",
        "title",
        "tr",
        "ul",
        "center",
    ]
)
CELL_TAGS = frozenset(("td", "th"))
_BLOCK = "\ue000"
_NL = "\ue001"
_SP = "\ue002"
_TAB = "\ue003"
_PRIVATE = re.compile("[\ue000-\ue003]")
_HTML_WS = re.compile(r"[ \t\n\r\f]+")
_SPACES = re.compile(" {2,}")
_BLOCKS = re.compile(" ?\ue000[\ue000 ]*")
# Markers of the fast path (private-use characters, never in a page it takes): _BLOCK, _NL,
# _SP and _TAB above; form feed and carriage return inside <pre>; where a <pre> opens and
# closes; a table cell's end.
_FF = "\ue004"
_CR = "\ue005"
_PRE_OPEN = "\ue006"
_PRE_CLOSE = "\ue007"
_CELL = "\ue008"
_PRE_EXTRA = re.compile("[\ue004\ue005]")
_PRE_SPLIT = re.compile("([\ue006\ue007])")
# A page that holds a marker itself (literally or as a numeric character reference) takes
# the walk.
_MARKERS = tuple(chr(c) for c in range(0xE000, 0xE009))
_MARKER_REF = re.compile(r"&#(?:[xX]0*[eE]00[0-8]|0*57(?:34[4-9]|35[0-2]))(?![0-9])")
_SPACE_RUN = re.compile("  +")
_SKIP_CSS = ", ".join(sorted(t for t in SKIP_TAGS if not t.startswith("-")))


def html_text(text: str) -> str:
    """Visible text: scripts, styles, comments dropped; entities decoded (by the parser); block
    elements and <br> become line breaks; white space collapsed as a browser does, except in
    <pre>; table cells separated by a space.

    Fast path: lexbor parses and drops the skipped elements, one pass over the elements puts
    marker text nodes around the ones that matter, and lexbor's own C walk joins the text;
    Python never visits the text nodes. The output is the same as `html_text_walk`'s (tests
    compare them on generated tag soup and the benchmark compares every corpus page).

    A page whose parse tree would be hostile (more than MAX_TREE_TAGS tags, or elements nested
    deeper than MAX_TREE_DEPTH, where lexbor's time grows with the square of the depth) is
    read by `html_text_stream` instead: no tree, linear time, memory of the text.
    """
    if tree_is_hostile(text):
        return html_text_stream(text)
    fast = html_text_fast(text)
    return html_text_walk(text) if fast is None else fast


# Guard against pages whose tree would exhaust time or memory. The largest page of the
# benchmark corpus has 118,436 "<" and nests 17 elements deep.
MAX_TREE_TAGS = 500_000  # "<" characters: ~160 MB of lexbor tree at most
MAX_TREE_DEPTH = 4096  # nesting: lexbor parses 4,096 levels in milliseconds, 200,000 in minutes
# Elements that never nest: void elements, and those whose end tag is optional (the parser
# closes them itself), so a page need not close them.
_FLAT_TAGS = frozenset(
    [
        *("area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta"),
        *("param", "source", "track", "wbr", "keygen", "frame"),
        *("p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody"),
        *("tfoot", "colgroup", "caption", "rb", "rt", "rtc", "rp", "html", "head", "body"),
    ]
)
_NAME_BYTES = 8


def _name_keys(names: list[str]) -> Any:
    import numpy as np

    rows = np.zeros((len(names), _NAME_BYTES), dtype=np.uint8)
    for i, name in enumerate(names):
        raw = name.encode("ascii")
        rows[i, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    return rows.view("<u8").reshape(-1)


def tree_is_hostile(text: str) -> bool:
    """True when `text` has more than MAX_TREE_TAGS tags, or when its tags nest deeper than
    MAX_TREE_DEPTH (counted over start and end tags, leaving out void elements and elements
    whose end tag is optional; "<div/>" counts, as HTML nests it; an end tag never takes the
    count below zero). Vectorized: milliseconds for a page of a hundred thousand tags; pages
    with at most MAX_TREE_DEPTH "<" are not scanned."""
    lt = text.count("<")
    if lt > MAX_TREE_TAGS:
        return True
    if lt <= MAX_TREE_DEPTH:
        return False
    import numpy as np

    raw = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    at = np.flatnonzero(raw == 0x3C)  # "<"
    window = _NAME_BYTES + 2
    index = at[:, None] + np.arange(1, window + 1)
    grid = raw[np.minimum(index, raw.size - 1)]
    grid[index >= raw.size] = 0
    closing = grid[:, 0] == 0x2F  # "/"
    names = np.where(closing[:, None], grid[:, 1:], grid[:, :-1])
    lower = names | 0x20  # ASCII letters to lower case; digits keep their value
    letter = (lower >= 0x61) & (lower <= 0x7A)
    is_name = letter | ((names >= 0x30) & (names <= 0x39))
    is_tag = letter[:, 0]
    # Name length: the first byte that is not a letter or digit.
    length = np.where(is_name.all(axis=1), window, np.argmin(is_name, axis=1))
    keep = np.arange(_NAME_BYTES) < np.minimum(length, _NAME_BYTES)[:, None]
    key = np.ascontiguousarray(np.where(keep, lower[:, :_NAME_BYTES], 0).astype(np.uint8))
    flat = np.isin(key.view("<u8").reshape(-1), _name_keys(sorted(_FLAT_TAGS)))
    flat &= length <= _NAME_BYTES
    step = np.where(is_tag & ~flat, np.where(closing, -1, 1), 0)
    level = np.concatenate([[0], np.cumsum(step, dtype=np.int64)])
    depth = level - np.minimum.accumulate(level)  # the count, floored at zero at every step
    return bool(depth.max() > MAX_TREE_DEPTH)


class _StreamText:
    """The extraction rules of `html_text_walk` over the standard library's event parser (no
    tree): for pages `tree_is_hostile` turns away."""

    def __init__(self) -> None:
        from html.parser import HTMLParser

        self.parts: list[str] = []
        self.done: list[str] = []  # pieces already joined
        self.skip = 0
        self.pre = 0
        self.pre_opened = False  # HTML drops one newline right after <pre>
        outer = self

        class Parser(HTMLParser):
            def handle_starttag(self, tag: str, attrs: Any) -> None:
                outer.start(tag, closed=False)

            def handle_startendtag(self, tag: str, attrs: Any) -> None:
                outer.start(tag, closed=True)

            def handle_endtag(self, tag: str) -> None:
                outer.end(tag)

            def handle_data(self, data: str) -> None:
                outer.data(data)

            def handle_comment(self, data: str) -> None:
                outer.pre_opened = False

        self.parser = Parser(convert_charrefs=True)

    def start(self, tag: str, *, closed: bool) -> None:
        self.pre_opened = False
        if tag in SKIP_TAGS:
            if not closed and tag not in _FLAT_TAGS:
                self.skip += 1
            return
        if self.skip:
            return
        if tag == "br":
            self.parts.append(_NL)
        elif tag in BLOCK_TAGS:
            self.parts.append(_BLOCK)
            if closed:
                self.parts.append(_BLOCK)
            elif tag == "pre":
                self.pre += 1
                self.pre_opened = True
        elif tag in CELL_TAGS and closed:
            self.parts.append(" ")

    def end(self, tag: str) -> None:
        self.pre_opened = False
        if tag in SKIP_TAGS:
            self.skip = max(0, self.skip - 1)
            return
        if self.skip:
            return
        if tag in BLOCK_TAGS:
            self.parts.append(_BLOCK)
            if tag == "pre":
                self.pre = max(0, self.pre - 1)
        elif tag in CELL_TAGS:
            self.parts.append(" ")
        elif tag == "br":
            self.parts.append(_NL)

    def data(self, value: str) -> None:
        if self.skip or not value:
            return
        if self.pre_opened:
            self.pre_opened = False
            value = value[1:] if value.startswith("\n") else value
            if not value:
                return
        if len(self.parts) >= 4096:  # keep memory that of the text, not of a list of pieces
            self.done.append("".join(self.parts))
            self.parts.clear()
        if _PRIVATE.search(value):
            value = _PRIVATE.sub("", value)
        if self.pre:
            self.parts.append(value.replace(" ", _SP).replace("\n", _NL).replace("\t", _TAB))
        else:
            self.parts.append(_HTML_WS.sub(" ", value))


def html_text_stream(text: str) -> str:
    """`html_text` without a tree, by the standard library's event parser: linear time and
    memory for any nesting or tag count. Its text follows the same rules; on malformed markup
    it can differ from lexbor's HTML5 tree (the parser does not repair mis-nested tags)."""
    reader = _StreamText()
    for start in range(0, len(text), PIECE):
        reader.parser.feed(text[start : start + PIECE])
    reader.parser.close()
    out = "".join(reader.done) + "".join(reader.parts)
    out = _SPACES.sub(" ", out)
    out = _BLOCKS.sub("\n", out)
    out = out.replace(_NL, "\n").replace(_SP, " ").replace(_TAB, "\t")
    lines = [line.rstrip(" ") for line in out.split("\n")]
    return "\n".join(lines).strip("\n")


def _encode_pre(text: str) -> str:
    """Protect the white space of <pre> content (between _PRE_OPEN/_PRE_CLOSE) from collapse."""
    out: list[str] = []
    depth = 0
    for part in _PRE_SPLIT.split(text):
        if part == _PRE_OPEN:
            depth += 1
        elif part == _PRE_CLOSE:
            depth = max(0, depth - 1)
        elif depth:
            out.append(
                part.replace(" ", _SP)
                .replace("\n", _NL)
                .replace("\t", _TAB)
                .replace("\f", _FF)
                .replace("\r", _CR)
            )
        else:
            out.append(part)
    return "".join(out)


def html_text_fast(text: str) -> str | None:
    """`html_text` without a Python walk over the text nodes; None for a page it cannot take
    (one that holds a marker character U+E000..U+E008 itself)."""
    if any(m in text for m in _MARKERS) or _MARKER_REF.search(text):
        return None
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(text)
    root = tree.root
    if root is None:
        return ""
    if root.tag not in BLOCK_TAGS:  # pragma: no cover - lexbor's document element is <html>
        return None
    # Skipped elements go first, innermost first (reverse document order); removed nodes are
    # detached, never visited again.
    for node in reversed(root.css(_SKIP_CSS)):
        node.decompose()
    # One pass over the elements, marking each as it is met: every insertion is a sibling
    # right beside the current element, which the walk steps over (text nodes are not
    # yielded), and no list of nodes is kept, so memory stays that of the tree.
    has_pre = has_cell = False
    elements = root.traverse()
    next(elements)  # the root itself: its breaks are added around the text below
    for node in elements:
        tag = node.tag
        if tag in BLOCK_TAGS:
            node.insert_before(_BLOCK)
            node.insert_after(_BLOCK)
            if tag == "pre":
                node.insert_before(_PRE_OPEN)
                node.insert_after(_PRE_CLOSE)
                has_pre = True
        elif tag in CELL_TAGS:
            node.insert_after(_CELL)
            has_cell = True
        elif tag == "br":
            node.insert_after(_NL)
    out = root.text(deep=True)
    if has_pre:
        out = _encode_pre(out)
    # White space collapsed as `html_text_walk` does it (every run of HTML white space to one
    # space), with plain string operations; then each block boundary, with the spaces around
    # it, becomes one line break.
    out = out.replace("\n", " ").replace("\t", " ")
    if "\r" in out:
        out = out.replace("\r", " ")
    if "\f" in out:
        out = out.replace("\f", " ")
    if has_cell:
        out = out.replace(_CELL, " ")
    out = _SPACE_RUN.sub(" ", out)
    out = "\n".join([part for part in [seg.strip(" ") for seg in out.split(_BLOCK)] if part])
    out = out.replace(_NL, "\n").replace(_SP, " ").replace(_TAB, "\t")
    if _PRE_EXTRA.search(out):  # form feeds and carriage returns kept inside <pre>
        out = out.replace(_FF, "\f").replace(_CR, "\r")
    lines = [line.rstrip(" ") for line in out.split("\n")]
    return "\n".join(lines).strip("\n")


def html_text_walk(text: str) -> str:
    """`html_text` by a node-by-node walk in Python: the reference the fast path is tested
    against, and the path for the rare page that holds the marker characters itself."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(text)
    root = tree.root
    if root is None:
        return ""
    parts: list[str] = []
    add = parts.append
    # Iterative depth-first walk with explicit exits: (node, entering, in_pre).
    stack: list[tuple[Any, bool, int]] = [(root, True, 0)]
    while stack:
        node, entering, pre = stack.pop()
        tag = node.tag
        if not entering:
            if tag in BLOCK_TAGS:
                add(_BLOCK)
            elif tag in CELL_TAGS:
                add(" ")
            continue
        if tag == "-text":
            value = node.text_content or ""
            if _PRIVATE.search(value):
                value = _PRIVATE.sub("", value)
            if pre:
                add(value.replace(" ", _SP).replace("\n", _NL).replace("\t", _TAB))
            else:
                add(_HTML_WS.sub(" ", value))
            continue
        if tag in SKIP_TAGS:
            continue
        if tag == "br":
            add(_NL)
            continue
        if tag in BLOCK_TAGS:
            add(_BLOCK)
        stack.append((node, False, pre))
        child_pre = pre + (tag == "pre")
        children = []
        child = node.first_child
        while child is not None:
            children.append(child)
            child = child.next
        for child in reversed(children):
            stack.append((child, True, child_pre))
    out = "".join(parts)
    out = _SPACES.sub(" ", out)
    out = _BLOCKS.sub("\n", out)
    out = out.replace(_NL, "\n").replace(_SP, " ").replace(_TAB, "\t")
    lines = [line.rstrip(" ") for line in out.split("\n")]
    return "\n".join(lines).strip("\n")


# Markdown -----------------------------------------------------------------------------------

_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\](?:\([^)]*\)|\[[^\]]*\])")
_MD_AUTOLINK = re.compile(r"<((?:https?|ftp|mailto):[^>\s]+)>")
_MD_CODE = re.compile(r"`+([^`]+?)`+")
_MD_STRONG = re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1")
_MD_EM = re.compile(r"(?<![\w*])([*_])(?=\S)(.+?)(?<=\S)\1(?![\w*])")
_MD_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_MD_HEADING = re.compile(r"^ {0,3}#{1,6}(?:\s+|$)(.*?)(?:\s+#+\s*)?$")
_MD_RULE = re.compile(r"^ {0,3}(?:[-*_] *){3,}$")
_MD_SETEXT = re.compile(r"^ {0,3}(?:=+|-+) *$")
_MD_QUOTE = re.compile(r"^ {0,3}(?:> ?)+")
_MD_BULLET = re.compile(r"^(\s*)(?:[-*+]|\d{1,9}[.)])\s+")
_MD_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s+\S")
_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def markdown_lines(lines: Iterator[str]) -> Iterator[str]:
    """A light Markdown-to-text pass, line by line (streams): syntax dropped, text kept.

    Headings lose their #, emphasis and code marks are removed, links and images keep their
    text, code blocks keep their content, rules, setext underlines, link reference definitions
    and front matter are dropped, list bullets and quote marks are removed.
    """
    fence: str | None = None
    first = True
    in_front = False
    for raw_line in lines:
        line = raw_line
        if first:
            first = False
            if line.rstrip() == "---":
                in_front = True
                continue
        if in_front:
            if line.rstrip() in ("---", "..."):
                in_front = False
            continue
        m = _MD_FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
                continue
            yield line + "\n"
            continue
        if m:
            fence = m.group(1)
            continue
        if _MD_RULE.match(line) or _MD_SETEXT.match(line) or _MD_REFDEF.match(line):
            continue
        h = _MD_HEADING.match(line)
        if h:
            line = h.group(1)
        line = _MD_QUOTE.sub("", line)
        line = _MD_BULLET.sub(r"\1", line)
        line = _MD_IMAGE.sub(r"\1", line)
        line = _MD_LINK.sub(r"\1", line)
        line = _MD_AUTOLINK.sub(r"\1", line)
        line = _MD_CODE.sub(r"\1", line)
        line = _MD_STRONG.sub(r"\2", line)
        line = _MD_EM.sub(r"\2", line)
        line = _MD_TAG.sub("", line)
        yield line.rstrip() + "\n"


def split_lines(pieces: Iterator[str]) -> Iterator[str]:
    """Lines (without their newline) from text pieces, holding at most one partial line."""
    rest = ""
    for piece in pieces:
        chunk = rest + piece if rest else piece
        lines = chunk.split("\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def batch(pieces: Iterator[str], size: int = PIECE) -> Iterator[str]:
    """Join small pieces (lines) into pieces of about `size` characters."""
    buf: list[str] = []
    n = 0
    for piece in pieces:
        buf.append(piece)
        n += len(piece)
        if n >= size:
            yield "".join(buf)
            buf, n = [], 0
    if buf:
        yield "".join(buf)


# Documents ----------------------------------------------------------------------------------

Doc = tuple[int, Iterator[str]]


@dataclass
class Counters:
    skipped_records: int = 0
    lines: int = 0  # JSON Lines: lines read


def _read_whole(fp: Any, name: str, what: str, limit: int = MAX_WHOLE) -> bytes:
    data = fp.read(limit + 1)
    if len(data) > limit:
        raise FormatError(
            INGEST_TOO_LARGE,
            f"{what} source is larger than --max-doc-size ({limit:,} bytes; parsed whole)",
            path=name,
            hint="split it, use JSON Lines for large JSON data sets, or raise --max-doc-size",
        )
    return bytes(data)


def field_value(obj: Any, field: str) -> Any:
    """The value `--text-field` names in a JSON object: the key that is exactly `field`
    (dots and all) when the object has one, else, for `a.b`, the key `b` of the object under
    the key `a` (a path of any depth, as a Parquet struct column is read); None when the
    path is not there."""
    if not isinstance(obj, dict):
        return None
    if field in obj or "." not in field:
        return obj.get(field)
    for key in field.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _field(obj: Any, opts: Options, name: str, where: str, counters: Counters) -> str | None:
    value = field_value(obj, opts.text_field)
    if isinstance(value, str):
        return value
    if opts.missing_field == "error":
        raise FormatError(
            INGEST_TEXT_FIELD,
            f"{where} has no string field {opts.text_field!r}",
            path=name,
            field=opts.text_field,
        )
    counters.skipped_records += 1
    return None


def documents(kind: str, fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    """The documents of one source of a known kind."""
    if kind == "text":
        yield 0, iter_decoded(fp, name, opts)
    elif kind == "markdown":
        yield 0, batch(markdown_lines(split_lines(iter_decoded(fp, name, opts))))
    elif kind == "html":
        text = decode_whole(_read_whole(fp, name, "HTML", opts.max_doc), name, opts)
        yield 0, iter([html_text(text)])
    elif kind == "json":
        text = decode_whole(_read_whole(fp, name, "JSON", opts.max_doc), name, opts)
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
            value = _field(obj, opts, name, f"element {n}", counters)
            if value is not None:
                yield (n if isinstance(doc, list) else 0), iter([crlf(value)])
    elif kind == "jsonl":
        yield from _jsonl(fp, name, opts, counters)
    else:  # pragma: no cover - kinds are fixed
        raise ValueError(kind)


def _read_line(fp: Any, limit: int) -> tuple[bytes, bool]:
    """One line and whether it fits in `limit` bytes, read a piece at a time: a longer line
    costs no more memory than `limit` and is never joined (the caller reports it)."""
    raw = fp.readline(min(limit, PIECE))
    if len(raw) < PIECE or raw.endswith(b"\n"):
        return bytes(raw), len(raw) < limit or raw.endswith(b"\n")
    parts = [raw]
    size = len(raw)
    while size < limit:
        more = fp.readline(min(PIECE, limit - size))
        if not more:
            break
        parts.append(more)
        size += len(more)
        if more.endswith(b"\n"):
            break
    if size >= limit and not parts[-1].endswith(b"\n"):
        return b"", False
    return b"".join(parts), True


def crlf(text: str) -> str:
    """CRLF line ends as LF (the scan for a CR is much cheaper than a replace that finds none)."""
    return text.replace("\r\n", "\n") if "\r" in text else text


def _fast_loads() -> Callable[[bytes], Any] | None:
    """orjson's parser, or None without it. It takes the line's bytes (it validates the UTF-8
    itself); a line it refuses, for any reason, goes through the standard library's decode
    and parse, which give the error message and offset (or accept what orjson does not: an
    integer beyond 64 bits, NaN, a lone surrogate escape, deep nesting)."""
    try:
        import orjson
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    return orjson.loads


def _jsonl(
    fp: Any, name: str, opts: Options, counters: Counters, line_no: int = 0, offset: int = 0
) -> Iterator[Doc]:
    """JSON Lines from `fp`; a work unit starts after `line_no` lines and `offset` bytes."""
    for item, text in jsonl_texts_stream(fp, name, opts, counters, line_no, offset):
        yield item, iter([text])


def jsonl_texts_stream(
    fp: Any, name: str, opts: Options, counters: Counters, line_no: int = 0, offset: int = 0
) -> Iterator[tuple[int, str]]:
    """Each JSON Lines record's text as `(line number, text)`, read line by line from `fp`."""
    first_line = line_no
    errors = "replace" if opts.encoding_errors == "replace" else "strict"
    fast = _fast_loads()
    refused = (ValueError, RecursionError)
    while True:
        raw, fits = _read_line(fp, opts.max_doc + 1)
        if not raw and fits:
            counters.lines = line_no - first_line
            return
        line_no += 1
        if not fits:
            raise _line_too_long(name, opts, line_no, offset)
        start = offset
        offset += len(raw)
        if start == 0 and raw.startswith(b"\xef\xbb\xbf"):  # the file's first line
            raw = raw[3:]
            start += 3
        if fast is not None:
            try:
                obj = fast(raw)
            except refused:
                pass
            else:
                value = _field(obj, opts, name, f"line {line_no}", counters)
                if value is not None:
                    yield line_no, crlf(value)
                continue
        value = _jsonl_slow(raw, start, line_no, name, opts, errors, counters)
        if value is not None:
            yield line_no, value


class TextBuffer:
    """Where `jsonl_texts` writes the texts it yields, reused from call to call: the texts
    are views into it, valid until it is given to `jsonl_texts` again. A buffer for each
    piece cost page faults for every text byte (the pages of a freed buffer went back to the
    system, a quarter of the extractor's time); an anonymous mapping is neither zeroed nor
    touched before the extractor writes into it. A buffer larger than KEEP is not kept (a
    piece with one huge line)."""

    KEEP = 32 << 20

    def __init__(self) -> None:
        self.data: Any = bytearray()

    def at_least(self, size: int) -> Any:
        import mmap

        if len(self.data) >= size:
            return self.data
        # Private: a worker forked after the buffer was made writes its own copy of the pages
        # (an anonymous mapping is shared by default). A little larger than asked: the pieces
        # vary in size, it grows once or twice.
        out = mmap.mmap(-1, size + size // 4, flags=mmap.MAP_PRIVATE)
        if size <= self.KEEP:
            self.data = out
        return out


def jsonl_texts(
    data: bytes | bytearray,
    name: str,
    opts: Options,
    counters: Counters,
    line_no: int = 0,
    offset: int = 0,
    size: int = -1,
    into: TextBuffer | None = None,
) -> Iterator[tuple[int, str | memoryview]]:
    """`jsonl_texts_stream` over the first `size` bytes (default: all) of a buffer that holds
    whole lines: a work unit's bytes; the same texts, line numbers, offsets, counts and errors.

    The lines are scanned by the compiled extractor first (`_jsonl_kernel.texts`, GIL
    released): a record that orjson takes with a string text field gives its text unescaped
    to UTF-8 with CRLF as LF, as a memoryview of those bytes in `into` (or in a buffer of
    this call's own), without a dict or a string per record. Every line the extractor leaves
    (an error, a record without the text field, a line too long, anything it is not sure
    of) goes the way of the line reader and gives a str: orjson on a slice of the buffer (no
    copy), then the standard library."""
    from matrixctl import _jsonl_kernel

    first_line = line_no
    errors = "replace" if opts.encoding_errors == "replace" else "strict"
    fast = _fast_loads()
    refused = (ValueError, RecursionError)
    end = len(data) if size < 0 else size
    limit = opts.max_doc
    key = opts.text_field.encode("utf-8", "surrogatepass")  # a lone surrogate never matches
    out = bytearray(end + 16) if into is None else into.at_least(end + 16)
    rows = _jsonl_kernel.texts(data, 0, end, key, limit, out)
    texts = memoryview(out)
    view = memoryview(data)
    try:
        for pos, stop, off, n, kind in struct.iter_unpack("5q", rows):
            line_no += 1
            if kind:  # 1: ASCII, 2: other UTF-8
                yield line_no, texts[off : off + n]
                continue
            if stop - pos - (data[stop - 1] == 10) > limit:
                raise _line_too_long(name, opts, line_no, offset + pos)
            start = offset + pos
            first = pos
            if start == 0 and data.startswith(b"\xef\xbb\xbf"):  # the file's first line
                first += 3
                start += 3
            if fast is not None:
                try:
                    obj = fast(view[first:stop])
                except refused:
                    pass
                else:
                    value = _field(obj, opts, name, f"line {line_no}", counters)
                    if value is not None:
                        yield line_no, crlf(value)
                    continue
            value = _jsonl_slow(
                bytes(view[first:stop]), start, line_no, name, opts, errors, counters
            )
            if value is not None:
                yield line_no, value
    finally:
        view.release()
    counters.lines = line_no - first_line


def _line_too_long(name: str, opts: Options, line_no: int, offset: int) -> FormatError:
    return FormatError(
        INGEST_TOO_LARGE,
        f"line {line_no} is longer than --max-doc-size ({opts.max_doc:,} bytes)",
        path=name,
        offset=offset,
        field=f"line {line_no}",
    )


def _jsonl_slow(
    raw: bytes,
    start: int,
    line_no: int,
    name: str,
    opts: Options,
    errors: str,
    counters: Counters,
) -> str | None:
    """A line orjson refused (or without orjson): the standard library's decode and parse give
    the error message and offset, or accept what orjson does not. None: no text (a blank
    line, or a record without the field under --missing-field skip)."""
    try:
        line = raw.decode("utf-8", errors)
    except UnicodeDecodeError as exc:
        if opts.encoding_errors == "skip-file":
            raise SkipFile(f"not UTF-8 at byte {start + exc.start}") from None
        raise _utf8_error(name, start + exc.start, exc.reason) from None
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise FormatError(
            INGEST_JSON,
            f"line {line_no} is not valid JSON: {exc.msg}",
            path=name,
            offset=start + len(line[: exc.pos].encode("utf-8")),
            field=f"line {line_no}",
        ) from None
    except RecursionError:
        raise FormatError(
            INGEST_JSON, f"line {line_no}: JSON nested too deeply", path=name, offset=start
        ) from None
    value = _field(obj, opts, name, f"line {line_no}", counters)
    return None if value is None else crlf(value)


Extractor = Callable[..., Iterator[Doc]]
