"""Markdown input: the text of a Markdown file without its markup, line by line (streamed).

Linear in time and bounded in memory on any input (docs/inputs.md, "Markdown"). The inline
markup (images, links, autolinks, code spans, strong and emphasis) is removed by scanners
that find each construct as the leftmost-first regular expressions this module used to apply
did (`tests/ingest/test_kinds_hostile.py` compares them on generated lines), but look up each
closing delimiter once instead of scanning the rest of the line from every opener: `' **a'`
repeated 50,000 times took minutes, a line of 1 MB hours. A line longer than LONG characters
is read in segments of LONG characters (from the line's start, whatever the reads): its
block markup (heading, quote, list item, fence) is decided by its first segment, it is never
a rule, a setext underline or a front matter delimiter, and inline markup is removed within
each segment.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from matrixctl.ingest.kinds.base import PIECE, Counters, Doc, Kind, Options, iter_decoded

LONG = 1 << 20  # characters: a longer line is read in segments of this many

_MD_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
_MD_RULE = re.compile(r"^ {0,3}(?:[-*_] *){3,}$")
_MD_SETEXT = re.compile(r"^ {0,3}(?:=+|-+) *$")
_MD_QUOTE = re.compile(r"^ {0,3}(?:> ?)+")
_MD_BULLET = re.compile(r"^(\s*)(?:[-*+]|\d{1,9}[.)])\s+")
_MD_REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s+\S")
_MD_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING_OPEN = re.compile(r" {0,3}(#{1,6})(?:\s+|$)")
_TICKS = re.compile(r"`+")
_AUTOLINK_END = re.compile(r"[>\s]")
_SCHEMES = ("http:", "https:", "ftp:", "mailto:")
# Openers and closers of strong (`**`, `__`) and emphasis (`*`, `_`) spans, at every
# position (zero-width look-aheads, so overlapping ones are found).
_STRONG = tuple(
    (d, re.compile(f"(?={re.escape(d)}\\S)"), re.compile(f"(?<=\\S)(?={re.escape(d)})"))
    for d in ("**", "__")
)
_EMPHASIS = tuple(
    (
        c,
        re.compile(f"(?<![\\w*])(?={re.escape(c)}\\S)"),
        re.compile(f"(?<=\\S)(?={re.escape(c)}(?![\\w*]))"),
    )
    for c in "*_"
)


class _Next:
    """The first index of `char` in `s` at or after a position, each found once: queries that
    do not go back cost, together, one scan of `s`."""

    def __init__(self, s: str, char: str) -> None:
        self.s = s
        self.char = char
        self.asked = 0
        self.found = s.find(char)

    def at(self, pos: int) -> int:
        if pos < self.asked or (0 <= self.found < pos):
            self.found = self.s.find(self.char, pos)
        self.asked = pos
        return self.found


def _images(s: str) -> str:
    """`![text](url)` as `text` (was `!\\[([^\\]]*)\\]\\([^)]*\\)`)."""
    if "![" not in s:
        return s
    close, paren = _Next(s, "]"), _Next(s, ")")
    out: list[str] = []
    cur = 0
    i = s.find("![")
    while i >= 0:
        j = close.at(i + 2)
        if j < 0:
            break  # no `]` from here on: no later opener has one either
        if s.startswith("(", j + 1):
            k = paren.at(j + 2)
            if k < 0:
                break
            out += (s[cur:i], s[i + 2 : j])
            cur = k + 1
            i = s.find("![", cur)
            continue
        i = s.find("![", i + 1)
    out.append(s[cur:])
    return "".join(out)


def _links(s: str) -> str:
    """`[text](url)` and `[text][ref]` as `text` (was
    `\\[([^\\]]+)\\](?:\\([^)]*\\)|\\[[^\\]]*\\])`)."""
    if "[" not in s or "]" not in s:
        return s
    close, ref_close, paren = _Next(s, "]"), _Next(s, "]"), _Next(s, ")")
    out: list[str] = []
    cur = 0
    i = s.find("[")
    while i >= 0:
        j = close.at(i + 1)
        if j < 0:
            break
        end = -1
        if j > i + 1:
            after = s[j + 1 : j + 2]
            if after == "(":
                end = paren.at(j + 2)
            elif after == "[":
                end = ref_close.at(j + 2)
        if end >= 0:
            out += (s[cur:i], s[i + 1 : j])
            cur = end + 1
            i = s.find("[", cur)
        else:
            i = s.find("[", i + 1)
    out.append(s[cur:])
    return "".join(out)


def _autolinks(s: str) -> str:
    """`<scheme:address>` as `scheme:address` (was `<((?:https?|ftp|mailto):[^>\\s]+)>`)."""
    if "<" not in s or ":" not in s:
        return s
    out: list[str] = []
    cur = 0
    stop, asked = -1, len(s) + 1  # the first `>` or white space from `asked` on (-1: none)
    i = s.find("<")
    while i >= 0:
        start = next((i + 1 + len(x) for x in _SCHEMES if s.startswith(x, i + 1)), -1)
        if start >= 0:
            if start < asked or 0 <= stop < start:
                found = _AUTOLINK_END.search(s, start)
                stop = found.start() if found is not None else -1
            asked = start
            if stop > start and s[stop] == ">":
                out += (s[cur:i], s[i + 1 : stop])
                cur = stop + 1
                i = s.find("<", cur)
                continue
        i = s.find("<", i + 1)
    out.append(s[cur:])
    return "".join(out)


def _code(s: str) -> str:
    """Code spans as their text (was `` `+([^`]+?)`+ ``): a run of backticks, text, the
    next run of backticks."""
    if "`" not in s:
        return s
    out: list[str] = []
    cur = 0
    i = s.find("`")
    while i >= 0:
        ticks = _TICKS.match(s, i)
        assert ticks is not None
        text = ticks.end()
        close = s.find("`", text) if text < len(s) else -1
        if close < 0:
            break  # no text, or no backtick after it: nothing later matches either
        end = _TICKS.match(s, close)
        assert end is not None
        out += (s[cur:i], s[text:close])
        cur = end.end()
        i = s.find("`", cur)
    out.append(s[cur:])
    return "".join(out)


