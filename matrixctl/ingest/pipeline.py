"""`ingest docs`: worker processes tokenize files; one ordered streaming writer builds the pack.

- The inputs are listed in a fixed order (sources.py); `--shard I/N` keeps a stable subset.
- With `--jobs 1` files are processed in this process. With N > 1, the matcher (trie) is
  built here and N worker processes are forked as soon as the symbol map is loaded: they share
  the matcher's pages (`Workers`). The files are then handed out in work units: runs of
  consecutive files of about the same number of bytes (`plan_units`), at most 2N + 2 units in
  flight, each worker's own pipe, and the writer consumes the results strictly in input order.
  The output bytes therefore do not depend on N, on how the files are grouped into units, or
  on which worker finishes first.
- A worker process leaves each unit's tokens, in the pack's dtype, in the unit's slot of
  shared memory and sends back only their count, largest id and CRC-32 (and the records); the
  writer writes them from the slot (docs/inputs.md, "What crosses between processes"). Pieces
  of a file as stored go to the workers as byte ranges, not bytes.
- A unit's tokens stay in memory up to 4 Mi tokens, then go to a file in the pack's dtype
  that the writer appends with `os.copy_file_range` (so do a worker's tokens that do not fit
  its slot); records spill past 64 Ki documents. Memory does not grow with the size of a file
  or of the corpus (a 5 GB text file streams through in 1 MiB pieces). `--executor dask` keeps the
  uint32 spill files its staging knows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl import codes, errors
from matrixctl.errors import FormatError, InputError, MatrixError, UsageError, from_os_error
from matrixctl.ingest import extract
from matrixctl.ingest.sources import SourceFile, enumerate_sources, parse_shard, shard_of
from matrixctl.tokenizers import pi

if TYPE_CHECKING:
    import numpy as np

INGEST_NO_INPUT = codes.define(
    "INGEST_NO_INPUT", "The sources hold no file to ingest (in this shard).", group="ingest"
)
INGEST_NO_DOCUMENTS = codes.define(
    "INGEST_NO_DOCUMENTS",
    "The inputs hold no document at all (every file empty, skipped or without the text "
    "field); an empty pack would look like a successful build.",
    group="ingest",
)
INGEST_CHANGED = codes.define(
    "INGEST_CHANGED",
    "An input file became shorter while it was ingested (a worker found fewer bytes than the "
    "file held when it was cut into pieces).",
    group="ingest",
)
INGEST_WORKER_LOST = codes.define(
    "INGEST_WORKER_LOST",
    "A worker process of `ingest docs --jobs N` ended without its result (killed, out of "
    "memory); no pack is written.",
    group="ingest",
)
MEM_TOKENS = 4 << 20  # a piece of 4 MiB of text (~1.3 Mi tokens) stays in memory
MEM_DOCS = 1 << 16
UNIT_MAX_BYTES = 4 << 20  # a work unit: consecutive files up to this many bytes...
UNIT_MIN_BYTES = 64 << 10
UNIT_MAX_FILES = 256  # ...and at most this many files
UNITS_PER_JOB = 32  # aim: this many units per worker, so the last ones end close together
PIECE_BYTES = 4 << 20  # a piece of one large JSON Lines file: whole lines, about this size
SPLIT_MIN = 2 * PIECE_BYTES  # files from this size on are cut into pieces (--jobs > 1)
SLOT_BYTES = 8 << 20  # shared memory per unit in flight, for its tokens (`Workers`)
WORKER_DEPTH = 2  # units queued at one worker
SHARED_COPY = 1 << 16  # fewer tokens in a slot than this are copied into one larger write

Tick = Callable[[int, int, int], None]  # files, bytes, tokens done so far


@dataclass
class FileResult:
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
    ids: Any = None  # np.ndarray of uint32 kept in memory, or None
    records: list[tuple[int, int]] = field(default_factory=list)  # (length, item) in memory
    spill_ids: str | None = None
    spill_records: str | None = None
    # Tokens in the pack's dtype in a file the writer appends file to file (`direct` mode):
    # its path, count, largest id and CRC-32.
    raw_ids: str | None = None
    raw_count: int = 0
    raw_max: int = -1
    raw_crc: int = 0
    lines: int = 0  # JSON Lines: the lines read (a piece whose lines the worker counts)
    item_base: int = 0  # added to the records' items by the writer (set there)
    # Tokens a worker process left in its unit's slot of shared memory (`Workers`): their
    # offset in bytes there, with raw_count, raw_max and raw_crc; `shared` is the writer's
    # view of them, valid until the next result is asked for.
    slot_offset: int = -1
    shared: Any = None
    # Tokens staged in the pack's dtype, copied as they are (--executor dask; dask_exec.py):
    # (path, offset, bytes, dtype, largest id, CRC-32 of the bytes).
    staged_ids: tuple[str, int, int, str, int, int] | None = None


@dataclass
class WorkerState:
    tok: pi.Tokenizer | None  # built in each worker when None (see _init_worker)
    eos_id: int | None
    opts: extract.Options
    spill_dir: str
    smap: pi.SymbolMap | None = None
    out_dtype: str = "<u4"  # the dtype in-memory tokens are returned in
    on_error: str = "fail"  # fail | skip: what a per-file failure does
    strict: bool = False  # a file that is not a document is an error
    on_bytes: Callable[[int], None] | None = None  # progress within a file (--jobs 1)
    # Worker processes write every unit's tokens to a file in the pack's dtype, so only the
    # counts travel back and the writer copies the bytes file to file (see _Acc).
    direct: bool = False
    # --jobs 1: tokens stay in memory, and past MEM_TOKENS go to such a file too (not to the
    # uint32 spill that is read back and converted).
    raw_spill: bool = False
    text_followers: bytes | None = None  # cache of text_cut_followers (b"": never cut)
    # --jobs 1: a JSON Lines file as stored is read once, its pieces handed over with their
    # bytes (`_read_pieces`), not cut first and read again range by range.
    read_once: bool = False
    # Worker processes: where a file's in-memory tokens are gathered (a slot of shared memory
    # the writer reads; see `Workers`), or None for a fresh array.
    gather: Callable[[list[np.ndarray], str], np.ndarray | None] | None = None
    # --jobs 1 under --on-error fail: the pack's writer, in this process; a unit's tokens past
    # MEM_TOKENS go straight into the atoms, after everything before them (see _Acc).
    sink: Callable[[list[np.ndarray]], None] | None = None
    # Dask workers: a folder of token files the client has merged already; a unit's tokens
    # overwrite one of them (see _Acc) instead of going into a new file.
    recycle: str | None = None


_STATE: WorkerState | None = None


class _Acc:
    """A file's tokens and records, in memory until they grow, then in spill files.

    `direct` (worker processes): the tokens always go to one file in the pack's dtype, with
    their count, largest id and CRC-32 kept as they are written; the writer appends that file
    to the atoms without reading it (`AtomWriter.append_file`).

    `sink` (`--jobs 1` under `--on-error fail`): past MEM_TOKENS the tokens go to the pack's
    writer at once instead of a spill file that it would copy again (a Parquet row group of
    64 MiB of text is about 21 Mi tokens). Sound because units are tokenized in input order
    in the writer's own process, so everything before this unit is in the atoms already, and
    because a failure then ends the build (the pack's temporary folder is removed): no unit's
    tokens have to be held back in case it is skipped. The unit's records and the tokens
    still in memory follow in its result, as without a sink.

    `recycle` (Dask workers, with `direct`): the tokens file is one taken from that folder
    (renamed away, so no other worker gets it), overwritten from its start and cut to size.
    Its pages are in the page cache already: writing into them cost 0.2 s of system time for
    660 MB on the benchmark machine, writing a new file 0.45-2.5 s (new pages, zeroed)."""

    def __init__(
        self,
        spill_dir: str,
        ordinal: int | str,
        out_dtype: str = "<u4",
        direct: bool = False,
        raw_spill: bool = False,
        gather: Callable[[list[np.ndarray], str], np.ndarray | None] | None = None,
        sink: Callable[[list[np.ndarray]], None] | None = None,
        recycle: str | None = None,
    ) -> None:
        self.gather = gather
        self.sink = sink
        self.recycle = recycle
        self.spill_dir = spill_dir
        self.out_dtype = out_dtype
        self.ordinal = ordinal
        self.parts: list[np.ndarray] = []
        self.n = 0
        self.records: list[tuple[int, int]] = []
        self.ids_path: str | None = None
        self.recs_path: str | None = None
        self.direct = direct
        self.raw_spill = raw_spill
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
                if self.sink is not None and not self.direct:
                    self.sink(self.parts)
                    self.parts, self.n = [], 0
                elif self.direct or self.raw_spill:
                    self._spill_raw()
                else:
                    self._spill_ids()

    def _spill_raw(self) -> None:
        from matrixctl.crc import crc32

        if self.raw_path is None:
            self.raw_path = os.path.join(self.spill_dir, f"{self.ordinal}.raw")
            if self.recycle is None or not _claim(self.recycle, self.raw_path):
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

    def _spill_ids(self) -> None:
        import numpy as np

        if self.ids_path is None:
            self.ids_path = os.path.join(self.spill_dir, f"{self.ordinal}.ids")
        with open(self.ids_path, "ab") as fp:
            fp.write(np.concatenate(self.parts).astype("<u4").tobytes())
        self.parts, self.n = [], 0

    def _spill_records(self) -> None:
        import numpy as np

        if self.recs_path is None:
            self.recs_path = os.path.join(self.spill_dir, f"{self.ordinal}.recs")
        with open(self.recs_path, "ab") as fp:
            fp.write(np.array(self.records, dtype="<u8").tobytes())
        self.records = []

    def close(self, result: FileResult) -> None:
        import numpy as np

        if self.direct or self.raw_path is not None:
            if self.parts:
                self._spill_raw()
            if self.recycle is not None and self.raw_path is not None:
                os.truncate(self.raw_path, self.raw_bytes)  # a recycled file's bytes past ours
            result.raw_ids = self.raw_path
            result.raw_count, result.raw_max, result.raw_crc = (
                self.raw_count,
                self.raw_max,
                self.raw_crc,
            )
        elif self.ids_path is not None:
            if self.parts:
                self._spill_ids()
            result.spill_ids = self.ids_path
        elif self.parts:
            ids = None if self.gather is None else self.gather(self.parts, self.out_dtype)
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


def _claim(folder: str, dest: str) -> bool:
    """Move one file of `folder` to `dest` (a rename: of workers racing for the same file,
    one gets it); False when there is none to take. Only a regular file with no other link
    is written into: a symbolic link or a hard link put there (the staging folder may be on
    a shared file system) would have the tokens written over some other file."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue
        try:
            os.replace(entry.path, dest)
            st = os.lstat(dest)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            return True
        with contextlib.suppress(OSError):
            os.unlink(dest)  # swapped for something else since the listing: not ours
    return False


def _encode_doc(tok: pi.Tokenizer, pieces: Iterator[str], acc: _Acc) -> int:
    """One document's tokens into `acc`, in the tokenizer's own dtype (uint16 for a map of at
    most 65,536 ids): the kernel writes them at that width, no int64 array is made."""
    import numpy as np

    first = next(pieces, None)
    if first is None:
        return 0
    second = next(pieces, None)
    if second is None:
        data = tok.prepare(first)
        if not data:
            return 0
        if tok.prefix:
            data = tok.prefix + data
        ids = np.frombuffer(tok.trie.match(data, len(data), tok.itemsize)[0], dtype=tok.dtype)
        acc.add(ids)
        return int(ids.size)
    enc = tok.stream()
    n = 0
    for piece in (first, second):
        ids = np.frombuffer(enc.feed_bytes(piece), dtype=tok.dtype)
        acc.add(ids)
        n += ids.size
    for piece in pieces:
        ids = np.frombuffer(enc.feed_bytes(piece), dtype=tok.dtype)
        acc.add(ids)
        n += ids.size
    ids = np.frombuffer(enc.finish_bytes(), dtype=tok.dtype)
    acc.add(ids)
    return int(n + ids.size)


TEXT_BATCH = 4 << 20  # bytes of prepared text matched by one kernel call (_encode_texts)


def _encode_texts(
    tok: pi.Tokenizer,
    texts: Iterator[tuple[int, str | bytes | memoryview]],
    acc: _Acc,
    result: FileResult,
    eos_id: int | None,
) -> None:
    """Documents of one text each (JSON Lines records, Parquet and Arrow rows) into `acc` and
    `result`: the same ids, end-of-document tokens, records and counts as `_encode_doc` gives
    document by document. Each text is prepared as `Tokenizer.prepare` does; the prepared
    documents are matched about TEXT_BATCH bytes at a time by one kernel call, which writes
    every batch's ids at the tokenizer's width into one buffer (`Trie.match_docs`).

    A text given as bytes or a memoryview is UTF-8 without CRLF (a column's cell, see
    columnar.texts; a JSON Lines record's text, see extract.jsonl_texts). Unless the map's
    marking rewrites text (wordpiece), it is prepared where it lies: ASCII as it is
    (normalization never changes it), other text by `_jsonl_kernel.normalize_utf8`, which
    normalizes only the runs `pi.normalize` normalizes and returns the same bytes when they
    are already normalized (no string of the whole text, no re-encoding)."""
    import unicodedata
    from functools import partial

    import numpy as np

    from matrixctl import _jsonl_kernel

    plain = tok.marking is None or tok.marking.scheme != "wordpiece"
    form: Any = tok.map.normalization.upper()  # as pi.normalize calls it
    normalize = None if form == "NONE" else partial(unicodedata.normalize, form)
    normalize_utf8 = _jsonl_kernel.normalize_utf8
    gap = pi.NORMALIZE_GAP
    prefix = tok.prefix
    extra = 0 if eos_id is None else 1
    batch: list[bytes | memoryview] = []
    items: list[int] = []
    size = 0

    def flush() -> None:
        ids, counts = tok.trie.match_docs(batch, tok.itemsize, -1 if eos_id is None else eos_id)
        acc.add(np.frombuffer(ids, dtype=tok.dtype))
        docs = tokens = 0
        for item, n in zip(items, np.frombuffer(counts, dtype=np.int64).tolist(), strict=True):
            if n == 0:
                result.empty_documents += 1
                continue
            acc.record(n + extra, item)
            docs += 1
            tokens += n + extra
        result.documents += docs
        result.tokens += tokens
        batch.clear()
        items.clear()

    data: bytes | memoryview
    for item, text in texts:
        if isinstance(text, str):
            data = text.encode() if plain and text.isascii() else tok.prepare(text)
        elif not plain:
            data = tok.prepare(str(text, "utf-8"))
        elif normalize is not None:
            data = normalize_utf8(text, gap, normalize)
        else:
            data = text
        if not data:
            result.empty_documents += 1
            continue
        batch.append(prefix + data if prefix else data)
        items.append(item)
        size += len(data)
        if size >= TEXT_BATCH:
            flush()
            size = 0
    if batch:
        flush()


def process_file(sf: SourceFile, state: WorkerState) -> FileResult:
    """One source file under the error policy: with `--on-error skip` any per-file failure
    (unreadable, binary when named, encoding, parse, size) leaves the file out, named in the
    manifest's `skipped` with the error's code and message; with `fail` it stops the ingest."""
    try:
        return _process_file(sf, state)
    except MatrixError as err:
        if state.on_error != "skip" or isinstance(err, UsageError):
            raise
        result = FileResult(sf, "")
        result.skip_code = err.code
        where = f" at byte {err.offset}" if err.offset is not None else ""
        result.skip_reason = f"{err.code}: {err.message}{where}"
        return result


def _open_raw(sf: SourceFile) -> Any:
    if sf.path == "-":
        from matrixctl.io import open_input_stream

        return open_input_stream("-")  # never closes stdin; bounded by the spool limit
    return open(sf.path, "rb")


def _process_file(sf: SourceFile, state: WorkerState) -> FileResult:
    """Extract, tokenize and account one source file (runs in a worker)."""
    from matrixctl.ingest import inputs

    assert state.tok is not None
    try:
        opened = _open_raw(sf)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    with opened as raw:
        reader = extract.HashingReader(raw, state.on_bytes)
        try:
            head = inputs.read_head(reader, extract.SNIFF)
        except OSError as exc:
            raise from_os_error(exc, sf.recorded) from None
        stream: Any = inputs.Prefixed(head, reader)
        compression = inputs.sniff_compression(head)
        name = "" if sf.path == "-" else sf.path
        dec = None
        try:
            if compression is not None:
                buffered, dec = inputs.decompressing(stream, compression, sf.recorded)
                head = inputs.read_head(buffered, extract.SNIFF)
                stream = inputs.Prefixed(head, buffered)
                name = extract.strip_compression(name)
            kind, stream = extract.detect_kind(
                head, name, stream, state.opts.max_doc, state.opts.input_kind
            )
            result = FileResult(sf, kind)
            result.compression = compression
            if kind == "binary":
                if sf.named or state.strict:
                    raise FormatError(
                        extract.INGEST_BINARY,
                        "is binary (a NUL byte in its first 8 KiB"
                        + (f" after {compression} decompression" if compression else "")
                        + "), not a document",
                        path=sf.recorded,
                        offset=head.index(b"\0"),
                    )
                result.skip_reason = "binary"
                return result
            if kind in extract.COLUMNAR and (compression or sf.path == "-"):
                raise FormatError(
                    extract.INGEST_COLUMNAR,
                    f"a {kind} input must be a file as stored (it is read by its footer), "
                    "not a compressed file or stdin",
                    path=sf.recorded,
                )
            _tokenize(sf, kind, stream, state, result)
            while stream.read(extract.PIECE):  # the rest, so damage at the end is found
                pass
            reader.drain()
        except FormatError as err:
            if (
                compression is not None
                and err.code != inputs.INGEST_COMPRESSED
                and err.offset is not None
            ):
                err.message += f" (offset into the {compression}-decompressed stream)"
            raise
        except extract.SkipFile as skip:
            result = FileResult(sf, "")
            result.skip_reason = f"encoding: {skip.reason}"
            return result
        except OSError as exc:
            raise from_os_error(exc, sf.recorded) from None
        result.sha256 = "sha256:" + reader.sha.hexdigest()
        result.size = reader.size
        result.decompressed = None if dec is None else dec.produced
        return result


def _tokenize(
    sf: SourceFile,
    kind: str,
    stream: Any,
    state: WorkerState,
    result: FileResult,
    piece: Piece | None = None,
) -> None:
    """The documents of one source, tokenized into `result` (spill files removed on failure)."""
    import numpy as np

    assert state.tok is not None
    acc = _Acc(
        state.spill_dir,
        sf.ordinal if piece is None else piece.id,
        state.out_dtype,
        state.direct,
        state.raw_spill,
        state.gather,
        state.sink,
        state.recycle,
    )
    counters = extract.Counters()
    eos = None if state.eos_id is None else np.array([state.eos_id], dtype=state.tok.dtype)
    # Documents of one text each go through `_encode_texts` (batches, one kernel call each);
    # the others (text, Markdown, HTML, JSON) through `_encode_doc`, piece by piece.
    texts: Iterator[tuple[int, str | bytes | memoryview]] | None = None
    docs: Iterator[extract.Doc] = iter(())
    if piece is not None and piece.kind == "parquet":
        from matrixctl.ingest import columnar

        texts = columnar.texts(
            "parquet",
            sf.path,
            sf.recorded,
            state.opts,
            counters,
            piece.groups,
            piece.first_line,
            ahead=state.read_once,
        )
    elif piece is not None and piece.kind == "text":
        part = _RangeReader(sf, piece.start, piece.length)
        docs = iter([(0, extract.iter_decoded(part, sf.recorded, state.opts, piece.start))])
    elif piece is not None:
        data = piece.data if not piece.length else _read_range(sf, piece.start, piece.length)
        texts = extract.jsonl_texts(
            data,
            sf.recorded,
            state.opts,
            counters,
            max(0, piece.first_line),  # -1: counted here from 0, the writer adds the base
            piece.start,
            piece.data_size,
            _text_buffer(),
        )
    elif kind in extract.COLUMNAR:
        from matrixctl.ingest import columnar

        texts = columnar.texts(
            kind, sf.path, sf.recorded, state.opts, counters, ahead=state.read_once
        )
    elif kind == "jsonl":
        texts = extract.jsonl_texts_stream(stream, sf.recorded, state.opts, counters)
    else:
        docs = extract.documents(kind, stream, sf.recorded, state.opts, counters)
    try:
        if texts is not None:
            _encode_texts(state.tok, texts, acc, result, state.eos_id)
        if piece is not None and piece.kind == "text":
            # A piece of one document: its tokens only. The writer counts the document, adds
            # its end-of-document token and its index record after the last piece.
            for _, pieces in docs:
                result.tokens += _encode_doc(state.tok, pieces, acc)
            docs = iter(())
        for item, pieces in docs:
            n = _encode_doc(state.tok, pieces, acc)
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
        _discard(acc)
        raise
    acc.close(result)
    result.skipped_records = counters.skipped_records
    result.lines = counters.lines


_TEXT_BUFFERS = threading.local()


def _text_buffer() -> extract.TextBuffer:
    """This thread's buffer for the texts of JSON Lines pieces (`extract.jsonl_texts`): a
    piece's texts are matched before `_tokenize` returns, so the next piece reuses it."""
    buffer: extract.TextBuffer | None = getattr(_TEXT_BUFFERS, "buffer", None)
    if buffer is None:
        buffer = _TEXT_BUFFERS.buffer = extract.TextBuffer()
    return buffer


def _read_range(sf: SourceFile, start: int, length: int) -> bytes:
    """The bytes of a ranged piece, read by the worker from the file as stored."""
    try:
        with open(sf.path, "rb") as fp:
            fp.seek(start)
            data = fp.read(length)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    if len(data) != length:
        raise InputError(
            INGEST_CHANGED,
            f"changed while it was read: {length:,} bytes expected at byte {start:,}, "
            f"{len(data):,} found",
            path=sf.recorded,
            offset=start,
        )
    return data


def _lines_before(sf: SourceFile, end: int) -> int:
    """The line feeds in the first `end` bytes of a file as stored."""
    count = 0
    try:
        with open(sf.path, "rb") as fp:
            while end > 0:
                block = fp.read(min(end, 8 << 20))
                if not block:
                    break
                count += block.count(b"\n")
                end -= len(block)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    return count


class _RangeReader:
    """`length` bytes of a file from `start`, read as a stream (a piece of a text file)."""

    def __init__(self, sf: SourceFile, start: int, length: int) -> None:
        self.sf = sf
        self.pos = start
        self.left = length

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        if n <= 0:
            return b""
        data = _read_range(self.sf, self.pos, n)
        self.pos += n
        self.left -= n
        return data


def _discard(acc: _Acc) -> None:
    """Remove the spill files of a file that is left out or failed."""
    for path in (acc.ids_path, acc.recs_path, acc.raw_path):
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)


