"""The one tokenizing step of `ingest docs`: a work unit's documents to ids and index records.

`process_file` runs one source file, `process_piece` one piece of a file (`ingest/units.py`),
wherever the executor runs them. Each opens its input through the kinds registry
(`kinds.open_input`), reads documents through its kind, encodes them with the build's
tokenizer (`ingest/tokenizer.py`, the `IngestTokenizer` interface) and hands the ids to a
`TokenSink`. The sink is the executor's: where tokens go past what a unit keeps in memory,
and where they go at the end (shared memory, a file to stage, a fresh array). The step itself
tests no executor's mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl.errors import FormatError, MatrixError, UsageError, from_os_error
from matrixctl.ingest import kinds
from matrixctl.ingest.kinds import base, compressed
from matrixctl.ingest.kinds.base import Kind
from matrixctl.ingest.kinds.jsonl import TextBuffer
from matrixctl.ingest.sources import SourceFile
from matrixctl.ingest.tokenizer import IngestTokenizer
from matrixctl.ingest.units import (
    Piece,
    RangeReader,
    check_identity,
    lines_before,
    open_raw,
    read_range,
)

if TYPE_CHECKING:
    import numpy as np

MEM_TOKENS = 4 << 20  # a unit's tokens held in memory (~1.3 Mi tokens of 4 MiB of text)...
MEM_DOCS = 1 << 16  # ...and its index records


@dataclass
class FileResult:
    """What the step made of one source file or piece. Its tokens are in exactly one place:
    `ids` (an array in memory), `raw_ids` (a file in the pack's dtype, with `raw_count`,
    `raw_max`, `raw_crc`), or where the executor moved them (`slot_offset`/`shared`: a slot of
    shared memory; `staged_ids`: an extent of a staged file)."""

    source: SourceFile
    kind: str
    sha256: str = ""
    size: int = 0
    skip_reason: str | None = None
    skip_code: str | None = None  # the error's code when --on-error skip left the file out
    compression: str | None = None  # gzip, zstd, xz, bz2 (by magic)
    decompressed: int | None = None  # bytes after decompression
    piece: Piece | None = None  # the work unit inside one file this result is of (no data)
    documents: int = 0
    empty_documents: int = 0
    skipped_records: int = 0
    tokens: int = 0
    ids: Any = None  # np.ndarray in the pack's dtype, or None
    records: list[tuple[int, int]] = field(default_factory=list)  # (length, item) in memory
    spill_records: str | None = None
    raw_ids: str | None = None
    raw_count: int = 0
    raw_max: int = -1
    raw_crc: int = 0
    lines: int = 0  # JSON Lines: the lines read (a piece whose lines the worker counts)
    item_base: int = 0  # added to the records' items by the writer (set there)
    slot_offset: int = -1
    shared: Any = None
    # (path, offset, bytes, dtype, largest id, CRC-32 of the bytes): --executor dask
    staged_ids: tuple[str, int, int, str, int, int] | None = None


class TokenSink:
    """Where a unit's tokens go (the executor's choice; this base: the plain way). Up to
    MEM_TOKENS stay in memory; past that, `overflow` may take them (True), else they go to a
    file in the pack's dtype (`claim` may provide the file). At the end, tokens still in
    memory are `gather`ed by the sink (an array it owns) or joined into a fresh array; with
    `files_only` they go to the file too, so that every unit's tokens are in a file."""

    files_only = False

    def overflow(self, parts: list[np.ndarray]) -> bool:
        return False

    def claim(self, path: str) -> bool:
        """Put a file of the sink's at `path` to be overwritten; False: make a new one."""
        return False

    def gather(self, parts: list[np.ndarray], dtype: str) -> np.ndarray | None:
        return None


@dataclass
class Step:
    """Everything the step needs besides the unit: the tokenizer, the options, where spill
    files go, and the executor's sink."""

    tok: IngestTokenizer | None  # None until the executor has it (Dask workers build their own)
    eos_id: int | None
    opts: base.Options
    spill_dir: str
    out_dtype: str = "<u4"  # the pack's dtype
    on_error: str = "fail"  # fail | skip: what a per-file failure does
    strict: bool = False  # a file that is not a document is an error
    on_bytes: Callable[[int], None] | None = None  # progress within a file (--jobs 1)
    sink: TokenSink = field(default_factory=TokenSink)
    ahead: bool = False  # Parquet: decode on a helper thread meanwhile (--jobs 1)


