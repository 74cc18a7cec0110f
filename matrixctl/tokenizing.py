"""Library side of `tokenize pi encode|decode` and `tokenize scx decode`: files and pipes in,
token streams or text out (the I/O glue between the tokenizers and the token stream codec)."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, BinaryIO

from matrixctl.errors import FormatError, from_os_error
from matrixctl.io import STDIO, _is_regular, atomic_output, display_name, open_input_stream
from matrixctl.tokenizers import pi

if TYPE_CHECKING:
    from matrixctl.tokenizers.scx import api as scx

READ_CHUNK = 1 << 20


def load_tokenizer(symbols: str | None) -> tuple[pi.SymbolMap, bytes, pi.Tokenizer]:
    """The map (default: the bundled one), its bytes and its tokenizer, through the per-user
    cache (matrixctl/tokenizers/pi_cache.py)."""
    from matrixctl.tokenizers import pi_cache

    return pi_cache.load_tokenizer(symbols or pi.default_map_path())


def encode_file(
    input_path: str,
    output: str,
    *,
    symbols: str | None,
    label: str | None = None,
    form: str = "stream",
    json_ids: BinaryIO | None = None,
    jobs: int = 1,
) -> dict[str, Any]:
    """Stream UTF-8 text into token ids of one document. Returns a summary.

    `jobs` > 1 encodes units of the input in that many worker processes
    (`tokenizers/pi_jobs.py`); the ids, and so every output byte, are the same for any `jobs`.

    `form` is `stream` (a token stream, binary, on `output`), `text` (the ids as one line of
    space-separated decimals on `output`, which `decode` and `pack atoms` read) or `json` (the
    ids comma-separated into `json_ids`, for the command's JSON document; `output` is not
    written). Memory stays flat in every form; text for stdout is spooled and appears only once
    the whole input is encoded, so a failure prints nothing.
    """
    smap, _, tok = load_tokenizer(symbols)
    name = display_name(input_path)
    nbytes = 0
    with open_input_stream(input_path) as raw:

        class Counting:
            def read(self, n: int = -1) -> bytes:
                nonlocal nbytes
                try:
                    data: bytes = raw.read(n)
                except OSError as exc:
                    raise from_os_error(exc, input_path) from None
                nbytes += len(data)
                return data

        fd = raw.fileno() if jobs > 1 and _is_regular(raw) else None
        parts = None
        try:  # the workers, once started, are stopped whatever happens (`parts.close()`)
            if jobs > 1:
                from matrixctl.tokenizers import pi_jobs

                # Started before the output is opened: the first step forks the workers and
                # deals them their first units, which they encode while this process sets up.
                parts = pi_jobs.encode(tok, Counting(), name, jobs, fd=fd)
                try:
                    next(parts)
                except OSError as exc:  # reading near the first cuts
                    raise from_os_error(exc, input_path) from None
            with _output(output, form) as out:
                sink: _IdSink
                if form == "stream":
                    sink = _StreamSink(out, tok.dtype, smap.vocab_size)
                elif form == "json":
                    assert json_ids is not None
                    sink = _TextSink(json_ids, ", ")
                else:
                    sink = _TextSink(out, " ")
                if parts is not None:
                    # A file output is flushed to the disk as it grows, while the workers
                    # encode, so the fsync that commits it has little left to write.
                    flush = _EarlyFlush(out if output != STDIO and form != "json" else None)
                    try:
                        for used, ids in parts:
                            if fd is not None:
                                nbytes += used
                            sink.write_bytes(ids, tok.dtype)
                            flush.check()
                    except OSError as exc:  # a worker's read of the file
                        raise from_os_error(exc, input_path) from None
                    finally:
                        flush.close()
                else:
                    enc = tok.stream()
                    for text in pi.iter_text(Counting(), name, READ_CHUNK):
                        sink.write_bytes(enc.feed_bytes(text), tok.dtype)
                    sink.write_bytes(enc.finish_bytes(), tok.dtype)
                sink.end_document(name if label is None else label)
                crc = sink.close()
        finally:
            if parts is not None:
                parts.close()
    summary: dict[str, Any] = {
        "input": input_path,
        "output": output,
        "bytes": nbytes,
        "tokens": sink.tokens,
        "documents": 1,
        "dtype": tok.dtype,
        "vocab_size": smap.vocab_size,
        "symbol_map": symbols or "(bundled default)",
        "symbol_map_hash": smap.canonical_hash(),
    }
    if crc is not None:
        summary["crc32"] = f"0x{crc:08x}"
    return summary


class _EarlyFlush:
    """Write a file output through to the disk as it grows, on a thread of its own (fdatasync
    each time `EARLY_FLUSH` more bytes were written), so the fsync that commits the file at
    the end has little left to do. `close()` waits for the thread."""

    def __init__(self, out: Any) -> None:
        self.out = out if out is not None and _is_regular(out) else None
        self.done = 0
        self.thread: Any = None

    def check(self) -> None:
        if self.out is None:
            return
        at = self.out.tell()
        if at - self.done < EARLY_FLUSH or (self.thread and self.thread.is_alive()):
            return
        import threading

        self.out.flush()
        self.done = at
        self.thread = threading.Thread(target=_datasync, args=(self.out.fileno(),), daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def _datasync(fd: int) -> None:
    with contextlib.suppress(OSError):  # best effort: the commit's fsync reports failures
        os.fdatasync(fd)


EARLY_FLUSH = 2 << 20


class _IdSink:
    tokens = 0

    def write(self, ids: Any) -> None:
        raise NotImplementedError

    def write_bytes(self, data: bytes, dtype: str) -> None:
        """Ids as the bytes of `dtype` (the tokenizer's own output, every id < vocab_size)."""
        import numpy as np

        self.write(np.frombuffer(data, dtype=dtype))

    def end_document(self, label: str) -> None:
        raise NotImplementedError

    def close(self) -> int | None:
        raise NotImplementedError


FRAME_TOKENS = 1 << 20  # ids per TOKENS frame of an encoded stream (the last one may be short)


class _StreamSink(_IdSink):
    """The token stream: ids regrouped into frames of `FRAME_TOKENS`, so the bytes do not
    depend on how the ids arrive (read sizes of a pipe, --jobs)."""

    def __init__(self, out: Any, dtype: str, vocab_size: int) -> None:
        from matrixctl.formats.token_stream import TokenStreamWriter

        self.writer = TokenStreamWriter(out, dtype=dtype, vocab_size=vocab_size)
        self.frame = FRAME_TOKENS * self.writer.header.itemsize
        self.pending = bytearray()

    def write_bytes(self, data: bytes, dtype: str) -> None:
        # No numpy: a one-line input starts fast.
        pending = self.pending
        pending += data
        if len(pending) >= self.frame:
            view = memoryview(pending)
            whole = len(pending) - len(pending) % self.frame
            for start in range(0, whole, self.frame):
                self.writer.write_bytes(view[start : start + self.frame])
            view.release()
            del pending[:whole]
        self.tokens += len(data) // self.writer.header.itemsize

    def end_document(self, label: str) -> None:
        if self.pending:
            self.writer.write_bytes(bytes(self.pending))
            self.pending.clear()
        self.writer.end_document(label)

    def close(self) -> int:
        return self.writer.close().crc32


class _TextSink(_IdSink):
    """Decimal ids joined by `sep`; a newline ends each document in the text form (`sep` is a
    space); the JSON form (`sep` is a comma) has no document ends: one array."""

    def __init__(self, out: Any, sep: str) -> None:
        self.out = out
        self.sep = sep

    def write(self, ids: Any) -> None:
        if ids.size == 0:
            return
        text = self.sep.join(map(str, ids.tolist()))
        self.out.write((self.sep + text if self.tokens else text).encode("ascii"))
        self.tokens += int(ids.size)

    def end_document(self, label: str) -> None:
        if self.sep == " ":
            self.out.write(b"\n")  # one line per document

    def close(self) -> None:
        return None


@contextmanager
def _output(path: str, form: str) -> Iterator[BinaryIO]:
    """Binary streams go through `atomic_output` (refused on a terminal); text may go to a
    terminal, but is spooled there too, so a failed run prints nothing to stdout. The JSON
    form writes no output here."""
    if form == "json":
        yield io.BytesIO()  # never written: the ids go to the JSON document
        return
    if form == "stream" or path != STDIO:
        with atomic_output(path, what="a token stream" if form == "stream" else "token ids") as out:
            yield out
        return
    import shutil
    import tempfile

    with tempfile.TemporaryFile(prefix="matrixctl-out-") as tmp:
        yield tmp
        tmp.seek(0)
        out = sys.stdout.buffer
        shutil.copyfileobj(tmp, out, READ_CHUNK)
        out.flush()


def decode_file(input_path: str, output: str, *, symbols: str | None, errors: str) -> None:
    """Token stream (or text ids) to UTF-8 text, streamed; atomic when writing a file."""
    from matrixctl.atoms import read_token_input

    smap, _, tok = load_tokenizer(symbols)
    name = display_name(input_path)
    with open_input_stream(input_path) as raw:
        tokens = read_token_input(raw)
        if tokens.vocab_size is not None and tokens.vocab_size != smap.vocab_size:
            raise FormatError(
                pi.PI_DECODE_ID,
                f"the stream declares vocab_size {tokens.vocab_size}, the map has "
                f"{smap.vocab_size}: it was not made with this map",
                path=name,
                field="vocab_size",
            )
        dec = pi.StreamDecoder(tok, errors=errors)
        if output == STDIO:
            _decode_to(sys.stdout.buffer, tokens.chunks, dec, name)
        else:
            with atomic_output(output, what="text") as out:
                _decode_to(out, tokens.chunks, dec, name)


def _decode_to(out: Any, chunks: Any, dec: pi.StreamDecoder, name: str) -> None:
    try:
        for chunk, _max_id, _crc in chunks:
            text = dec.feed(chunk)
            if text:
                out.write(text.encode("utf-8", "surrogatepass"))
        out.write(dec.finish().encode("utf-8", "surrogatepass"))
        out.flush()
    except FormatError as err:
        raise err.with_path(name) from None


def decode_token_stream(
    tok: scx.Tokenizer,
    fp: Any,
    out: Any,
    *,
    strict: bool = True,
    tick: Any = None,
    name: str = "<stdin>",
) -> dict[str, Any]:
    """Decode an MXTOKENS token stream read from `fp` into `out` (a binary file).

    Errors name the token index and, where known, the byte offset of that token in the input.
    """
    import numpy as np

    from matrixctl.formats import token_stream
    from matrixctl.io import read_exact
    from matrixctl.tokenizers.scx import tokens as scx_tokens
    from matrixctl.tokenizers.scx.api import Decoder, ScxFailure, fail

    head = read_exact(fp, token_stream.HEADER_SIZE, "token stream header", offset=0)
    if not head.startswith(token_stream.MAGIC):
        raise FormatError(
            "UNKNOWN_FORMAT",
            f"not a matrixctl token stream (MXTOKENS): {head[:8]!r}",
            path=name,
            offset=0,
        )
    header = token_stream.StreamHeader.parse(head)
    dec = Decoder(tok, strict_invertibility=strict)
    frames: list[tuple[int, int]] = []  # (first token index, byte offset of its ids)
    tokens = 0
    written = 0

    def where(err: ScxFailure) -> ScxFailure:
        idx = err.issue.token_index
        if idx is not None and frames:
            import bisect

            k = bisect.bisect_right([f[0] for f in frames], idx) - 1
            if k >= 0:
                first, off = frames[k]
                err.offset = off + (idx - first) * header.itemsize
        err.path = name
        return err

    try:
        for event in token_stream.iter_events(_Ticking(fp, tick), header):
            if event.kind != token_stream.KIND_TOKENS:
                continue
            ids = event.tokens
            if ids.dtype != np.dtype("<u2"):
                high = np.flatnonzero(ids > 0xFFFF)
                if high.size:
                    i = tokens + int(high[0])
                    raise fail(
                        scx_tokens.UNKNOWN_TOKEN,
                        f"token id {int(ids[high[0]])} does not fit SCX's u16 token space",
                        token_index=i,
                    )
                ids = ids.astype("<u2")
            frames.append((tokens, event.offset + token_stream.FRAME_SIZE))
            tokens += ids.size
            for part in dec.feed(ids):
                out.write(part.data)
                written += part.size
        for part in dec.finish():
            out.write(part.data)
            written += part.size
    except ScxFailure as err:
        raise where(err) from None
    except FormatError as err:
        raise err.with_path(name) from None
    return {"tokens": tokens, "bytes": written, "warnings": dec.warnings}


class _Ticking:
    """The token stream reader of `decode_token_stream`: counts what it reads, and reads of
    REUSE_BYTES or more (token frame bodies) land in one buffer it keeps, returned as a view
    that the next such read overwrites. The SCX decoder copies what it keeps of its input, so
    nothing reads a frame after the next; a fresh buffer per frame (2 MiB) cost a page fault
    per 4 KiB, two thirds of decode's faults. A reused read is whole (it loops over short
    reads) or ends at the end of the input, so no caller joins two of them."""

    REUSE_BYTES = 1 << 16

    def __init__(self, fp: Any, tick: Any) -> None:
        self._fp = fp
        self._tick = tick
        self._buf = bytearray()
        self._readinto = getattr(fp, "readinto", None)

    def read(self, n: int = -1) -> Any:
        if n < self.REUSE_BYTES or self._readinto is None:
            data = self._fp.read(n)
        else:
            if len(self._buf) < n:
                self._buf = bytearray(n)  # a view of the old one keeps it alive
            view = memoryview(self._buf)[:n]
            got = 0
            while got < n:
                more = self._readinto(view[got:])
                if not more:
                    break
                got += more
            data = view[:got]
        if self._tick:
            self._tick(len(data))
        return data


# Model tokenizers (`tokenize model`) --------------------------------------------------------

MODEL_INPUT_MAX = 1 << 31  # bytes of text one `tokenize model encode` takes (one document)


def model_encode_file(
    input_path: str,
    output: str,
    *,
    model: str,
    label: str | None = None,
    form: str = "stream",
    json_ids: BinaryIO | None = None,
    add_special: bool = False,
    jobs: int = 1,
    record: bool = True,
) -> dict[str, Any]:
    """UTF-8 text into the model's token ids, as one document (`encode_file`'s forms).
    `jobs` > 1 encodes parts of a large text in that many processes where the tokenizer's
    pre-tokenizer allows it (`tokenizers/model/jobs.py`): the same ids. `record`: the summary
    holds the tokenizer's record (its source's SHA-256: a whole model GGUF is read for it);
    without, only its family and pre-tokenizer.

    A model tokenizer encodes a text whole (its pre-tokenizer and merges see all of it), so
    the input is read into memory first, up to MODEL_INPUT_MAX bytes; the output is written
    only once every id is known, so a failure leaves nothing."""
    import numpy as np

    from matrixctl.tokenizer_files import load_model_tokenizer
    from matrixctl.tokenizers.model.base import TOKENIZER_TEXT

    tok, source = load_model_tokenizer(model)
    name = display_name(input_path)
    with open_input_stream(input_path) as raw:
        try:
            data = raw.read(MODEL_INPUT_MAX + 1)
        except OSError as exc:
            raise from_os_error(exc, input_path) from None
    if len(data) > MODEL_INPUT_MAX:
        raise FormatError(
            TOKENIZER_TEXT,
            f"larger than {MODEL_INPUT_MAX:,} bytes: one document is encoded in memory",
            path=name,
            offset=MODEL_INPUT_MAX,
        )
    text = _utf8(data, name, TOKENIZER_TEXT)
    dtype = "uint16" if tok.vocab_size <= 1 << 16 else "uint32"
    from matrixctl.tokenizers.model.jobs import encode_parallel

    found = encode_parallel(tok, text, jobs)
    if add_special:
        if tok.add_bos and tok.bos_id is not None:
            found.insert(0, tok.bos_id)
        if tok.add_eos and tok.eos_id is not None:
            found.append(tok.eos_id)
    ids = np.asarray(found, dtype=np.dtype(dtype).newbyteorder("<"))
    with _output(output, form) as out:
        sink: _IdSink
        if form == "stream":
            sink = _StreamSink(out, dtype, tok.vocab_size)
        elif form == "json":
            assert json_ids is not None
            sink = _TextSink(json_ids, ", ")
        else:
            sink = _TextSink(out, " ")
        sink.write_bytes(ids.tobytes(), dtype)
        sink.end_document(name if label is None else label)
        crc = sink.close()
    summary: dict[str, Any] = {
        "input": input_path,
        "output": output,
        "bytes": len(data),
        "tokens": int(ids.size),
        "documents": 1,
        "dtype": dtype,
        "vocab_size": tok.vocab_size,
        "tokenizer": (
            source.record(tok) if record else {"family": tok.family, "pre_tokenizer": tok.pre}
        ),
        "add_special": add_special,
    }
    if crc is not None:
        summary["crc32"] = f"0x{crc:08x}"
    return summary


def _utf8(data: bytes, name: str, code: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(
            code,
            f"not UTF-8 text: {exc.reason} at byte {exc.start}",
            path=name,
            offset=exc.start,
        ) from None


def model_decode_file(input_path: str, output: str, *, model: str, errors: str) -> None:
    """A token stream (or text ids) to UTF-8 text with the model's tokenizer; atomic when
    writing a file. The ids are decoded together (SentencePiece drops the first leading space
    and WordPiece joins pieces across the whole sequence)."""
    import numpy as np

    from matrixctl.atoms import read_token_input
    from matrixctl.tokenizer_files import load_model_tokenizer
    from matrixctl.tokenizers.model.base import TOKENIZER_DECODE_UTF8, TOKENIZER_ID

    tok, _ = load_model_tokenizer(model)
    name = display_name(input_path)
    with open_input_stream(input_path) as raw:
        tokens = read_token_input(raw)
        if tokens.vocab_size is not None and tokens.vocab_size != tok.vocab_size:
            raise FormatError(
                TOKENIZER_ID,
                f"the stream declares vocab_size {tokens.vocab_size}, the model has "
                f"{tok.vocab_size}: it was not made with this tokenizer",
                path=name,
                field="vocab_size",
            )
        parts = [np.asarray(chunk, dtype=np.int64) for chunk, _max, _crc in tokens.chunks]
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= tok.vocab_size))
    if bad.size:
        i = int(bad[0])
        raise FormatError(
            TOKENIZER_ID,
            f"token {i} is id {int(ids[i])}, outside the vocabulary [0, {tok.vocab_size})",
            path=name,
            field=f"ids[{i}]",
        )
    data = tok.decode_bytes(ids.tolist())
    if errors == "strict":
        _utf8(data, name, TOKENIZER_DECODE_UTF8)
    else:
        data = data.decode("utf-8", "replace").encode("utf-8")
    if output == STDIO:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        with atomic_output(output, what="text") as out:
            out.write(data)
