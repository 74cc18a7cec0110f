"""CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320, the zlib CRC), and CRC-32C (Castagnoli,
the zTensor digest) through the compiled kernel `matrixctl/_crc_kernel.c`.

zlib-ng's implementation (PCLMULQDQ/AVX2 folding) measured 13 GiB/s against 3.5 GiB/s for
CPython's `zlib.crc32` on the development machine (docs/benchmarks.md), and gives identical
values. It is a declared dependency; if it cannot be imported the standard library is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_crc32: Callable[[Any, int], int] | None = None
BACKEND = ""


def _load() -> Callable[[Any, int], int]:
    global _crc32, BACKEND
    try:
        from zlib_ng import zlib_ng

        _crc32, BACKEND = zlib_ng.crc32, "zlib-ng"
    except ImportError:  # pragma: no cover - the dependency is declared
        import zlib

        _crc32, BACKEND = zlib.crc32, "zlib"
    return _crc32


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 of a bytes-like object, continuing from `value`."""
    fn = _crc32 or _load()
    return fn(data, value) & 0xFFFFFFFF


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of any bytes-like object (mapped-file slices included: no copy, no numpy),
    continuing from the finished value `value` (google_crc32c.extend's convention)."""
    from matrixctl._crc_kernel import crc32c as kernel

    return kernel(data, value)


def crc32_chunked(buf: Any, start: int, end: int, value: int = 0, chunk: int = 8 << 20) -> int:
    """CRC-32 of `buf[start:end]` in chunks, so a mapped file is never copied whole."""
    fn = _crc32 or _load()
    with memoryview(buf) as view:
        for pos in range(start, end, chunk):
            value = fn(view[pos : min(pos + chunk, end)], value)
    return value & 0xFFFFFFFF


def _gf2_times(mat: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of A + B from crc32(A), crc32(B) and len(B), without reading either again.

    zlib-ng exposes zlib's crc32_combine; without it, the same GF(2) matrix method runs in
    Python (log2(len2) squarings of a 32x32 bit matrix: microseconds)."""
    if len2 <= 0:
        return crc1 & 0xFFFFFFFF
    try:
        from zlib_ng import zlib_ng

        return int(zlib_ng.crc32_combine(crc1, crc2, len2)) & 0xFFFFFFFF
    except (ImportError, AttributeError):  # pragma: no cover - the dependency is declared
        return combine_py(crc1, crc2, len2)


def combine_py(crc1: int, crc2: int, len2: int) -> int:
    """crc32_combine in Python (zlib's algorithm), for when zlib-ng is missing."""
    if len2 <= 0:
        return crc1 & 0xFFFFFFFF
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # the operator for one zero bit
    even = _gf2_square(odd)  # two zero bits
    odd = _gf2_square(even)  # four zero bits
    while True:
        even = _gf2_square(odd)
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _gf2_square(even)
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return (crc1 ^ crc2) & 0xFFFFFFFF
