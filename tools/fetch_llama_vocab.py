"""Fetch llama.cpp's tokenizer test vocabularies (`models/ggml-vocab-*.gguf`) for the tests.

They ship inside the llama-cpp-python 0.3.36 source distribution on PyPI; this script downloads
that archive with pip (no build, no dependencies) and extracts only the vocabulary files into
DEST (default `.venv/llama-vocab`). The test vectors beside them (`.inp`/`.out`) are small and
kept in `fixtures/llama-vocab/`; the vocabularies (about 90 MB) are not committed.

    python tools/fetch_llama_vocab.py [DEST]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "llama-cpp-python==0.3.36"
PREFIX = "vendor/llama.cpp/models/ggml-vocab-"


def main(argv: list[str]) -> int:
    dest = argv[1] if len(argv) > 1 else os.path.join(".venv", "llama-vocab")
    os.makedirs(dest, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                PACKAGE,
                "-d",
                tmp,
            ],
            check=True,
        )
        (archive,) = (os.path.join(tmp, n) for n in os.listdir(tmp) if n.endswith(".tar.gz"))
        with tarfile.open(archive) as tar:
            for member in tar:
                rel = member.name.split("/", 1)[-1]
                if not (rel.startswith(PREFIX) and rel.endswith(".gguf") and member.isfile()):
                    continue
                src = tar.extractfile(member)
                assert src is not None
                name = os.path.basename(rel)
                part = os.path.join(dest, name + ".part")
                with open(part, "wb") as out:
                    out.write(src.read())
                os.replace(part, os.path.join(dest, name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