# Work units inside one file -----------------------------------------------------------------


@dataclass
class Piece:
    """A work unit inside one JSON Lines source: whole lines, self-contained.

    `id` is stable (`ORDINAL:START-END`, the byte range in the decompressed stream) and the
    same whatever --jobs is; `first_line` is the number of lines before it, so its records'
    items and error line numbers are those of the file; `sha256` is of its bytes, so a result
    can be checked against its input. The last piece also carries the file's totals (hash and
    size as stored, compression). A cluster engine can schedule these as they are.
    """

    id: str
    source: SourceFile
    index: int
    start: int
    first_line: int
    lines: int
    data: bytes
    sha256: str
    stored_end: int  # stored bytes of the file read when the piece was cut (progress)
    last: bool = False
    file_sha256: str = ""
    file_size: int = 0
    compression: str | None = None
    decompressed: int | None = None
    kind: str = "jsonl"
    groups: tuple[int, int] | None = None  # Parquet: the row groups [first, stop)
    # A piece of a file as stored (not compressed) may travel without its bytes: `data` is
    # then empty and the worker reads these `length` bytes at `start` itself.
    length: int = 0
    # --jobs 1 (`_read_pieces`): the piece's bytes are the first `data_size` of `data`, a
    # buffer this process reuses once the piece is done.
    data_size: int = -1
    # --jobs 1, the last piece of a Parquet file: the file's hash still running on its helper
    # thread (an `io.FileHash`), taken once the piece is tokenized (never pickled).
    digest: Any = None


