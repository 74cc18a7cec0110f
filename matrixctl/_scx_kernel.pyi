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
    def encode_blocks(
        self,
        data: Buffer,
        first_bundle: int,
        debug: bool,
        chunk_bundles: int,
        shard_bundles: int,
        block_bundles: int,
    ) -> list[TokenBuffer]: ...
    def decode(self, tokens: Buffer) -> tuple[bytes, int] | None: ...

class TokenBuffer:
    """Tokens of a block from `Codec.encode_blocks`: a read-only buffer (u16) in pooled memory."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
