"""Token ids between matrixctl's id formats and NumPy `.npy`, for `convert`.

    token stream (.mxt)   <->  1-D .npy of the stream's id dtype (uint16 or uint32)
    MATRIX-ATOM (.bin)    <->  2-D .npy, atoms x atom_size, of the atoms' dtype

The decisions (docs/formats/npy.md, token-stream.md, matrix-atom.md):

- Reading the id file checks it as `verify` would (frames, totals, CRC-32s, id ranges); a damaged
  input is refused with its own code and nothing is written.
- A `.npy` holds only the ids: a stream's document boundaries and labels, its declared
  vocab_size, and the atoms' vocab_size and flags are dropped, each with a note.
- Back from `.npy`: integer arrays only (`IDS_NPY_DTYPE`); 1-D becomes a token stream and 2-D
  MATRIX-ATOM (`IDS_NPY_SHAPE` otherwise). The id dtype is `--dtype uint16|uint32`, else the
  array's own when it is uint16 or uint32, else the narrower of the two that holds every id.
  An id that does not fit (negative, too large for the dtype, not below `--vocab-size`) is
  refused naming the token, never wrapped.
- The stream gets one document labelled with the source name (as `tokenize pi encode` labels
  its input); vocab_size is `--vocab-size`, else undeclared (stream) or largest id + 1 (atoms,
  as `pack atoms` does).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.converters import Result
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats import matrix_atom, npy, token_stream
from matrixctl.io import Source, atomic_output

if TYPE_CHECKING:
    import numpy as np

G = "convert"
IDS_NPY_DTYPE = codes.define(
    "IDS_NPY_DTYPE",
    "A .npy converted to token ids must hold integers (not floats, complex numbers or bools).",
    group=G,
)
IDS_NPY_SHAPE = codes.define(
    "IDS_NPY_SHAPE",
    "A .npy of token ids must be 1-D (token stream) or 2-D atoms x atom_size (MATRIX-ATOM).",
    group=G,
)

ID_DTYPES = {"uint16": "u16", "uint32": "u32"}  # id dtype -> zTensor dtype name of the .npy
CHUNK = 1 << 22  # ids per step


def _npy_header_size(dtype: str, shape: tuple[int, ...]) -> int:
    return len(npy.header_bytes(dtype, shape))


# Ids -> .npy ------------------------------------------------------------------------------------


def stream_to_npy(src: Source, dst_path: str, options: dict[str, Any]) -> Result:
    """A token stream's ids, every document in order, as a 1-D .npy."""
    import numpy as np

    from matrixctl.opening import open_checked

    subject = open_checked(src, token_stream.FORMAT)
    header: token_stream.StreamHeader = subject.header
    dtype = ID_DTYPES[header.dtype]
    docs = 0
    count = 0
    with atomic_output(dst_path, what="a .npy file") as out:
        head = npy.header_bytes(dtype, (0,))
        out.write(head)
        reader = token_stream.MemReader(src.buf, token_stream.HEADER_SIZE)
        try:
            for event in token_stream.iter_events(reader, header):
                if event.kind == token_stream.KIND_TOKENS:
                    ids: np.ndarray = event.tokens
                    out.write(np.ascontiguousarray(ids).data.cast("B"))
                    count += ids.size
                elif event.kind == token_stream.KIND_DOC:
                    docs += 1
        except FormatError as err:
            raise err.with_path(src.name) from None
        final = npy.header_bytes(dtype, (count,))
        assert len(final) == len(head)  # numpy pads the header for the growing axis
        out.seek(0)
        out.write(final)
        out.seek(0, 2)
    notes = []
    if docs > 1:
        notes.append(
            f"{src.name}: its {docs} document boundaries and labels are not kept in a .npy "
            "(the ids of every document follow one another)"
        )
    if header.vocab_size:
        notes.append(
            f"{src.name}: the declared vocab_size {header.vocab_size} is not kept in a .npy; "
            f"pass --vocab-size {header.vocab_size} when converting back"
        )
    summary = {"dtype": header.dtype, "shape": [count], "tokens": count, "documents": docs}
    return Result(summary, notes)


