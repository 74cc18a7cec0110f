"""Markdown input: the text of a Markdown file without its markup, line by line (streamed)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from matrixctl.ingest.kinds.base import PIECE, Counters, Doc, Kind, Options, iter_decoded

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


def documents(fp: Any, name: str, opts: Options, counters: Counters) -> Iterator[Doc]:
    yield 0, batch(markdown_lines(split_lines(iter_decoded(fp, name, opts))))


KINDS = (Kind("markdown", 1, names=(".md", ".markdown", ".mdown", ".mkd"), documents=documents),)
