"""Numbers about what a file holds, for `matrixctl inspect --stats` (library side: no printing).

- Tensor containers (every format `convert` reads): per tensor, the element count, min, max,
  mean and standard deviation of the finite values, and the counts of zeros, NaN and Inf.
  Values stream through in chunks of at most CHUNK_ELEMENTS (memory stays bounded whatever the
  tensor's size); sums are accumulated in float64 and merged chunk by chunk with the pairwise
  update of Chan, Golub and LeVeque, so the mean and the population standard deviation
  (ddof=0, as numpy's `std`) do not drift on long tensors. Counts are exact integers; min and
  max of integer tensors are exact too. bf16 and float8 are read through `ml_dtypes`; bool is
  0/1. A quantized tensor that cannot be dequantized, and complex tensors, get a
  `not_computed` reason instead.
- Token files (an ingest pack folder, a MATRIX-ATOM file, a token stream): documents, tokens,
  the document-length histogram in power-of-two bins ([1, 1], [2, 3], [4, 7], ...), the most
  frequent ids with their text from the pack's own symbol map, and the padding share.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl.errors import FormatError
from matrixctl.tensors import DTYPES, TENSOR_SIZE, TensorInfo, TensorSource, element_count

if TYPE_CHECKING:
    import numpy as np

CHUNK_ELEMENTS = 1 << 20  # values converted to float64 at a time (8 MiB)
TOP_IDS = 10  # most frequent ids listed
BINCOUNT_LIMIT = 1 << 20  # ids counted with one bincount array below this vocabulary size


# Tensors ------------------------------------------------------------------------------------


@dataclass
class Moments:
    """Running statistics of a stream of values (see the module docstring)."""

    count: int = 0  # every element, NaN and Inf included
    finite: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean (finite values)
    low: float | int | None = None
    high: float | int | None = None
    zeros: int = 0
    nan: int = 0
    inf: int = 0

    def _merge(self, n: int, mean: float, m2: float, low: Any, high: Any) -> None:
        if n == 0:
            return
        total = self.finite + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.finite * n / total
        self.finite = total
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def add(self, values: np.ndarray) -> None:
        """One chunk of values: a float, integer or bool numpy array (any width)."""
        import numpy as np

        with np.errstate(all="ignore"):  # an overflow shows as a null mean or std, not a warning
            self._add(values)

    def _add(self, values: np.ndarray) -> None:
        import numpy as np

        self.count += int(values.size)
        if values.size == 0:
            return
        if values.dtype == np.bool_:
            values = values.view(np.uint8)
        if values.dtype.kind in "iu":
            self.zeros += int(np.count_nonzero(values == 0))
            x = values.astype(np.float64)
            mean = float(x.mean())
            m2 = float(np.square(x - mean).sum())
            self._merge(values.size, mean, m2, int(values.min()), int(values.max()))
            return
        x = values.astype(np.float64)
        nan = np.isnan(x)
        inf = np.isinf(x)
        self.nan += int(np.count_nonzero(nan))
        self.inf += int(np.count_nonzero(inf))
        self.zeros += int(np.count_nonzero(x == 0))
        if self.nan or self.inf:
            x = x[~(nan | inf)]
        if x.size:
            mean = float(x.mean())
            m2 = float(np.square(x - mean).sum())
            self._merge(x.size, mean, m2, float(x.min()), float(x.max()))

    def add_zeros(self, n: int, integer: bool) -> None:
        """`n` implicit zeros (the elements a sparse tensor does not store)."""
        if n <= 0:
            return
        self.count += n
        self.zeros += n
        zero: float | int = 0 if integer else 0.0
        self._merge(n, 0.0, 0.0, zero, zero)

    def to_json(self) -> dict[str, Any]:
        some = self.finite > 0
        std = math.sqrt(self.m2 / self.finite) if some and self.m2 >= 0 else math.nan
        return {
            "count": self.count,
            "min": self.low if some else None,
            "max": self.high if some else None,
            # Beyond float64 (values near 1.8e308 summed): null rather than Infinity or NaN.
            "mean": self.mean if some and math.isfinite(self.mean) else None,
            "std": std if math.isfinite(std) else None,
            "zeros": self.zeros,
            "nan": self.nan,
            "inf": self.inf,
        }


def _value_dtype(dtype: str) -> np.dtype:
    import numpy as np

    d = DTYPES[dtype]
    if d.numeric:
        return np.dtype(d.storage)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, d.ml_dtypes or ""))


def _chunks(source: TensorSource, info: TensorInfo, role: str, dtype: str) -> Iterator[Any]:
    """The values of one component in arrays of at most CHUNK_ELEMENTS, whatever the sizes of
    the pieces the source streams (a piece may end inside an element: its bytes carry over)."""
    import numpy as np

    value = _value_dtype(dtype)
    size = value.itemsize
    carry = b""
    for piece in source.stream(info, role):
        raw = memoryview(piece).cast("B")
        if carry:
            raw = memoryview(carry + bytes(raw))
        whole = len(raw) - len(raw) % size
        arr = np.frombuffer(raw[:whole], dtype=value)
        for start in range(0, arr.size, CHUNK_ELEMENTS):
            yield arr[start : start + CHUNK_ELEMENTS]
        carry = bytes(raw[whole:])
    if carry:
        raise FormatError(
            TENSOR_SIZE,
            f"{info.name}: the {role} bytes end inside an element ({len(carry)} bytes left over)",
            field=info.name,
        )


def _values_role(info: TensorInfo) -> str:
    return {"sparse_csr": "values", "sparse_coo": "values"}.get(info.layout, "data")


def stats_of(source: TensorSource, info: TensorInfo) -> dict[str, Any]:
    """The statistics of one tensor, or {"not_computed": reason}."""
    from matrixctl.formats.gguf import GGUF_DEQUANT

    kind = DTYPES[info.dtype].kind
    if info.layout == "quantized_group":
        return {"not_computed": "quantized: not computed"}
    if kind == "complex":
        return {"not_computed": "complex values: not computed"}
    role = _values_role(info)
    acc = Moments()
    try:
        for chunk in _chunks(source, info, role, info.dtype):
            acc.add(chunk)
    except FormatError as err:
        if err.code == GGUF_DEQUANT:
            return {"not_computed": "quantized: not computed (no dequantizer for its type)"}
        raise
    if role != "data":  # sparse: the elements not stored are zeros
        acc.add_zeros(element_count(info.shape) - acc.count, kind in ("int", "uint", "bool"))
    return acc.to_json()


def tensor_stats(path: str) -> list[dict[str, Any]]:
    """Every tensor of the container at `path`, in storage order, with its statistics."""
    from matrixctl.converters.tensors import open_source

    rows = []
    with open_source(path) as source:
        for info in source.tensors():
            rows.append(
                {
                    "name": info.name,
                    "dtype": info.dtype,
                    "shape": list(info.shape),
                    "stats": stats_of(source, info),
                }
            )
            source.release(info)
    return rows


# Token files --------------------------------------------------------------------------------


def length_histogram(lengths: np.ndarray) -> list[dict[str, int]]:
    """Documents per power-of-two length bin [2^k, 2^(k+1) - 1], from the first non-empty bin to
    the last (empty bins between them included, so the shape reads right)."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.uint64)
    lengths = lengths[lengths > 0]
    if lengths.size == 0:
        return []
    bins = np.floor(np.log2(lengths.astype(np.float64))).astype(np.int64)
    # log2 of a float can land a hair below an exact power of two: correct by integer compare.
    bins -= (np.left_shift(np.uint64(1), bins.astype(np.uint64)) > lengths).astype(np.int64)
    counts = np.bincount(bins)
    first = int(np.flatnonzero(counts)[0])
    return [
        {"from": 1 << k, "to": (1 << (k + 1)) - 1, "documents": int(counts[k])}
        for k in range(first, counts.size)
    ]


