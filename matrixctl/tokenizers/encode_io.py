"""Library side of `tokenize pi encode|decode`: files and pipes in, token streams or text out."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

from matrixctl.errors import FormatError, from_os_error
from matrixctl.io import STDIO, atomic_output, display_name, open_input_stream
from matrixctl.tokenizers import pi

READ_CHUNK = 1 << 20


def load_tokenizer(symbols: str | None) -> tuple[pi.SymbolMap, bytes, pi.Tokenizer]:
    path = symbols or pi.default_map_path()
    smap, raw = pi.load_symbol_map(path)
    return smap, raw, pi.Tokenizer(smap)


def encode_file(
    input_path: str,
    output: str,
    *,
    symbols: str | None,
    label: str | None = None,
    form: str = "stream",
) -> dict[str, Any]:
    """Stream UTF-8 text into token ids of one document. Returns a summary.

    `form` is `stream` (a token stream, binary), `text` (the ids as one line of
    whitespace-separated decimals, which `decode` and `pack atoms` read) or `json` (one JSON
    document on `output`: the summary with the ids last). Memory stays flat in every form: text
    and JSON are spooled to a temporary file and appear only once the whole input is encoded.
    """
    smap, _, tok = load_tokenizer(symbols)
    name = display_name(input_path)
    nbytes = 0
    with (
        open_input_stream(input_path) as raw,
        _output(output, form) as out,
        contextlib.ExitStack() as stack,
    ):

        class Counting:
            def read(self, n: int = -1) -> bytes:
                nonlocal nbytes
                try:
                    data: bytes = raw.read(n)
                except OSError as exc:
                    raise from_os_error(exc, input_path) from None
                nbytes += len(data)
                return data

        sink: _IdSink = (
            _StreamSink(out, tok.dtype, smap.vocab_size)
            if form == "stream"
            else _TextSink(
                out, stack.enter_context(tempfile.TemporaryFile()) if form == "json" else None
            )
        )
        enc = tok.stream()
        for text in pi.iter_text(Counting(), name, READ_CHUNK):
            sink.write(enc.feed(text))
        sink.write(enc.finish())
        sink.end_document(name if label is None else label)
        crc = sink.close()
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
        if form == "json":
            assert isinstance(sink, _TextSink)
            sink.finish_json(summary)
    return summary


class _IdSink:
    tokens = 0

    def write(self, ids: Any) -> None:
        raise NotImplementedError

    def end_document(self, label: str) -> None:
        raise NotImplementedError

    def close(self) -> int | None:
        raise NotImplementedError


class _StreamSink(_IdSink):
    def __init__(self, out: Any, dtype: str, vocab_size: int) -> None:
        from matrixctl.formats.token_stream import TokenStreamWriter

        self.writer = TokenStreamWriter(out, dtype=dtype, vocab_size=vocab_size)

    def write(self, ids: Any) -> None:
        self.writer.write(ids)
        self.tokens = self.writer.tokens

    def end_document(self, label: str) -> None:
        self.writer.end_document(label)

    def close(self) -> int:
        return self.writer.close().crc32


class _TextSink(_IdSink):
    """Decimal ids: space-separated on `out`, or for JSON comma-separated in `spool` first (the
    document's counts come before its ids)."""

    def __init__(self, out: Any, spool: Any = None) -> None:
        self.out = out
        self.spool = spool
        self.json = spool is not None
        self.sep = ", " if self.json else " "
        self.target = spool if self.json else out

    def write(self, ids: Any) -> None:
        if ids.size == 0:
            return
        text = self.sep.join(map(str, ids.tolist())).encode("ascii")
        self.target.write(self.sep.encode() + text if self.tokens else text)
        self.tokens += int(ids.size)

    def end_document(self, label: str) -> None:
        if not self.json:
            self.target.write(b"\n")  # one line per document

    def close(self) -> None:
        return None

    def finish_json(self, summary: dict[str, Any]) -> None:
        """Write the document: the summary's fields, then `"ids": [...]` copied from the spool."""
        head = json.dumps(summary, indent=2, ensure_ascii=False)
        self.out.write(
            head[: head.rindex("\n}")].encode("utf-8", "backslashreplace") + b',\n  "ids": ['
        )
        self.spool.seek(0)
        shutil.copyfileobj(self.spool, self.out, READ_CHUNK)
        self.out.write(b"]\n}\n")


@contextmanager
def _output(path: str, form: str) -> Iterator[BinaryIO]:
    """Binary streams go through `atomic_output` (refused on a terminal); text and JSON may go
    to a terminal, but are spooled there too, so a failed run prints nothing to stdout."""
    if form == "stream" or path != STDIO:
        with atomic_output(path, what="a token stream" if form == "stream" else "token ids") as out:
            yield out
        return
    with tempfile.TemporaryFile(prefix="matrixctl-out-") as tmp:
        yield tmp
        tmp.seek(0)
        out = sys.stdout.buffer
        shutil.copyfileobj(tmp, out, READ_CHUNK)
        out.flush()


def decode_file(input_path: str, output: str, *, symbols: str | None, errors: str) -> None:
    """Token stream (or text ids) to UTF-8 text, streamed; atomic when writing a file."""
    from matrixctl.packing import read_token_input

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
