"""The fast paths of `ingest docs`: HTML text without a Python node walk, work units of files
handed to the workers, tokens returned in the pack's dtype. Each must give the bytes the plain
paths give (speed itself is measured by bench/bench_ingest.py, never here)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies

from matrixctl.ingest import step as ingest_step
from matrixctl.ingest import units as ingest_units
from matrixctl.ingest import writer
from matrixctl.ingest.kinds import html as kinds_html
from matrixctl.ingest.sources import SourceFile, enumerate_sources
from matrixctl.tokenizers import pi
from tests.helpers.cli import ROOT, run_cli

CORPUS = ROOT / "fixtures" / "corpus"


def plan_units(files: list[Any], jobs: int) -> list[Any]:
    """The runs of files the planner makes when no file is cut."""
    cutting = ingest_units.Cutting()
    none = lambda sf: iter([None])  # noqa: E731
    return list(ingest_units.plan(files, jobs, cutting, can_cut=False, split=none))


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# HTML: the fast path against the node walk ----------------------------------------------------

TAGS = [
    "p", "div", "li", "ul", "tr", "td", "th", "table", "h2", "pre", "br", "b", "span", "a",
    "script", "style", "noscript", "template", "svg", "math", "select", "button", "title",
    "head", "body", "html", "textarea", "code", "center", "iframe", "option", "hr",
]  # fmt: skip
PIECES = strategies.one_of(
    strategies.sampled_from(TAGS).map(lambda t: f"<{t}>"),
    strategies.sampled_from(TAGS).map(lambda t: f"</{t}>"),
    strategies.sampled_from(
        [
            " ",
            "  ",
            "\n",
            "\t",
            "\f",
            "\r",
            "\r\n",
            "\xa0",
            "&nbsp;",
            "&amp;",
            "&#13;",
            "&#12;",
            "&#x9;",
            "<!-- c -->",
            "<!doctype html>",
            "<br/>",
            "<",
            ">",
            "&",
            "word",
            "Wort",
            "слово",
            "言葉",
            "x y",
            "<p class='a b'>",
            "<td colspan=2>",
            "&#65;",
            "&#0;",
        ]
    ),
    strategies.text(alphabet=" \n\tab<>/&;", max_size=8),
)
SOUP = strategies.lists(PIECES, max_size=40).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SOUP)
def test_fast_html_text_equals_the_walk_on_tag_soup(page: str) -> None:
    """Decision: the fast HTML path must give exactly the node walk's text (issue 3's rules),
    so packs keep their bytes; generated tag soup (unclosed, stray and nested tags, skipped
    elements, <pre> with every HTML white space, entities) checks it."""
    fast = kinds_html.html_text_fast(page)
    assert fast is not None  # no marker character in the soup: the fast path took it
    assert fast == kinds_html.html_text_walk(page)


@pytest.mark.parametrize(
    ("page", "text"),
    [
        ("<pre>a\fb&#13;c\r\nd\te</pre>", "a\fb\rc\nd\te"),
        ("<p>a <span> b </span></p><div> c </div>", "a b\nc"),
        ("<table><tr><td>a<td>b</table>after", "a b\nafter"),
        ("<pre><pre> a </pre> b </pre>", " a\n b"),
        ("<template><p>t</p></template>v<select><option>o</select>w", "vw"),
        ("<div>" * 3000 + "deep", "deep"),
        ("<p>one<br>two<br><br>three</p>", "one\ntwo\n\nthree"),
        ("<!-- only a comment -->", ""),
        ("<script>a()</script><style>p{}</style>", ""),
        ("text &amp; more<", "text & more<"),
    ],
)
def test_odd_pages_by_hand(page: str, text: str) -> None:
    """Decision: expected texts typed by hand; both paths give them."""
    assert kinds_html.html_text(page) == text
    assert kinds_html.html_text_walk(page) == text


@pytest.mark.parametrize(
    "page",
    [
        "a\ue000b<p>c</p>",
        "<pre>x\ue001y</pre>z",
        "x&#xE000;y<p>z</p>",
        "x&#57345;y",
        "x&#X0000e005y",
        "<pre>a\ue004b\ue005</pre>",
        "<td>\ue008</td>",
        "<pre>&#xe006;</pre>&#57351;",
    ],
)
def test_pages_holding_marker_characters_take_the_walk(page: str) -> None:
    """Decision: a page holding U+E000..U+E008 (the fast path's markers), literally or as a
    numeric character reference, is extracted by the node walk, so its text is unchanged:
    U+E000..U+E003 are dropped as before, U+E004..U+E008 kept."""
    assert kinds_html.html_text_fast(page) is None
    assert kinds_html.html_text(page) == kinds_html.html_text_walk(page)


def test_marker_reference_lookalikes_stay_on_the_fast_path() -> None:
    assert kinds_html.html_text_fast("&#57353; &#xE0061; &#5734;") == "\ue009 \U000e0061 \u1666"


# Work units -------------------------------------------------------------------------------------


def files_of(sizes: list[int]) -> list[SourceFile]:
    return [SourceFile(i, f"f{i}", f"f{i}", size, False) for i, size in enumerate(sizes)]


@given(strategies.lists(strategies.integers(0, 20 << 20), max_size=200), strategies.integers(1, 8))
def test_units_are_consecutive_runs_within_the_limits(sizes: list[int], jobs: int) -> None:
    files = files_of(sizes)
    units = plan_units(files, jobs)
    assert [f for unit in units for f in unit] == files
    assert all(unit for unit in units)
    for unit in units:
        assert len(unit) <= ingest_units.UNIT_MAX_FILES
        if len(unit) > 1:
            assert sum(f.size for f in unit) <= ingest_units.UNIT_MAX_BYTES


def test_units_balance_bytes() -> None:
    """Decision: units aim at total / (32 x jobs) bytes, between 64 KiB and 4 MiB; a file
    larger than that is a unit alone."""
    units = plan_units(files_of([100 << 10] * 100 + [9 << 20] + [1 << 10] * 3), 2)
    sizes = [sum(f.size for f in u) for u in units]
    assert len(units[0]) == 3  # target 19,219 KiB / 64 = 300.3 KiB: three 100 KiB files
    assert [len(u) for u in units].count(1) >= 1 and (9 << 20) in sizes
    assert plan_units([], 2) == []
    tiny = plan_units(files_of([10] * 1000), 2)
    assert [len(u) for u in tiny] == [256, 256, 256, 232]  # 64 KiB target, 256 files at most


def make_sources(root: Path) -> Path:
    src = root / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(12):
        (src / f"t{i:02}.txt").write_text(f"text file {i}\n" * (i * 30 + 1), encoding="utf-8")
    (src / "sub" / "page.html").write_text(
        "<html><body><p>A <b>page</b></p><pre> kept  as is </pre></body></html>", "utf-8"
    )
    (src / "sub" / "rows.jsonl").write_text(
        "".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(40)), encoding="utf-8"
    )
    (src / "sub" / "doc.md").write_text("# Title\n\n*em* text\n" * 50, encoding="utf-8")
    return src


def ingest(src: Path, out: Path, *args: str) -> dict[str, bytes]:
    run = run_cli(
        "ingest", "docs", str(src), "-o", str(out), "--svgt", "4x4", "--atom-size", "16", *args
    )
    assert run.code == 0, run.stderr
    return tree_bytes(out)


def test_unit_grouping_and_spills_never_change_the_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision: files are grouped into work units for the workers; any grouping, any --jobs
    and spilled or in-memory tokens give the same pack bytes."""
    src = make_sources(tmp_path)
    base = ingest(src, tmp_path / "one", "--jobs", "1")
    monkeypatch.setattr(ingest_units, "UNIT_MAX_BYTES", 1)
    monkeypatch.setattr(ingest_units, "UNIT_MIN_BYTES", 1)
    assert len(plan_units(enumerate_sources([str(src)], [])[0], 2)) == 15
    assert ingest(src, tmp_path / "each", "--jobs", "2") == base  # one file per unit
    monkeypatch.setattr(ingest_units, "UNIT_MAX_BYTES", 1 << 30)
    monkeypatch.setattr(ingest_units, "UNIT_MIN_BYTES", 1 << 30)
    assert ingest(src, tmp_path / "all", "--jobs", "3") == base  # one unit for every file
    monkeypatch.setattr(ingest_units, "UNIT_MAX_BYTES", 3000)
    monkeypatch.setattr(ingest_units, "UNIT_MIN_BYTES", 3000)
    monkeypatch.setattr(ingest_step, "MEM_TOKENS", 50)  # the larger files spill inside units
    monkeypatch.setattr(writer.TokenBuffer, "LIMIT", 7)
    assert ingest(src, tmp_path / "mixed", "--jobs", "2") == base
    assert ingest(src, tmp_path / "mixed1", "--jobs", "1") == base


def test_an_error_inside_a_unit_stops_the_ingest_with_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's error names its file and offset, whatever unit it was in; nothing is left."""
    src = make_sources(tmp_path)
    (src / "t05.txt").write_bytes(b"ok\nbad \xff here\n")
    monkeypatch.setattr(ingest_units, "UNIT_MAX_BYTES", 1 << 30)
    monkeypatch.setattr(ingest_units, "UNIT_MIN_BYTES", 1 << 30)
    for jobs in ("1", "2"):
        run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "p"), "--jobs", jobs)
        assert run.code == 1, run.stderr
        assert "INGEST_UTF8" in run.stderr and "t05.txt" in run.stderr
        assert "offset 7" in run.stderr
        assert sorted(os.listdir(tmp_path)) == ["src"]
    missing = run_cli(
        "ingest", "docs", str(tmp_path / "nope"), "-o", str(tmp_path / "p"), "-j", "2"
    )
    assert missing.code == 2 and "IO_NOT_FOUND" in missing.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_a_folder_reached_through_a_link_is_still_a_duplicate(tmp_path: Path) -> None:
    """The listing resolves a folder's real path once; files below it keep being recognised
    as duplicates of the same file named through a symbolic link or directly."""
    src = make_sources(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(src, target_is_directory=True)
    files, skipped = enumerate_sources([str(link), str(src / "t03.txt"), str(src)], [])
    assert len(files) == 15
    assert [s.reason for s in skipped] == ["duplicate of an earlier input"] * 16
    assert skipped[0].recorded == str(src / "t03.txt")


def test_the_workers_share_the_parents_automaton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --jobs 2 the automaton is made once (built, or loaded from the map cache), before
    the workers are forked (they read the same pages); no worker builds another."""
    src = make_sources(tmp_path)
    base = ingest(src, tmp_path / "one", "--jobs", "1")
    real = pi.Tokenizer
    built: list[int] = []

    def counted(*args: object) -> object:
        if os.getpid() != parent:
            raise AssertionError("a worker built its own automaton")
        built.append(os.getpid())
        return real(*args)  # type: ignore[arg-type]

    parent = os.getpid()
    monkeypatch.setattr(pi, "Tokenizer", counted)
    assert ingest(src, tmp_path / "two", "--jobs", "2") == base
    assert built == [parent]