class _NextMatch:
    """The first match of `rx` in `s` at or after a position, each found once (as `_Next`)."""

    def __init__(self, s: str, rx: re.Pattern[str]) -> None:
        self.s = s
        self.rx = rx
        self.asked = -1
        self.found = -1

    def at(self, pos: int) -> int:
        if pos < self.asked or (0 <= self.found < pos) or self.asked < 0:
            m = self.rx.search(self.s, pos)
            self.found = -1 if m is None else m.start()
        self.asked = pos
        return self.found


def _spans(s: str, kinds: tuple[tuple[str, re.Pattern[str], re.Pattern[str]], ...]) -> str:
    """Leftmost-first spans, as `(D)(?=\\S)(.+?)(?<=\\S)D` finds them for each delimiter D
    of `kinds` (delimiter, opener, closer): the first opener after the last span is closed
    by the first closer of its delimiter at least one character after it. An opener without
    one means no later opener of that delimiter has one: the delimiter is dropped. So each
    step takes a span or drops a delimiter, and each opener and closer is found once."""
    live = [(d, _NextMatch(s, op), _NextMatch(s, cl)) for d, op, cl in kinds if d in s]
    out: list[str] = []
    cur = 0
    while True:
        best: tuple[int, _NextMatch, str] | None = None
        for delim, opener, closer in live:
            at = opener.at(cur)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, closer, delim)
        if best is None:
            break
        i, closer, delim = best
        w = len(delim)
        e = closer.at(i + w + 1)
        if e < 0:
            live = [k for k in live if k[0] != delim]
            continue
        out += (s[cur:i], s[i + w : e])
        cur = e + w
    if not out:
        return s
    out.append(s[cur:])
    return "".join(out)


def _strong(s: str) -> str:
    """`**text**` and `__text__` as `text` (was `(\\*\\*|__)(?=\\S)(.+?)(?<=\\S)\\1`)."""
    return _spans(s, _STRONG)


def _emphasis(s: str) -> str:
    """`*text*` and `_text_` as `text` (was
    `(?<![\\w*])([*_])(?=\\S)(.+?)(?<=\\S)\\1(?![\\w*])`)."""
    return _spans(s, _EMPHASIS)


def _heading(line: str) -> str | None:
    """An ATX heading's text without its `#` marks and closing `#`s, or None (was
    `^ {0,3}#{1,6}(?:\\s+|$)(.*?)(?:\\s+#+\\s*)?$`)."""
    m = _HEADING_OPEN.match(line)
    if m is None:
        return None
    start = m.end()
    end = len(line.rstrip())
    hashes = end
    while hashes > start and line[hashes - 1] == "#":
        hashes -= 1
    if hashes < end:  # a closing run of `#` after white space
        space = hashes
        while space > start and line[space - 1].isspace():
            space -= 1
        if start < space < hashes:
            return line[start:space]
    return line[start:]