class UnitTokens:
    """A unit's tokens and records, in memory until they grow, then in files (see TokenSink)."""

    def __init__(self, spill_dir: str, name: int | str, out_dtype: str, sink: TokenSink) -> None:
        self.sink = sink
        self.spill_dir = spill_dir
        self.out_dtype = out_dtype
        self.name = name
        self.parts: list[np.ndarray] = []
        self.n = 0
        self.records: list[tuple[int, int]] = []
        self.recs_path: str | None = None
        self.raw_path: str | None = None
        self.raw_count = 0
        self.raw_max = -1
        self.raw_crc = 0
        self.raw_bytes = 0

    def add(self, ids: np.ndarray) -> None:
        if ids.size:
            self.parts.append(ids)
            self.n += ids.size
            if self.n >= MEM_TOKENS:
                if self.sink.overflow(self.parts):
                    self.parts, self.n = [], 0
                else:
                    self._spill_raw()

    def _spill_raw(self) -> None:
        from matrixctl.crc import crc32

        if self.raw_path is None:
            self.raw_path = os.path.join(self.spill_dir, f"{self.name}.raw")
            if not self.sink.claim(self.raw_path):
                open(self.raw_path, "wb").close()
        # Part by part, not joined first: a joined block is a fresh allocation of up to
        # MEM_TOKENS ids each time (pages faulted in and zeroed), the parts are there already.
        with open(self.raw_path, "r+b") as fp:
            fp.seek(self.raw_bytes)
            for part in self.parts:
                block = part.astype(self.out_dtype, copy=False)
                self.raw_max = max(self.raw_max, int(block.max()))
                data = block.data.cast("B")
                self.raw_crc = crc32(data, self.raw_crc)
                fp.write(data)
                self.raw_count += block.size
                self.raw_bytes += data.nbytes
        self.parts, self.n = [], 0

    def record(self, length: int, item: int) -> None:
        self.records.append((length, item))
        if len(self.records) >= MEM_DOCS:
            self._spill_records()

    def _spill_records(self) -> None:
        import numpy as np

        if self.recs_path is None:
            self.recs_path = os.path.join(self.spill_dir, f"{self.name}.recs")
        with open(self.recs_path, "ab") as fp:
            fp.write(np.array(self.records, dtype="<u8").tobytes())
        self.records = []

    def close(self, result: FileResult) -> None:
        import numpy as np

        if self.sink.files_only or self.raw_path is not None:
            if self.parts:
                self._spill_raw()
            if self.raw_path is not None:
                os.truncate(self.raw_path, self.raw_bytes)  # a claimed file's bytes past ours
            result.raw_ids = self.raw_path
            result.raw_count, result.raw_max, result.raw_crc = (
                self.raw_count,
                self.raw_max,
                self.raw_crc,
            )
        elif self.parts:
            ids = self.sink.gather(self.parts, self.out_dtype)
            if ids is None:
                ids = self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)
                ids = ids.astype(self.out_dtype, copy=False)
            result.ids = ids
        if self.recs_path is not None:
            if self.records:
                self._spill_records()
            result.spill_records = self.recs_path
        else:
            result.records = self.records

    def discard(self) -> None:
        """Remove the files of a unit that is left out or failed."""
        for path in (self.recs_path, self.raw_path):
            if path:
                with contextlib.suppress(OSError):
                    os.unlink(path)


# One source file ----------------------------------------------------------------------------


def process_file(sf: SourceFile, step: Step) -> FileResult:
    """One source file under the error policy: with `--on-error skip` any per-file failure
    (unreadable, binary when named, encoding, parse, size) leaves the file out, named in the
    manifest's `skipped` with the error's code and message; with `fail` it stops the ingest."""
    try:
        return _process_file(sf, step)
    except MatrixError as err:
        if step.on_error != "skip" or isinstance(err, UsageError):
            raise
        result = FileResult(sf, "")
        result.skip_code = err.code
        where = f" at byte {err.offset}" if err.offset is not None else ""
        result.skip_reason = f"{err.code}: {err.message}{where}"
        return result


