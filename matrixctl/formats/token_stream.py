"""The matrixctl token stream: what flows through a pipe between `tokenize` and `pack atoms`.

A self-describing, streamable binary format (docs/formats/token-stream.md). All integers are
little-endian.

    header (16 bytes)
      0   8  magic        b"MXTOKENS"
      8   2  version      1
      10  1  dtype_id     1 = uint16, 2 = uint32 (the same ids as MATRIX-ATOM)
      11  1  flags        0 (reserved)
      12  4  vocab_size   ids are < vocab_size; 0 = not declared

    frames, each an 8-byte frame header then a body padded with zeros to a multiple of 8 bytes
      0   1  kind         1 = TOKENS, 2 = DOC, 0 = END
      1   3  reserved     0
      4   4  count        TOKENS: ids in the body (1 .. 2**24)
                          DOC: bytes of a UTF-8 label (0 .. 65535); the document ends here
                          END: 0
    END body (24 bytes): token_count u64, doc_count u64, crc32 u32, reserved u32; crc32 is the
      CRC-32 of every byte of the stream before it (header, frames, padding, END's counts)

The END frame is last and mandatory: a stream cut short by a crashed producer has no END, so the
consumer fails instead of packing a silently shorter dataset.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl import codes
from matrixctl.crc import crc32, crc32_combine
from matrixctl.errors import FormatError, UsageError
from matrixctl.io import Readable, Releaser, read_exact
from matrixctl.records import FrozenRecord

if TYPE_CHECKING:
    import numpy as np

FORMAT = "token-stream"
MAGIC = b"MXTOKENS"
VERSION = 1
HEADER = struct.Struct("<8sHBBI")
FRAME = struct.Struct("<B3sI")
END_BODY = struct.Struct("<QQII")
HEADER_SIZE = HEADER.size
FRAME_SIZE = FRAME.size
END_SIZE = FRAME_SIZE + END_BODY.size
ALIGN = 8

KIND_END = 0
KIND_TOKENS = 1
KIND_DOC = 2
KIND_NAMES = {KIND_END: "END", KIND_TOKENS: "TOKENS", KIND_DOC: "DOC"}
MAX_FRAME_TOKENS = 1 << 24
MAX_LABEL_BYTES = (1 << 16) - 1

DTYPES: dict[int, tuple[str, str, int]] = {1: ("uint16", "<u2", 2), 2: ("uint32", "<u4", 4)}
DTYPE_IDS = {name: dtype_id for dtype_id, (name, _, _) in DTYPES.items()}

G = FORMAT
TOKS_HEADER = codes.define("TOKS_HEADER", "The token stream header is incomplete.", group=G)
TOKS_VERSION = codes.define("TOKS_VERSION", "Unsupported token stream version.", group=G)
TOKS_DTYPE = codes.define("TOKS_DTYPE", "Token stream dtype_id is not 1 or 2.", group=G)
TOKS_RESERVED = codes.define(
    "TOKS_RESERVED", "A reserved field or padding byte of the token stream is not zero.", group=G
)
TOKS_FRAME = codes.define(
    "TOKS_FRAME", "A frame has an unknown kind or a count outside its limits.", group=G
)
TOKS_NO_END = codes.define(
    "TOKS_NO_END",
    "The stream ends without its END frame (the producer stopped early).",
    group=G,
)
TOKS_AFTER_END = codes.define("TOKS_AFTER_END", "Bytes follow the END frame.", group=G)
TOKS_TOTALS = codes.define(
    "TOKS_TOTALS", "The END frame's token or document count disagrees with the frames.", group=G
)
TOKS_CRC = codes.define(
    "TOKS_CRC", "The END frame's CRC-32 disagrees with the bytes of the stream.", group=G
)
TOKS_ID_RANGE = codes.define(
    "TOKS_ID_RANGE", "A token id is >= the vocab_size the stream declares.", group=G
)
TOKS_LABEL = codes.define("TOKS_LABEL", "A document label is not valid UTF-8.", group=G)
TEXT_IDS = codes.define(
    "TEXT_IDS",
    "Text token input holds something other than whitespace-separated decimal ids < 2**32.",
    group=G,
)


def _pad(n: int) -> int:
    return (-n) % ALIGN


class StreamHeader(FrozenRecord):
    __slots__ = ("dtype_id", "flags", "version", "vocab_size")
    dtype_id: int
    vocab_size: int
    version: int
    flags: int

    def __init__(
        self, dtype_id: int = 1, vocab_size: int = 0, version: int = VERSION, flags: int = 0
    ) -> None:
        self._init(dtype_id, vocab_size, version, flags)

    @property
    def dtype(self) -> str:
        return DTYPES[self.dtype_id][0]

    @property
    def np_dtype(self) -> str:
        return DTYPES[self.dtype_id][1]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype_id][2]

    def to_bytes(self) -> bytes:
        return HEADER.pack(MAGIC, self.version, self.dtype_id, self.flags, self.vocab_size)

    @classmethod
    def parse(cls, raw: bytes) -> StreamHeader:
        """Parse and check the 16-byte header (magic already matched by the caller)."""
        if len(raw) < HEADER_SIZE:
            raise FormatError(
                TOKS_HEADER,
                f"stream has {len(raw)} bytes, its header needs {HEADER_SIZE}",
                offset=len(raw),
                field="header",
            )
        magic, version, dtype_id, flags, vocab = HEADER.unpack_from(raw, 0)
        if magic != MAGIC:
            raise FormatError(codes.UNKNOWN_FORMAT, f"not a token stream: {magic!r}", offset=0)
        if version != VERSION:
            raise FormatError(
                TOKS_VERSION, f"version {version} is not supported", offset=8, field="version"
            )
        if dtype_id not in DTYPES:
            raise FormatError(
                TOKS_DTYPE, f"dtype_id {dtype_id} is unknown", offset=10, field="dtype_id"
            )
        if flags:
            raise FormatError(
                TOKS_RESERVED, f"flags is 0x{flags:02x}, must be 0", offset=11, field="flags"
            )
        return cls(dtype_id, vocab, version, flags)


class EndInfo(FrozenRecord):
    __slots__ = ("crc32", "doc_count", "token_count")
    token_count: int
    doc_count: int
    crc32: int

    def __init__(self, token_count: int, doc_count: int, crc32: int) -> None:
        self._init(token_count, doc_count, crc32)


class Event(FrozenRecord):
    """One frame: TOKENS carries `tokens`, DOC carries `label`, END carries `end`."""

    __slots__ = ("crc", "end", "kind", "label", "max_id", "offset", "tokens")
    kind: int
    offset: int
    tokens: Any
    label: str | None
    end: EndInfo | None
    max_id: int  # TOKENS: the largest id in the frame (already checked against vocab)
    crc: int | None  # TOKENS: CRC-32 of the ids' bytes alone (what a writer re-uses)

    def __init__(
        self,
        kind: int,
        offset: int,
        tokens: Any = None,
        label: str | None = None,
        end: EndInfo | None = None,
        max_id: int = -1,
        crc: int | None = None,
    ) -> None:
        self._init(kind, offset, tokens, label, end, max_id, crc)


class TokenStreamWriter:
    """Write a token stream frame by frame (does not need a seekable output)."""

    def __init__(self, fp: BinaryIO, *, dtype: str = "uint16", vocab_size: int = 0) -> None:
        if dtype not in DTYPE_IDS:
            raise UsageError(f"token stream dtype must be uint16 or uint32, got {dtype!r}")
        self.fp = fp
        self.header = StreamHeader(DTYPE_IDS[dtype], vocab_size)
        self.tokens = 0
        self.docs = 0
        self.crc = 0
        self._emit(self.header.to_bytes())

    def _emit(self, data: bytes | memoryview) -> None:
        self.fp.write(data)
        self.crc = crc32(data, self.crc)

    def write(self, ids: np.ndarray) -> None:
        import numpy as np

        ids = np.asarray(ids).reshape(-1)
        if ids.size == 0:
            return
        limit = self.header.vocab_size or (1 << (8 * self.header.itemsize))
        if int(ids.min()) < 0 or int(ids.max()) >= limit:
            bad = int(np.argmax((ids < 0) | (ids >= limit)))
            raise FormatError(
                TOKS_ID_RANGE,
                f"token {self.tokens + bad} (id {int(ids[bad])}) is outside [0, {limit})",
                field=f"token[{self.tokens + bad}]",
            )
        out = ids.astype(self.header.np_dtype, copy=False)
        for start in range(0, out.size, MAX_FRAME_TOKENS):
            part = out[start : start + MAX_FRAME_TOKENS]
            data = np.ascontiguousarray(part).data.cast("B")
            self._emit(FRAME.pack(KIND_TOKENS, b"\0\0\0", part.size))
            self._emit(data)
            self._emit(bytes(_pad(len(data))))
        self.tokens += out.size

    def write_bytes(self, data: bytes) -> None:
        """Ids already in the stream's dtype, as bytes, each known to be below vocab_size (a
        tokenizer's own output): written as `write` would, without numpy."""
        size = self.header.itemsize
        view = memoryview(data)
        step = MAX_FRAME_TOKENS * size
        for start in range(0, len(view), step):
            part = view[start : start + step]
            self._emit(FRAME.pack(KIND_TOKENS, b"\0\0\0", len(part) // size))
            self._emit(part)
            self._emit(bytes(_pad(len(part))))
        self.tokens += len(view) // size

    def end_document(self, label: str = "") -> None:
        raw = label.encode("utf-8")
        if len(raw) > MAX_LABEL_BYTES:
            raw = raw[:MAX_LABEL_BYTES].decode("utf-8", "ignore").encode("utf-8")
        self._emit(FRAME.pack(KIND_DOC, b"\0\0\0", len(raw)))
        self._emit(raw + bytes(_pad(len(raw))))
        self.docs += 1

    def close(self) -> EndInfo:
        self._emit(FRAME.pack(KIND_END, b"\0\0\0", 0))
        self._emit(struct.pack("<QQ", self.tokens, self.docs))
        self.fp.write(struct.pack("<II", self.crc, 0))
        self.fp.flush()
        return EndInfo(self.tokens, self.docs, self.crc)


class MemReader:
    """`read(n)` over a buffer, returning zero-copy memoryview slices.

    Over a mapped file, pages well behind the cursor are released (`Releaser`), so reading a
    large stream keeps resident memory flat.
    """

    def __init__(self, buf: Any, pos: int = 0) -> None:
        self.view = memoryview(buf)
        self.pos = pos
        self._releaser = Releaser(buf)

    def read(self, n: int = -1) -> memoryview:
        end = len(self.view) if n < 0 else min(len(self.view), self.pos + n)
        out = self.view[self.pos : end]
        self.pos = end
        self._releaser.advance(end)
        return out


def iter_events(fp: Readable, header: StreamHeader, *, start: int = HEADER_SIZE) -> Iterator[Event]:
    """Frames after the header, each checked; ends after END (and checks nothing follows).

    Raises FormatError with the offset of the first problem. The token arrays may be views of
    the input buffer.
    """
    import numpy as np

    pos = start
    tokens = docs = 0
    crc = crc32(header.to_bytes())
    itemsize = header.itemsize
    vocab = header.vocab_size
    while True:
        raw = fp.read(FRAME_SIZE)
        if len(raw) == 0:
            raise FormatError(
                TOKS_NO_END,
                f"stream ends after {tokens} tokens and {docs} documents without an END frame",
                offset=pos,
                field="END",
            )
        if len(raw) < FRAME_SIZE:
            raw = bytes(raw) + _read_body(fp, FRAME_SIZE - len(raw), "frame header", pos + len(raw))
        kind, reserved, count = FRAME.unpack(raw)
        crc = crc32(raw, crc)
        if reserved != b"\0\0\0":
            raise FormatError(
                TOKS_RESERVED,
                "frame header reserved bytes are not zero",
                offset=pos + 1,
                field="frame.reserved",
            )
        body = pos + FRAME_SIZE
        if kind == KIND_TOKENS:
            if not 1 <= count <= MAX_FRAME_TOKENS:
                raise FormatError(
                    TOKS_FRAME,
                    f"TOKENS frame count {count} is outside 1..{MAX_FRAME_TOKENS}",
                    offset=pos + 4,
                    field="frame.count",
                )
            nbytes = count * itemsize
            data = _read_body(fp, nbytes + _pad(nbytes), "token frame", body)
            _check_zero(data[nbytes:], body + nbytes)
            ids = np.frombuffer(data, dtype=header.np_dtype, count=count)
            hi = int(ids.max())
            if vocab and hi >= vocab:
                bad = int(np.argmax(ids >= vocab))
                raise FormatError(
                    TOKS_ID_RANGE,
                    f"token {tokens + bad} (id {int(ids[bad])}) is not below the declared "
                    f"vocab_size {vocab}",
                    offset=body + bad * itemsize,
                    field=f"token[{tokens + bad}]",
                )
            ids_crc = crc32(memoryview(data)[:nbytes])
            crc = crc32_combine(crc, ids_crc, nbytes)
            if len(data) > nbytes:
                crc = crc32(memoryview(data)[nbytes:], crc)
            yield Event(KIND_TOKENS, pos, tokens=ids, max_id=hi, crc=ids_crc)
            tokens += count
            pos = body + nbytes + _pad(nbytes)
        elif kind == KIND_DOC:
            if count > MAX_LABEL_BYTES:
                raise FormatError(
                    TOKS_FRAME,
                    f"DOC label length {count} exceeds {MAX_LABEL_BYTES}",
                    offset=pos + 4,
                    field="frame.count",
                )
            data = _read_body(fp, count + _pad(count), "document label", body)
            _check_zero(data[count:], body + count)
            crc = crc32(data, crc)
            try:
                label = bytes(data[:count]).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise FormatError(
                    TOKS_LABEL,
                    f"document label is not UTF-8: {exc.reason}",
                    offset=body + exc.start,
                    field="doc.label",
                ) from None
            yield Event(KIND_DOC, pos, label=label)
            docs += 1
            pos = body + count + _pad(count)
        elif kind == KIND_END:
            if count != 0:
                raise FormatError(
                    TOKS_FRAME,
                    f"END frame count is {count}, must be 0",
                    offset=pos + 4,
                    field="frame.count",
                )
            data = _read_body(fp, END_BODY.size, "END frame", body)
            n, d, c, res = END_BODY.unpack(bytes(data))
            crc = crc32(memoryview(data)[:16], crc)
            if res:
                raise FormatError(
                    TOKS_RESERVED,
                    "END frame reserved field is not zero",
                    offset=body + 20,
                    field="end.reserved",
                )
            if n != tokens or d != docs:
                raise FormatError(
                    TOKS_TOTALS,
                    f"END says {n} tokens and {d} documents; the frames hold {tokens} and {docs}",
                    offset=body,
                    field="end.token_count",
                )
            if c != crc:
                raise FormatError(
                    TOKS_CRC,
                    f"END crc32 is 0x{c:08x}, the ids' CRC-32 is 0x{crc:08x}",
                    offset=body + 16,
                    field="end.crc32",
                )
            tail = fp.read(1)
            if len(tail):
                raise FormatError(
                    TOKS_AFTER_END,
                    "bytes follow the END frame",
                    offset=body + END_BODY.size,
                    field="END",
                )
            yield Event(KIND_END, pos, end=EndInfo(n, d, c))
            return
        else:
            raise FormatError(
                TOKS_FRAME, f"unknown frame kind {kind}", offset=pos, field="frame.kind"
            )


def _read_body(fp: Readable, n: int, what: str, offset: int) -> Any:
    data = fp.read(n)
    if len(data) < n:
        try:
            data = bytes(data) + read_exact(fp, n - len(data), what, offset=offset + len(data))
        except FormatError as err:
            raise FormatError(
                TOKS_NO_END,
                f"stream ends inside a {what} (offset {offset}, {n} bytes declared)",
                offset=err.offset,
                field=what,
            ) from None
    return data


def _check_zero(pad: Any, offset: int) -> None:
    if any(bytes(pad)):
        raise FormatError(
            TOKS_RESERVED, "frame padding bytes are not zero", offset=offset, field="frame.padding"
        )


def read_end(buf: Any, size: int) -> EndInfo | None:
    """The END trailer read from the last 32 bytes of a complete stream, without a scan."""
    if size < HEADER_SIZE + END_SIZE:
        return None
    kind, reserved, count = FRAME.unpack_from(buf, size - END_SIZE)
    if kind != KIND_END or reserved != b"\0\0\0" or count != 0:
        return None
    n, d, c, _ = END_BODY.unpack_from(buf, size - END_BODY.size)
    return EndInfo(n, d, c)


# Text ids: whitespace-separated decimal integers, for hand use and shell pipelines.
_BAD_TEXT = re.compile(rb"[^0-9 \t\r\n\f\v]")
_TOO_LONG = re.compile(rb"[0-9]{11,}")
TEXT_CHUNK = 1 << 22


def iter_text_ids(fp: Readable, first: bytes = b"") -> Iterator[np.ndarray]:
    """Parse whitespace-separated decimal ids in chunks (bounded memory); int64 arrays."""
    import numpy as np

    carry = first
    consumed = 0  # bytes of input before `carry`
    while True:
        chunk = fp.read(TEXT_CHUNK)
        data = carry + bytes(chunk)
        if not data:
            return
        if chunk:
            # Keep a trailing partial number for the next round.
            cut = len(data)
            while cut > 0 and data[cut - 1 : cut].isdigit():
                cut -= 1
            body, carry = data[:cut], data[cut:]
        else:
            body, carry = data, b""
        bad = _BAD_TEXT.search(body)
        if bad:
            raise FormatError(
                TEXT_IDS,
                f"unexpected byte {body[bad.start() : bad.start() + 1]!r} in text token ids",
                offset=consumed + bad.start(),
                field="ids",
            )
        long = _TOO_LONG.search(body)
        if long:
            raise FormatError(
                TEXT_IDS,
                "token id does not fit uint32",
                offset=consumed + long.start(),
                field="ids",
            )
        parts = body.split()
        if parts:
            ids = np.array(parts).astype(np.int64)
            if int(ids.max()) >= 1 << 32:
                at = int(np.argmax(ids >= 1 << 32))
                raise FormatError(
                    TEXT_IDS,
                    f"token id {int(ids[at])} does not fit uint32",
                    field="ids",
                    offset=consumed + body.find(parts[at]),
                )
            yield ids
        consumed += len(body)
        if not chunk:
            return
