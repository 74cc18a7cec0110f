"""Parquet and Arrow IPC inputs of `ingest docs` (docs/inputs.md), through pyarrow.

pyarrow is an optional extra (`pip install 'matrixctl[parquet]'`), imported only here. A file
is streamed a row group (Parquet) or a record batch (Arrow) at a time; only the text column is
read. Each row is one document; its item in the document index is its row number in the file.
`--text-field a.b` reads the column `a` and, inside its struct values, the field `b` (a column
named `a.b` itself wins, as a key named `a.b` does in JSON). A null
or non-string cell is handled like a JSON record without the field (skipped and counted, or an
error under `--missing-field error`); a column that is not text (a list, an integer) is an
error naming its type. The documents do not depend on how the file is cut into row groups or
batches.

Hostile files (docs/inputs.md, "Parquet and Arrow"): memory is bounded whatever the file says.
A dictionary-encoded column is read as a dictionary and each cell is a view of its entry (one
20 MiB entry used by 5,000 rows is 20 MiB, not 100 GB), and its length is checked against
--max-doc-size before any text is made; Parquet page checksums are verified where the file
has them; an Arrow stream must end with its end-of-stream marker.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.ingest.kinds import base as extract
from matrixctl.ingest.kinds import parquet_pages
from matrixctl.ingest.kinds.base import Kind

BATCH_ROWS = 1024  # rows converted to Python strings at a time, at most...
BATCH_BYTES = 1 << 20  # ...and about this many bytes of text (from the footer's sizes)
READ_BUFFER = 1 << 20  # Parquet: column chunks are read through a buffer of this size
DECODED = 16 << 20  # most text bytes one batch of a dictionary-encoded column may decode to
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's end (continuation, length 0)
INGEST_PARQUET_CRC = codes.define(
    "INGEST_PARQUET_CRC",
    "A Parquet page's CRC-32 does not match its bytes (verified where the writer stored one).",
    group="ingest",
)


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


_KIND_NAMES = {"parquet": "Parquet", "arrow": "Arrow IPC"}


def _reason(exc: BaseException) -> str:
    """pyarrow's reason as one short clause: its first line, without the error class and the
    C++ source locations it sometimes carries."""
    import re

    text = str(exc).strip().split("\n", 1)[0]
    text = re.sub(r"^(?:Invalid|IOError|ArrowInvalid|Arrow error|NotImplemented):\s*", "", text)
    text = re.sub(r"\S*/(?:cpp|src)/\S+:\d+\s*", "", text).strip(" :")
    if not text:
        text = type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _damaged(name: str, kind: str, exc: BaseException) -> FormatError:
    reason = _reason(exc)
    if "CRC" in reason or "checksum" in reason.lower():
        return FormatError(
            INGEST_PARQUET_CRC,
            f"a page's CRC-32 does not match its bytes: the {_KIND_NAMES[kind]} file is damaged",
            path=name,
        )
    return FormatError(
        extract.INGEST_COLUMNAR,
        f"is not a readable {_KIND_NAMES[kind]} file (damaged or truncated: {reason})",
        path=name,
    )


def _not_a_file(name: str, kind: str) -> FormatError:
    return FormatError(
        extract.INGEST_COLUMNAR,
        f"a {kind} input must be a file as stored (it is read by its footer), "
        "not a compressed file or stdin",
        path=name,
        hint="save it to a file first",
    )


def _text_type(pa: Any, kind: Any) -> bool:
    """A column type whose cells are read as text (nulls are skipped rows)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_null(kind)
        or getattr(pa.types, "is_string_view", lambda _: False)(kind)
    )