def _process_file(sf: SourceFile, step: Step) -> FileResult:
    try:
        opened = open_raw(sf)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    with opened as raw:
        reader = base.HashingReader(raw, step.on_bytes)
        inp = None
        try:
            name = "" if sf.path == "-" else sf.path
            inp = kinds.open_input(reader, name, sf.recorded, step.opts)
            result = FileResult(sf, inp.kind)
            result.compression = inp.compression
            if inp.kind == "binary":
                if sf.named or step.strict:
                    raise FormatError(
                        base.INGEST_BINARY,
                        "is binary (a NUL byte in its first 8 KiB"
                        + (f" after {inp.compression} decompression" if inp.compression else "")
                        + "), not a document",
                        path=sf.recorded,
                        offset=inp.head.index(b"\0"),
                    )
                result.skip_reason = "binary"
                return result
            kind = kinds.get(inp.kind)
            if kind.by_path is not None and (inp.compression or sf.path == "-"):
                raise FormatError(
                    base.INGEST_COLUMNAR,
                    f"a {kind.name} input must be a file as stored (it is read by its footer), "
                    "not a compressed file or stdin",
                    path=sf.recorded,
                )
            _tokenize(sf, kind, inp.stream, step, result)
            while inp.stream.read(base.PIECE):  # the rest, so damage at the end is found
                pass
            reader.drain()
        except FormatError as err:
            compression = None if inp is None else inp.compression
            if (
                compression is not None
                and err.code != compressed.INGEST_COMPRESSED
                and err.offset is not None
            ):
                err.message += f" (offset into the {compression}-decompressed stream)"
            raise
        except base.SkipFile as skip:
            result = FileResult(sf, "")
            result.skip_reason = f"encoding: {skip.reason}"
            return result
        except OSError as exc:
            raise from_os_error(exc, sf.recorded) from None
        result.sha256 = "sha256:" + reader.sha.hexdigest()
        result.size = reader.size
        result.decompressed = None if inp.decompressor is None else inp.decompressor.produced
        return result


# The documents of a unit ----------------------------------------------------------------------


_TEXT_BUFFERS = threading.local()


def _text_buffer() -> TextBuffer:
    """This thread's buffer for the texts of JSON Lines pieces (`kinds.jsonl.texts`): a
    piece's texts are matched before `_tokenize` returns, so the next piece reuses it."""
    buffer: TextBuffer | None = getattr(_TEXT_BUFFERS, "buffer", None)
    if buffer is None:
        buffer = _TEXT_BUFFERS.buffer = TextBuffer()
    return buffer


def _read(
    sf: SourceFile,
    kind: Kind,
    stream: Any,
    step: Step,
    counters: base.Counters,
    piece: Piece | None,
) -> tuple[Iterator[base.Text] | None, Iterator[base.Doc]]:
    """The unit's documents from its kind: texts (one per document) or documents."""
    from matrixctl.ingest.kinds import jsonl

    opts = step.opts
    if piece is None:
        if kind.by_path is not None:
            return kind.by_path(
                kind.name, sf.path, sf.recorded, opts, counters, ahead=step.ahead
            ), iter(())
        if kind.texts is not None:
            return kind.texts(stream, sf.recorded, opts, counters), iter(())
        assert kind.documents is not None
        return None, kind.documents(stream, sf.recorded, opts, counters)
    if kind.cut == "row-groups":
        assert kind.by_path is not None
        texts = kind.by_path(
            kind.name,
            sf.path,
            sf.recorded,
            opts,
            counters,
            piece.groups,
            piece.first_line,
            ahead=step.ahead,
        )
        return texts, iter(())
    if kind.cut == "text":
        part = RangeReader(sf, piece.start, piece.length, piece.identity)
        return None, iter([(0, base.iter_decoded(part, sf.recorded, opts, piece.start))])
    data = (
        piece.data
        if not piece.length
        else read_range(sf, piece.start, piece.length, piece.identity)
    )
    texts = jsonl.texts(
        data,
        sf.recorded,
        opts,
        counters,
        max(0, piece.first_line),  # -1: counted here from 0, the writer adds the base
        piece.start,
        piece.data_size,
        _text_buffer(),
    )
    return texts, iter(())


