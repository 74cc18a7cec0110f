"""Hugging Face `tokenizer.json` (the `tokenizers` library's serialisation): the cheap sniff.

JSON has no magic number: a file is taken for a tokenizer.json when its first 64 bytes (after an
optional UTF-8 BOM and white space) open a JSON object whose keys include `"truncation"` or
`"added_tokens"` (the library writes `version`, `truncation`, `padding`, `added_tokens`, ...
first), or when it is named `tokenizer.json`. Parsing and the tokenizer are in
`matrixctl.tokenizers.model` (docs/tokenizers.md).
"""

from __future__ import annotations

FORMAT = "hf-tokenizer"
KEYS = (b'"truncation"', b'"added_tokens"')


def sniff(head: bytes, size: int) -> bool:
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text.startswith(b"{") and any(k in text for k in KEYS)
