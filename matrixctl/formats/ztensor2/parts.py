"""zTensor 2: a part's bytes: digests (`Digester`), the zstd seekable encoding (`seek_table`,
`iter_seekable`, `decode_seekable_into`) and streaming a part with its checks (`stream_part`)."""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.formats.ztensor2.layout import (
    _DIGEST_RE,
    SEEK_MAGIC,
    SEEK_SKIPPABLE,
    ZSTD_FRAME_MAX,
    ZSTD_SEEKABLE,
    ZT2_DECODED_LENGTH,
    ZT2_DIGEST,
    ZT2_NOT_READ,
    ZT2_VALUES,
    ZT2_ZSTD,
    Part,
)
from matrixctl.tensors import (
    CHUNK_BYTES,
    mapped_chunks,
    read_pieces,
)

# Digests ------------------------------------------------------------------------------------


def parse_digest(text: str) -> tuple[str, str] | None:
    """(algorithm, hex) for a registered algorithm; None for another; ValueError when a
    registered algorithm's value is malformed."""
    algo, sep, value = text.partition(":")
    pattern = _DIGEST_RE.get(algo)
    if pattern is None:
        if not sep or not algo:
            raise ValueError("a digest is ALGORITHM:HEX")
        return None
    if not pattern.fullmatch(value):
        n = 16 if algo == "xxh3" else 64
        raise ValueError(f"{algo} digests are {algo}: followed by {n} lowercase hex digits")
    return algo, value


class Digester:
    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        if algorithm == "xxh3":
            import xxhash

            self._h: Any = xxhash.xxh3_64()
        else:
            import hashlib  # only for sha256 digests: it loads OpenSSL

            self._h = hashlib.sha256()

    def update(self, data: Any) -> None:
        self._h.update(data)

    def text(self) -> str:
        return f"{self.algorithm}:{self._h.hexdigest()}"


# Zstd seekable ------------------------------------------------------------------------------


def seek_table(blob: Any) -> list[tuple[int, int, int]]:
    """[(stored offset in the blob, stored size, decoded size)] of a zstd seekable stream,
    after the profile's checks on the table (ValueError otherwise)."""
    view = memoryview(blob).cast("B")
    n = len(view)
    if n < 9 + 8:
        raise ValueError(f"{n} bytes cannot hold a seek table")
    nframes = int.from_bytes(view[n - 9 : n - 5], "little")
    desc = view[n - 5]
    magic = int.from_bytes(view[n - 4 :], "little")
    if magic != SEEK_MAGIC:
        raise ValueError(f"no seek table: the last 4 bytes are 0x{magic:08x}, not 0x8f92eab1")
    if desc & 0x7C:
        raise ValueError(f"seek table descriptor 0x{desc:02x} has reserved bits set")
    entry = 12 if desc & 0x80 else 8
    table = nframes * entry + 9
    if table + 8 > n:
        raise ValueError(f"a seek table of {nframes:,} frames does not fit in {n:,} bytes")
    start = n - table - 8
    head = int.from_bytes(view[start : start + 4], "little")
    size = int.from_bytes(view[start + 4 : start + 8], "little")
    if head != SEEK_SKIPPABLE or size != table:
        raise ValueError("the seek table is not a skippable frame of its declared size")
    frames = []
    pos = 0
    for i in range(nframes):
        at = start + 8 + i * entry
        c = int.from_bytes(view[at : at + 4], "little")
        d = int.from_bytes(view[at + 4 : at + 8], "little")
        frames.append((pos, c, d))
        pos += c
    if pos != start:
        raise ValueError(
            f"frames add up to {pos:,} bytes, the stream holds {start:,} before the table"
        )
    for i, (_, c, d) in enumerate(frames):
        if d > ZSTD_FRAME_MAX:
            raise ValueError(f"frame {i} holds {d:,} bytes, above the 16 MiB limit")
        if i < len(frames) - 1 and d != frames[0][2]:
            raise ValueError(
                f"frame {i} holds {d:,} bytes, frame 0 {frames[0][2]:,}: all but the last must be "
                "equal"
            )
        if c < 6:
            raise ValueError(f"frame {i} is {c} bytes, too short for a zstd frame")
    return frames