def _tokenize(
    sf: SourceFile,
    kind: Kind,
    stream: Any,
    step: Step,
    result: FileResult,
    piece: Piece | None = None,
) -> None:
    """The documents of one unit, tokenized into `result` (its files removed on failure)."""
    import numpy as np

    tok = step.tok
    assert tok is not None
    acc = UnitTokens(
        step.spill_dir, sf.ordinal if piece is None else piece.id, step.out_dtype, step.sink
    )
    counters = base.Counters()
    eos_id = step.eos_id
    eos = None if eos_id is None else np.array([eos_id], dtype=tok.dtype)
    extra = 0 if eos_id is None else 1
    try:
        texts, docs = _read(sf, kind, stream, step, counters, piece)
        if texts is not None:
            take_batches(tok.encode_texts(texts, eos_id), acc, result, extra)
        if piece is not None and kind.cut == "text":
            # A piece of one document: its tokens only. The writer counts the document, adds
            # its end-of-document token and its index record after the last piece.
            for _, pieces in docs:
                for ids in tok.encode_document(pieces):
                    acc.add(ids)
                    result.tokens += ids.size
            docs = iter(())
        for item, pieces in docs:
            n = 0
            for ids in tok.encode_document(pieces):
                acc.add(ids)
                n += ids.size
            if n == 0:
                result.empty_documents += 1
                continue
            if eos is not None:
                acc.add(eos)
                n += 1
            acc.record(n, item)
            result.documents += 1
            result.tokens += n
    except BaseException:
        acc.discard()
        raise
    acc.close(result)
    result.skipped_records = counters.skipped_records
    result.lines = counters.lines


def take_batches(
    batches: Iterator[tuple[np.ndarray, list[tuple[int, int]]]],
    acc: UnitTokens,
    result: FileResult,
    extra: int,
) -> None:
    """`IngestTokenizer.encode_texts`' batches into `acc` and `result`: each batch's ids, a
    record per non-empty document (its ids plus `extra`, the EOS), empty ones counted."""
    for ids, batch in batches:
        acc.add(ids)
        for item, n in batch:
            if n == 0:
                result.empty_documents += 1
                continue
            acc.record(n + extra, item)
            result.documents += 1
            result.tokens += n + extra


# One piece of a file ---------------------------------------------------------------------------


def process_piece(piece: Piece, step: Step) -> FileResult:
    """Tokenize one piece; the result carries the piece without its bytes. A piece of a file
    as stored is read from the file the planner hashed, checked before and after (a Parquet
    piece is read by path; a byte range is also checked around its read): IO_CHANGED."""
    try:
        check_identity(piece)
        result = _process_piece(piece, step)
        check_identity(piece)
    except BaseException:
        if piece.digest is not None:
            piece.digest.cancel()
        raise
    if piece.digest is not None:  # the file's hash, finished meanwhile (`Cutting.defer_hash`)
        result.sha256 = piece.digest.result()
        check_identity(piece)  # ...of the file the pieces were read from
    return result


def _process_piece(piece: Piece, step: Step) -> FileResult:
    result = FileResult(piece.source, piece.kind)
    kind = kinds.get(piece.kind)
    try:
        try:
            _tokenize(piece.source, kind, None, step, result, piece)
        except FormatError:
            if piece.first_line >= 0:
                raise
            # The error names lines counted from the piece's start: count the lines before
            # it (an error is rare, so its cost is paid only here) and read it again for
            # the file's own line numbers.
            base_lines = lines_before(piece.source, piece.start)
            _tokenize(
                piece.source,
                kind,
                None,
                dataclasses.replace(step, sink=TokenSink()),  # only for the line numbers
                FileResult(piece.source, piece.kind),
                dataclasses.replace(piece, first_line=base_lines),
            )
            raise
    except FormatError as err:
        if piece.compression is not None and err.offset is not None:
            err.message += f" (offset into the {piece.compression}-decompressed stream)"
        raise
    except base.SkipFile as skip:  # pragma: no cover - pieces are cut under --on-error fail
        raise FormatError(base.INGEST_UTF8, skip.reason, path=piece.source.recorded) from None
    result.piece = piece.bare()
    if piece.last:
        result.sha256 = piece.file_sha256
        result.size = piece.file_size
        result.compression = piece.compression
        result.decompressed = piece.decompressed
    return result


def error_payload(err: MatrixError) -> tuple[Any, ...]:
    """A MatrixError as plain values, to cross from a worker process to the writer."""
    return (
        type(err).__name__,
        err.code,
        err.message,
        err.path,
        err.offset,
        err.field,
        err.hint,
    )


def reraise(payload: tuple[Any, ...]) -> None:
    """Raise again, in the writer's process, the error `error_payload` describes."""
    from matrixctl import errors

    cls_name, code, message, path, offset, fld, hint = payload
    cls = getattr(errors, cls_name, FormatError)
    if cls is UsageError:
        raise UsageError(message, code=code, hint=hint)
    if not issubclass(cls, MatrixError):
        cls = FormatError
    raise cls(code, message, path=path, offset=offset, field=fld, hint=hint)