def atoms_to_npy(src: Source, dst_path: str, options: dict[str, Any]) -> Result:
    """MATRIX-ATOM atoms as a 2-D .npy (atom_count x atom_size), payload CRC and ids checked."""
    import numpy as np

    from matrixctl.crc import crc32
    from matrixctl.opening import open_checked

    subject = open_checked(src, matrix_atom.FORMAT)
    h: matrix_atom.AtomHeader = subject.header
    name = h.dtype_name
    if name is None or not subject.payload_ok:  # the structural rules report these first
        raise FormatError(
            matrix_atom.ATOM_TRUNCATED, "header and file size disagree", path=src.name
        )
    tokens = matrix_atom.token_view(src.buf, h)
    shape = (h.atom_count, h.atom_size)
    crc = 0
    with atomic_output(dst_path, what="a .npy file") as out:
        out.write(npy.header_bytes(ID_DTYPES[name], shape))
        step = max(1, CHUNK // h.atom_size) * h.atom_size
        for start in range(0, tokens.size, step):
            part = tokens[start : start + step]
            hi = int(part.max())
            if hi >= h.vocab_size:
                bad = start + int(np.argmax(part >= h.vocab_size))
                raise FormatError(
                    matrix_atom.ATOM_ID_RANGE,
                    f"token {bad} (id {int(tokens[bad])}) is not below vocab_size "
                    f"{h.vocab_size}; nothing was written",
                    path=src.name,
                    offset=h.data_offset + bad * tokens.itemsize,
                    field=f"token[{bad}]",
                )
            data = part.data.cast("B")
            crc = crc32(data, crc)
            out.write(data)
        if crc != h.payload_crc32:
            raise FormatError(
                matrix_atom.ATOM_PAYLOAD_CRC,
                f"the atoms' payload CRC-32 is 0x{crc:08x}, the header says "
                f"0x{h.payload_crc32:08x}; nothing was written",
                path=src.name,
                offset=matrix_atom.FIELDS["payload_crc32"][0],
                field="payload_crc32",
            )
    notes = [
        f"{src.name}: vocab_size {h.vocab_size} is not kept in a .npy; pass --vocab-size "
        f"{h.vocab_size} when converting back"
    ]
    if h.flags:
        notes.append(f"{src.name}: flags {', '.join(matrix_atom.flag_names(h.flags))} are not kept")
    summary = {
        "dtype": name,
        "shape": list(shape),
        "atom_count": h.atom_count,
        "atom_size": h.atom_size,
        "tokens": h.token_count,
    }
    return Result(summary, notes)


# .npy -> ids ------------------------------------------------------------------------------------


class _NpyIds:
    """An integer .npy opened for reading ids in C order, little-endian, in chunks."""

    def __init__(self, src: Source, ndim: int, what: str) -> None:
        from matrixctl.opening import open_checked
        from matrixctl.tensors import DTYPES

        self.src = src
        self.checked = open_checked(src, npy.NPY)
        self.h: npy.NpyHeader = self.checked.header
        kind = DTYPES[self.h.dtype].kind
        if kind not in ("int", "uint"):
            raise FormatError(
                IDS_NPY_DTYPE,
                f"the array's dtype is {self.h.descr} ({kind}): token ids are integers",
                path=src.name,
                field="descr",
                hint="a .npy of ids holds an integer dtype such as uint16, uint32 or int64",
            )
        if len(self.h.shape) != ndim:
            other = "--to matrix-atom (2-D)" if ndim == 1 else "--to token-stream (1-D)"
            raise FormatError(
                IDS_NPY_SHAPE,
                f"the array's shape is {list(self.h.shape)}; {what} needs a {ndim}-D array",
                path=src.name,
                field="shape",
                hint=f"an array of {len(self.h.shape)} dimensions cannot be written as {what}"
                + ("" if len(self.h.shape) not in (1, 2) else f"; use {other}"),
            )
        self.storage = DTYPES[self.h.dtype].storage
        self.size = 1
        for n in self.h.shape:
            self.size *= n

    def chunks(self) -> Iterator[np.ndarray]:
        import numpy as np

        from matrixctl.formats.npy import NpySource

        source = NpySource(self.src, self.checked)
        info = source.tensors()[0]
        for piece in source.stream(info):
            yield np.frombuffer(piece, dtype=self.storage)

    def id_dtype(self, requested: str | None) -> str:
        """--dtype, else the array's own uint16/uint32, else the narrower that holds every id."""
        if requested is not None:
            return requested
        own = {"u16": "uint16", "u32": "uint32"}.get(self.h.dtype)
        if own is not None:
            return own
        hi = -1
        for chunk in self.chunks():
            if chunk.size:
                hi = max(hi, int(chunk.max()))
        return "uint16" if hi < matrix_atom.UINT16_LIMIT else "uint32"


def _id_options(options: dict[str, Any]) -> tuple[str | None, int | None]:
    values = options.get("dtype") or []
    dtype = None
    if values:
        if len(values) != 1 or values[0].strip().lower() not in ("uint16", "uint32", "u16", "u32"):
            raise UsageError(
                f"--dtype {' '.join(values)}: token ids are written as uint16 or uint32"
            )
        dtype = {"u16": "uint16", "u32": "uint32"}.get(values[0].strip().lower())
        dtype = dtype or values[0].strip().lower()
    vocab = options.get("vocab_size")
    if vocab is not None and not 1 <= vocab < matrix_atom.UINT32_LIMIT:
        raise UsageError(
            f"--vocab-size must be between 1 and {matrix_atom.UINT32_LIMIT - 1}, got {vocab}"
        )
    return dtype, vocab


def _check_signed(chunk: np.ndarray, first: int, name: str) -> None:
    """Negative ids are refused before any cast could wrap them."""
    import numpy as np

    if chunk.dtype.kind == "i" and chunk.size and int(chunk.min()) < 0:
        bad = int(np.argmax(chunk < 0))
        raise FormatError(
            token_stream.TOKS_ID_RANGE,
            f"token {first + bad} (id {int(chunk[bad])}) is negative",
            path=name,
            field=f"token[{first + bad}]",
        )


def npy_to_stream(src: Source, dst_path: str, options: dict[str, Any]) -> Result:
    """A 1-D integer .npy as a token stream of one document."""
    requested, vocab = _id_options(options)
    arr = _NpyIds(src, 1, "a token stream")
    dtype = arr.id_dtype(requested)
    with atomic_output(dst_path, what="a token stream") as out:
        writer = token_stream.TokenStreamWriter(out, dtype=dtype, vocab_size=vocab or 0)
        try:
            for chunk in arr.chunks():
                _check_signed(chunk, writer.tokens, src.name)
                writer.write(chunk)
        except FormatError as err:
            raise err.with_path(src.name) from None
        writer.end_document(src.name)
        end = writer.close()
    summary = {
        "dtype": dtype,
        "tokens": end.token_count,
        "documents": end.doc_count,
        "vocab_size": vocab,
        "crc32": f"0x{end.crc32:08x}",
    }
    return Result(summary)


def npy_to_atoms(src: Source, dst_path: str, options: dict[str, Any]) -> Result:
    """A 2-D integer .npy (atoms x atom_size) as MATRIX-ATOM."""
    requested, vocab = _id_options(options)
    arr = _NpyIds(src, 2, "MATRIX-ATOM")
    atom_size = arr.h.shape[1]
    if atom_size < 1 or atom_size >= matrix_atom.UINT32_LIMIT:
        raise FormatError(
            IDS_NPY_SHAPE,
            f"the array's shape is {list(arr.h.shape)}: atom_size (the second axis) must be "
            f"between 1 and {matrix_atom.UINT32_LIMIT - 1}",
            path=src.name,
            field="shape",
        )
    dtype = arr.id_dtype(requested)
    with atomic_output(dst_path, what="a MATRIX-ATOM file") as out:
        writer = matrix_atom.AtomWriter(out, atom_size=atom_size, dtype=dtype, vocab_size=vocab)
        try:
            for chunk in arr.chunks():
                _check_signed(chunk, writer.tokens, src.name)
                writer.write(chunk)
            header = writer.finish()
        except FormatError as err:
            raise err.with_path(src.name) from None
        finally:
            writer.close()
    summary = {
        "dtype": header.dtype_name,
        "atom_count": header.atom_count,
        "atom_size": header.atom_size,
        "tokens": header.token_count,
        "vocab_size": header.vocab_size,
        "vocab_size_source": "--vocab-size" if vocab is not None else "max id + 1",
        "payload_crc32": f"0x{header.payload_crc32:08x}",
    }
    return Result(summary)
