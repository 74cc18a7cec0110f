"""Parquet and Arrow IPC inputs of `ingest docs` (docs/inputs.md), through pyarrow.

pyarrow is an optional extra (`pip install 'matrixctl[parquet]'`), imported only here. A file
is streamed a row group (Parquet) or a record batch (Arrow) at a time; only the text column is
read. Each row is one document; its item in the document index is its row number in the file.
`--text-field a.b` reads the column `a` and, inside its struct values, the field `b` (a column
named `a.b` itself wins, as a key named `a.b` does in JSON). A null
or non-string cell is handled like a JSON record without the field (skipped and counted, or an
error under `--missing-field error`). The documents do not depend on how the file is cut into
row groups or batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.ingest.kinds import base as extract
from matrixctl.ingest.kinds.base import Kind

BATCH_ROWS = 1024  # rows converted to Python strings at a time, at most...
BATCH_BYTES = 1 << 20  # ...and about this many bytes of text (from the footer's sizes)
READ_BUFFER = 1 << 20  # Parquet: column chunks are read through a buffer of this size


def _pyarrow(name: str) -> Any:
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise FormatError(
            extract.INGEST_COLUMNAR,
            "is Parquet/Arrow, which needs the parquet extra (pyarrow), not installed",
            path=name,
            hint="pip install 'matrixctl[parquet]'  (or: pip install pyarrow)",
        ) from None
    return pyarrow


def _damaged(name: str, kind: str, exc: BaseException) -> FormatError:
    return FormatError(extract.INGEST_COLUMNAR, f"is not a readable {kind} file ({exc})", path=name)


class Table:
    """One Parquet or Arrow file: its row groups / batches and the text column."""

    def __init__(self, kind: str, path: str, name: str, field: str) -> None:
        self.pa = _pyarrow(name)
        self.kind = kind
        self.name = name
        self.path = path
        self.field = field
        self.top, self.inner = field, []
        try:
            if kind == "parquet":
                # Memory (docs/inputs.md, "Parquet and Arrow"): batches hold about
                # BATCH_BYTES of text and are decoded on this thread only (`group_texts`).
                # A buffered stream (1 MiB reads) of each column chunk, not the whole chunk
                # read into memory first: the same batches; decoding the 1 GB benchmark
                # folder alone peaked at 311 MB instead of 336-344 MB (docs/benchmarks.md).
                self.pf = self.pa.parquet.ParquetFile(
                    path, pre_buffer=False, buffer_size=READ_BUFFER
                )
                self.schema = self.pf.schema_arrow
                meta = self.pf.metadata
                self.groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
                self.rows = [
                    max(1, min(BATCH_ROWS, BATCH_BYTES * rows // max(1, group.total_byte_size)))
                    for rows, group in ((n, meta.row_group(i)) for i, n in enumerate(self.groups))
                ]
            else:
                self.source = self.pa.memory_map(path, "r")
                try:
                    self.reader = self.pa.ipc.open_file(self.source)
                    self.batches: Any = None
                    self.groups = [
                        self.reader.get_batch(i).num_rows
                        for i in range(self.reader.num_record_batches)
                    ]
                except self.pa.ArrowInvalid:
                    self.source.seek(0)
                    self.reader = None
                    self.batches = self.pa.ipc.open_stream(self.source)
                    self.groups = []
                self.schema = (self.reader or self.batches).schema
            names = self.schema.names  # decoded here: a name that is not UTF-8 is damage
        except (OSError, UnicodeDecodeError, self.pa.ArrowException) as exc:
            raise _damaged(name, kind, exc) from None
        if field not in names and "." in field:  # a column named `field` wins, as for JSON
            self.top, *self.inner = field.split(".")
        if self.top not in names:
            raise FormatError(
                extract.INGEST_TEXT_FIELD,
                f"has no column {self.top!r} (columns: {', '.join(names[:20])})",
                path=name,
                field=field,
                hint="choose the column with --text-field",
            )

    def group_columns(self, index: int) -> Iterator[Any]:
        """The text column of row group / batch `index`, as checked Arrow arrays of at most
        BATCH_ROWS rows (about BATCH_BYTES of text)."""
        try:
            if self.kind == "parquet":
                for batch in self.pf.iter_batches(
                    batch_size=self.rows[index],
                    row_groups=[index],
                    columns=[self.top],
                    use_threads=False,  # one column: threads only add buffers
                ):
                    yield _checked(batch.column(0))
            else:
                col = self.reader.get_batch(index).column(self.top)
                for start in range(0, len(col), BATCH_ROWS):
                    yield _checked(col.slice(start, BATCH_ROWS))
        except (OSError, KeyError, UnicodeDecodeError, self.pa.ArrowException) as exc:
            raise _damaged(self.name, self.kind, exc) from None

    def group_texts(self, index: int) -> Iterator[list[Any]]:
        """The text column of row group / batch `index`, BATCH_ROWS Python values at a time."""
        for col in self.group_columns(index):
            yield self._values(col)

    def _values(self, col: Any) -> list[Any]:
        try:
            values: list[Any] = col.to_pylist()
        except (UnicodeDecodeError, self.pa.ArrowException) as exc:
            raise _damaged(self.name, self.kind, exc) from None
        for key in self.inner:
            values = [v.get(key) if isinstance(v, dict) else None for v in values]
        return values

    def stream_columns(self, groups: tuple[int, int] | None = None) -> Iterator[Any]:
        """Every row group / batch in order (an Arrow stream is read as it comes), or those
        of `groups` (a range of row group numbers), as checked Arrow arrays."""
        if self.kind == "arrow" and self.reader is None:
            try:
                for batch in self.batches:
                    yield _checked(batch.column(self.top))
            except (OSError, KeyError, UnicodeDecodeError, self.pa.ArrowException) as exc:
                raise _damaged(self.name, self.kind, exc) from None
            return
        first, stop = groups if groups is not None else (0, len(self.groups))
        for index in range(first, stop):
            yield from self.group_columns(index)

    def stream_texts(self, groups: tuple[int, int] | None = None) -> Iterator[list[Any]]:
        """`stream_columns` as lists of Python values."""
        for col in self.stream_columns(groups):
            yield self._values(col)

    def cells(self, col: Any) -> Iterator[str | bytes | memoryview | None]:
        """The text of each row of a checked column: a string column's cells straight from
        its Arrow buffers (offsets and UTF-8 data, checked by `_checked`), each a memoryview
        of the column's data (no copy, no Python string), or bytes for a cell holding a
        carriage return (its CRLF is replaced, so it is copied); None for a null or a value
        that is not a string. A column of another type (or `a.b` in a struct) goes through
        Python values (str)."""
        pa = self.pa
        kind = col.type
        if self.inner or not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            for value in self._values(col):
                yield value if isinstance(value, str) else None
            return
        import numpy as np

        rows = len(col)
        if rows == 0:
            return
        _, offsets_buf, data_buf = col.buffers()
        width = np.int64 if pa.types.is_large_string(kind) else np.int32
        offsets = np.frombuffer(offsets_buf, dtype=width)[col.offset : col.offset + rows + 1]
        bounds = offsets.tolist()
        data = memoryview(data_buf if data_buf is not None else b"")
        nulls = col.is_null().to_numpy(zero_copy_only=False).tolist() if col.null_count else None
        # The rows with a carriage return, from one scan of the column's text.
        with_cr: set[int] = set()
        if bounds[-1] > bounds[0]:
            text = np.frombuffer(data, dtype=np.uint8)[bounds[0] : bounds[-1]]
            at = np.flatnonzero(text == 13)
            if at.size:
                rows_at = np.searchsorted(offsets, at + bounds[0], side="right") - 1
                with_cr = set(rows_at.tolist())
        for i in range(rows):
            if nulls is not None and nulls[i]:
                yield None
                continue
            cell = data[bounds[i] : bounds[i + 1]]
            yield bytes(cell) if i in with_cr else cell


def _checked(col: Any) -> Any:
    """A column with its buffers checked. Arrow IPC buffers are taken as stored: string offsets
    past the data made to_pylist fail with SystemError (found by
    fuzz/fuzz_columnar_arrow.py), and the cells are read from the buffers directly. A full
    validation (offsets, UTF-8) turns damage into ArrowInvalid, reported as
    INGEST_COLUMNAR."""
    col.validate(full=True)
    return col


def _texts(
    cells: Iterator[str | bytes | memoryview | None],
    first_row: int,
    name: str,
    opts: extract.Options,
    counters: extract.Counters,
) -> Iterator[tuple[int, str | bytes | memoryview]]:
    row = first_row - 1
    for value in cells:
        row += 1
        if value is None:
            if opts.missing_field == "error":
                raise FormatError(
                    extract.INGEST_TEXT_FIELD,
                    f"row {row} has no string {opts.text_field!r}",
                    path=name,
                    field=opts.text_field,
                )
            counters.skipped_records += 1
            continue
        if (
            len(value) > opts.max_doc // 4
            and (len(value) if not isinstance(value, str) else len(value.encode("utf-8")))
            > opts.max_doc
        ):
            raise FormatError(
                extract.INGEST_TOO_LARGE,
                f"row {row} is larger than --max-doc-size ({opts.max_doc:,} bytes)",
                path=name,
                field=opts.text_field,
            )
        if isinstance(value, bytes):  # a cell with a carriage return (`Table.cells`)
            yield row, value.replace(b"\r\n", b"\n")
        elif isinstance(value, memoryview):  # UTF-8 without a carriage return
            yield row, value
        else:
            yield row, extract.crlf(value)


def row_group_pieces(path: str, name: str, target: int) -> list[tuple[int, int, int]]:
    """Runs of consecutive row groups of about `target` bytes (uncompressed, as the footer
    says): `(first group, stop, rows before)`, the work units of one large Parquet file."""
    pa = _pyarrow(name)
    try:
        meta = pa.parquet.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as exc:
        raise _damaged(name, "parquet", exc) from None
    pieces: list[tuple[int, int, int]] = []
    first = rows = size = before = 0
    for i in range(meta.num_row_groups):
        group = meta.row_group(i)
        size += group.total_byte_size
        rows += group.num_rows
        if size >= target or i == meta.num_row_groups - 1:
            pieces.append((first, i + 1, before))
            first, before, size = i + 1, rows, 0
    return pieces or [(0, 0, 0)]


def row_group_ends(path: str, name: str) -> list[int]:
    """The byte where each row group ends in the file (its column chunks' last byte, from the
    footer): how far the progress of a file read in runs of row groups has come."""
    pa = _pyarrow(name)
    try:
        meta = pa.parquet.ParquetFile(path).metadata
        ends: list[int] = []
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            end = 0
            for c in range(group.num_columns):
                col = group.column(c)
                begin = col.dictionary_page_offset or col.data_page_offset
                end = max(end, begin + col.total_compressed_size)
            ends.append(max(end, ends[-1] if ends else 0))
    except (OSError, pa.ArrowException) as exc:
        raise _damaged(name, "parquet", exc) from None
    return ends


AHEAD_BATCHES = 8  # batches (about BATCH_BYTES each) decoded ahead of the tokenizer
_GROUP_END = object()  # after the last batch of each row group, in `_Reader`'s queue


class _Reader:
    """`--jobs 1`: the text column of one Parquet file's row groups from `first` on, decoded
    on a helper thread up to AHEAD_BATCHES batches ahead, across the pieces the file is cut
    into: the pieces are read one after the other in this process, so the next piece's first
    batches are decoded while the one before is tokenized. (A decoder per piece left the
    tokenizer waiting at the start of every piece: 0.6-0.9 s of 6-7 s on the 1 GB
    benchmark folder.) Each row group's batches are followed by a marker, so a piece takes
    exactly its own and a damaged row group's error is raised in its own piece."""

    def __init__(self, table: Table, first: int) -> None:
        from matrixctl.io import Ahead

        self.table = table
        self.key = (table.path, table.field)
        self.next = first
        self.helper = Ahead(self._produce(first), "matrixctl-columns", AHEAD_BATCHES)
        self.items = iter(self.helper)

    def _produce(self, first: int) -> Iterator[Any]:
        for index in range(first, len(self.table.groups)):
            for col in self.table.group_columns(index):
                yield len(col), list(self.table.cells(col))
            yield _GROUP_END

    def columns(self, first: int, stop: int) -> Iterator[tuple[int, list[Any]]]:
        """The rows and cells (`Table.cells`) of each checked column of row groups `first` to
        `stop` (exclusive), in order."""
        for index in range(first, stop):
            for col in self.items:
                if col is _GROUP_END:
                    break
                yield col
            self.next = index + 1

    def close(self) -> None:
        self.helper.close()


