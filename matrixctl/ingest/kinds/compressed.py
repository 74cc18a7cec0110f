"""Opening one input of `ingest docs` as a stream of document bytes (docs/inputs.md).

- A file (or stdin, `-`) is read through `HashingReader`: the SHA-256 and size in the manifest
  are over the bytes as stored.
- Compression is recognised by magic bytes, never by name: gzip (`1f 8b`, every member of a
  multi-member file), zstd (`28 b5 2f fd`, every frame, with or without a content size, and
  skippable frames `5X 2a 4d 18` anywhere, first included: `pzstd` writes one before each
  frame), xz (`fd 37 7a 58 5a 00`, every stream) and bzip2 (`BZh`, every stream). Zero bytes
  between or after members/frames are padding, skipped wherever the reads end. The stream is
  decompressed piece by piece: at most `OUT_PIECE` bytes of output are held at a time, so a
  decompression bomb costs time, never memory. A stream that ends inside a member or frame is
  `INGEST_COMPRESSED` naming the offset into the stored file; so is damaged data.
- gzip uses python-isal when it is installed (the `fast-gzip` extra; fastest here, see
  docs/benchmarks.md), else zlib-ng (a dependency of matrixctl).
- `Prefixed` gives back the bytes read while sniffing, so streams that cannot seek (stdin,
  decompressed data) are sniffed like files.
"""

from __future__ import annotations

import io
from typing import Any, BinaryIO, Protocol

from matrixctl import codes
from matrixctl.errors import FormatError

INGEST_COMPRESSED = codes.define(
    "INGEST_COMPRESSED",
    "A compressed input (gzip, zstd, xz, bzip2) is truncated or damaged; the offset is into "
    "the file as stored.",
    group="ingest",
)

IN_PIECE = 1 << 16  # stored bytes read at a time
OUT_PIECE = 1 << 20  # most decompressed bytes produced by one step
ZSTD_IN = 1 << 11  # zstd has no output cap: 2 KiB of input yields at most 64 MiB

SUFFIXES = (".gz", ".gzip", ".zst", ".zstd", ".xz", ".bz2")  # names stripped of them
MAGICS = (
    (b"\x1f\x8b", "gzip"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"BZh", "bz2"),
)


def _skippable(head: bytes) -> bool:
    """A zstd skippable frame's magic: `50 2a 4d 18` to `5f 2a 4d 18`."""
    return len(head) >= 4 and 0x50 <= head[0] <= 0x5F and head[1:4] == b"\x2a\x4d\x18"


def cut_magic(head: bytes, name: str) -> str | None:
    """The codec whose magic a whole file shorter than it begins (a file named `x.zst`
    holding `28 b5 2f`): a compressed file cut inside its magic, not a text."""
    suffix = name.lower().rsplit(".", 1)[-1] if "." in name else ""
    codec = {"gz": "gzip", "gzip": "gzip", "zst": "zstd", "zstd": "zstd", "xz": "xz"}.get(suffix)
    if codec is None or not head:
        return None
    magic = next(m for m, c in MAGICS if c == codec)
    return codec if len(head) < len(magic) and magic.startswith(head) else None


_UNIT = {"gzip": "member", "zstd": "frame", "xz": "stream", "bz2": "stream"}


def sniff_compression(head: bytes) -> str | None:
    if _skippable(head):
        return "zstd"
    for magic, name in MAGICS:
        if head.startswith(magic):
            if name == "bz2" and (len(head) < 4 or not 0x31 <= head[3] <= 0x39):
                continue  # "BZh" then the block size digit 1-9
            return name
    return None


class Readable(Protocol):
    def read(self, n: int = -1) -> bytes: ...