def _split_parquet(sf: SourceFile, size: int, defer: bool = False) -> Iterator[Piece]:
    """The pieces of one large Parquet file: runs of row groups. The file is hashed on a
    helper thread while its pieces are tokenized (hashlib and reads release the GIL); the
    last piece waits for the digest, or with `defer` (`--jobs 1`, where the pieces are
    tokenized in this process) carries the running hash, which `process_piece` takes once
    the piece is tokenized: the tokenizer no longer waits for the end of the file's hash."""
    from matrixctl.ingest import columnar

    ranges = columnar.row_group_pieces(sf.path, sf.recorded, size)
    ends = columnar.row_group_ends(sf.path, sf.recorded)
    from matrixctl.io import FileHash

    hashing: FileHash | None = FileHash(sf.path)
    try:
        for index, (first, stop, rows) in enumerate(ranges):
            piece = Piece(
                f"{sf.ordinal}:rg{first}-{stop}",
                sf,
                index,
                first,
                rows,
                0,
                b"",
                "",
                0,
                kind="parquet",
            )
            piece.groups = (first, stop)
            piece.stored_end = ends[stop - 1] if stop > 0 else 0  # progress by bytes
            if index == len(ranges) - 1:
                piece.last = True
                assert hashing is not None
                if defer:
                    piece.digest, hashing = hashing, None
                else:
                    piece.file_sha256 = hashing.result()
                piece.file_size = piece.stored_end = os.path.getsize(sf.path)
            yield piece
    finally:
        if hashing is not None:
            hashing.cancel()


