"""Build the benchmark corpus (>= 50 MB of real text) from Debian documentation packages.

    python bench/corpus.py [OUT]        # default bench/out/corpus
    python bench/corpus.py --large [OUT]    # default bench/out/corpus-large (bench_inputs.py)

Recipe: `apt-get download` the packages below (Debian's own archive, the same versions for
everyone on Debian 12), unpack them with `dpkg-deb -x`, and keep the documentation files that
`ingest docs` reads: HTML pages, plain text, Markdown, after gunzipping `.gz` text files. Binary
files (images, fonts) are left out. Packages:

- python3.11-doc: the Python 3.11 documentation, ~1,000 HTML pages (English prose and code);
- debian-handbook: "The Debian Administrator's Handbook", HTML in many languages (English,
  French, German, Japanese, Chinese, Russian... so other scripts are measured too);
- debian-reference-en: the Debian Reference, HTML.

`--large` adds the documentation packages of Rust, OpenJDK 17, PostgreSQL 15, Ruby 3.1, Perl,
Git and Django (about 1 GB of pages as stored) for bench/bench_inputs.py, which needs 1 GB of
real text.

The result is written as plain files under OUT; the script prints its size. Needs apt-get and
dpkg-deb (Debian) and the network to the Debian archive; run `apt-get update` first.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = ["python3.11-doc", "debian-handbook", "debian-reference-en"]
LARGE = [
    "rust-doc",
    "openjdk-17-doc",
    "postgresql-doc-15",
    "ruby3.1-doc",
    "perl-doc",
    "git-doc",
    "python-django-doc",
]
KEEP = (".html", ".htm", ".txt", ".md", ".rst")
ROOT = Path(__file__).resolve().parent


def main() -> int:
    args = sys.argv[1:]
    large = "--large" in args
    args = [a for a in args if a != "--large"]
    default = ROOT / "out" / ("corpus-large" if large else "corpus")
    out = Path(args[0]) if args else default
    packages = PACKAGES + LARGE if large else PACKAGES
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists; {size(out) / 1e6:.1f} MB", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", *packages], cwd=tmp, check=True)
        for deb in sorted(Path(tmp).glob("*.deb")):
            dest = Path(tmp) / deb.stem
            subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)
            for path in sorted(dest.rglob("*")):
                if path.is_symlink() or not path.is_file():
                    continue
                rel = path.relative_to(dest)
                name = path.name
                target = out / deb.stem.split("_")[0] / rel
                if name.endswith(".gz") and name[:-3].endswith(KEEP):
                    target = target.with_name(name[:-3])
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with gzip.open(path) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
                elif name.endswith(KEEP):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
    print(f"{out}: {size(out) / 1e6:.1f} MB", file=sys.stderr)
    return 0


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


if __name__ == "__main__":
    raise SystemExit(main())
