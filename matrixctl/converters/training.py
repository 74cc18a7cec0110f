"""An ingest pack exported to the dataset formats trainers read (`convert PACKDIR OUT --to X`):

    megatron     PREFIX.bin + PREFIX.idx   Megatron-LM / NeMo IndexedDataset (formats/megatron.py)
    mds          OUTDIR/index.json + shards   MosaicML StreamingDataset (formats/mds.py)
    hf-parquet   OUTDIR/data-*.parquet      Hugging Face `datasets` ("parquet" builder)

One sequence (row, sample) per document: the document's ids exactly as the pack holds them,
its end-of-document id included, the padding after the last document not. The pack is checked
as `open_pack` checks it (manifest, artifacts and their sizes, headers); the ids are copied,
never re-encoded, in bounded pieces (docs/training.md). Outputs are atomic: the two Megatron
files each appear whole (`.idx` last), an output folder is built in a hidden sibling and renamed
into place. The same pack gives the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.converters import Result
from matrixctl.errors import FormatError, OutputError
from matrixctl.formats import doc_index, matrix_atom, mds, megatron
from matrixctl.io import (
    Source,
    atomic_output,
    copy_file_range_all,
    mapped_fd,
    sibling_temp_name,
)

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.io import Folder

EXPORT_OUTPUT = codes.define(
    "EXPORT_OUTPUT",
    "The output folder of an export (mds, hf-parquet) exists and is not empty; it is never "
    "replaced.",
    group="convert",
)
EXPORT_RANGE = codes.define(
    "EXPORT_RANGE",
    "A pack that the export format cannot hold: a document longer than Megatron's int32 "
    "sequence lengths or an MDS shard's u32 offsets, an empty document (MDS stores none).",
    group="convert",
)
RECORDS = 1 << 20  # index records per step
PARQUET_ROWS = 1 << 14  # documents per Parquet row group at most
PARQUET_TOKENS = 1 << 24  # ids per Parquet row group at most
PARQUET_SHARD = 1 << 28  # ids per Parquet file at most (~1 GiB of int32)


class _Pack:
    """The pack's ids and document records, mapped (checked as `open_pack` checks a pack)."""

    def __init__(self, source: Folder) -> None:
        from matrixctl.opening import open_checked

        checked = open_checked(source, "ingest-pack")
        self.name = source.name
        manifest = checked.manifest
        atoms_path = checked.file(manifest["atom_file"])
        index_path = checked.file(manifest.get("doc_index") or "")
        if atoms_path is None or index_path is None:
            raise FormatError(
                "PACK_MISSING", "the pack has no atom file or no document index", path=self.name
            )
        self._stack = contextlib.ExitStack()
        self.atoms_src = self._stack.enter_context(Source.open(atoms_path))
        self.header: matrix_atom.AtomHeader = open_checked(
            self.atoms_src, matrix_atom.FORMAT
        ).header
        index_src = self._stack.enter_context(Source.open(index_path))
        self.index_header: doc_index.IndexHeader = open_checked(index_src, doc_index.FORMAT).header
        self.records = doc_index.records_view(index_src.buf, self.index_header)
        self.tokens = matrix_atom.token_view(self.atoms_src.buf, self.header)
        self.dtype: str = self.header.dtype_name or "uint32"
        self.vocab_size = self.header.vocab_size
        self.documents = self.index_header.doc_count
        self.doc_tokens = self.index_header.token_count
        if self.doc_tokens > self.header.token_count:
            raise FormatError(
                "PACK_INDEX",
                f"the document index covers {self.doc_tokens} tokens, the atoms hold "
                f"{self.header.token_count}",
                path=self.name,
            )

    def lengths(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first document, token lengths as int64) in pieces of RECORDS documents."""
        import numpy as np

        for start in range(0, self.documents, RECORDS):
            part = self.records[start : start + RECORDS]
            yield start, part["token_length"].astype(np.int64)

    def close(self) -> None:
        self._stack.close()


def _opened(source: Any) -> _Pack:
    return _Pack(source)


# Megatron ---------------------------------------------------------------------------------------


def pack_to_megatron(source: Any, dst: str, options: dict[str, Any]) -> Result:
    """PREFIX.bin (the documents' ids, byte for byte) + PREFIX.idx (MMIDIDX)."""
    import numpy as np

    prefix = dst[:-4] if dst.endswith((".bin", ".idx")) else dst
    pack = _opened(source)
    try:
        # uint32 ids below 2**31 are the same bytes as int32 (Megatron has no uint32 code).
        dtype = "uint16" if pack.dtype == "uint16" else "int32"
        if dtype == "int32" and pack.vocab_size > 1 << 31:
            raise FormatError(
                EXPORT_RANGE,
                f"vocab_size {pack.vocab_size} does not fit Megatron's int32 ids",
                path=pack.name,
                field="vocab_size",
            )
        itemsize = np.dtype(dtype).itemsize
        n = pack.documents
        notes: list[str] = []
        with (
            atomic_output(prefix + ".idx", what="a Megatron index") as idx,
            atomic_output(prefix + ".bin", what="a Megatron .bin") as out,
        ):
            out.flush()
            length = pack.doc_tokens * itemsize
            fd = mapped_fd(pack.atoms_src.buf)
            if fd is not None:
                copy_file_range_all(fd, pack.header.data_offset, length, out.fileno())
            else:  # not a mapped file (cannot happen for a pack's artifact, kept safe)
                start = pack.header.data_offset
                for pos in range(start, start + length, 1 << 24):
                    out.write(pack.atoms_src.buf[pos : min(start + length, pos + (1 << 24))])
            idx.write(megatron.header_bytes(dtype, n, n + 1))
            for start, lengths in pack.lengths():
                if lengths.size and int(lengths.max()) > megatron.MAX_SEQUENCE:
                    bad = start + int(np.argmax(lengths > megatron.MAX_SEQUENCE))
                    raise FormatError(
                        EXPORT_RANGE,
                        f"document {bad} has {int(lengths[bad - start])} tokens, more than "
                        "Megatron's int32 sequence lengths hold",
                        path=pack.name,
                    )
                idx.write(lengths.astype("<i4").tobytes())
            for start in range(0, n, RECORDS):
                part = pack.records[start : start + RECORDS]
                idx.write((part["token_offset"].astype("<i8") * itemsize).tobytes())
            for start in range(0, n + 1, RECORDS):
                idx.write(np.arange(start, min(n + 1, start + RECORDS), dtype="<i8").tobytes())
    finally:
        pack.close()
    summary = {"documents": n, "tokens": pack.doc_tokens, "dtype": dtype}
    summary["files"] = [prefix + ".bin", prefix + ".idx"]
    return Result(summary, notes)


# Output folders ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _atomic_folder(dst: str) -> Iterator[str]:
    """A hidden sibling folder renamed to `dst` when the block completes (removed otherwise).
    `dst` must not exist or be an empty folder."""
    if os.path.lexists(dst) and not (
        os.path.isdir(dst) and not os.path.islink(dst) and not os.listdir(dst)
    ):
        raise OutputError(
            EXPORT_OUTPUT,
            "exists and is not an empty folder; refusing to replace it",
            path=dst,
            hint="choose another output, or remove it yourself",
        )
    tmp = sibling_temp_name(dst)
    made = False
    try:
        os.mkdir(tmp)
        made = True
        yield tmp
        if os.path.isdir(dst):
            os.rmdir(dst)
        os.rename(tmp, dst)
        made = False
    finally:
        if made:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as fp:
        fp.write(data)
        fp.flush()
        os.fsync(fp.fileno())


# MDS --------------------------------------------------------------------------------------------


def pack_to_mds(source: Any, dst: str, options: dict[str, Any]) -> Result:
    """OUTDIR/index.json + shard.NNNNN.mds, one `input_ids` sample per document."""
    import numpy as np

    pack = _opened(source)
    try:
        itemsize = np.dtype(pack.dtype).itemsize
        encoding = f"ndarray:{pack.dtype}"
        config = mds.shard_config(encoding, mds.SIZE_LIMIT)
        config_raw = mds.config_bytes(config)
        lengths = np.concatenate([part for _, part in pack.lengths()] or [np.zeros(0, np.int64)])
        if lengths.size and int(lengths.min()) == 0:
            bad = int(np.argmax(lengths == 0))
            raise FormatError(
                EXPORT_RANGE, f"document {bad} is empty; MDS stores no empty array", path=pack.name
            )
        shape_bytes = np.select(
            [lengths < 1 << 8, lengths < 1 << 16, lengths < 1 << 32], [1, 2, 4], 8
        )
        sample = 4 + 1 + shape_bytes + lengths * itemsize  # the size header, then the array
        shards: list[dict[str, Any]] = []
        with _atomic_folder(dst) as tmp:
            start = 0
            while start < lengths.size:
                # MosaicML's rule: a shard's size counts 8 + its config, and 4 + each sample.
                budget = mds.SIZE_LIMIT - 8 - len(config_raw)
                cum = np.cumsum(sample[start:] + 4)
                stop = start + max(1, int(np.searchsorted(cum, budget, side="right")))
                shards.append(
                    _mds_shard(
                        tmp, len(shards), pack, start, stop, sample, config, config_raw, itemsize
                    )
                )
                start = stop
            _write_file(os.path.join(tmp, mds.INDEX), mds.index_bytes(shards))
    finally:
        pack.close()
    return Result(
        {"documents": int(lengths.size), "tokens": pack.doc_tokens, "shards": len(shards)}
    )


def _mds_shard(
    folder: str,
    number: int,
    pack: _Pack,
    start: int,
    stop: int,
    sample: np.ndarray,
    config: dict[str, Any],
    config_raw: bytes,
    itemsize: int,
) -> dict[str, Any]:
    import numpy as np

    count = stop - start
    base = 4 + 4 * (count + 1) + len(config_raw)
    sizes = sample[start:stop]
    offsets = np.concatenate([[0], np.cumsum(sizes)]) + base
    if int(offsets[-1]) >= 1 << 32:
        raise FormatError(
            EXPORT_RANGE,
            f"document {start} does not fit an MDS shard's u32 offsets",
            path=pack.name,
        )
    name = mds.shard_name(number)
    digest = hashlib.sha1(usedforsecurity=False)
    with open(os.path.join(folder, name), "wb") as fp:

        def put(data: bytes) -> None:
            digest.update(data)
            fp.write(data)

        put(np.uint32(count).tobytes() + offsets.astype("<u4").tobytes() + config_raw)
        recs = pack.records[start:stop]
        buf = bytearray()
        for off, length in zip(
            recs["token_offset"].tolist(), recs["token_length"].tolist(), strict=True
        ):
            code = mds.shape_code(length)
            shape = np.array([length], dtype=mds.SHAPE_DTYPES[code]).tobytes()
            buf += (1 + len(shape) + length * itemsize).to_bytes(4, "little")
            buf.append(1 << 2 | code)
            buf += shape
            buf += pack.tokens[off : off + length].tobytes()
            if len(buf) >= 1 << 22:
                put(bytes(buf))
                buf.clear()
        put(bytes(buf))
        fp.flush()
        os.fsync(fp.fileno())
        size = fp.tell()
    return {
        **config,
        "raw_data": {"basename": name, "bytes": size, "hashes": {mds.HASH: digest.hexdigest()}},
        "samples": count,
        "zip_data": None,
    }


# Hugging Face Parquet ---------------------------------------------------------------------------


def pack_to_hf_parquet(source: Any, dst: str, options: dict[str, Any]) -> Result:
    """OUTDIR/data-NNNNN-of-MMMMM.parquet, one row per document, `input_ids` as list<int32>."""
    import numpy as np

    try:
        import pyarrow
        from pyarrow import parquet
    except ImportError:
        from matrixctl.errors import UsageError

        raise UsageError(
            "--to hf-parquet needs pyarrow, which is not installed",
            hint="pip install 'matrixctl[parquet]'",
        ) from None
    pack = _opened(source)
    try:
        if pack.vocab_size > 1 << 31:
            raise FormatError(
                EXPORT_RANGE,
                f"vocab_size {pack.vocab_size} does not fit int32 input_ids",
                path=pack.name,
            )
        lengths = np.concatenate([part for _, part in pack.lengths()] or [np.zeros(0, np.int64)])
        ends = np.cumsum(lengths)
        # Files by tokens (at least one document each), row groups by documents and tokens.
        cuts = [0]
        while cuts[-1] < lengths.size:
            first = cuts[-1]
            before = int(ends[first - 1]) if first else 0
            stop = int(np.searchsorted(ends, before + PARQUET_SHARD, side="right"))
            cuts.append(max(first + 1, stop))
        files = len(cuts) - 1
        schema = pyarrow.schema([pyarrow.field("input_ids", pyarrow.list_(pyarrow.int32()))])
        written = []
        with _atomic_folder(dst) as tmp:
            for k in range(files):
                name = f"data-{k:05}-of-{files:05}.parquet"
                written.append(name)
                with parquet.ParquetWriter(
                    os.path.join(tmp, name), schema, compression="zstd", store_schema=True
                ) as writer:
                    lo = cuts[k]
                    while lo < cuts[k + 1]:
                        before = int(ends[lo - 1]) if lo else 0
                        hi = min(
                            cuts[k + 1],
                            lo + PARQUET_ROWS,
                            max(
                                lo + 1, int(np.searchsorted(ends, before + PARQUET_TOKENS, "right"))
                            ),
                        )
                        recs = pack.records[lo:hi]
                        first = int(recs["token_offset"][0])
                        last = int(recs["token_offset"][-1] + recs["token_length"][-1])
                        values = pack.tokens[first:last].astype(np.int32)
                        offsets = np.concatenate(
                            [recs["token_offset"].astype(np.int64) - first, [last - first]]
                        ).astype(np.int32)
                        column = pyarrow.ListArray.from_arrays(
                            pyarrow.array(offsets), pyarrow.array(values)
                        )
                        writer.write_table(pyarrow.table({"input_ids": column}, schema=schema))
                        lo = hi
            if files == 0:
                name = "data-00000-of-00001.parquet"
                written.append(name)
                parquet.write_table(
                    pyarrow.table(
                        {"input_ids": pyarrow.array([], pyarrow.list_(pyarrow.int32()))},
                        schema=schema,
                    ),
                    os.path.join(tmp, name),
                    compression="zstd",
                )
    finally:
        pack.close()
    return Result({"documents": int(lengths.size), "tokens": pack.doc_tokens, "files": written})
