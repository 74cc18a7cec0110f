"""Types of the JSON Lines text-field extractor of `ingest docs` (matrixctl/_jsonl_kernel.c)."""

from collections.abc import Callable
from typing import Any

Buffer = Any  # bytes, bytearray, memoryview, mmap (the buffer protocol)

def texts(data: Buffer, start: int, end: int, field: bytes, limit: int, out: Buffer) -> bytes: ...
def normalize_utf8(data: Buffer, gap: int, normalize: Callable[[str], str]) -> Buffer: ...
