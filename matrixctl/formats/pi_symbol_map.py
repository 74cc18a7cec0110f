"""π symbol maps (`pi_symbol_map.json`, matrix-ingest-v1.md section 3.1): the cheap sniff.

The map is JSON, so it has no magic number: a file is taken for a symbol map when its first
64 bytes (after an optional UTF-8 BOM and white space) open a JSON object and name one of the
map's own keys. Parsing, checks and the tokenizer are in `matrixctl.tokenizers.pi`.
"""

from __future__ import annotations

FORMAT = "pi-symbol-map"
KEYS = (
    b'"vocab_size"',
    b'"symbols"',
    b'"unk_id"',
    b'"byte_fallback"',
    b'"byte_base_id"',
    b'"normalization"',
)


def sniff(head: bytes, size: int) -> bool:
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    return text.startswith(b"{") and any(k in text for k in KEYS)
