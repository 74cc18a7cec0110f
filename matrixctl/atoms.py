"""Library side of `matrixctl pack atoms` and `matrixctl pack svgt`.

Both stream with bounded memory and write atomically; the command layer only parses options and
reports. Neither prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.crc import crc32
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats import matrix_atom, svgt, token_stream
from matrixctl.io import (
    STDIO,
    Source,
    atomic_output,
    open_input_stream,
    read_exact,
    refuse_binary_to_terminal,
)

if TYPE_CHECKING:
    import numpy as np

Tick = Callable[[int], None]


@dataclass
class TokenInput:
    """Ids read from a token stream or from text; `chunks` yields integer arrays."""

    kind: str  # "token-stream" or "text"
    vocab_size: int | None
    # ids, their max and the CRC-32 of their bytes when already known
    chunks: Iterator[tuple[np.ndarray, int | None, int | None]]
    docs: list[int]  # running count of documents (DOC frames), filled while reading


class _Counting:
    """Count bytes read through a stream, for progress."""

    def __init__(self, fp: Any, tick: Tick) -> None:
        self._fp = fp
        self._tick = tick

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._fp.read(n)
        self._tick(len(data))
        return data


def read_token_input(fp: Any) -> TokenInput:
    """Sniff a token stream (magic MXTOKENS) or whitespace-separated decimal ids."""
    head = b""
    while len(head) < len(token_stream.MAGIC):
        more = fp.read(len(token_stream.MAGIC) - len(head))
        if not more:
            break
        head += bytes(more)
    if head == token_stream.MAGIC:
        rest = read_exact(
            fp, token_stream.HEADER_SIZE - len(head), "token stream header", offset=len(head)
        )
        header = token_stream.StreamHeader.parse(head + rest)
        docs = [0]

        def stream_chunks() -> Iterator[tuple[np.ndarray, int | None, int | None]]:
            for event in token_stream.iter_events(fp, header):
                if event.kind == token_stream.KIND_TOKENS:
                    yield event.tokens, event.max_id, event.crc
                elif event.kind == token_stream.KIND_DOC:
                    docs[0] += 1

        return TokenInput("token-stream", header.vocab_size or None, stream_chunks(), docs)
    text_ids = ((ids, None, None) for ids in token_stream.iter_text_ids(fp, head))
    return TokenInput("text", None, text_ids, [0])


def write_atoms(
    input_path: str,
    output_path: str,
    *,
    atom_size: int,
    dtype: str = "auto",
    vocab_size: int | None = None,
    pad_id: int = 0,
    tick: Tick | None = None,
) -> dict[str, Any]:
    """Token ids (stream or text) -> MATRIX-ATOM file. Returns a summary for the report."""
    refuse_binary_to_terminal(output_path, "a MATRIX-ATOM file")
    with _open_tokens(input_path) as raw:
        fp = _Counting(raw, tick) if tick else raw
        tokens = read_token_input(fp)
        vocab = vocab_size
        if tokens.vocab_size is not None:
            if vocab_size is not None and vocab_size != tokens.vocab_size:
                raise UsageError(
                    f"--vocab-size {vocab_size} disagrees with the stream's declared vocab_size "
                    f"{tokens.vocab_size}"
                )
            vocab = tokens.vocab_size
        with atomic_output(output_path, what="a MATRIX-ATOM file") as out:
            writer = matrix_atom.AtomWriter(
                out, atom_size=atom_size, dtype=dtype, vocab_size=vocab, pad_id=pad_id
            )
            try:
                for chunk, max_id, crc in tokens.chunks:
                    writer.write(chunk, max_id, crc=crc)
                header = writer.finish()
            except FormatError as err:
                raise err.with_path("<stdin>" if input_path == STDIO else input_path) from None
            finally:
                writer.close()
    return {
        "input": input_path,
        "input_kind": tokens.kind,
        "output": output_path,
        "documents": tokens.docs[0] if tokens.kind == "token-stream" else None,
        "tokens": header.token_count - writer.padding,
        "padding": writer.padding,
        "token_count": header.token_count,
        "atom_count": header.atom_count,
        "atom_size": header.atom_size,
        "dtype": header.dtype_name,
        "vocab_size": header.vocab_size,
        "vocab_size_source": "declared" if vocab is not None else "max id + 1",
        "payload_crc32": f"0x{header.payload_crc32:08x}",
    }


@contextmanager
def _open_tokens(path: str) -> Iterator[Any]:
    """A regular file is mapped and read zero-copy; stdin and pipes are read in chunks."""
    if path != STDIO and os.path.isfile(path):
        with Source.open(path) as src:
            yield token_stream.MemReader(src.buf)
    else:
        with open_input_stream(path) as fp:
            yield fp


def open_valid(path: str, fmt: str) -> tuple[Source, Any]:
    """Open `path`, require format `fmt` and structural validity; raise the first error."""
    from matrixctl.formats import registry
    from matrixctl.opening import open_checked

    src = Source.open(path)
    try:
        found = registry.sniff(src)
        if found != fmt:
            raise FormatError(
                codes.UNKNOWN_FORMAT,
                f"expected a {fmt} file, found {found or 'an unknown format'}",
                path=src.name,
                offset=0,
            )
        subject = open_checked(src, fmt)
    except BaseException:
        src.close()
        raise
    return src, subject


def write_svgt(
    atoms_path: str, output_path: str, *, grid: str, tick: Tick | None = None
) -> dict[str, Any]:
    """MATRIX-ATOM -> SVG-Tensor, checking the atoms' payload CRC on the way."""
    refuse_binary_to_terminal(output_path, "an SVG-Tensor file")
    src, subject = open_valid(atoms_path, matrix_atom.FORMAT)
    with src:
        h: matrix_atom.AtomHeader = subject.header
        rows, cols = svgt.parse_grid(grid, h.atom_size)
        tokens = matrix_atom.token_view(src.buf, h)
        per_chunk = max(1, (1 << 22) // h.atom_size) * h.atom_size
        crc = 0

        def chunks() -> Iterator[np.ndarray]:
            nonlocal crc
            for start in range(0, tokens.size, per_chunk):
                part = tokens[start : start + per_chunk]
                crc = crc32(part.data.cast("B"), crc)
                if tick:
                    tick(part.nbytes)
                yield part

        with atomic_output(output_path, what="an SVG-Tensor file") as out:
            try:
                header = svgt.write_svgt(
                    out, chunks(), rows=rows, cols=cols, atom_count=h.atom_count
                )
            except FormatError as err:
                raise err.with_path(src.name) from None
            if crc != h.payload_crc32:
                raise FormatError(
                    matrix_atom.ATOM_PAYLOAD_CRC,
                    f"the atoms' payload CRC-32 is 0x{crc:08x}, the header says "
                    f"0x{h.payload_crc32:08x}; nothing was written",
                    path=src.name,
                    offset=matrix_atom.FIELDS["payload_crc32"][0],
                    field="payload_crc32",
                )
    return {
        "input": atoms_path,
        "output": output_path,
        "grid": f"{rows}x{cols}",
        "atom_count": header.atom_count,
        "bytes": svgt.HEADER_SIZE + header.payload_bytes,
    }


def input_size(path: str) -> int | None:
    if path == STDIO:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None
