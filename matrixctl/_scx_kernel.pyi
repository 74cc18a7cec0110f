"""Types of the SCX tokenizer's compiled kernel (matrixctl/_scx_kernel.c)."""

from typing import Any

Buffer = Any  # bytes, bytearray, memoryview, numpy arrays (the buffer protocol)

class Codec:
    """One config's lane tables: lookup, encode and decode of whole bundles."""

    def __init__(self, width: int, lanes: int, expand: Buffer, active: Buffer) -> None: ...
    def lookup(self, data: Buffer) -> bytes: ...
    def encode(
        self,
        data: Buffer,
        first_bundle: int,
        debug: bool,
        chunk_bundles: int,
        shard_bundles: int = 0,
    ) -> bytes: ...
    def decode(self, tokens: Buffer) -> tuple[bytes, int] | None: ...
