"""Benchmark: HTML to visible text with selectolax (lexbor), lxml and the standard library.

    python bench/bench_extract.py [--limit-mb 20]

Runs on the HTML pages of the benchmark corpus (bench/corpus.py), one process, and prints MB/s
of HTML per library with the ratio against the standard library's html.parser (the anchor), and
how many characters of visible text each one finds (a coarse quality check: script and style
contents must not count). matrixctl has two paths over selectolax (lexbor): the fast one
`ingest docs` uses (`html_text`: marker text nodes and lexbor's own text walk) and the Python
node walk it replaced (`html_text_walk`, kept as its reference); the script checks that both
give exactly the same text on every page.
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


sys.path.insert(0, str(HERE.parent))


def matrixctl_fast(text: str) -> str:
    from matrixctl.ingest.kinds.html import html_text

    return html_text(text)


def matrixctl_walk(text: str) -> str:
    from matrixctl.ingest.kinds.html import html_text_walk

    return html_text_walk(text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit-mb", type=int, default=20, help="HTML to read (0 = every page)")
    args = ap.parse_args()
    pages = []
    total = 0
    for path in sorted(CORPUS.rglob("*.html")):
        data = path.read_bytes()
        pages.append(data.decode("utf-8", "replace"))
        total += len(data)
        if args.limit_mb and total >= args.limit_mb << 20:
            break
    rows = []
    texts: dict[str, list[str]] = {}
    for name, fn in (
        ("html.parser (stdlib, anchor)", stdlib),
        ("lxml", lxml_text),
        ("matrixctl node walk (before)", matrixctl_walk),
        ("matrixctl html_text (ingest docs)", matrixctl_fast),
    ):
        t = time.perf_counter()
        out = [fn(p) for p in pages]
        rows.append(
            (name, total / (time.perf_counter() - t), sum(len(" ".join(o.split())) for o in out))
        )
        texts[name] = out
    anchor = rows[0][1]
    print(f"HTML: {len(pages)} pages, {total / 1e6:.1f} MB\n")
    print("| extractor | MB/s | x html.parser | visible characters |")
    print("| --- | --- | --- | --- |")
    for name, rate, chars in rows:
        print(f"| {name} | {rate / 1e6:.1f} | {rate / anchor:.2f} | {chars:,} |")
    a, b = texts["matrixctl node walk (before)"], texts["matrixctl html_text (ingest docs)"]
    differ = sum(x != y for x, y in zip(a, b, strict=True))
    print(f"\nmatrixctl pages whose text differs between the two paths: {differ} of {len(pages)}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
