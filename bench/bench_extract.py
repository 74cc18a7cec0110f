"""Benchmark: HTML to visible text with selectolax (lexbor), lxml and the standard library.

    python bench/bench_extract.py [--limit-mb 20]

Runs on the HTML pages of the benchmark corpus (bench/corpus.py), one process, and prints MB/s
of HTML per library with the ratio against the standard library's html.parser (the anchor), and
how many characters of visible text each one finds (a coarse quality check: script and style
contents must not count). matrixctl uses the selectolax walk (matrixctl.ingest.extract).
"""

from __future__ import annotations

import argparse
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "out" / "corpus"
SKIP = {"script", "style", "noscript", "template"}


class StdlibText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in SKIP:
            self.skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIP and self.skip:
            self.skip -= 1

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


def stdlib(text: str) -> str:
    p = StdlibText()
    p.feed(text)
    p.close()
    return " ".join(" ".join(p.parts).split())


def lxml_text(text: str) -> str:
    import lxml.html

    root = lxml.html.document_fromstring(text.encode("utf-8"))
    for bad in root.xpath("//script|//style|//noscript|//template"):
        bad.drop_tree()
    return " ".join(root.text_content().split())


def selectolax_text(text: str) -> str:
    sys.path.insert(0, str(HERE.parent))
    from matrixctl.ingest.extract import html_text

    return " ".join(html_text(text).split())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-mb", type=int, default=20)
    args = ap.parse_args()
    pages = []
    total = 0
    for path in sorted(CORPUS.rglob("*.html")):
        data = path.read_bytes()
        pages.append(data.decode("utf-8", "replace"))
        total += len(data)
        if total >= args.limit_mb << 20:
            break
    rows = []
    for name, fn in (
        ("html.parser (stdlib, anchor)", stdlib),
        ("lxml", lxml_text),
        ("selectolax walk (matrixctl)", selectolax_text),
    ):
        t = time.perf_counter()
        chars = sum(len(fn(p)) for p in pages)
        rows.append((name, total / (time.perf_counter() - t), chars))
    anchor = rows[0][1]
    print(f"HTML: {len(pages)} pages, {total / 1e6:.1f} MB\n")
    print("| extractor | MB/s | x html.parser | visible characters |")
    print("| --- | --- | --- | --- |")
    for name, rate, chars in rows:
        print(f"| {name} | {rate / 1e6:.1f} | {rate / anchor:.2f} | {chars:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