class IdCounter:
    """Occurrences of every id over chunks: one bincount array for a small vocabulary, a
    Counter of each chunk's distinct ids otherwise."""

    def __init__(self, vocab_size: int) -> None:
        import numpy as np

        self.small = 0 < vocab_size <= BINCOUNT_LIMIT
        self.counts = np.zeros(vocab_size if self.small else 0, dtype=np.int64)
        self.other: Counter[int] = Counter()

    def add(self, ids: np.ndarray) -> None:
        import numpy as np

        if ids.size == 0:
            return
        if self.small and int(ids.max()) < self.counts.size:
            self.counts += np.bincount(ids, minlength=self.counts.size)
            return
        values, counts = np.unique(ids, return_counts=True)
        self.other.update(dict(zip(values.tolist(), counts.tolist(), strict=True)))

    def top(self, n: int) -> list[tuple[int, int]]:
        """The n most frequent (id, count), most frequent first, ties by smaller id."""
        import numpy as np

        merged = Counter(self.other)
        for i in np.flatnonzero(self.counts).tolist():
            merged[i] += int(self.counts[i])
        return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _role(smap: Any, ident: int) -> str | None:
    """What a special id is for under a symbol map: eos, pad, unk or byte (fallback)."""
    if smap.eos_id is not None and ident == smap.eos_id:
        return "eos"
    if ident == smap.pad_id:
        return "pad"
    if ident == smap.unk_id:
        return "unk"
    base = smap.byte_base_id
    if smap.byte_fallback and base is not None and base <= ident < base + 256:
        return "byte"
    return None


def _top_rows(counter: IdCounter, total: int, smap: Any | None) -> list[dict[str, Any]]:
    """The most frequent ids; with a map, each with its text (a fallback byte as <0xNN>) and
    its role. Texts are returned as they are: the terminal renderer escapes them."""
    rows = []
    texts = dict(smap.symbols) if smap is not None else {}
    for ident, count in counter.top(TOP_IDS):
        row: dict[str, Any] = {"id": ident, "count": count, "share": count / total if total else 0}
        if smap is not None:
            role = _role(smap, ident)
            text = texts.get(ident)
            if role == "byte":
                text = f"<0x{ident - smap.byte_base_id:02X}>"
            row["text"] = text
            row["role"] = role
        rows.append(row)
    return rows


