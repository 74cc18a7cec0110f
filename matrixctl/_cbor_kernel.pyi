"""Types of the strict CBOR decoders (matrixctl/_cbor_kernel.c); matrixctl/cbor.py is the API."""

from typing import Any

def loads(data: Any, max_items: int, max_depth: int, error: type[Exception], /) -> Any: ...
def loads_deterministic(
    data: Any, max_depth: int, max_items: int, error: type[Exception], /
) -> Any: ...
