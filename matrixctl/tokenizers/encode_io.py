"""Library side of `tokenize pi encode|decode`: files and pipes in, token streams or text out."""

from __future__ import annotations

import sys
from typing import Any

from matrixctl.errors import FormatError, from_os_error
from matrixctl.io import STDIO, atomic_output, display_name, open_input_stream
from matrixctl.tokenizers import pi

READ_CHUNK = 1 << 20


def load_tokenizer(symbols: str | None) -> tuple[pi.SymbolMap, bytes, pi.Tokenizer]:
    """The map (default: the bundled one), its bytes and its tokenizer, through the per-user
    cache (matrixctl/tokenizers/pi_cache.py)."""
    from matrixctl.tokenizers import pi_cache

    return pi_cache.load_tokenizer(symbols or pi.default_map_path())


def encode_file(
    input_path: str, output: str, *, symbols: str | None, label: str | None = None
) -> dict[str, Any]:
    """Stream UTF-8 text into a token stream with one document. Returns a summary."""
    from matrixctl.formats.token_stream import TokenStreamWriter

    smap, _, tok = load_tokenizer(symbols)
    name = display_name(input_path)
    nbytes = 0
    with open_input_stream(input_path) as raw, atomic_output(output, what="a token stream") as out:

        class Counting:
            def read(self, n: int = -1) -> bytes:
                nonlocal nbytes
                try:
                    data: bytes = raw.read(n)
                except OSError as exc:
                    raise from_os_error(exc, input_path) from None
                nbytes += len(data)
                return data

        writer = TokenStreamWriter(out, dtype=tok.dtype, vocab_size=smap.vocab_size)
        enc = tok.stream()
        for text in pi.iter_text(Counting(), name, READ_CHUNK):
            writer.write_bytes(enc.feed_bytes(text))
        writer.write_bytes(enc.finish_bytes())
        writer.end_document(name if label is None else label)
        end = writer.close()
    return {
        "input": input_path,
        "output": output,
        "bytes": nbytes,
        "tokens": end.token_count,
        "documents": end.doc_count,
        "dtype": tok.dtype,
        "vocab_size": smap.vocab_size,
        "symbol_map": symbols or "(bundled default)",
        "symbol_map_hash": smap.canonical_hash(),
        "crc32": f"0x{end.crc32:08x}",
    }


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