_SHARED: list[_Reader] = []  # readers kept for the next piece of their file (`--jobs 1`)


def _shared_reader(kind: str, path: str, name: str, field: str, first: int) -> _Reader:
    """The reader kept for the piece that starts at row group `first` of `path` (left by the
    piece before it, or started by `prefetch`), else a new one."""
    for reader in _SHARED:
        if reader.key == (path, field) and reader.next == first:
            return reader
    reader = _Reader(Table(kind, path, name, field), first)
    _SHARED.append(reader)
    return reader


def prefetch(path: str, name: str, field: str, first: int) -> None:
    """Start decoding the Parquet file whose piece starting at row group `first` comes next
    (`--jobs 1`, while the last piece of the file before is tokenized: opening a file and
    its first row group took 20-150 ms, which the tokenizer waited for at every file)."""
    _shared_reader("parquet", path, name, field, first)


def _release(reader: _Reader) -> None:
    if reader in _SHARED:
        _SHARED.remove(reader)
    reader.close()


def release_readers() -> None:
    """Stop every decoder kept for a next piece (after an error, or when the caller stops
    reading pieces)."""
    while _SHARED:
        _SHARED.pop().close()


def texts(
    kind: str,
    path: str,
    name: str,
    opts: extract.Options,
    counters: extract.Counters,
    groups: tuple[int, int] | None = None,
    first_row: int = 0,
    *,
    ahead: bool = False,
) -> Iterator[tuple[int, str | bytes | memoryview]]:
    """Every row of a Parquet or Arrow file as `(row number, text)`, or the rows of the row
    groups `groups`, the first of which is row `first_row`; CRLF as LF. A string column's
    text comes as UTF-8 (a memoryview of the column's data, or bytes; see `Table.cells`), a
    struct field's as str. `ahead` (`--jobs 1`, where the second core is free): the next
    columns are read and decoded on a helper thread meanwhile; for the pieces of a file
    (`groups`), one helper runs on from piece to piece (`_Reader`; `release_readers` stops
    it when the caller stops early)."""
    from matrixctl.io import Ahead

    row = first_row
    if ahead and groups is not None:
        reader = _shared_reader(kind, path, name, opts.text_field, groups[0])
        try:
            for rows, made in reader.columns(*groups):
                yield from _texts(iter(made), row, name, opts, counters)
                row += rows
        except BaseException:
            release_readers()
            raise
        if groups[1] >= len(reader.table.groups):
            _release(reader)
        return
    table = Table(kind, path, name, opts.text_field)
    columns: Iterator[tuple[int, Any]] = (
        (len(col), table.cells(col)) for col in table.stream_columns(groups)
    )
    helper = None
    if ahead:  # the cells of each column made on the helper thread too
        helper = Ahead(
            ((n, list(cells)) for n, cells in columns), "matrixctl-columns", AHEAD_BATCHES
        )
    try:
        for rows, made in columns if helper is None else helper:
            yield from _texts(iter(made), row, name, opts, counters)
            row += rows
    finally:
        if helper is not None:
            helper.close()


def documents(
    kind: str,
    path: str,
    name: str,
    opts: extract.Options,
    counters: extract.Counters,
    groups: tuple[int, int] | None = None,
    first_row: int = 0,
) -> Iterator[extract.Doc]:
    """`texts` as documents (`(item, pieces)`, as the other extractors give them)."""
    for row, text in texts(kind, path, name, opts, counters, groups, first_row):
        yield row, iter([text if isinstance(text, str) else str(text, "utf-8")])


KINDS = (
    Kind("parquet", 5, magics=(b"PAR1",), by_path=texts, cut="row-groups"),
    # Arrow IPC files start with ARROW1, Arrow IPC streams (`datasets` save_to_disk) with a
    # continuation marker.
    Kind("arrow", 6, magics=(b"ARROW1", b"\xff\xff\xff\xff"), by_path=texts),
)