def _count_atoms(buf: Any, header: Any, counter: IdCounter, tokens: int) -> None:
    import numpy as np

    from matrixctl.formats import matrix_atom

    dtype = matrix_atom.DTYPES[header.dtype_id][1]
    ids = np.frombuffer(buf, dtype=dtype, count=tokens, offset=header.data_offset)
    for start in range(0, ids.size, CHUNK_ELEMENTS):
        counter.add(ids[start : start + CHUNK_ELEMENTS])


def atom_stats(path: str) -> dict[str, Any]:
    """A MATRIX-ATOM file alone: it has no document boundaries, pad id or map."""
    from matrixctl.atoms import open_valid
    from matrixctl.formats import matrix_atom

    src, subject = open_valid(path, matrix_atom.FORMAT)
    with src:
        h = subject.header
        counter = IdCounter(h.vocab_size)
        _count_atoms(src.buf, h, counter, h.token_count)
    return {
        "documents": None,
        "tokens": h.token_count,
        "top_ids": _top_rows(counter, h.token_count, None),
    }


def stream_stats(path: str) -> dict[str, Any]:
    """A token stream: documents end at its DOC frames."""
    import numpy as np

    from matrixctl.atoms import open_valid
    from matrixctl.formats import token_stream

    src, subject = open_valid(path, token_stream.FORMAT)
    lengths: list[int] = []
    with src:
        h = subject.header
        counter = IdCounter(h.vocab_size)
        tokens = current = 0
        for event in token_stream.iter_events(
            token_stream.MemReader(src.buf, token_stream.HEADER_SIZE), h
        ):
            if event.kind == token_stream.KIND_TOKENS:
                ids = np.asarray(event.tokens)
                counter.add(ids)
                tokens += ids.size
                current += ids.size
            elif event.kind == token_stream.KIND_DOC:
                lengths.append(current)
                current = 0
    return {
        "documents": len(lengths),
        "tokens": tokens,
        "unterminated_tokens": current,
        "length_bins": "powers of two",
        "length_histogram": length_histogram(np.array(lengths, dtype=np.uint64)),
        "top_ids": _top_rows(counter, tokens, None),
    }


def pack_stats(path: str) -> dict[str, Any]:
    """An ingest pack: the atoms (padding apart), the document index and the pack's own map
    (a model tokenizer's pack: the ids alone)."""
    from matrixctl.atoms import open_valid
    from matrixctl.formats import doc_index, ingest_pack, matrix_atom
    from matrixctl.tokenizers.pi import load_symbol_map
    from matrixctl.validate.ingest_pack import PACK_INDEX

    with open(os.path.join(path, ingest_pack.MANIFEST), "rb") as fp:
        manifest = json.load(fp)
    # A model tokenizer's pack holds its record, not its vocabulary: ids without texts.
    smap = (
        None
        if isinstance(manifest.get("model_tokenizer"), dict)
        else load_symbol_map(os.path.join(path, manifest["tokenizer"]))[0]
    )
    src, subject = open_valid(os.path.join(path, manifest["atom_file"]), matrix_atom.FORMAT)
    with src:
        h = subject.header
        index_src, index = open_valid(os.path.join(path, manifest["doc_index"]), doc_index.FORMAT)
        with index_src:
            lengths = doc_index.records_view(index_src.buf, index.header)["token_length"].copy()
        tokens = int(lengths.sum())
        if tokens > h.token_count:
            raise FormatError(
                PACK_INDEX,
                f"the index covers {tokens:,} tokens, the atom file holds {h.token_count:,}",
                path=path,
                field="doc_index",
            )
        counter = IdCounter(h.vocab_size)
        _count_atoms(src.buf, h, counter, tokens)
    padding = h.token_count - tokens
    return {
        "documents": int(lengths.size),
        "tokens": tokens,
        "padding": padding,
        "padding_share": padding / h.token_count if h.token_count else 0.0,
        "length_bins": "powers of two",
        "length_histogram": length_histogram(lengths),
        "top_ids": _top_rows(counter, tokens, smap),
    }


def stats_for(path: str, fmt: str | None) -> dict[str, Any] | None:
    """{"tensors": [...]} for a tensor container, the token numbers for a pack, an atom file or
    a token stream; None for a format that has no statistics."""
    from matrixctl.formats.registry import TENSOR_CONTAINERS

    if any(c.format == fmt and c.io()[0] is not None for c in TENSOR_CONTAINERS):
        return {"tensors": tensor_stats(path)}
    if fmt == "ingest-pack":
        return pack_stats(path)
    if fmt == "matrix-atom":
        return atom_stats(path)
    if fmt == "token-stream":
        return stream_stats(path)
    return None