def sniff_input(
    sf: SourceFile, reader: Any, state: WorkerState
) -> tuple[str, Any, str | None, Any]:
    """The input's kind and a stream of its (decompressed) bytes, head included: compression by
    magic, then the kind by content with the name as a hint. Returns (kind, stream,
    compression or None, decompressor or None)."""
    from matrixctl.ingest import inputs

    head = inputs.read_head(reader, extract.SNIFF)
    stream: Any = inputs.Prefixed(head, reader)
    compression = inputs.sniff_compression(head)
    dec = None
    if compression is not None:
        buffered, dec = inputs.decompressing(stream, compression, sf.recorded)
        head = inputs.read_head(buffered, extract.SNIFF)
        stream = inputs.Prefixed(head, buffered)
    kind, stream = extract.detect_kind(
        head,
        extract.strip_compression(sf.path),
        stream,
        state.opts.max_doc,
        state.opts.input_kind,
    )
    return kind, stream, compression, dec


def split_file(
    sf: SourceFile,
    state: WorkerState,
    size: int = 0,
    *,
    hashes: bool = True,
    ranged: bool = False,
) -> Iterator[Piece | None]:
    """Cut one source into pieces if it is JSON Lines: yields None (and nothing else) when it
    is not, so the caller hands it out whole. Runs in the main process, reading the stream
    once, in order: it hashes the stored bytes and counts lines as it cuts.

    `hashes=False` leaves each piece's own SHA-256 out (only a cluster's staged units are
    checked by it). `ranged=True` cuts a file as stored (not compressed, not stdin) into
    byte ranges without their bytes: the worker reads its range itself, so the bytes cross
    no pipe and this process only hashes and cuts."""

    size = size or PIECE_BYTES
    try:
        opened = _open_raw(sf)
    except OSError as exc:
        raise from_os_error(exc, sf.recorded) from None
    with opened as raw:
        reader = extract.HashingReader(raw)
        try:
            kind, stream, compression, dec = sniff_input(sf, reader, state)
            if kind == "parquet" and compression is None and sf.path != "-":
                yield from _split_parquet(sf, size, defer=state.read_once)
                return
            as_stored = ranged and compression is None and sf.path != "-"
            followers = text_cut_followers(state) if kind == "text" and as_stored else None
            if followers is not None:
                yield from _cut_ranges(sf, size, state.opts.max_doc, followers)
                return
            if kind != "jsonl":
                yield None
                return
            if as_stored and state.read_once:
                yield from _read_pieces(sf, size, state.opts.max_doc)
                return
            if as_stored:
                yield from _cut_ranges(sf, size, state.opts.max_doc)
                return
            if state.read_once and compression is not None:
                # --jobs 1: the next pieces are decompressed on a helper thread while this
                # one tokenizes (the decompressors release the GIL); reading, not tokenizing.
                ahead = _ReadAhead(stream, size)
                try:
                    yield from _cut(
                        sf, ahead, reader, dec, compression, size, state.opts.max_doc, hashes=hashes
                    )
                finally:
                    ahead.close()
                return
            yield from _cut(
                sf, stream, reader, dec, compression, size, state.opts.max_doc, hashes=hashes
            )
        except OSError as exc:
            raise from_os_error(exc, sf.recorded) from None


class _ReadAhead:
    """`read(size)` of a stream done on a helper thread (`io.Ahead`), up to two reads ahead of
    the caller: the chunks, then b"" at the end, in order; an exception the stream raises is
    raised by the `read` that reaches it. `close` stops the thread (the caller may stop
    early)."""

    def __init__(self, stream: Any, size: int) -> None:
        import functools

        from matrixctl.io import Ahead

        self.ahead = Ahead(iter(functools.partial(stream.read, size), b""), "matrixctl-read")
        self.chunks = iter(self.ahead)
        self.done = False

    def read(self, n: int = -1) -> bytes:
        if self.done:
            return b""
        try:
            data: bytes = next(self.chunks)
        except StopIteration:
            self.done = True
            return b""
        except BaseException:
            self.done = True
            raise
        return data

    def close(self) -> None:
        self.ahead.close()


def _cut(
    sf: SourceFile,
    stream: Any,
    reader: extract.HashingReader,
    dec: Any,
    compression: str | None,
    size: int,
    max_doc: int,
    *,
    hashes: bool = True,
) -> Iterator[Piece]:
    import hashlib

    start = lines = index = 0
    carry = b""
    pending: Piece | None = None
    while True:
        data = stream.read(size)
        if data:
            buf = carry + data if carry else data
            cut = buf.rfind(b"\n") + 1
            if cut == 0:
                carry = buf
                if len(carry) > max_doc + 1:
                    raise FormatError(
                        extract.INGEST_TOO_LARGE,
                        f"line {lines + 1} is longer than --max-doc-size ({max_doc:,} bytes)",
                        path=sf.recorded,
                        offset=start,
                        field=f"line {lines + 1}",
                    )
                continue
            body, carry = buf[:cut], buf[cut:]
        else:
            body, carry = carry, b""
            if not body and pending is not None:
                break
        count = body.count(b"\n")
        piece = Piece(
            f"{sf.ordinal}:{start}-{start + len(body)}",
            sf,
            index,
            start,
            lines,
            count,
            body,
            "sha256:" + hashlib.sha256(body).hexdigest() if hashes else "",
            reader.size,
        )
        if pending is not None:
            yield pending
        pending = piece
        index += 1
        start += len(body)
        lines += count
        if not data:
            break
    assert pending is not None
    pending.last = True
    pending.file_sha256 = "sha256:" + reader.sha.hexdigest()
    reader.drain()
    pending.file_sha256 = "sha256:" + reader.sha.hexdigest()
    pending.file_size = reader.size
    pending.stored_end = reader.size
    pending.compression = compression
    pending.decompressed = None if dec is None else dec.produced
    yield pending


def _too_long(sf: SourceFile, line: int, start: int, max_doc: int) -> FormatError:
    return FormatError(
        extract.INGEST_TOO_LARGE,
        f"line {line} is longer than --max-doc-size ({max_doc:,} bytes)",
        path=sf.recorded,
        offset=start,
        field=f"line {line}",
    )


def text_cut_followers(state: WorkerState) -> bytes | None:
    """Where a plain text file (one document) may be cut into pieces that give the same
    tokens (docs/inputs.md, "Plain text in pieces"): right after a line feed, before an ASCII
    byte that no symbol of the map has right after a line feed inside it (nor a carriage
    return, which the text reader turns into a line feed). Returns those
    bytes (a cut must not be followed by one of them), or None when text is never cut: a map
    whose space marking adds a prefix to each document or splits words (wordpiece), or
    `--encoding-errors skip-file` (a file must be skipped whole)."""
    if state.opts.encoding_errors == "skip-file" or state.smap is None:
        return None
    if state.text_followers is not None:
        return state.text_followers or None
    smap = state.smap
    marking = smap.space_marking
    followers = bytearray()
    if marking is None or not (marking.scheme == "wordpiece" or marking.adds_prefix):
        for sid, text in smap.symbols:
            if sid in smap.specials or "\n" not in text:
                continue
            key = smap.key(text)
            at = key.find(b"\n")
            while 0 <= at < len(key) - 1:
                if key[at + 1] not in followers:
                    followers.append(key[at + 1])
                at = key.find(b"\n", at + 1)
        followers.append(0)  # never empty: b"" means "never cut" in the cache
    state.text_followers = bytes(followers) if followers else b""
    return state.text_followers or None


def _text_cut(data: bytearray, n: int, followers: bytes) -> int:
    """The index of the last line feed in `data[:n]` after which a text file may be cut, or
    -1."""
    at = n - 1
    while True:
        at = data.rfind(b"\n", 0, at)
        if at < 0:
            return -1
        nxt = data[at + 1]
        if nxt < 0x80 and nxt != 0x0D and nxt not in followers:  # CR is read as a line feed
            return at


def hashed_reads(fp: Any, size: int, sha: Any) -> Iterator[tuple[bytearray, int]]:
    """The reads of `fp` to its end, each as (buffer, bytes read), into two buffers of `size`
    in turn (no allocation per read). Each read is hashed into `sha` on a helper thread
    (hashlib releases the GIL) while the caller looks at it and the next one is read; a
    buffer is valid until the next step. When this ends, every read is hashed."""
    from concurrent.futures import ThreadPoolExecutor

    bufs = [bytearray(size), bytearray(size)]
    hashing: list[Any] = [None, None]  # the hash of each buffer's last read, in flight
    reads = 0
    with ThreadPoolExecutor(1, thread_name_prefix="matrixctl-hash") as hasher:
        while True:
            which = reads % 2
            reads += 1
            buf = bufs[which]
            if hashing[which] is not None:
                hashing[which].result()  # its last read is hashed: the buffer is free
            view = memoryview(buf)
            n = fp.readinto(view)
            if not n:
                break
            hashing[which] = hasher.submit(sha.update, view[:n])
            yield buf, n
        for future in hashing:
            if future is not None:
                future.result()