class Table:
    """One Parquet or Arrow file: its row groups / batches and the text column."""

    def __init__(
        self, kind: str, path: str, name: str, field: str, max_doc: int = extract.MAX_WHOLE
    ) -> None:
        self.pa = _pyarrow(name)
        if name == "-":
            raise _not_a_file(name, kind)
        self.kind = kind
        self.name = name
        self.path = path
        self.field = field
        self.max_doc = max_doc
        self.top, self.inner = field, []
        self.pf_dict: Any = None
        self.last_dictionary: Any = None  # the dictionary of the last batch (`cells`)
        self.chunks: list[tuple[int, int, bool]] | None = None  # `_column_chunks`
        try:
            if kind == "parquet":
                # Memory (docs/inputs.md, "Parquet and Arrow"): batches hold about
                # BATCH_BYTES of text and are decoded on this thread only (`group_texts`).
                # A buffered stream (1 MiB reads) of each column chunk, not the whole chunk
                # read into memory first: the same batches; decoding the 1 GB benchmark
                # folder alone peaked at 311 MB instead of 336-344 MB (docs/benchmarks.md).
                self.pf = self.pa.parquet.ParquetFile(
                    path,
                    pre_buffer=False,
                    buffer_size=READ_BUFFER,
                    page_checksum_verification=True,
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
        self._check_type()

    def _check_type(self) -> None:
        """The text column (or struct field) must hold text: a list or an integer column is
        an error naming it and its type, not a file of skipped rows."""
        pa = self.pa
        kind = self.schema.field(self.top).type
        where = self.top
        for key in self.inner:
            if not pa.types.is_struct(kind) or kind.get_field_index(key) < 0:
                raise FormatError(
                    extract.INGEST_TEXT_FIELD,
                    f"column {where!r} ({kind}) has no field {key!r}",
                    path=self.name,
                    field=self.field,
                    hint="choose the column with --text-field",
                )
            kind = kind.field(key).type
            where = f"{where}.{key}"
        if not _text_type(pa, kind):
            raise FormatError(
                extract.INGEST_TEXT_FIELD,
                f"column {where!r} is {kind}, not text (string)",
                path=self.name,
                field=self.field,
                hint="choose a string column with --text-field",
            )

    def _inner(self, col: Any) -> Any:
        """The struct field `--text-field a.b` names, as its own array (a null struct gives a
        null cell)."""
        from pyarrow import compute

        for key in self.inner:
            col = compute.struct_field(col, key)
        return col

    def _dict_file(self) -> Any:
        if self.pf_dict is None:
            self.pf_dict = self.pa.parquet.ParquetFile(
                self.path,
                pre_buffer=False,
                buffer_size=READ_BUFFER,
                page_checksum_verification=True,
                read_dictionary=[".".join([self.top, *self.inner])],
            )
        return self.pf_dict

    def _check_pages(self, index: int, start: int, end: int) -> None:
        """Refuse row group `index` before any page of its text column is decompressed when a
        page's own header proves a value over --max-doc-size: its values average more than
        the limit (a 300 MB cell is one page of one value; a 10 KB file). The headers are
        read from the file; the pages are not."""
        try:
            with open(self.path, "rb") as fp:
                pages = list(parquet_pages.pages(fp, start, end))
        except (OSError, ValueError) as exc:
            raise _damaged(self.name, self.kind, exc) from None
        for _kind, size, values in pages:
            if values and (size - 4 * values) // values > self.max_doc:
                first = sum(self.groups[:index])
                last = first + max(1, self.groups[index]) - 1
                rows = f"row {first}" if first == last else f"rows {first} to {last}"
                raise FormatError(
                    extract.INGEST_TOO_LARGE,
                    f"{rows} (row group {index}) hold a cell larger than --max-doc-size "
                    f"({self.max_doc:,} bytes): a page of {size:,} bytes for {values:,} "
                    f"value{'s' if values > 1 else ''}, refused before it is read",
                    path=self.name,
                    field=self.field,
                )

    def _plan(self, index: int) -> tuple[Any, int]:
        """How row group `index` is read: the file object and rows per batch. A column chunk
        with a dictionary page has its dictionary looked at first (one row read as a
        dictionary): its longest entry `n` bounds what a row decodes to, so batches of
        DECODED // n rows decode to at most DECODED bytes; an entry longer than DECODED or
        --max-doc-size, and the chunk is read as a dictionary (each cell a view of its entry,
        its length checked before any text is made). Plain pages hold their text: the
        footer's sizes are what they decode to."""
        rows = self.rows[index]
        if self.chunks is None:
            try:
                self.chunks = parquet_pages.column_chunks(
                    self.path, ".".join([self.top, *self.inner])
                )
            except (OSError, ValueError, RecursionError) as exc:
                raise _damaged(self.name, self.kind, exc) from None
        if index >= len(self.chunks) or self.chunks[index][1] <= self.chunks[index][0]:
            return self.pf, rows
        start, end, has_dictionary = self.chunks[index]
        self._check_pages(index, start, end)
        if not has_dictionary:
            return self.pf, rows
        first = next(
            self._dict_file().iter_batches(
                batch_size=1, row_groups=[index], columns=[self.top], use_threads=False
            ),
            None,
        )
        if first is None:
            return self.pf, rows
        col = first.column(0)
        if self.inner:
            col = self._inner(col)
        if not self.pa.types.is_dictionary(col.type):
            return self.pf, rows
        longest = _longest_entry(col.dictionary)
        if longest > min(DECODED, self.max_doc):
            return self._dict_file(), BATCH_ROWS
        return self.pf, max(1, min(rows, DECODED // max(1, longest)))

    def group_columns(self, index: int) -> Iterator[Any]:
        """The text column of row group / batch `index`, as checked Arrow arrays of at most
        BATCH_ROWS rows (about BATCH_BYTES of text)."""
        try:
            if self.kind == "parquet":
                pf, rows = self._plan(index)
                for batch in pf.iter_batches(
                    batch_size=rows,
                    row_groups=[index],
                    columns=[self.top],
                    use_threads=False,  # one column: threads only add buffers
                ):
                    yield self._column(batch.column(0))
            else:
                col = self.reader.get_batch(index).column(self.top)
                for start in range(0, len(col), BATCH_ROWS):
                    yield self._column(col.slice(start, BATCH_ROWS))
        except (OSError, KeyError, UnicodeDecodeError, self.pa.ArrowException) as exc:
            raise _damaged(self.name, self.kind, exc) from None

    def _column(self, col: Any) -> Any:
        col = _checked(col)
        return self._inner(col) if self.inner else col

    def group_texts(self, index: int) -> Iterator[list[Any]]:
        """The text column of row group / batch `index`, BATCH_ROWS Python values at a time."""
        for col in self.group_columns(index):
            yield self._values(col)

    def _values(self, col: Any) -> list[Any]:
        try:
            values: list[Any] = col.to_pylist()
        except (UnicodeDecodeError, self.pa.ArrowException) as exc:
            raise _damaged(self.name, self.kind, exc) from None
        return values

    def stream_columns(self, groups: tuple[int, int] | None = None) -> Iterator[Any]:
        """Every row group / batch in order (an Arrow stream is read as it comes), or those
        of `groups` (a range of row group numbers), as checked Arrow arrays."""
        if self.kind == "arrow" and self.reader is None:
            try:
                while True:
                    before = self.source.tell()
                    try:
                        batch = self.batches.read_next_batch()
                    except StopIteration:
                        break
                    yield self._column(batch.column(self.top))
                self._check_end(before)
            except (OSError, KeyError, UnicodeDecodeError, self.pa.ArrowException) as exc:
                raise _damaged(self.name, self.kind, exc) from None
            return
        first, stop = groups if groups is not None else (0, len(self.groups))
        for index in range(first, stop):
            yield from self.group_columns(index)

    def _check_end(self, before: int) -> None:
        """An Arrow stream ends with its end-of-stream marker (or the 4 zero bytes of the
        format before 0.15): a stream cut between two record batches reads like a whole one
        to pyarrow, and is an error here."""
        after = self.source.tell()
        self.source.seek(before)
        end = self.source.read(after - before)
        if end not in (EOS, EOS[4:]):
            raise FormatError(
                extract.INGEST_COLUMNAR,
                "is not a readable Arrow IPC file (truncated: the stream ends after "
                f"{before:,} bytes without its end-of-stream marker)",
                path=self.name,
                offset=before,
            )

    def stream_texts(self, groups: tuple[int, int] | None = None) -> Iterator[list[Any]]:
        """`stream_columns` as lists of Python values."""
        for col in self.stream_columns(groups):
            yield self._values(col)

    def cells(self, col: Any) -> Iterator[str | bytes | memoryview | _Oversized | None]:
        """The text of each row of a checked column: a string column's cells straight from
        its Arrow buffers (offsets and UTF-8 data, checked by `_checked`), each a memoryview
        of the column's data (no copy, no Python string), or bytes for a cell holding a
        carriage return (its CRLF is replaced, so it is copied); None for a null. A
        dictionary-encoded column's cells are views of their entries
        (`_dictionary_cells`); a string view column goes through Python values (str) in
        bounded runs (`_other_cells`)."""
        pa = self.pa
        kind = col.type
        if pa.types.is_dictionary(kind):
            # pyarrow gives each batch of a row group its own copy of the dictionary: the
            # cells of a batch whose dictionary equals the one before are views of that one,
            # so batches decoded ahead hold one copy, not one each (20 MiB each, measured).
            values = col.dictionary
            last = self.last_dictionary
            if last is not None and len(last) == len(values) and last.equals(values):
                values = last
            self.last_dictionary = values
            yield from _dictionary_cells(pa, col.indices, values)
            return
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            yield from self._other_cells(col)
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

    def _other_cells(self, col: Any) -> Iterator[str | _Oversized | None]:
        """Cells of another type (a string view, nulls) through Python values, in runs of
        rows whose text is at most DECODED bytes (a view array can point many rows at one
        long value); a cell over --max-doc-size is never made (`_Oversized`)."""

        if self.pa.types.is_null(col.type):
            yield from (None for _ in range(len(col)))
            return
        sizes = _view_lengths(col)
        start = 0
        while start < len(col):
            stop, total = start, 0
            while stop < len(col) and sizes[stop] <= self.max_doc:
                if stop > start and total + sizes[stop] > DECODED:
                    break
                total += sizes[stop]
                stop += 1
            for value in self._values(col.slice(start, stop - start)):
                yield value if isinstance(value, str) else None
            if stop < len(col) and sizes[stop] > self.max_doc:
                yield _Oversized(sizes[stop])
                stop += 1
            start = stop


def _view_lengths(col: Any) -> list[int]:
    """Each cell's length in bytes, from a string view column's views (16 bytes each, the
    length first, little-endian int32; checked by the full validation), 0 for a null."""
    import numpy as np

    views = col.buffers()[1]
    if views is None or len(col) == 0:
        return [0] * len(col)
    lengths = np.frombuffer(views, dtype="<i4").reshape(-1, 4)[
        col.offset : col.offset + len(col), 0
    ]
    out = np.maximum(lengths, 0)
    if col.null_count:
        out = np.where(col.is_null().to_numpy(zero_copy_only=False), 0, out)
    return [int(n) for n in out.tolist()]


class _Oversized:
    """A cell longer than --max-doc-size, not made: only its length."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def _longest_entry(dictionary: Any) -> int:
    """The longest entry of a dictionary of strings, in bytes (from its offsets)."""
    from pyarrow import compute

    if len(dictionary) == 0:
        return 0
    longest = compute.max(compute.binary_length(dictionary)).as_py()
    return int(longest or 0)


def _dictionary_cells(pa: Any, indices: Any, values: Any) -> Iterator[bytes | memoryview | None]:
    """The cells of a dictionary-encoded string column, each a view of its entry in the
    dictionary's data (never decoded per row), or bytes for an entry holding a carriage
    return (copied once per entry, shared by its rows); None for a null."""
    import numpy as np

    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        yield from (None for _ in range(len(indices)))  # not text: refused at open
        return
    entries = len(values)
    if len(indices) == 0:
        return
    width = np.int64 if pa.types.is_large_string(values.type) else np.int32
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=width)[values.offset : values.offset + entries + 1]
    bounds = offsets.tolist()
    data = memoryview(data_buf if data_buf is not None else b"")
    empty = values.null_count and values.is_null().to_numpy(zero_copy_only=False).tolist()
    nulls = (
        indices.is_null().to_numpy(zero_copy_only=False).tolist() if indices.null_count else None
    )
    picks = indices.fill_null(0).to_numpy(zero_copy_only=False).tolist()
    # The entries with a carriage return, from one scan of the dictionary's text; each is
    # copied once (`_texts` replaces its CRLF) and the copy shared by its rows.
    copies: dict[int, bytes] = {}
    if bounds[-1] > bounds[0]:
        text = np.frombuffer(data, dtype=np.uint8)[bounds[0] : bounds[-1]]
        at = np.flatnonzero(text == 13)
        if at.size:
            for j in set((np.searchsorted(offsets, at + bounds[0], side="right") - 1).tolist()):
                copies[j] = bytes(data[bounds[j] : bounds[j + 1]])
    for i, j in enumerate(picks):
        if (nulls is not None and nulls[i]) or (empty and empty[j]):
            yield None
        elif j in copies:
            yield copies[j]
        else:
            yield data[bounds[j] : bounds[j + 1]]


def _checked(col: Any) -> Any:
    """A column with its buffers checked. Arrow IPC buffers are taken as stored: string offsets
    past the data made to_pylist fail with SystemError (found by
    fuzz/fuzz_columnar_arrow.py), and the cells are read from the buffers directly. A full
    validation (offsets, UTF-8) turns damage into ArrowInvalid, reported as
    INGEST_COLUMNAR."""
    col.validate(full=True)
    if hasattr(col, "dictionary"):  # the entries too; an index past them is refused above
        col.dictionary.validate(full=True)
    return col


def _texts(
    cells: Iterator[str | bytes | memoryview | _Oversized | None],
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
        if isinstance(value, _Oversized) or (
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
        assert not isinstance(value, _Oversized)
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
    if name == "-":
        raise _not_a_file(name, "parquet")
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
        groups = pa.parquet.ParquetFile(path).metadata.num_row_groups
        ends: list[int] = []
        for _start, end, _dict in parquet_pages.column_chunks(path, None):
            ends.append(max(end, ends[-1] if ends else 0))
    except (OSError, ValueError, RecursionError, pa.ArrowException) as exc:
        raise _damaged(name, "parquet", exc) from None
    if len(ends) != groups:
        raise _damaged(name, "parquet", ValueError("the footer's row groups do not add up"))
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


def _shared_reader(
    kind: str, path: str, name: str, field: str, first: int, max_doc: int = extract.MAX_WHOLE
) -> _Reader:
    """The reader kept for the piece that starts at row group `first` of `path` (left by the
    piece before it, or started by `prefetch`), else a new one."""
    for reader in _SHARED:
        if reader.key == (path, field) and reader.next == first:
            return reader
    reader = _Reader(Table(kind, path, name, field, max_doc), first)
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
        reader = _shared_reader(kind, path, name, opts.text_field, groups[0], opts.max_doc)
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
    table = Table(kind, path, name, opts.text_field, opts.max_doc)
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
