"""Hostile HTML: pages whose parse tree would take minutes (deep nesting) or gigabytes (millions
of tags) are read by the tree-less streaming extractor, with the same extraction rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies

from matrixctl.ingest.kinds import html as kinds_html
from tests.helpers.cli import ROOT, run_cli


def test_deep_nesting_is_hostile_and_still_extracted() -> None:
    """Decision: nesting deeper than MAX_TREE_DEPTH (4,096) takes the streaming extractor;
    lexbor needs minutes for 200,000 levels (its time grows with the square of the depth)."""
    n = kinds_html.MAX_TREE_DEPTH + 1
    page = "<html><body>" + "<div>" * n + "deep &amp; down" + "</div>" * n + "</body></html>"
    assert kinds_html.tree_is_hostile(page)
    assert kinds_html.html_text(page) == "deep & down"
    shallow = "<div>" * kinds_html.MAX_TREE_DEPTH + "x" + "</div>" * kinds_html.MAX_TREE_DEPTH
    assert not kinds_html.tree_is_hostile(shallow)


@pytest.mark.parametrize(
    "page",
    [
        "<p>x" * 6000,  # optional end tags: the parser closes them, they do not nest
        "<li>x<br><img src=a><hr>" * 3000,  # void elements
        "<DIV>x</DIV>" * 6000,  # closed, in capitals
        "</div>" * 6000 + "<div>" * 4000,  # stray end tags do not take the count below zero
        "<custom-element>" * 10 + "a < b and 3 <4 " * 3000,  # "<" in text is not a tag
    ],
)
def test_wide_pages_are_not_hostile(page: str) -> None:
    assert page.count("<") > kinds_html.MAX_TREE_DEPTH
    assert not kinds_html.tree_is_hostile(page)


@pytest.mark.parametrize(
    "page",
    [
        "<span>" * 5000,  # never closed
        "<div/>" * 5000,  # HTML ignores the slash of a non-void element: they nest
        "<x-a>" * 2500 + "<div>" * 2500,  # unknown elements nest too
        "<section><div class='a'><b>" * 1500,
        "<div>" * 3000 + "</div>" * 10 + "<div>" * 2000,
    ],
)
def test_deep_pages_are_hostile(page: str) -> None:
    assert kinds_html.tree_is_hostile(page)


def test_too_many_tags_take_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decision: more than MAX_TREE_TAGS (500,000) "<" in one page takes the streaming
    extractor (an 8 MB page of "<p>x" builds a 650 MB lexbor tree)."""
    monkeypatch.setattr(kinds_html, "MAX_TREE_TAGS", 100)
    page = "<p>one<p>two &lt;3" * 60
    assert kinds_html.tree_is_hostile(page)
    called = []
    real = kinds_html.html_text_stream
    monkeypatch.setattr(kinds_html, "html_text_stream", lambda t: called.append(1) or real(t))
    assert kinds_html.html_text(page) == "\n".join(["one", "two <3"] * 60)
    assert called


def test_real_pages_take_the_tree() -> None:
    pages = sorted((ROOT / "fixtures" / "corpus").rglob("*.htm*"))
    assert pages
    for path in pages:
        assert not kinds_html.tree_is_hostile(path.read_text("utf-8", "replace")), path


# Well-formed pages: the streaming extractor and the tree walk give the same text.
INLINE = ["span", "b", "a", "em", "code"]
NESTING = ["div", "section", "blockquote"]  # blocks that may hold blocks
LEAF_BLOCKS = ["p", "h2"]  # blocks that hold inline content only (HTML closes them otherwise)
SKIP = ["script", "style", "noscript", "template"]
WORDS = strategies.text(alphabet="ab &<>\n\t", min_size=1, max_size=6).map(
    lambda t: t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
)


def _inline(depth: int) -> strategies.SearchStrategy[str]:
    leaf = strategies.one_of(WORDS, strategies.just("<br>"), strategies.just("<!-- note -->"))
    if depth == 0:
        return leaf
    inner = strategies.lists(_inline(depth - 1), max_size=3).map("".join)
    return strategies.one_of(
        leaf,
        strategies.tuples(strategies.sampled_from(INLINE), inner).map(
            lambda p: f"<{p[0]}>{p[1]}</{p[0]}>"
        ),
    )


def _tree(depth: int) -> strategies.SearchStrategy[str]:
    inline = _inline(2)
    if depth == 0:
        return inline
    inner = strategies.lists(_tree(depth - 1), max_size=4).map("".join)
    runs = strategies.lists(inline, max_size=3).map("".join)
    return strategies.one_of(
        inline,
        strategies.tuples(strategies.sampled_from(NESTING), inner).map(
            lambda p: f"<{p[0]}>{p[1]}</{p[0]}>"
        ),
        strategies.tuples(strategies.sampled_from(LEAF_BLOCKS), runs).map(
            lambda p: f"<{p[0]}>{p[1]}</{p[0]}>"
        ),
        strategies.lists(runs, min_size=1, max_size=3).map(
            lambda items: "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"
        ),
        strategies.tuples(strategies.sampled_from(SKIP), WORDS).map(
            lambda p: f"<{p[0]}>{p[1]}</{p[0]}>"
        ),
        runs.map(lambda t: f"<pre>{t}</pre>"),
        strategies.lists(runs, min_size=1, max_size=3).map(
            lambda cells: "<table><tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr></table>"
        ),
    )


@settings(max_examples=300, deadline=None)
@given(strategies.lists(_tree(3), max_size=5).map("".join))
def test_stream_equals_the_walk_on_well_formed_pages(body: str) -> None:
    page = f"<html><head><title>t</title></head><body>{body}</body></html>"
    assert kinds_html.html_text_stream(page) == kinds_html.html_text_walk(page)


def test_a_hostile_page_is_ingested(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    n = kinds_html.MAX_TREE_DEPTH * 2
    (src / "deep.html").write_text("<html><body>" + "<div>" * n + "bottom" + "</div>" * n)
    run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "pack"), "--json")
    assert run.code == 0, run.stderr
    assert run_cli("verify", str(tmp_path / "pack")).code == 0