def _cut_ranges(
    sf: SourceFile, size: int, max_doc: int, followers: bytes | None = None
) -> Iterator[Piece]:
    """The pieces of a JSON Lines file as stored, as byte ranges (see `split_file`): the
    same cuts as `_cut`, found without keeping any of the bytes. The file is read again from
    its start (`hashed_reads`: hashed on a helper thread while this one searches each read
    for its last line end). With `followers`, the file is plain text (one document) cut where
    `text_cut_followers` says."""
    import hashlib

    sha = hashlib.sha256()
    start = pos = index = 0
    pending: Piece | None = None
    kind = "jsonl" if followers is None else "text"

    def piece(end: int) -> Piece:
        # Lines are not counted here (a pass over every byte on the serial path): the worker
        # counts its piece's lines from 0 (first_line -1), the writer adds the lines before it.
        cut = Piece(f"{sf.ordinal}:{start}-{end}", sf, index, start, -1, -1, b"", "", pos)
        cut.length = end - start
        cut.kind = kind
        return cut

    with open(sf.path, "rb", buffering=0) as fp:
        for buf, n in hashed_reads(fp, size, sha):
            newline = buf.rfind(b"\n", 0, n) if not followers else _text_cut(buf, n, followers)
            pos += n
            if newline < 0:
                if followers is None and pos - start > max_doc + 1:
                    raise _too_long(sf, _lines_before(sf, start) + 1, start, max_doc)
                continue
            end = pos - n + newline + 1
            cut = piece(end)
            if pending is not None:
                yield pending
            pending = cut
            index += 1
            start = end
        if pos != start or pending is None:  # the rest after the last cut (an empty file: one)
            cut = piece(pos)
            if pending is not None:
                yield pending
            pending = cut
    pending.last = True
    pending.file_sha256 = "sha256:" + sha.hexdigest()
    pending.file_size = pending.stored_end = pos
    yield pending


def _read_pieces(sf: SourceFile, size: int, max_doc: int) -> Iterator[Piece]:
    """--jobs 1: the pieces of a JSON Lines file as stored, each with its bytes, from one read
    of the file (where `_cut_ranges` reads it to cut and each piece is read again). Two
    buffers take turns: a piece's bytes stay in one while it is tokenized, the next read goes
    into the other (so the piece before is known not to be the last), and the bytes after
    the last line end move over with it. Each read is hashed on a helper thread (hashlib
    releases the GIL). The same cuts as `_cut_ranges` for the same buffer size; line numbers
    are counted by the tokenizing side (`first_line` -1), as for ranges."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    sha = hashlib.sha256()
    bufs = [bytearray(2 * size), bytearray(2 * size)]
    hashing: list[Any] = [None, None]  # the hash of each buffer's last read, in flight
    cur = filled = index = pos = start = 0
    pending: Piece | None = None
    with (
        open(sf.path, "rb", buffering=0) as fp,
        ThreadPoolExecutor(1, thread_name_prefix="matrixctl-hash") as hasher,
    ):
        while True:
            buf = bufs[cur]
            if filled == len(buf):  # a line longer than the buffer: a larger one
                bigger = bytearray(2 * len(buf))
                bigger[:filled] = buf
                bufs[cur] = buf = bigger
            n = fp.readinto(memoryview(buf)[filled:])
            if n:
                hashing[cur] = hasher.submit(sha.update, memoryview(buf)[filled : filled + n])
            pos += n
            end = filled + n
            cut = buf.rfind(b"\n", 0, end) + 1 if n else end
            if n and cut == 0:
                if end > max_doc + 1:
                    raise _too_long(sf, _lines_before(sf, start) + 1, start, max_doc)
                filled = end
                continue
            if cut == 0 and pending is not None:
                break
            piece = Piece(
                f"{sf.ordinal}:{start}-{start + cut}", sf, index, start, -1, -1, b"", "", pos
            )
            piece.data, piece.data_size = buf, cut
            if pending is not None:
                yield pending  # its buffer, the other one, is free once this returns
            pending = piece
            index += 1
            start += cut
            if not n:
                break
            other = 1 - cur
            if hashing[other] is not None:
                hashing[other].result()
            rest = end - cut
            if rest > len(bufs[other]) // 2:
                bufs[other] = bytearray(2 * rest)
            bufs[other][:rest] = buf[cut:end]
            cur, filled = other, rest
        for future in hashing:
            if future is not None:
                future.result()
    assert pending is not None
    pending.last = True
    pending.file_sha256 = "sha256:" + sha.hexdigest()
    pending.file_size = pending.stored_end = pos
    yield pending


def process_piece(piece: Piece, state: WorkerState) -> FileResult:
    """Tokenize one piece (runs in a worker); the result carries the piece without its data."""
    try:
        result = _process_piece(piece, state)
    except BaseException:
        if piece.digest is not None:
            piece.digest.cancel()
        raise
    if piece.digest is not None:  # --jobs 1: the file's hash, finished meanwhile
        result.sha256 = piece.digest.result()
    return result


def _process_piece(piece: Piece, state: WorkerState) -> FileResult:
    result = FileResult(piece.source, piece.kind)
    try:
        try:
            _tokenize(piece.source, piece.kind, None, state, result, piece)
        except FormatError:
            if piece.first_line >= 0:
                raise
            # The error names lines counted from the piece's start: count the lines before
            # it (an error is rare, so its cost is paid only here) and read it again for
            # the file's own line numbers.
            base = _lines_before(piece.source, piece.start)
            _tokenize(
                piece.source,
                piece.kind,
                None,
                dataclasses.replace(state, sink=None),  # only for the error's line numbers
                FileResult(piece.source, piece.kind),
                dataclasses.replace(piece, first_line=base),
            )
            raise
    except FormatError as err:
        if piece.compression is not None and err.offset is not None:
            err.message += f" (offset into the {piece.compression}-decompressed stream)"
        raise
    except extract.SkipFile as skip:  # pragma: no cover - pieces are cut under --on-error fail
        raise FormatError(extract.INGEST_UTF8, skip.reason, path=piece.source.recorded) from None
    result.piece = dataclasses.replace(piece, data=b"", digest=None)
    if piece.last:
        result.sha256 = piece.file_sha256
        result.size = piece.file_size
        result.compression = piece.compression
        result.decompressed = piece.decompressed
    return result


def plan_work(
    files: list[SourceFile],
    state: WorkerState,
    jobs: int,
    *,
    hashes: bool = True,
    ranged: bool = False,
) -> Iterator[list[SourceFile] | Piece]:
    """The work units in input order: runs of small files (`plan_units`), and the pieces of
    every large JSON Lines file (`split_file`), so one big file keeps every worker busy.
    Files are cut only under --on-error fail (a file left out must leave no token behind)."""
    for unit in plan_units(files, jobs):
        sf = unit[0]
        # stdin ("-") is never cut here: it is read once (with --jobs N it was spooled first).
        if len(unit) == 1 and state.on_error == "fail" and sf.size >= SPLIT_MIN and sf.path != "-":
            pieces = split_file(sf, state, hashes=hashes, ranged=ranged)
            first = next(pieces)
            if first is None:
                yield unit
                continue
            yield first
            yield from (p for p in pieces if p is not None)
        else:
            yield unit


# Worker processes ---------------------------------------------------------------------------


def plan_units(files: list[SourceFile], jobs: int) -> list[list[SourceFile]]:
    """Consecutive runs of files of about equal size in bytes: the work units for N workers.

    Small files are grouped (fewer, larger messages between processes), a file larger than a
    unit is a unit alone, and the target size shrinks for small inputs so that every worker
    gets many units and the workers finish close together.
    """
    total = sum(f.size for f in files)
    target = min(UNIT_MAX_BYTES, max(UNIT_MIN_BYTES, total // max(1, jobs * UNITS_PER_JOB)))
    units: list[list[SourceFile]] = []
    unit: list[SourceFile] = []
    size = 0
    for sf in files:
        if unit and (size + sf.size > target or len(unit) >= UNIT_MAX_FILES):
            units.append(unit)
            unit, size = [], 0
        unit.append(sf)
        size += sf.size
    if unit:
        units.append(unit)
    return units


def _die_with_parent(parent: int) -> None:
    """Make this worker end, silently, when the process that started it dies (killed with
    SIGKILL, say): Linux delivers SIGKILL on the parent's death; a parent already gone before
    that request took effect is caught by the check after it. Everywhere, SIGPIPE is restored
    to its default in workers, so a write to the dead parent's result pipe ends the worker
    without a `BrokenPipeError` traceback."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


_PARENT = os.getpid()


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # Forked with SIGINT and SIGTERM blocked (`Workers`): a SIGTERM that came before the
    # line above was left pending, and now ends this process as it should.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    _die_with_parent(_PARENT)