def _check_frame(view: Any, i: int) -> None:
    if int.from_bytes(view[:4], "little") != 0xFD2FB528:
        raise ValueError(f"frame {i} does not start with the zstd magic")
    if not view[4] & 0x04:
        raise ValueError(f"frame {i} has no content checksum")
    from matrixctl.formats.ztensor import zstd_frames

    declared = zstd_frames(view)  # a complete frame, nothing after it
    del declared


def iter_seekable(
    blob: Any, decoded_length: int, where: str, offset: int, field_name: str
) -> Iterator[bytes]:
    """The decoded frames of a zt.zstd-seekable/1 part, each checked (checksum, size)."""
    import zstandard

    def fail(code: str, msg: str) -> FormatError:
        return FormatError(code, f"{where}: {msg}", offset=offset, field=field_name)

    try:
        frames = seek_table(blob)
    except ValueError as exc:
        raise fail(ZT2_ZSTD, str(exc)) from None
    total = sum(d for _, _, d in frames)
    if total != decoded_length:
        raise fail(
            ZT2_DECODED_LENGTH,
            f"frames decode to {total:,} bytes, decoded_length is {decoded_length:,}",
        )
    view = memoryview(blob).cast("B")
    local = threading.local()

    def decode(i: int) -> bytes:
        pos, c, d = frames[i]
        frame = view[pos : pos + c]
        dctx = getattr(local, "dctx", None)
        if dctx is None:
            dctx = local.dctx = zstandard.ZstdDecompressor()
        try:
            _check_frame(frame, i)
            out: bytes = dctx.decompress(frame, max_output_size=max(d, 1))
        except (ValueError, zstandard.ZstdError) as exc:
            raise fail(ZT2_ZSTD, f"frame {i}: {exc}") from None
        if len(out) != d:
            raise fail(
                ZT2_DECODED_LENGTH,
                f"frame {i} decodes to {len(out):,} bytes, the seek table says {d:,}",
            )
        return out

    if len(frames) < 2:
        for i in range(len(frames)):
            yield decode(i)
        return
    # Frames are independent: decode a few ahead on helper threads (zstd releases the GIL),
    # in order, with at most DECODE_AHEAD frames (<= 16 MiB each) held at once.
    pool = _decoder_pool()
    pending: collections.deque[Any] = collections.deque()
    nxt = 0
    try:
        while nxt < len(frames) or pending:
            while nxt < len(frames) and len(pending) < DECODE_AHEAD:
                pending.append(pool.submit(decode, nxt))
                nxt += 1
            yield pending.popleft().result()
    finally:
        for fut in pending:
            fut.cancel()
        for fut in pending:
            with contextlib.suppress(BaseException):
                fut.result()


def decode_seekable_into(blob: Any, out: Any, where: str, offset: int, field_name: str) -> None:
    """Decode a zt.zstd-seekable/1 part straight into `out` (a writable uint8 array of exactly
    decoded_length bytes): the same checks as `iter_seekable` (table, magic, content checksum,
    one complete frame each, sizes), with no intermediate bytes and no copy. Frames decode on
    the helper threads, each into its own slice of `out`."""
    import zstandard

    def fail(code: str, msg: str) -> FormatError:
        return FormatError(code, f"{where}: {msg}", offset=offset, field=field_name)

    try:
        frames = seek_table(blob)
    except ValueError as exc:
        raise fail(ZT2_ZSTD, str(exc)) from None
    total = sum(d for _, _, d in frames)
    if total != len(out):
        raise fail(
            ZT2_DECODED_LENGTH, f"frames decode to {total:,} bytes, decoded_length is {len(out):,}"
        )
    view = memoryview(blob).cast("B")
    target = memoryview(out).cast("B")
    starts = []
    at = 0
    for _, _, d in frames:
        starts.append(at)
        at += d
    local = threading.local()

    def decode(i: int) -> None:
        pos, c, d = frames[i]
        frame = view[pos : pos + c]
        dctx = getattr(local, "dctx", None)
        if dctx is None:
            dctx = local.dctx = zstandard.ZstdDecompressor()
        dest = target[starts[i] : starts[i] + d]
        got = 0
        try:
            _check_frame(frame, i)
            with dctx.stream_reader(frame, read_across_frames=False, closefd=False) as reader:
                while got < d:
                    n = reader.readinto(dest[got:])
                    if not n:
                        break
                    got += n
                more = len(reader.read(1)) if got == d else 0  # the checksum is read here
        except (ValueError, zstandard.ZstdError) as exc:
            raise fail(ZT2_ZSTD, f"frame {i}: {exc}") from None
        if got != d or more:
            what = f"{got:,}" if got != d else f"more than {d:,}"
            raise fail(
                ZT2_DECODED_LENGTH, f"frame {i} decodes to {what} bytes, the seek table says {d:,}"
            )

    if len(frames) < 2:
        for i in range(len(frames)):
            decode(i)
        return
    pool = _decoder_pool()
    futures = [pool.submit(decode, i) for i in range(len(frames))]
    try:
        for fut in futures:
            fut.result()  # the first failure in frame order
    finally:
        for fut in futures:
            fut.cancel()
        for fut in futures:
            with contextlib.suppress(BaseException):
                fut.result()


