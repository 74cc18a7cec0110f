"""A Megatron indexed dataset or an MDS folder back into an ingest pack
(`convert PREFIX.idx PACKDIR --to ingest-pack`, `convert MDSDIR PACKDIR --to ingest-pack`;
docs/training.md, "Reading them back").

The input is checked first as `verify` checks it (structure, then the Megatron pointers and
document indices or the MDS shard headers), so nothing is read through a pointer that was not
checked. Each Megatron *document* (its sequences joined) or MDS sample (its `input_ids`, a 1-D
integer ndarray) becomes one pack document, in order. **Decisions:** the pack's tokenizer is the
bundled π symbol map (what `ingest docs` uses by default; the ids keep their values, so they
mean what they meant to the model that made them only if that model used the same vocabulary),
every id must be below its vocab_size (`IMPORT_IDS` otherwise); `eos_id` is the map's when every
document ends with it (so a pack exported and imported again has the same documents and eos),
else none; the atom size is `ingest docs`' default, 256. The pack is written by the pack builder
(`ingest/pack.py`): atomic, verified by construction. Two passes over the ids: the first checks
the ranges and the ends, the second writes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError

if TYPE_CHECKING:
    import numpy as np

IMPORT_IDS = codes.define(
    "IMPORT_IDS",
    "A Megatron or MDS dataset converted into a pack holds ids that are not token ids of the "
    "pack's π symbol map (negative, not integers, or not below its vocab_size), or an MDS "
    "column that is not a 1-D integer ndarray named input_ids.",
    group="convert",
)
ATOM_SIZE = 256  # `ingest docs`' default


class Result:
    """What `convert` reports (the shape of `matrixctl.converters.Result`, which this layer
    does not import: converters/ and ingest/ are independent)."""

    def __init__(self, summary: dict[str, Any]) -> None:
        self.summary = summary
        self.notes: list[str] = []


STEP = 1 << 22  # ids per write


def megatron_to_pack(source: Any, dst: str, options: dict[str, Any]) -> Result:
    import numpy as np

    from matrixctl.io import Source
    from matrixctl.opening import open_checked

    subject = open_checked(source, "megatron", scan=True)  # every check verify runs
    h = subject.header
    if np.dtype(h.dtype).kind not in "iu":
        raise FormatError(IMPORT_IDS, f"the ids are {h.dtype}, not integers", path=source.name)
    lengths, pointers, docs = subject.arrays()
    with Source.open(subject.bin_path) as bin_src:
        starts = pointers // (h.itemsize or 1)
        bounds = np.asarray(docs, dtype=np.int64)
        dtype = np.dtype(h.dtype).newbyteorder("<")

        def documents() -> Iterator[np.ndarray]:
            ids = np.frombuffer(bin_src.buf, dtype=dtype) if bin_src.size else np.zeros(0, dtype)
            for d in range(len(bounds) - 1):
                lo, hi = int(bounds[d]), int(bounds[d + 1])
                if hi > lo:
                    first = int(starts[lo])
                    last = int(starts[hi - 1]) + int(lengths[hi - 1])
                    yield ids[first:last]  # the document's sequences tile the .bin
                else:
                    yield ids[0:0]

        summary = _build(dst, documents, source.name, "megatron", bin_src.size)
    return Result(summary)


def mds_to_pack(source: Any, dst: str, options: dict[str, Any]) -> Result:
    import mmap

    import numpy as np

    from matrixctl.formats import mds
    from matrixctl.opening import open_checked
    from matrixctl.validate.mds import shard_offsets

    subject = open_checked(source, "mds", scan=True)  # every check verify runs
    shards = subject.shards
    for n, entry in enumerate(shards):
        names, encs = entry["column_names"], entry["column_encodings"]
        if "input_ids" not in names or entry.get("zip_data"):
            raise FormatError(
                IMPORT_IDS,
                f"shard {n} has no input_ids column, or is compressed",
                path=source.name,
                field=f"shards[{n}]",
            )
        enc = encs[names.index("input_ids")]
        dtype = enc.split(":")[1] if isinstance(enc, str) and enc.count(":") == 1 else None
        if not enc.startswith("ndarray:") or dtype is None or np.dtype(dtype).kind not in "iu":
            raise FormatError(
                IMPORT_IDS,
                f"shard {n}'s input_ids encoding is {enc!r}, not ndarray of an integer dtype",
                path=source.name,
                field=f"shards[{n}].column_encodings",
            )
    total = 0

    def documents() -> Iterator[np.ndarray]:
        nonlocal total
        for entry in shards:
            path, _ = subject.file_of(entry)
            names, sizes = entry["column_names"], entry["column_sizes"]
            col = names.index("input_ids")
            dtype = np.dtype(entry["column_encodings"][col].split(":")[1]).newbyteorder("<")
            variable = [i for i, size in enumerate(sizes) if size is None]
            offsets = shard_offsets(path, entry)
            with open(path, "rb") as fp:
                buf = mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ)
            total += len(buf)
            for k in range(len(offsets) - 1):
                lo = int(offsets[k])
                var = np.frombuffer(buf, dtype="<u4", count=len(variable), offset=lo).tolist()
                widths = [
                    var[variable.index(i)] if s is None else int(s) for i, s in enumerate(sizes)
                ]
                pos = lo + 4 * len(variable) + sum(widths[:col])
                ndim, code = buf[pos] >> 2, buf[pos] & 3
                if ndim != 1:
                    raise FormatError(
                        IMPORT_IDS,
                        f"sample {k} of {entry['raw_data']['basename']}: input_ids has {ndim} "
                        "dimensions, not 1",
                        path=source.name,
                    )
                shape = np.frombuffer(buf, dtype=mds.SHAPE_DTYPES[code], count=1, offset=pos + 1)
                yield np.frombuffer(
                    buf, dtype=dtype, count=int(shape[0]), offset=pos + 1 + (1 << code)
                )

    return Result(_build(dst, documents, source.name, "mds", None))


def _build(
    dst: str,
    documents: Callable[[], Iterator[np.ndarray]],
    name: str,
    kind: str,
    size: int | None,
) -> dict[str, Any]:
    import numpy as np

    from matrixctl.formats import ingest_pack as pack_format
    from matrixctl.formats import matrix_atom
    from matrixctl.ingest.pack import PackBuilder, PackPlan
    from matrixctl.tokenizers import pi

    map_path = pi.default_map_path()
    raw = pi.read_map_bytes(map_path)
    smap = pi.check_map_bytes(raw, map_path)
    vocab = smap.vocab_size
    ends_with_eos = smap.eos_id is not None
    count = tokens = 0
    for j, doc in enumerate(documents()):
        count += 1
        tokens += doc.size
        if doc.size:
            low, high = int(doc.min()), int(doc.max())
            if low < 0 or high >= vocab:
                raise FormatError(
                    IMPORT_IDS,
                    f"document {j} holds id {low if low < 0 else high}, outside the π symbol "
                    f"map's vocabulary [0, {vocab})",
                    path=name,
                )
        if not doc.size or int(doc[-1]) != smap.eos_id:
            ends_with_eos = False
    dtype = matrix_atom.choose_dtype("auto", vocab)
    assert dtype is not None
    plan = PackPlan(
        atom_size=ATOM_SIZE,
        dtype=dtype,
        vocab_size=vocab,
        pad_id=smap.pad_id,
        eos_id=smap.eos_id if ends_with_eos and count else None,
        grid=None,
        tokenizer_raw=raw,
        tokenizer_meta={
            "symbol_map": {"file": pack_format.SYMBOLS, "canonical_hash": smap.canonical_hash()}
        },
        manifest_head={"source": name},
    )
    with PackBuilder(dst, plan) as pb:
        for j, doc in enumerate(documents()):
            for i in range(0, doc.size, STEP):
                pb.add_tokens(doc[i : i + STEP].astype(np.uint32))
            pb.add_record(int(doc.size), 0, j)
        source = {
            "path": name,
            "ordinal": 0,
            "kind": kind,
            "bytes": size if size is not None else 0,
            "sha256": None,
            "compression": None,
            "decompressed_bytes": None,
            "documents": count,
            "tokens": tokens,
            "skipped_records": 0,
            "empty_documents": 0,
        }
        manifest = pb.finish(
            {
                "sources": [source],
                "skipped": [],
                "shard": None,
                "options": {"input_kind": kind, "on_error": "fail"},
            }
        )
    return {
        "documents": manifest["documents"],
        "tokens": manifest["tokens"],
        "atoms": manifest["atom_count"],
        "eos_id": manifest["eos_id"],
        "pack": os.fspath(dst),
    }
