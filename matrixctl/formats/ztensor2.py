"""zTensor container v2 (written by ztensor 2.x): recognised, not read.

The 2.x releases of the reference implementation write a different container: magic
89 5A 54 32 0D 0A 1A 0A (0x89 "ZT2" CR LF SUB LF) at offset 0 and again at EOF, a 40-byte footer
(manifest offset, manifest length, XXH3-64 of the manifest, u32 version, u32 reserved, magic),
4096-byte alignment and a different manifest schema. matrixctl implements zTensor v1.1
(`ZTEN1000`); a v2 file is named as such in one line instead of "unknown format".
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.tensors import TensorInfo, TensorSource

if TYPE_CHECKING:
    from collections.abc import Iterator

    from matrixctl.io import Source

FORMAT = "ztensor-v2"
MAGIC = b"\x89ZT2\r\n\x1a\n"
FOOTER = struct.Struct("<QQQII8s")  # 40 bytes
MIN_SIZE = len(MAGIC) + FOOTER.size

ZT2_UNSUPPORTED = codes.define(
    "ZT2_UNSUPPORTED",
    "A zTensor v2 container (ztensor 2.x, magic 0x89 ZT2): matrixctl reads zTensor v1.1 only.",
    group="ztensor",
)


def footer(buf: Any, size: int) -> dict[str, Any] | None:
    """The v2 footer fields, or None when the file is too short or the tail magic is absent."""
    if size < MIN_SIZE:
        return None
    moff, mlen, mhash, version, _reserved, magic = FOOTER.unpack(bytes(buf[size - 40 : size]))
    if magic != MAGIC:
        return None
    return {
        "version": version,
        "manifest_offset": moff,
        "manifest_length": mlen,
        "manifest_xxh3": f"0x{mhash:016x}",
    }


def unsupported(src: Source) -> FormatError:
    info = footer(src.buf, src.size)
    what = f"footer version {info['version']}" if info else "its footer is missing or damaged"
    return FormatError(
        ZT2_UNSUPPORTED,
        f"this is a zTensor v2 container written by ztensor 2.x ({what}); matrixctl reads "
        "zTensor v1.1 (magic ZTEN1000) only",
        path=src.name,
        offset=0,
        field="magic",
    )


class Zt2Source(TensorSource):
    format = FORMAT

    def __init__(self, src: Source) -> None:
        raise unsupported(src)

    def tensors(self) -> list[TensorInfo]:  # pragma: no cover - never constructed
        return []

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:  # pragma: no cover
        return iter(())


TENSOR_IO = {FORMAT: (Zt2Source, None)}