class _SlotGather:
    """A worker's side of its unit's slot (`Workers`): each file's in-memory tokens are gathered
    into the slot, one file after the other, instead of into a fresh array; tokens that no
    longer fit get a fresh array (`_hand_over` sends those as a file)."""

    def __init__(self, mem: Any, slot: int) -> None:
        self.mem = mem
        self.base = slot * SLOT_BYTES
        self.used = 0
        self.made: list[tuple[np.ndarray, int]] = []  # (the array, its offset in the slot)

    def __call__(self, parts: list[np.ndarray], dtype: str) -> np.ndarray | None:
        import numpy as np

        width = np.dtype(dtype).itemsize
        count = sum(part.size for part in parts)
        if self.used + count * width > SLOT_BYTES:
            return None
        out = np.frombuffer(self.mem, dtype=dtype, count=count, offset=self.base + self.used)
        np.concatenate(parts, out=out, casting="safe")
        self.made.append((out, self.used))
        self.used += count * width
        return out


def _hand_over(res: FileResult, gather: _SlotGather, spill_dir: str) -> None:
    """A result's in-memory tokens, made ready to cross to the writer without their bytes:
    in the slot (their offset), else in a file in the pack's dtype; with their count, largest
    id and CRC-32, computed here rather than on the writer's serial path."""
    from matrixctl.crc import crc32

    ids = res.ids
    if ids is None:
        return
    res.ids = None
    res.raw_count, res.raw_max = int(ids.size), int(ids.max())
    data = ids.data.cast("B")
    res.raw_crc = crc32(data)
    for made, offset in gather.made:
        if made is ids:
            res.slot_offset = offset
            return
    name = res.piece.id if res.piece is not None else str(res.source.ordinal)
    res.raw_ids = os.path.join(spill_dir, f"{name}.raw")
    with open(res.raw_ids, "wb") as fp:
        fp.write(data)


def _work(unit: list[SourceFile] | Piece, spill_dir: str, mem: Any, slot: int) -> tuple[str, Any]:
    assert _STATE is not None
    state = _STATE
    state.spill_dir = spill_dir
    state.raw_spill = True  # tokens in memory up to MEM_TOKENS (gathered into the slot)
    gather = _SlotGather(mem, slot)
    state.gather = gather
    assert state.tok is not None  # the parent's, inherited (`Workers`)
    try:
        if isinstance(unit, Piece):
            results = [process_piece(unit, state)]
        else:
            results = [process_file(sf, state) for sf in unit]
        for res in results:
            _hand_over(res, gather, spill_dir)
        return "ok", results
    except MatrixError as err:
        return "error", (
            type(err).__name__,
            err.code,
            err.message,
            err.path,
            err.offset,
            err.field,
            err.hint,
        )


def _serve(conn: Any, mem: Any, others: list[Any]) -> None:
    """A worker process: units from `conn`, one at a time, each answered on `conn`."""
    for other in others:  # the parent's pipe ends, inherited through the fork
        other.close()
    _init_worker()
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            unit, spill_dir, slot = task
            reply: tuple[str, Any] = _work(unit, spill_dir, mem, slot)
        except Exception as exc:  # a fault, not an input error: the writer raises it again
            reply = ("raise", exc)
        try:
            conn.send(reply)
        except Exception as exc:  # an exception that does not pickle
            conn.send(("raise", RuntimeError(f"{type(exc).__name__}: {exc}")))


def _reraise(payload: tuple[Any, ...]) -> None:
    cls_name, code, message, path, offset, fld, hint = payload
    cls = getattr(errors, cls_name, FormatError)
    if cls is UsageError:
        raise UsageError(message, code=code, hint=hint)
    if not issubclass(cls, MatrixError):
        cls = FormatError
    raise cls(code, message, path=path, offset=offset, field=fld, hint=hint)


class Workers:
    """N forked worker processes, started before the inputs are listed (see module doc).

    Each worker has its own pipe: this process sends it units (at most WORKER_DEPTH queued, so
    the next one is there when it ends one; the least busy worker gets the next unit) and
    reads every reply as it comes, then hands the results on strictly in input order. At
    most `window` units are in flight, each with a slot of SLOT_BYTES of shared memory (an
    anonymous shared mapping made before the fork) where its worker leaves its tokens; the
    writer writes them from there, so they cross with no pipe and no file, and the slot is
    reused once the writer has asked for the next result. A worker that dies without its
    reply (killed, out of memory) is INGEST_WORKER_LOST."""

    def __init__(self, state: WorkerState, jobs: int) -> None:
        import mmap
        import multiprocessing

        global _STATE, _PARENT
        self.jobs = jobs
        self.state = state
        self.window = 2 * jobs + 2
        self.mem = mmap.mmap(-1, self.window * SLOT_BYTES)  # MAP_SHARED | MAP_ANONYMOUS
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        self.ok = False
        if state.tok is None:  # `ingest_docs` passes the one from the map cache
            assert state.smap is not None
            state.tok = pi.Tokenizer(state.smap)
        # One matcher, made here and inherited: the workers read the same pages (it is never
        # written once built), so two of them running at once share one copy in the
        # processor's cache instead of competing with two (about a tenth less CPU in the
        # matcher on two cores).
        ctx = multiprocessing.get_context("fork")
        _STATE = state  # inherited by the forked workers
        _PARENT = os.getpid()
        # A worker inherits this process's SIGTERM handler (it raises an exception) until
        # `_init_worker` restores the default: it is forked with SIGINT and SIGTERM blocked,
        # so a SIGTERM from `close` in between waits and then ends it. Here a signal waits
        # until the workers are started.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            for _ in range(jobs):
                here, there = ctx.Pipe()
                proc = ctx.Process(
                    target=_serve,
                    args=(there, self.mem, [*self.conns, here]),
                    name="matrixctl-ingest",
                    daemon=True,
                )
                proc.start()
                there.close()
                self.conns.append(here)
                self.procs.append(proc)
        except BaseException:
            self.close()
            raise
        finally:
            _STATE = None
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def results(self, files: list[SourceFile], spill_dir: str) -> Iterator[FileResult]:
        """Each file's result, in input order."""
        from multiprocessing.connection import wait

        import numpy as np

        units = plan_work(files, self.state, self.jobs, hashes=False, ranged=True)
        free = list(range(self.window))
        queued: list[deque[int]] = [deque() for _ in self.conns]  # each worker's units
        slots: dict[int, int] = {}  # a unit in flight: its slot
        done: dict[int, tuple[str, Any]] = {}  # replies ahead of their turn
        sent = turn = 0
        more = True
        while True:
            while more and sent - turn < self.window:
                w = min(range(self.jobs), key=lambda i: len(queued[i]))
                if len(queued[w]) >= WORKER_DEPTH:
                    break
                unit = next(units, None)
                if unit is None:
                    more = False
                    break
                slots[sent] = free.pop()
                try:
                    self.conns[w].send((unit, spill_dir, slots[sent]))
                except OSError:
                    raise self._lost(w) from None
                queued[w].append(sent)
                sent += 1
            if turn in done:
                status, payload = done.pop(turn)
                if status == "error":
                    _reraise(payload)
                if status == "raise":
                    raise payload
                base = slots[turn] * SLOT_BYTES
                for res in payload:
                    if res.slot_offset >= 0:
                        res.shared = np.frombuffer(
                            self.mem,
                            dtype=self.state.out_dtype,
                            count=res.raw_count,
                            offset=base + res.slot_offset,
                        )
                yield from payload
                for res in payload:
                    res.shared = None  # written: the slot is free again
                free.append(slots.pop(turn))
                turn += 1
                continue
            if turn == sent:
                break
            for ready in wait([self.conns[i] for i in range(self.jobs) if queued[i]]):
                w = self.conns.index(ready)
                try:
                    reply = self.conns[w].recv()
                except (EOFError, OSError):
                    raise self._lost(w) from None
                done[queued[w].popleft()] = reply
        self.ok = True

    def _lost(self, w: int) -> InputError:
        proc = self.procs[w]
        proc.join(1)
        code = proc.exitcode
        how = (
            "still running"
            if code is None
            else (f"killed by signal {-code}" if code < 0 else f"exit status {code}")
        )
        return InputError(
            INGEST_WORKER_LOST,
            f"worker process {proc.pid} ended without its result ({how})",
            hint="out of memory? try fewer --jobs",
        )

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if self.ok:
                with contextlib.suppress(OSError):
                    conn.send(None)
            else:
                proc.terminate()
        for proc in self.procs:
            proc.join(5)
            if proc.exitcode is None:  # never expected: a worker that ignored the request
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()
        with contextlib.suppress(BufferError):  # a view still held (an error's traceback)
            self.mem.close()


