"""Build the benchmark corpus (>= 50 MB of real text) from Debian documentation packages.

    python bench/corpus.py [OUT]        # default bench/out/corpus

Recipe: `apt-get download` the packages below (Debian's own archive, the same versions for
everyone on Debian 12), unpack them with `dpkg-deb -x`, and keep the documentation files that
`ingest docs` reads: HTML pages, plain text, Markdown, after gunzipping `.gz` text files. Binary
files (images, fonts) are left out. Packages:

- python3.11-doc: the Python 3.11 documentation, ~1,000 HTML pages (English prose and code);
- debian-handbook: "The Debian Administrator's Handbook", HTML in many languages (English,
  French, German, Japanese, Chinese, Russian... so other scripts are measured too);
- debian-reference-en: the Debian Reference, HTML.

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
KEEP = (".html", ".htm", ".txt", ".md", ".rst")
ROOT = Path(__file__).resolve().parent


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "out" / "corpus"
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists; {size(out) / 1e6:.1f} MB", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=tmp, check=True)
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