DECODE_AHEAD = 4
_POOL: Any = None


def _decoder_pool() -> Any:
    global _POOL
    if _POOL is None:
        import concurrent.futures
        import os

        workers = max(1, min(4, os.cpu_count() or 1))
        _POOL = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="zt2-zstd")
    return _POOL


# Streaming parts ----------------------------------------------------------------------------


def check_values(part: Part, piece: Any, count: int | None = None) -> str | None:
    """Why `piece` (decoded bytes of `part`) breaks its logical type's data rule."""
    import numpy as np

    arr = np.frombuffer(piece, dtype=np.uint8)
    if part.type == "bool" and arr.size and int(arr.max()) > 1:
        bad = int(np.flatnonzero(arr > 1)[0])
        return f"bool byte 0x{int(arr[bad]):02x} at element {bad}"
    if part.type == "f4_e2m1" and count is not None and count % 2 and arr.size and arr[-1] >> 4:
        return "the final odd nibble of f4_e2m1 data is not zero"
    return None


def _known_digest(part: Part) -> str | None:
    """The algorithm of the part's digest when this reader computes it."""
    if part.digest:
        with contextlib.suppress(ValueError):
            known = parse_digest(part.digest)
            if known is not None:
                return known[0]
    return None


def stream_part(
    buf: Any,
    part: Part,
    *,
    verify_digest: bool = True,
    chunk: int = CHUNK_BYTES,
) -> Iterator[Any]:
    """Decoded bytes of a local part whose bounds were checked (zero-copy slices for raw
    data). The digest is checked before the last piece is handed out, so a consumer never
    finishes with damaged bytes; bool data is checked as it goes."""
    where = f"{part.obj}/{part.role}"
    digester: Digester | None = None
    known = _known_digest(part) if verify_digest else None
    if known is not None:
        digester = Digester(known)
    if part.encoding is None:
        pieces: Iterator[Any] = mapped_chunks(buf, part.offset, part.length, chunk)
        if digester is not None:  # hashing first keeps the pieces zero-copy
            for piece in read_pieces(buf, part.offset, part.length, chunk):
                digester.update(piece)
            _check_digest(part, digester)
            digester = None
    elif part.encoding == ZSTD_SEEKABLE:
        stored = memoryview(buf)[part.offset : part.end]
        pieces = iter_seekable(stored, part.decoded_length or 0, where, part.offset, part.field)
    else:
        raise FormatError(
            ZT2_NOT_READ,
            f"{where}: encoding {part.encoding!r} is not one this reader decodes",
            offset=part.offset,
            field=f"{part.field}/encoding",
        )
    held: Any = None
    for piece in pieces:
        if part.type == "bool":
            why = check_values(part, piece)
            if why:
                raise FormatError(
                    ZT2_VALUES, f"{where}: {why}", offset=part.offset, field=part.field
                )
        if digester is not None:
            digester.update(piece)
        if held is not None:
            yield held
        held = piece
    if digester is not None:
        _check_digest(part, digester)
    if held is not None:
        yield held


def _check_digest(part: Part, digester: Digester) -> None:
    got = digester.text()
    if part.digest != got:
        raise FormatError(
            ZT2_DIGEST,
            f"{part.obj}/{part.role}: digest is {part.digest}, the decoded bytes give {got}",
            offset=part.offset,
            field=f"{part.field}/digest",
        )
