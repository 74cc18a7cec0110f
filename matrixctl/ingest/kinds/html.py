"""HTML input: the visible text of a page (docs/formats/ingest-pack.md, "Extraction").

A page is parsed whole (at most --max-doc-size bytes); its text comes from the lexbor engine
(selectolax), through a fast path for ordinary pages and a tree walk for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from matrixctl.ingest.kinds.base import (
    PIECE,
    Counters,
    Doc,
    Kind,
    Options,
    decode_whole,
    read_whole,
)

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


def documents(fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    text = decode_whole(read_whole(fp, name, "HTML", opts.max_doc), name, opts)
    yield 0, iter([html_text(text)])


_HTML_TAG = re.compile(
    rb"<(?:!doctype\s+html|html|head|body|title|meta|p|div|h[1-6]|table|a)\b", re.I
)


def sniff(body: bytes) -> bool:
    """A leading `<` with an HTML tag in the first 4 KiB."""
    return body.startswith(b"<") and _HTML_TAG.search(body[:4096]) is not None


KINDS = (Kind("html", 2, names=(".html", ".htm", ".xhtml"), sniff=sniff, documents=documents),)
