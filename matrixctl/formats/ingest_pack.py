"""MATRIX ingest pack (matrix-ingest-v1.md section 6): a folder, recognised by its manifest.

The layout and the manifest fields are in docs/formats/ingest-pack.md; writing is
`matrixctl.ingest.pack`, checking is `matrixctl.validate.ingest_pack`.
"""

from __future__ import annotations

import os

FORMAT = "ingest-pack"
MANIFEST = "ingest_manifest.json"
ATOMS = "matrix_atoms.bin"
SYMBOLS = "pi_symbol_map.json"  # the tokenizer of a π pack
MODEL_TOKENIZER = "model_tokenizer.json"  # the record of a model tokenizer pack (--tokenizer)
SVGT = "atoms.svgt"
DOC_INDEX = "doc_index.bin"
MANIFEST_VERSION = 1


def is_pack(path: str) -> bool:
    """A folder is an ingest pack when it holds ingest_manifest.json."""
    return os.path.isfile(os.path.join(path, MANIFEST))