def _inline(line: str) -> str:
    line = _images(line)
    line = _links(line)
    line = _autolinks(line)
    line = _code(line)
    line = _strong(line)
    line = _emphasis(line)
    return _MD_TAG.sub("", line)


def _block(line: str, whole: bool) -> str:
    """A line's quote marks, bullets and heading marks removed (`whole`: not the first
    segment of a longer line, whose closing heading marks are not looked for)."""
    if whole:
        heading = _heading(line)
    else:
        m = _HEADING_OPEN.match(line)
        heading = None if m is None else line[m.end() :]
    if heading is not None:
        line = heading
    line = _MD_QUOTE.sub("", line)
    return _MD_BULLET.sub(r"\1", line)


def markdown_lines(lines: Iterator[tuple[str, bool]]) -> Iterator[str]:
    """A light Markdown-to-text pass, line by line (streams): syntax dropped, text kept.

    `lines`: `split_lines`' segments (text, ends the line). Headings lose their #, emphasis
    and code marks are removed, links and images keep their text, code blocks keep their
    content, rules, setext underlines, link reference definitions and front matter are
    dropped, list bullets and quote marks are removed.
    """
    fence: str | None = None
    first = True
    in_front = False
    cont: str | None = None  # within a long line: "skip", "keep" (fenced) or "text"
    held = ""  # a long line's white space not yet known to be trailing
    for line, ends in lines:
        if cont is not None:  # a later segment of a long line
            if cont == "keep":
                yield line + "\n" if ends else line
            elif cont == "text":
                text = held + _inline(line)
                body = text.rstrip()
                held = text[len(body) :]
                if ends:
                    held = ""
                    yield body + "\n"
                elif body:
                    yield body
            if ends:
                cont = None
            continue
        whole = ends
        if first:
            first = False
            if whole and line.rstrip() == "---":
                in_front = True
                continue
        if in_front:
            if whole and line.rstrip() in ("---", "..."):
                in_front = False
            if not whole:
                cont = "skip"
            continue
        m = _MD_FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
                if not whole:
                    cont = "skip"
                continue
            if not whole:
                cont = "keep"
            yield line + "\n" if whole else line
            continue
        if m:
            fence = m.group(1)
            if not whole:
                cont = "skip"
            continue
        if _MD_REFDEF.match(line) or (whole and (_MD_RULE.match(line) or _MD_SETEXT.match(line))):
            if not whole:
                cont = "skip"
            continue
        text = _inline(_block(line, whole))
        if whole:
            yield text.rstrip() + "\n"
            continue
        cont = "text"
        body = text.rstrip()
        held = text[len(body) :]
        if body:
            yield body


def split_lines(pieces: Iterator[str], long: int = LONG) -> Iterator[tuple[str, bool]]:
    """Lines (without their newline) from text pieces, as `(text, True)`; a line longer than
    `long` characters as segments of `long` characters from its start, each `(text, False)`
    but the last (never empty): the same segments whatever the pieces. Holds at most about
    `long` characters and one piece."""
    held: list[str] = []
    size = 0
    for piece in pieces:
        start = 0
        while True:
            nl = piece.find("\n", start)
            if nl < 0:
                break
            line = piece[start:nl]
            if held:
                line = "".join(held) + line
                held, size = [], 0
            yield from _segments(line, long)
            start = nl + 1
        if start < len(piece):
            held.append(piece[start:] if start else piece)
            size += len(piece) - start
            if size > long:  # full segments out, at least one character kept
                joined = "".join(held)
                cut = (size - 1) // long * long
                for at in range(0, cut, long):
                    yield joined[at : at + long], False
                held, size = [joined[cut:]], size - cut
    if held:
        yield from _segments("".join(held), long)


def _segments(line: str, long: int) -> Iterator[tuple[str, bool]]:
    if len(line) <= long:
        yield line, True
        return
    cut = (len(line) - 1) // long * long
    for at in range(0, cut, long):
        yield line[at : at + long], False
    yield line[cut:], True


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


def documents(fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    yield 0, batch(markdown_lines(split_lines(iter_decoded(fp, name, opts))))


KINDS = (Kind("markdown", 1, names=(".md", ".markdown", ".mdown", ".mkd"), documents=documents),)