class _Capped:
    """zlib/isal (gzip), lzma and bz2 decompressors: output capped per call."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "gzip":
            try:
                from isal import isal_zlib as zmod
            except ImportError:
                from zlib_ng import zlib_ng as zmod  # type: ignore[no-redef]
            self.obj: Any = zmod.decompressobj(31)
        elif kind == "xz":
            import lzma

            self.obj = lzma.LZMADecompressor()
        else:
            import bz2

            self.obj = bz2.BZ2Decompressor()
        self.tail = b""

    @property
    def eof(self) -> bool:
        return bool(self.obj.eof)

    def step(self, data: bytes, cap: int) -> bytes:
        if self.kind == "gzip":
            out: bytes = self.obj.decompress(self.tail + data if self.tail else data, cap)
            self.tail = self.obj.unconsumed_tail
            return out
        return bytes(self.obj.decompress(data, cap))

    def pending(self) -> bool:
        if self.kind == "gzip":
            return bool(self.tail)
        return not self.obj.needs_input and not self.obj.eof

    def unused(self) -> bytes:
        return bytes(self.obj.unused_data)


class _Zstd:
    """zstd: no output cap in the binding, so input goes in small pieces (ZSTD_IN)."""

    def __init__(self) -> None:
        import zstandard

        self.obj = zstandard.ZstdDecompressor().decompressobj(write_size=OUT_PIECE)
        self.tail = b""
        self.eof = False

    def step(self, data: bytes, cap: int) -> bytes:
        buf = self.tail + data if self.tail else data
        take, self.tail = buf[:ZSTD_IN], buf[ZSTD_IN:]
        out = self.obj.decompress(take)
        if self.obj.eof:
            self.eof = True
            self.tail = bytes(self.obj.unused_data) + self.tail
        return bytes(out)

    def pending(self) -> bool:
        return bool(self.tail) and not self.eof

    def unused(self) -> bytes:
        return self.tail


def _new(kind: str) -> _Zstd | _Capped:
    return _Zstd() if kind == "zstd" else _Capped(kind)


class Decompressor(io.RawIOBase):
    """The decompressed bytes of a compressed stream, every member/frame in turn."""

    def __init__(self, raw: Readable, kind: str, name: str) -> None:
        self.raw = raw
        self.kind = kind
        self.name = name
        self.stored = 0  # stored bytes handed to the decompressor
        self.produced = 0  # decompressed bytes handed out
        self.obj = _new(kind)
        self.started = False  # the current member has received input
        self.done = False
        self.buf = b""  # stored bytes of the next member, after one ends
        self.out = b""  # decompressed bytes not yet handed out, from `pos`
        self.pos = 0

    def readable(self) -> bool:
        return True

    def _error(self, message: str, offset: int | None = None) -> FormatError:
        return FormatError(
            INGEST_COMPRESSED,
            f"{self.kind} stream {message}",
            path=self.name,
            offset=self.stored if offset is None else offset,
            hint="offset into the file as stored",
        )

    def _next_member(self, rest: bytes) -> bytes:
        """After a member/frame ends: the next one, or the end. Zero bytes before it are
        padding, skipped whatever the reads (decision: docs/inputs.md, "Compressed inputs");
        anything else is an error at its offset, naming another codec's magic."""
        rest = rest.lstrip(b"\0")
        while len(rest) < 8:
            more = self.raw.read(IN_PIECE)
            if not more:
                break
            self.stored += len(more)
            rest = (rest + more).lstrip(b"\0") if not rest else rest + more
        if not rest:
            self.done = True
            return b""
        found = sniff_compression(rest[:8])
        if found != self.kind:
            what = f"a {found} stream" if found else "data"
            raise self._error(
                f"is followed by {what}, not another {_UNIT[self.kind]}",
                self.stored - len(rest),
            )
        self.obj = _new(self.kind)
        self.started = True
        return rest

    def _produce(self) -> bytes:
        while not self.done:
            if self.obj.eof:
                rest = self.obj.unused()
                self.buf = self._next_member(rest)
                if self.done:
                    return b""
                out = self._step(self.buf)
                if out:
                    return out
                continue
            if self.obj.pending():
                out = self._step(b"")
                if out:
                    return out
                continue
            data = self.raw.read(IN_PIECE)
            if not data:
                if self.started and not self.obj.eof:
                    raise self._error("ends before its end marker (truncated)")
                self.done = True
                return b""
            self.stored += len(data)
            self.started = True
            out = self._step(data)
            if out:
                return out
        return b""

    def _step(self, data: bytes) -> bytes:
        try:
            return self.obj.step(data, OUT_PIECE)
        except (OSError, EOFError, ValueError, MemoryError) as exc:
            raise self._error(f"is damaged ({exc})") from None
        except Exception as exc:  # zlib.error, zstandard.ZstdError, lzma.LZMAError
            raise self._error(f"is damaged ({exc})") from None

    def readinto(self, b: Any) -> int:
        if self.pos >= len(self.out):
            self.out = self._produce()
            self.pos = 0
            if not self.out:
                return 0
        n = min(len(b), len(self.out) - self.pos)
        b[:n] = memoryview(self.out)[self.pos : self.pos + n]
        self.pos += n
        self.produced += n
        return n


class Prefixed:
    """A reader that first gives back `prefix` (bytes already read while sniffing)."""

    def __init__(self, prefix: bytes, fp: Any) -> None:
        self.prefix = prefix
        self.fp = fp

    def read(self, n: int = -1) -> bytes:
        if self.prefix:
            if n < 0:
                out = self.prefix + self.fp.read()
                self.prefix = b""
                return bytes(out)
            out, self.prefix = self.prefix[:n], self.prefix[n:]
            if len(out) < n:
                out += bytes(self.fp.read(n - len(out)))
            return out
        return bytes(self.fp.read(n))

    def readline(self, limit: int = -1) -> bytes:
        if self.prefix:
            cut = self.prefix.find(b"\n")
            if cut >= 0 and (limit < 0 or cut < limit):
                out, self.prefix = self.prefix[: cut + 1], self.prefix[cut + 1 :]
                return out
            if limit >= 0 and len(self.prefix) >= limit:
                out, self.prefix = self.prefix[:limit], self.prefix[limit:]
                return out
            head, self.prefix = self.prefix, b""
            rest = self.fp.readline(-1 if limit < 0 else limit - len(head))
            return head + bytes(rest)
        return bytes(self.fp.readline(limit))


def decompressing(raw: Readable, kind: str, name: str) -> tuple[BinaryIO, Decompressor]:
    """A buffered reader of the decompressed bytes, and the decompressor (for its counts)."""
    dec = Decompressor(raw, kind, name)
    return io.BufferedReader(dec, OUT_PIECE), dec


def read_head(fp: Any, n: int) -> bytes:
    """Up to n bytes, reading again after short reads (pipes and decompressors return less)."""
    parts: list[bytes] = []
    got = 0
    while got < n:
        data = fp.read(n - got)
        if not data:
            break
        parts.append(bytes(data))
        got += len(data)
    return b"".join(parts)