def _prefetch_parquet(unit: Any, state: WorkerState) -> None:
    """`--jobs 1`: start decoding `unit` now when it is the first piece of a Parquet file."""
    if isinstance(unit, Piece) and unit.kind == "parquet" and unit.index == 0 and unit.groups:
        from matrixctl.ingest import columnar

        columnar.prefetch(
            unit.source.path, unit.source.recorded, state.opts.text_field, unit.groups[0]
        )


def ordered_results(files: list[SourceFile], state: WorkerState, jobs: int) -> Iterator[FileResult]:
    """Each file's result, in input order, from `jobs` processes."""
    if jobs <= 1 or len(files) <= 1:
        if state.tok is None:
            assert state.smap is not None
            state.tok = pi.Tokenizer(state.smap)
        state.raw_spill = True
        state.read_once = True
        # Large JSON Lines and Parquet files go piece by piece here too: each piece's tokens
        # stay in memory instead of the whole file's being spilled and read back.
        units = plan_work(files, state, 1, hashes=False, ranged=True)
        try:
            following = next(units, None)
            while following is not None:
                unit, following = following, None
                if isinstance(unit, Piece) and unit.kind == "parquet" and unit.last:
                    # The next unit is cut now: a Parquet file's first piece starts decoding
                    # while this last piece of the file before is tokenized.
                    following = next(units, None)
                    _prefetch_parquet(following, state)
                if isinstance(unit, Piece):
                    yield process_piece(unit, state)
                else:
                    for sf in unit:
                        yield process_file(sf, state)
                if following is None:
                    following = next(units, None)
        finally:
            if "matrixctl.ingest.columnar" in sys.modules:  # a Parquet file's decoder
                sys.modules["matrixctl.ingest.columnar"].release_readers()
        return
    workers = Workers(state, jobs)
    try:
        yield from workers.results(files, state.spill_dir)
    finally:
        workers.close()


# The command --------------------------------------------------------------------------------


@dataclass
class IngestOptions:
    symbols: str | None = None
    atom_size: int = 256
    dtype: str = "auto"
    svgt: str | None = None
    eos_id: str | None = None  # an id, "none", or None for the map's eos_id
    jobs: int = 1
    shard: str | None = None
    text_field: str = "text"
    missing_field: str = "skip"
    encoding_errors: str = "error"
    on_error: str = "fail"
    strict: bool = False
    max_doc_size: int = extract.MAX_WHOLE
    input_kind: str = "auto"
    executor: str = "local"  # local (--jobs processes) | dask (ingest/dask_exec.py)
    scheduler: str | None = None  # dask: a scheduler address; None: DASK_SCHEDULER_ADDRESS or local
    resume: bool = False  # dask: reuse the staged units that check out


def resolve_eos(smap: pi.SymbolMap, value: str | None) -> int | None:
    if value is None:
        if smap.eos_id is None:
            raise UsageError(
                "the symbol map has no eos_id, so documents cannot be separated",
                hint="pass --eos-id ID (an id of the map's vocabulary) or --eos-id none",
            )
        return smap.eos_id
    if value.lower() == "none":
        return None
    if not value.isdigit():
        raise UsageError(f"--eos-id must be an id or none, got {value!r}")
    eos = int(value)
    if eos >= smap.vocab_size:
        raise UsageError(f"--eos-id {eos} is outside the vocabulary [0, {smap.vocab_size})")
    return eos


def _load_map(path: str, build: bool) -> tuple[pi.SymbolMap, bytes, pi.Tokenizer | None]:
    """The symbol map at `path`, its bytes, and (when `build`: the local executor) its
    tokenizer, through the per-user map cache (tokenizers/pi_cache.py) as `tokenize pi
    encode` does: a sound entry for the map's exact bytes gives the checked map and its
    compiled matcher; otherwise the map is checked in full (and with `build`, its matcher is
    compiled and the entry stored). `--jobs N` workers share this process's matcher
    (`Workers`); Dask workers build their own."""
    from matrixctl.tokenizers import pi_cache

    if build:
        return pi_cache.load_tokenizer(path)
    raw = pi.read_map_bytes(path)
    hit = pi_cache.load(raw)
    return (pi.check_map_bytes(raw, path) if hit is None else hit[0]), raw, None


def ingest_docs(
    srcs: list[str], out_dir: str, opts: IngestOptions, tick: Tick | None = None
) -> dict[str, Any]:
    """Documents to a complete, verified-by-construction ingest pack. Returns a summary."""
    from matrixctl.formats import matrix_atom
    from matrixctl.formats import svgt as svgt_fmt

    if opts.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if opts.missing_field not in ("skip", "error"):
        raise UsageError("--missing-field must be skip or error")
    if opts.encoding_errors not in ("error", "replace", "skip-file"):
        raise UsageError("--encoding-errors must be error, replace or skip-file")
    if opts.on_error not in ("fail", "skip"):
        raise UsageError("--on-error must be fail or skip")
    if opts.max_doc_size < 1:
        raise UsageError("--max-doc-size must be at least 1 byte")
    if opts.input_kind != "auto" and opts.input_kind not in extract.KINDS:
        raise UsageError(f"--input-kind must be auto or one of {', '.join(extract.KINDS)}")
    if srcs.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    if opts.executor not in ("local", "dask"):
        raise UsageError("--executor must be local or dask")
    if opts.executor != "dask" and (opts.scheduler or opts.resume):
        raise UsageError("--scheduler and --resume go with --executor dask")
    shard = parse_shard(opts.shard)
    map_path = opts.symbols or pi.default_map_path()
    smap, map_raw, tok = _load_map(map_path, opts.executor == "local")
    eos = resolve_eos(smap, opts.eos_id)
    dtype = matrix_atom.choose_dtype(opts.dtype, smap.vocab_size)
    assert dtype is not None
    if dtype == "uint16" and smap.vocab_size > matrix_atom.UINT16_LIMIT:
        raise UsageError(
            f"--dtype uint16 cannot hold the map's ids (vocab_size {smap.vocab_size:,})"
        )
    if not 1 <= opts.atom_size < matrix_atom.UINT32_LIMIT:
        raise UsageError("--atom-size must be between 1 and 2**32 - 1")
    grid = svgt_fmt.parse_grid(opts.svgt, opts.atom_size) if opts.svgt else None
    if grid and smap.vocab_size > matrix_atom.UINT16_LIMIT:
        raise UsageError(
            "--svgt needs ids below 65536 (SVG-Tensor stores uint16) but the map's vocab_size "
            f"is {smap.vocab_size:,}"
        )
    state = WorkerState(
        tok,  # None with Dask: each of its workers builds its own
        eos,
        extract.Options(
            opts.text_field,
            opts.missing_field,
            opts.encoding_errors,
            opts.max_doc_size,
            opts.input_kind,
        ),
        "",
        smap,
        "<u2" if dtype == "uint16" else "<u4",
        opts.on_error,
        opts.strict,
    )
    # The workers start now, with the matcher loaded above, while this process lists the inputs.
    workers: Any = None
    if opts.executor == "dask":
        from matrixctl.ingest.dask_exec import DaskWorkers

        workers = DaskWorkers(state, opts.jobs, out_dir, opts.scheduler, opts.resume, map_raw)
    elif opts.jobs > 1:
        workers = Workers(state, opts.jobs)
    try:
        summary = _ingest(
            srcs, out_dir, opts, shard, smap, map_raw, eos, dtype, grid, state, workers, tick
        )
        if opts.executor == "dask":
            summary["executor"] = workers.report()
        return summary
    finally:
        if workers is not None:
            workers.close()


