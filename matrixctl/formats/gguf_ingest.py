"""The folder `ingest gguf` writes (docs/formats/gguf.md, "The ingest folder"): a π symbol map,
the tokenizer sidecar, the token embeddings in a tensor container, and a manifest with the
SHA-256 of the source and of every file. Recognised by its manifest, `gguf_manifest.json`.
Writing is `matrixctl.ingest.gguf`; checking is `matrixctl.validate.gguf_ingest`.
"""

from __future__ import annotations

import os

from matrixctl import codes

FORMAT = "gguf-ingest"
MANIFEST = "gguf_manifest.json"
SYMBOLS = "pi_symbol_map.json"
TOKENIZER = "gguf_tokenizer.json"
MANIFEST_VERSION = 1

GGUF_OUTPUT = codes.define(
    "GGUF_OUTPUT",
    "The output folder exists and is neither a folder `ingest gguf` wrote nor empty (it is "
    "never replaced).",
    group="ingest",
)


def is_folder(path: str) -> bool:
    """A folder `ingest gguf` wrote holds gguf_manifest.json."""
    return os.path.isfile(os.path.join(path, MANIFEST))
