"""MATRIX-ATOM v1: fixed-width token files (spec: matrix-ingest-v1.md section 2).

Byte layout (all integers little-endian), resolved as docs/formats/matrix-atom.md explains:

    off  size field          value
    0x00  8   magic          b"MTRXATOM"
    0x08  2   version        1
    0x0A  2   header_bytes   64
    0x0C  1   dtype_id       1 = uint16, 2 = uint32
    0x0D  1   flags          bit0 svg_tensor, bit1 index; other bits must be 0
    0x0E  2   reserved       0
    0x10  4   vocab_size     ids are < vocab_size
    0x14  4   atom_size      tokens per atom, >= 1
    0x18  8   atom_count     token_count / atom_size
    0x20  8   token_count    tokens in the payload, padding included
    0x28  8   data_offset    64 (the payload follows the header)
    0x30  4   header_crc32   CRC-32 of bytes 0..63 with bytes 0x30..0x33 zeroed
    0x34  4   payload_crc32  CRC-32 of the payload bytes
    0x38  8   reserved       0
    0x40  ..  payload        token_count ids, '<u2' or '<u4'

The codec parses and writes; judging a file (the findings) is `matrixctl.validate.matrix_atom`.
numpy is imported inside the functions that need it, so `inspect` stays cheap.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.crc import crc32, crc32_combine
from matrixctl.errors import FormatError, UsageError
from matrixctl.io import BackgroundWriter, copy_file_range_all

if TYPE_CHECKING:
    import numpy as np

FORMAT = "matrix-atom"
MAGIC = b"MTRXATOM"
VERSION = 1
HEADER_SIZE = 64
HEADER = struct.Struct("<8sHHBBHIIQQQII8s")
assert HEADER.size == HEADER_SIZE

# dtype_id -> (name, numpy little-endian dtype string, item size)
DTYPES: dict[int, tuple[str, str, int]] = {1: ("uint16", "<u2", 2), 2: ("uint32", "<u4", 4)}
DTYPE_IDS = {name: dtype_id for dtype_id, (name, _, _) in DTYPES.items()}
UINT16_LIMIT = 1 << 16
UINT32_LIMIT = 1 << 32
# vocab_size is a u32, so the largest representable vocabulary is 2**32 - 1 and the largest id
# any file can hold validly is 2**32 - 2.
MAX_ID = UINT32_LIMIT - 2

FLAG_SVG_TENSOR = 1 << 0
FLAG_INDEX = 1 << 1
KNOWN_FLAGS = FLAG_SVG_TENSOR | FLAG_INDEX

# Field name -> (offset, size), for findings that point at a field.
FIELDS: dict[str, tuple[int, int]] = {
    "magic": (0x00, 8),
    "version": (0x08, 2),
    "header_bytes": (0x0A, 2),
    "dtype_id": (0x0C, 1),
    "flags": (0x0D, 1),
    "reserved0": (0x0E, 2),
    "vocab_size": (0x10, 4),
    "atom_size": (0x14, 4),
    "atom_count": (0x18, 8),
    "token_count": (0x20, 8),
    "data_offset": (0x28, 8),
    "header_crc32": (0x30, 4),
    "payload_crc32": (0x34, 4),
    "reserved1": (0x38, 8),
}
HEADER_CRC_SPAN = (0x30, 0x34)
PAYLOAD_CRC_SPAN = (0x34, 0x38)

G = FORMAT
ATOM_TRUNCATED_HEADER = codes.define(
    "ATOM_TRUNCATED_HEADER", "The file is shorter than the 64-byte MATRIX-ATOM header.", group=G
)
ATOM_VERSION = codes.define("ATOM_VERSION", "Unsupported MATRIX-ATOM version (v1 only).", group=G)
ATOM_HEADER_BYTES = codes.define("ATOM_HEADER_BYTES", "header_bytes is not 64.", group=G)
ATOM_DTYPE = codes.define("ATOM_DTYPE", "dtype_id is not 1 (uint16) or 2 (uint32).", group=G)
ATOM_FLAGS = codes.define("ATOM_FLAGS", "flags has bits set that v1 does not define.", group=G)
ATOM_RESERVED = codes.define("ATOM_RESERVED", "A reserved header field is not zero.", group=G)
ATOM_DATA_OFFSET = codes.define("ATOM_DATA_OFFSET", "data_offset is not 64.", group=G)
ATOM_ATOM_SIZE = codes.define("ATOM_ATOM_SIZE", "atom_size is 0.", group=G)
ATOM_VOCAB_SIZE = codes.define("ATOM_VOCAB_SIZE", "vocab_size is 0.", group=G)
ATOM_COUNT = codes.define("ATOM_COUNT", "atom_count * atom_size differs from token_count.", group=G)
ATOM_TRUNCATED = codes.define(
    "ATOM_TRUNCATED", "The file ends before the token_count tokens it declares.", group=G
)
ATOM_TRAILING = codes.define(
    "ATOM_TRAILING", "Bytes follow the last token the header declares.", group=G
)
ATOM_HEADER_CRC = codes.define(
    "ATOM_HEADER_CRC", "header_crc32 does not match the header.", group=G
)
ATOM_HEADER_CRC_LEGACY = codes.define(
    "ATOM_HEADER_CRC_LEGACY",
    "header_crc32 was computed with payload_crc32 zeroed too, as the spec's reference tool "
    "binary_pack.py does; accepted.",
    group=G,
    severity=Severity.WARNING,
)
ATOM_PAYLOAD_CRC = codes.define(
    "ATOM_PAYLOAD_CRC", "payload_crc32 does not match the payload.", group=G
)
ATOM_ID_RANGE = codes.define("ATOM_ID_RANGE", "A token id is >= vocab_size.", group=G)
ATOM_ID_OVERFLOW = codes.define(
    "ATOM_ID_OVERFLOW", "A token id does not fit the requested dtype (never wrapped).", group=G
)
ATOM_DTYPE_NARROW = codes.define(
    "ATOM_DTYPE_NARROW",
    "uint16 payload with vocab_size above 65536: ids 65536 and up cannot be stored.",
    group=G,
    severity=Severity.WARNING,
)
ATOM_DTYPE_WIDE = codes.define(
    "ATOM_DTYPE_WIDE",
    "uint32 payload although every id below vocab_size fits uint16 (twice the size needed).",
    group=G,
    severity=Severity.INFO,
)


@dataclass(frozen=True)
class AtomHeader:
    magic: bytes = MAGIC
    version: int = VERSION
    header_bytes: int = HEADER_SIZE
    dtype_id: int = 1
    flags: int = 0
    reserved0: int = 0
    vocab_size: int = 0
    atom_size: int = 1
    atom_count: int = 0
    token_count: int = 0
    data_offset: int = HEADER_SIZE
    header_crc32: int = 0
    payload_crc32: int = 0
    reserved1: bytes = bytes(8)

    @classmethod
    def parse(cls, raw: bytes) -> AtomHeader:
        if len(raw) < HEADER_SIZE:
            raise FormatError(
                ATOM_TRUNCATED_HEADER,
                f"file has {len(raw)} bytes, the header alone needs {HEADER_SIZE}",
                offset=len(raw),
                field="header",
            )
        return cls(*HEADER.unpack_from(raw, 0))

    def to_bytes(self) -> bytes:
        return HEADER.pack(
            self.magic,
            self.version,
            self.header_bytes,
            self.dtype_id,
            self.flags,
            self.reserved0,
            self.vocab_size,
            self.atom_size,
            self.atom_count,
            self.token_count,
            self.data_offset,
            self.header_crc32,
            self.payload_crc32,
            self.reserved1,
        )

    @property
    def dtype_name(self) -> str | None:
        entry = DTYPES.get(self.dtype_id)
        return entry[0] if entry else None

    @property
    def itemsize(self) -> int | None:
        entry = DTYPES.get(self.dtype_id)
        return entry[2] if entry else None

    @property
    def payload_bytes(self) -> int | None:
        size = self.itemsize
        return None if size is None else self.token_count * size

    def with_crc(self) -> AtomHeader:
        """This header with header_crc32 computed over its other 60 bytes."""
        return replace(self, header_crc32=header_crc(self.to_bytes()))

    def to_json(self) -> dict[str, Any]:
        return {
            "magic": self.magic.decode("latin-1"),
            "version": self.version,
            "header_bytes": self.header_bytes,
            "dtype_id": self.dtype_id,
            "dtype": self.dtype_name,
            "flags": self.flags,
            "flag_names": flag_names(self.flags),
            "reserved0": self.reserved0,
            "vocab_size": self.vocab_size,
            "atom_size": self.atom_size,
            "atom_count": self.atom_count,
            "token_count": self.token_count,
            "data_offset": self.data_offset,
            "header_crc32": f"0x{self.header_crc32:08x}",
            "payload_crc32": f"0x{self.payload_crc32:08x}",
            "reserved1": self.reserved1.hex(),
        }


def flag_names(flags: int) -> list[str]:
    names = []
    if flags & FLAG_SVG_TENSOR:
        names.append("svg_tensor")
    if flags & FLAG_INDEX:
        names.append("index")
    if flags & ~KNOWN_FLAGS:
        names.append(f"unknown(0x{flags & ~KNOWN_FLAGS:02x})")
    return names


def header_crc(raw: bytes, *, legacy: bool = False) -> int:
    """CRC-32 of the 64 header bytes with header_crc32 zeroed (and payload_crc32 when legacy)."""
    buf = bytearray(raw[:HEADER_SIZE])
    lo, hi = HEADER_CRC_SPAN
    buf[lo:hi] = bytes(hi - lo)
    if legacy:
        lo, hi = PAYLOAD_CRC_SPAN
        buf[lo:hi] = bytes(hi - lo)
    return crc32(bytes(buf))


def token_view(buf: Any, header: AtomHeader) -> np.ndarray:
    """Zero-copy numpy view of the payload; the caller has checked the file size."""
    import numpy as np

    dtype = np.dtype(DTYPES[header.dtype_id][1])
    return np.frombuffer(buf, dtype=dtype, count=header.token_count, offset=header.data_offset)


def choose_dtype(requested: str, vocab_size: int | None) -> str | None:
    """`uint16`/`uint32`, or None when auto must wait for the data (vocab_size unknown)."""
    if requested != "auto":
        return requested
    if vocab_size is None:
        return None
    return "uint16" if vocab_size <= UINT16_LIMIT else "uint32"


class AtomWriter:
    """Stream token ids into a MATRIX-ATOM file with bounded memory.

    The header is written last (the file object must be seekable; `matrixctl.io.atomic_output`
    gives one for stdout too). Every id is checked before it is written: below `vocab_size` when
    that is known, and within the dtype; ids are never wrapped. With `dtype="auto"` and no
    vocabulary size, the payload starts as uint16 and is widened in place to uint32 the first
    time an id above 65535 arrives.
    """

    CHUNK = 1 << 22  # tokens per write when re-encoding
    BACKGROUND_MIN = 1 << 20  # chunks this large are written on a helper thread

    def __init__(
        self,
        fp: BinaryIO,
        *,
        atom_size: int,
        dtype: str = "auto",
        vocab_size: int | None = None,
        pad_id: int = 0,
        flags: int = 0,
    ) -> None:
        if atom_size < 1 or atom_size >= UINT32_LIMIT:
            raise UsageError(
                f"--atom-size must be between 1 and {UINT32_LIMIT - 1}, got {atom_size}"
            )
        if dtype not in ("auto", "uint16", "uint32"):
            raise UsageError(f"--dtype must be auto, uint16 or uint32, got {dtype!r}")
        if vocab_size is not None and not 1 <= vocab_size < UINT32_LIMIT:
            raise UsageError(
                f"--vocab-size must be between 1 and {UINT32_LIMIT - 1}, got {vocab_size}"
            )
        if pad_id < 0 or (vocab_size is not None and pad_id >= vocab_size):
            raise UsageError(f"--pad-id {pad_id} is outside the vocabulary [0, {vocab_size})")
        if dtype == "uint16" and pad_id >= UINT16_LIMIT:
            raise UsageError(f"--pad-id {pad_id} does not fit uint16")
        if flags & ~KNOWN_FLAGS:
            raise UsageError(f"unknown MATRIX-ATOM flags 0x{flags:02x}")
        self.fp = fp
        self.atom_size = atom_size
        self.requested = dtype
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.flags = flags
        self.dtype = choose_dtype(dtype, vocab_size) or "uint16"
        self.tokens = 0
        self.max_id = -1
        self.crc = 0
        self._bg: BackgroundWriter | None = None
        self.fp.seek(0)
        self.fp.write(bytes(HEADER_SIZE))

    @property
    def _np_dtype(self) -> str:
        return DTYPES[DTYPE_IDS[self.dtype]][1]

    def write(self, ids: np.ndarray, max_id: int | None = None, *, crc: int | None = None) -> None:
        """Append ids (any integer dtype). Raises FormatError naming the first bad token.

        `max_id` may pass the chunk's largest id, and `crc` the CRC-32 of `ids`' bytes, when
        the caller has computed them already (the token stream reader has: its frame CRCs);
        the CRC is used only when the ids are written as they are, without a conversion.
        """
        import numpy as np

        if ids.size == 0:
            return
        ids = np.ascontiguousarray(ids).reshape(-1)
        lo = int(ids.min()) if ids.dtype.kind == "i" else 0
        hi = int(ids.max()) if max_id is None else max_id
        if lo < 0:
            self._bad(ids, ids < 0, "is negative")
        if self.vocab_size is not None and hi >= self.vocab_size:
            self._bad(ids, ids >= self.vocab_size, f"is not below vocab_size {self.vocab_size}")
        if hi > MAX_ID:
            self._bad(
                ids,
                ids > MAX_ID,
                f"is above {MAX_ID}, the largest id a u32 vocab_size allows",
                code=ATOM_ID_OVERFLOW,
            )
        if hi >= UINT16_LIMIT and self.dtype == "uint16":
            if self.requested == "uint16":
                self._bad(
                    ids,
                    ids >= UINT16_LIMIT,
                    "does not fit uint16 (never wrapped; use --dtype uint32 or auto)",
                    code=ATOM_ID_OVERFLOW,
                )
            self._widen()
        same = ids.dtype == np.dtype(self._np_dtype)
        out = ids if same else ids.astype(self._np_dtype)
        data = out.data.cast("B")
        if same and crc is not None:
            self.crc = crc32_combine(self.crc, crc, len(data))
        else:
            self.crc = crc32(data, self.crc)
        self._write(data)
        self.tokens += ids.size
        self.max_id = max(self.max_id, hi)

    def write_range(
        self, src: int, offset: int, nbytes: int, dtype: str, *, max_id: int, crc: int
    ) -> None:
        """Append ids stored as they are, `nbytes` at `offset` of the file descriptor `src`
        (little-endian `dtype`, "<u2" or "<u4"), copied inside the kernel: the caller vouches
        for their largest id and the CRC-32 of the bytes (a staged work unit's completion
        record). Ids of another width, or ones that need a check the caller cannot vouch for,
        are read and written like `write`."""
        import numpy as np

        if nbytes == 0:
            return
        width = np.dtype(dtype).itemsize
        if (
            np.dtype(dtype) != np.dtype(self._np_dtype)
            or nbytes % width
            or (self.vocab_size is not None and max_id >= self.vocab_size)
        ):
            self.write(np.frombuffer(os.pread(src, nbytes, offset), dtype=dtype))
            return
        self._drain()
        self.fp.flush()
        at = self.fp.tell()
        os.lseek(self.fp.fileno(), at, os.SEEK_SET)
        copy_file_range_all(src, offset, nbytes, self.fp.fileno())
        self.fp.seek(at + nbytes)
        self.crc = crc32_combine(self.crc, crc, nbytes)
        self.tokens += nbytes // width
        self.max_id = max(self.max_id, max_id)

    def append_file(self, path: str, count: int, max_id: int, crc: int) -> None:
        """Append `count` ids stored in the writer's own dtype in the file `path` (an ingest
        worker's tokens), whose largest id and CRC-32 the worker computed as it wrote them:
        `write_range` of the whole file, copied inside the kernel."""
        import numpy as np

        with open(path, "rb") as src:
            self.write_range(
                src.fileno(),
                0,
                count * np.dtype(self._np_dtype).itemsize,
                self._np_dtype,
                max_id=max_id,
                crc=crc,
            )

    def _bad(self, ids: np.ndarray, mask: np.ndarray, why: str, code: str = ATOM_ID_RANGE) -> None:
        import numpy as np

        first = int(np.argmax(mask))
        index = self.tokens + first
        raise FormatError(
            code,
            f"token {index} (id {int(ids[first])}) {why}",
            field=f"token[{index}]",
        )

    def _write(self, data: memoryview) -> None:
        if self._bg is None and len(data) >= self.BACKGROUND_MIN:
            self._bg = BackgroundWriter(self.fp)
        if self._bg is not None:
            self._bg.write(data)
        else:
            self.fp.write(data)

    def _drain(self) -> None:
        if self._bg is not None:
            self._bg.close()
            self._bg = None

    def settle(self) -> None:
        """Wait until every chunk handed over is written (its buffer may then be reused)."""
        if self._bg is not None:
            self._bg.drain()

    def close(self) -> None:
        """Stop the background writer (after an error too); finish() calls it itself."""
        self._drain()

    def _widen(self) -> None:
        """Rewrite the uint16 payload written so far as uint32, in place, last chunk first."""
        import numpy as np

        self._drain()
        n = self.tokens
        end = n
        while end > 0:
            start = max(0, end - self.CHUNK)
            self.fp.seek(HEADER_SIZE + 2 * start)
            chunk = np.frombuffer(self.fp.read(2 * (end - start)), dtype="<u2")
            self.fp.seek(HEADER_SIZE + 4 * start)
            self.fp.write(chunk.astype("<u4").tobytes())
            end = start
        # Recompute the CRC over the widened payload, front to back.
        self.crc = 0
        self.fp.seek(HEADER_SIZE)
        remaining = 4 * n
        while remaining:
            block = self.fp.read(min(remaining, 4 * self.CHUNK))
            self.crc = crc32(block, self.crc)
            remaining -= len(block)
        self.fp.seek(HEADER_SIZE + 4 * n)
        self.dtype = "uint32"

    def finish(self) -> AtomHeader:
        """Pad to a whole atom, write the header, return it. The file stays open."""
        import numpy as np

        self._drain()
        vocab = self.vocab_size
        if vocab is None:
            vocab = max(self.max_id, self.pad_id) + 1
        if self.dtype == "uint16" and self.pad_id >= UINT16_LIMIT:
            self._widen()
        pad = (-self.tokens) % self.atom_size
        if pad:
            fill = np.full(pad, self.pad_id, dtype=self._np_dtype)
            data = fill.data.cast("B")
            self.crc = crc32(data, self.crc)
            self.fp.write(data)
            self.tokens += pad
        header = AtomHeader(
            dtype_id=DTYPE_IDS[self.dtype],
            flags=self.flags,
            vocab_size=vocab,
            atom_size=self.atom_size,
            atom_count=self.tokens // self.atom_size,
            token_count=self.tokens,
            data_offset=HEADER_SIZE,
            payload_crc32=self.crc,
        ).with_crc()
        self.fp.seek(0)
        self.fp.write(header.to_bytes())
        self.fp.seek(0, 2)
        self.padding = pad
        return header


def write_atoms(
    fp: BinaryIO,
    ids: np.ndarray,
    *,
    atom_size: int,
    dtype: str = "auto",
    vocab_size: int | None = None,
    pad_id: int = 0,
    flags: int = 0,
) -> AtomHeader:
    """Write a whole array as one MATRIX-ATOM file (convenience over `AtomWriter`)."""
    writer = AtomWriter(
        fp, atom_size=atom_size, dtype=dtype, vocab_size=vocab_size, pad_id=pad_id, flags=flags
    )
    writer.write(ids)
    return writer.finish()