def _ingest(
    srcs: list[str],
    out_dir: str,
    opts: IngestOptions,
    shard: tuple[int, int] | None,
    smap: pi.SymbolMap,
    map_raw: bytes,
    eos: int | None,
    dtype: str,
    grid: tuple[int, int] | None,
    state: WorkerState,
    workers: Workers | None,
    tick: Tick | None,
) -> dict[str, Any]:
    from matrixctl.ingest.pack import PackBuilder, PackPlan

    files, skipped = enumerate_sources(srcs, exclude=[out_dir], on_error=opts.on_error)
    total = len(files)
    if shard is not None:
        files = [f for f in files if shard_of(f.recorded, shard[1]) == shard[0]]
    if not files and (shard is None or total == 0):
        raise InputError(
            INGEST_NO_INPUT,
            "no input files" + (f" in shard {shard[0]}/{shard[1]}" if shard else ""),
            path=", ".join(srcs),
        )
    plan = PackPlan(
        atom_size=opts.atom_size,
        dtype=dtype,
        vocab_size=smap.vocab_size,
        pad_id=smap.pad_id,
        eos_id=eos,
        grid=grid,
        map_raw=map_raw,
        map_hash=smap.canonical_hash(),
        manifest_head={"source": srcs[0] if len(srcs) == 1 else list(srcs)},
    )
    started = time.monotonic()
    nbytes = ntokens = done = 0
    if tick is not None and workers is None:
        # --jobs 1: the bar moves with the bytes read inside each file.
        def within(n: int) -> None:
            assert tick is not None
            tick(done, nbytes + n, ntokens)

        state.on_bytes = within
    with PackBuilder(out_dir, plan) as pb:
        state.spill_dir = pb.spill_dir
        if workers is not None and any(f.path == "-" for f in files):
            files = [_spool_stdin(f, pb.spill_dir) if f.path == "-" else f for f in files]
        if workers is not None:
            results = workers.results(files, pb.spill_dir)
        else:
            results = ordered_results(files, state, 1)
        tokens = _TokenBuffer(pb)
        if workers is None and opts.on_error == "fail":
            state.sink = tokens.write_through
        split_at = 0  # stored bytes of the file being read in pieces, already counted
        lines_before = 0  # lines of the file being read in pieces, before this piece
        for res in results:
            if res.piece is not None:
                if res.piece.first_line < 0:  # a piece whose lines its worker counted
                    lines_before = 0 if res.piece.index == 0 else lines_before
                    res.item_base = lines_before
                    lines_before += res.lines
                ntokens += res.tokens
                _append_piece(pb, res, tokens)
                nbytes += res.piece.stored_end - split_at
                split_at = 0 if res.piece.last else res.piece.stored_end
                done += res.piece.last
                if tick:
                    tick(done, nbytes, ntokens)
                continue
            done += 1
            nbytes += res.source.size
            if res.skip_reason is not None:
                pb.skipped.append(
                    {
                        "path": res.source.recorded,
                        "reason": res.skip_reason,
                        "ordinal": res.source.ordinal,
                        "code": res.skip_code,
                    }
                )
            else:
                ntokens += res.tokens
                _append(pb, res, tokens)
            if tick:
                tick(done, nbytes, ntokens)
        tokens.flush()
        if shard is None and pb.index.docs == 0:
            raise FormatError(
                INGEST_NO_DOCUMENTS,
                f"the inputs hold no document ({len(files):,} files read, "
                f"{len(skipped) + len(pb.skipped):,} skipped); no pack is written",
                path=", ".join(srcs),
                hint="the manifest would list them: see the skipped files above, or --text-field",
            )
        tail = {
            "sources": pb.sources,
            "skipped": [
                {"path": s.recorded, "reason": s.reason, "ordinal": None, "code": s.code}
                for s in skipped
            ]
            + pb.skipped,
            "shard": (
                {"index": shard[0], "count": shard[1], "sources_total": total} if shard else None
            ),
            "options": {
                "text_field": opts.text_field,
                "missing_field": opts.missing_field,
                "encoding_errors": opts.encoding_errors,
                "on_error": opts.on_error,
                "strict": opts.strict,
                "max_doc_size": opts.max_doc_size,
                "input_kind": opts.input_kind,
            },
        }
        manifest = pb.finish(tail)
    elapsed = time.monotonic() - started
    return {
        "pack": out_dir,
        "files": len(files),
        "bytes": nbytes,
        "documents": manifest["documents"],
        "tokens": manifest["tokens"],
        "atoms": manifest["atom_count"],
        "atom_size": manifest["atom_size"],
        "dtype": manifest["dtype"],
        "vocab_size": manifest["vocab_size"],
        "skipped": len(manifest["skipped"]),
        "skipped_files": [
            {"path": s["path"], "reason": s["reason"], "code": s["code"]}
            for s in manifest["skipped"]
        ],
        "hash": manifest["hash"],
        "seconds": round(elapsed, 3),
    }


class _TokenBuffer:
    """In-memory token arrays of consecutive files, appended to the atoms in one write."""

    LIMIT = 1 << 20

    def __init__(self, pb: Any) -> None:
        self.pb = pb
        self.parts: list[np.ndarray] = []
        self.n = 0

    def add(self, ids: np.ndarray) -> None:
        self.parts.append(ids)
        self.n += ids.size
        if self.n >= self.LIMIT:
            self.flush()

    def flush(self) -> None:
        import numpy as np

        if self.parts:
            parts = self.parts
            self.parts, self.n = [], 0
            self.pb.add_tokens(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def write_through(self, parts: list[np.ndarray]) -> None:
        """Tokens of the unit being tokenized (`WorkerState.sink`): after the ones waiting
        here, part by part (no joined copy)."""
        self.flush()
        for part in parts:
            self.pb.add_tokens(part)


def _spool_stdin(sf: SourceFile, spill_dir: str) -> SourceFile:
    """With --jobs > 1, stdin is first copied as it is into the pack's temporary folder, so
    the workers can read it like a file (and a large JSON Lines stream is cut into pieces)."""
    import shutil

    from matrixctl.io import open_input_stream

    path = os.path.join(spill_dir, "stdin")
    with open_input_stream("-") as src, open(path, "wb") as out:  # bounded: --spool-limit
        shutil.copyfileobj(src, out, 1 << 20)
    return dataclasses.replace(sf, path=path, size=os.path.getsize(path))


def _append_piece(pb: Any, res: FileResult, tokens: _TokenBuffer) -> None:
    """A piece's tokens and records; its counts go into its file's manifest entry."""
    assert res.piece is not None
    if res.piece.index == 0:
        _append(pb, res, tokens)
        if res.piece.kind == "text" and res.piece.last:
            _end_text(pb, tokens)
        return
    entry = pb.sources[-1]
    for key, value in (
        ("documents", res.documents),
        ("tokens", res.tokens),
        ("skipped_records", res.skipped_records),
        ("empty_documents", res.empty_documents),
    ):
        entry[key] += value
    if res.piece.last:
        entry.update(
            bytes=res.size,
            sha256=res.sha256,
            compression=res.compression,
            decompressed_bytes=res.decompressed,
        )
    _append(pb, res, tokens, len(pb.sources) - 1)
    if res.piece.kind == "text" and res.piece.last:
        _end_text(pb, tokens)


def _end_text(pb: Any, tokens: _TokenBuffer) -> None:
    """After the last piece of a plain text file: the document's end-of-document token and
    index record, as one whole-file unit would have them (or it is counted empty)."""
    import numpy as np

    entry = pb.sources[-1]
    n = entry["tokens"]
    if n == 0:
        entry["empty_documents"] += 1
        return
    if pb.plan.eos_id is not None:
        tokens.add(np.array([pb.plan.eos_id], dtype=pb.plan.dtype))
        n += 1
        entry["tokens"] = n
    pb.add_record(n, len(pb.sources) - 1, 0)
    entry["documents"] += 1


def _append(pb: Any, res: FileResult, tokens: _TokenBuffer, index: int | None = None) -> None:

    if index is not None:
        _add_payload(pb, res, tokens, index)
        return
    index = len(pb.sources)
    pb.sources.append(
        {
            "path": res.source.recorded,
            "ordinal": res.source.ordinal,
            "kind": res.kind,
            "bytes": res.size,
            "sha256": res.sha256,
            "compression": res.compression,
            "decompressed_bytes": res.decompressed,
            "documents": res.documents,
            "tokens": res.tokens,
            "skipped_records": res.skipped_records,
            "empty_documents": res.empty_documents,
        }
    )
    _add_payload(pb, res, tokens, index)


def _add_payload(pb: Any, res: FileResult, tokens: _TokenBuffer, index: int) -> None:
    import numpy as np

    if res.shared is not None:
        if res.shared.size < SHARED_COPY:  # a small file's: batched with its neighbours'
            tokens.add(res.shared.copy())
        else:
            tokens.flush()
            pb.add_tokens_shared(res.shared, res.raw_max, res.raw_crc)
    elif res.raw_ids is not None:
        tokens.flush()
        pb.atoms.append_file(res.raw_ids, res.raw_count, res.raw_max, res.raw_crc)
        os.unlink(res.raw_ids)
    elif res.staged_ids is not None:
        tokens.flush()
        pb.add_tokens_range(*res.staged_ids)
    elif res.spill_ids is not None:
        tokens.flush()
        pb.add_tokens_file(res.spill_ids)
        os.unlink(res.spill_ids)
    elif res.ids is not None:
        tokens.add(res.ids)
    if res.spill_records is not None:
        with open(res.spill_records, "rb") as fp:
            while True:
                block = fp.read(16 << 16)
                if not block:
                    break
                pb.add_records(
                    np.frombuffer(block, dtype="<u8").reshape(-1, 2), index, res.item_base
                )
        os.unlink(res.spill_records)
    if len(res.records) > 8:  # a piece's many records: one write, one CRC-32
        pb.add_records(np.array(res.records, dtype="<u8").reshape(-1, 2), index, res.item_base)
        return
    for length, item in res.records:
        pb.add_record(length, index, item + res.item_base)
