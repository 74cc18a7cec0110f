"""Types of the byte-level BPE tokenizer's compiled kernel (matrixctl/_bpe_kernel.c)."""

from collections.abc import Sequence
from typing import Any

Buffer = Any  # bytes, bytearray, memoryview, array.array (the buffer protocol)

CLASS_L: int
CLASS_N: int
CLASS_W: int
CLASS_M: int
KIND_GPT2: int
KIND_LLAMA3: int
KIND_QWEN2: int
KIND_QWEN35: int
KIND_STARCODER: int

def classes(ranges: Sequence[tuple[int, int, int]], white: str) -> bytes: ...

class Model:
    """A byte-level BPE tokenizer's pre-tokenizer, merges and chunk cache."""

    def __init__(
        self,
        kind: int,
        classes: bytes,
        byte_sym: Buffer,
        sym_token: Buffer,
        missing_off: Buffer,
        missing_ids: Buffer,
        merges: Buffer,
        vocab_blob: Buffer,
        vocab_off: Buffer,
        vocab_ids: Buffer,
        ignore_merges: bool,
        cache_limit: int,
    ) -> None: ...
    def encode(self, text: str) -> bytes: ...
    def encode_list(self, text: str) -> list[int]: ...
    def bounds(self, text: str) -> bytes: ...
    def cache_size(self) -> int: ...
