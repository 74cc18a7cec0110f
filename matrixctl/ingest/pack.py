"""Writing an ingest pack folder (matrix-ingest-v1.md section 6; docs/formats/ingest-pack.md).

`PackBuilder` builds the pack in a hidden temporary sibling folder
(`.NAME.mxPID-START-HOST-RANDOM.tmp`, same parent, so the final rename is atomic), streaming
atoms and document records as they arrive in order. `finish` completes the atom header, the
index, the projection, writes the tokenizer file (the symbol map, or a model tokenizer's
record), hashes every artifact, writes the manifest last
(every file synced first) and publishes the folder in one atomic exchange or rename
(`matrixctl.ingest.swap`): PACKDIR is always absent, the previous pack or the new one, whole.
On any failure (Ctrl-C included) the temporary folder is removed; after a kill the next run
writing PACKDIR removes it. An existing PACKDIR is replaced only on success, and only when it
is an ingest pack, a pack an older version left without its final manifest name, or an empty
folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import InputError, OutputError
from matrixctl.formats import doc_index, matrix_atom, svgt
from matrixctl.formats import ingest_pack as pack_format
from matrixctl.ingest.swap import clean_stale, make_temp_dir, publish
from matrixctl.io import FileHash, sha256_file
from matrixctl.package import __version__

if TYPE_CHECKING:
    import numpy as np

INGEST_OUTPUT = codes.define(
    "INGEST_OUTPUT",
    "PACKDIR exists and is neither an ingest pack nor an empty folder (it is never replaced).",
    group="ingest",
)
WRITE_CHUNK = 1 << 22  # tokens per write when copying spilled tokens


def check_destination(dest: str) -> None:
    if os.path.lexists(dest):
        if os.path.isdir(dest) and not os.path.islink(dest):
            if pack_format.is_pack(dest) or _interrupted(dest) or not os.listdir(dest):
                return
            raise OutputError(
                INGEST_OUTPUT,
                "exists and is not an ingest pack; refusing to replace it",
                path=dest,
                hint="choose another -o, or remove the folder yourself",
            )
        raise OutputError(INGEST_OUTPUT, "exists and is not a folder", path=dest)


def _interrupted(dest: str) -> bool:
    """A pack an older version left between its last two renames: the manifest still has its
    `.partial` name. It is ours, so the next run replaces it."""
    return os.path.isfile(os.path.join(dest, pack_format.MANIFEST + ".partial"))


def created_stamp() -> str | None:
    """ISO 8601 UTC time from SOURCE_DATE_EPOCH, or None (no wall-clock time in artifacts)."""
    from matrixctl.epoch import source_date_text

    return source_date_text()


def write_json(path: str, doc: Any) -> None:
    data = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    with open(path, "wb") as fp:
        fp.write(data.encode("utf-8"))
        fp.flush()
        os.fsync(fp.fileno())


@dataclass
class PackPlan:
    """Everything the pack's header fields and manifest need to know up front."""

    atom_size: int
    dtype: str
    vocab_size: int
    pad_id: int
    eos_id: int | None
    grid: tuple[int, int] | None
    tokenizer_raw: bytes  # the bytes of the pack's tokenizer file
    # What the manifest says of the tokenizer: {"symbol_map": {...}} for π, {"symbol_map":
    # None, "model_tokenizer": {...}} for a model tokenizer (docs/formats/ingest-pack.md).
    tokenizer_meta: dict[str, Any]
    tokenizer_file: str = pack_format.SYMBOLS
    manifest_head: dict[str, Any] = field(default_factory=dict)


class PackBuilder:
    """Stream documents into a pack in a temporary folder; `finish` puts it in place."""

    def __init__(self, dest: str, plan: PackPlan) -> None:
        clean_stale(dest)
        check_destination(dest)
        self.dest = dest
        self.plan = plan
        self.sources: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.done = False
        self._made: list[str] = []  # the temporary folder, recorded before it exists

    def _create(self) -> None:
        """Make the temporary folder and open its files. Called by `__enter__`; a failure or a
        signal anywhere in here removes what was made (the `with` block is not entered yet)."""
        plan = self.plan
        opened: list[Any] = []
        try:
            self.tmp = make_temp_dir(self.dest, self._made)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(self.tmp, 0o777 & ~umask)
            self.spill_dir = os.path.join(self.tmp, ".spill")
            os.mkdir(self.spill_dir)
            flags = matrix_atom.FLAG_INDEX | (matrix_atom.FLAG_SVG_TENSOR if plan.grid else 0)
            self._atoms_fp = open(os.path.join(self.tmp, pack_format.ATOMS), "w+b")  # noqa: SIM115
            opened.append(self._atoms_fp)
            self.atoms = matrix_atom.AtomWriter(
                self._atoms_fp,
                atom_size=plan.atom_size,
                dtype=plan.dtype,
                vocab_size=plan.vocab_size,
                pad_id=plan.pad_id,
                flags=flags,
            )
            self._index_fp = open(os.path.join(self.tmp, pack_format.DOC_INDEX), "w+b")  # noqa: SIM115
            opened.append(self._index_fp)
            self.index = doc_index.IndexWriter(self._index_fp, eos_id=plan.eos_id)
        except BaseException:
            for fp in opened:
                with contextlib.suppress(OSError):
                    fp.close()
            for made in self._made:
                shutil.rmtree(made, ignore_errors=True)
            raise

    # Streaming ----------------------------------------------------------------------------

    def add_tokens(self, ids: np.ndarray) -> None:
        self.atoms.write(ids)

    def add_tokens_shared(self, ids: np.ndarray, max_id: int, crc: int) -> None:
        """Ids in memory another process reuses once this returns (a worker's slot), with the
        largest id and CRC-32 that process computed: written before returning."""
        self.atoms.write(ids, max_id, crc=crc)
        self.atoms.settle()

    def add_tokens_file(self, path: str) -> None:
        import numpy as np

        with open(path, "rb") as fp:
            while True:
                block = fp.read(WRITE_CHUNK * 4)
                if not block:
                    break
                self.atoms.write(np.frombuffer(block, dtype="<u4"))

    def add_tokens_range(
        self, path: str, offset: int, nbytes: int, dtype: str, max_id: int, crc: int
    ) -> None:
        """Tokens staged in a file (a Dask work unit's results), copied as they are."""
        fd = os.open(path, os.O_RDONLY)
        try:
            self.atoms.write_range(fd, offset, nbytes, dtype, max_id=max_id, crc=crc)
        except InputError as err:  # IO_CHANGED: the staged file was cut while copied
            err.path = err.path or path
            raise
        finally:
            os.close(fd)

    def add_record(self, length: int, source: int, item: int) -> None:
        self.index.add(length, source, item)

    def add_records(self, pairs: np.ndarray, source: int, item_base: int = 0) -> None:
        """Rows of (token length, item), uint64, of one source (`IndexWriter.add_many`)."""
        self.index.add_many(pairs, source, item_base)

    # Completion ---------------------------------------------------------------------------

    def finish(self, manifest_tail: dict[str, Any]) -> dict[str, Any]:
        """Complete every artifact, write the manifest, move the pack into place."""
        plan = self.plan
        header = self.atoms.finish()
        padding = self.atoms.padding
        # The atoms (the largest file) are hashed on a helper thread while this one syncs them
        # and completes the rest (hashlib and reads release the GIL).
        self._atoms_fp.flush()
        atoms_hash = FileHash(os.path.join(self.tmp, pack_format.ATOMS))
        try:
            self._sync(self._atoms_fp)
            idx_header = self.index.finish()
            self._sync(self._index_fp)
            shutil.rmtree(self.spill_dir)
            files: dict[str, dict[str, Any]] = {}
            if plan.grid:
                self._project(header)
            with open(os.path.join(self.tmp, plan.tokenizer_file), "wb") as fp:
                fp.write(plan.tokenizer_raw)
                fp.flush()
                os.fsync(fp.fileno())
        except BaseException:
            atoms_hash.cancel()
            raise
        atoms_digest = atoms_hash.result()
        for name in (
            pack_format.ATOMS,
            plan.tokenizer_file,
            pack_format.DOC_INDEX,
            *((pack_format.SVGT,) if plan.grid else ()),
        ):
            path = os.path.join(self.tmp, name)
            digest = atoms_digest if name == pack_format.ATOMS else sha256_file(path)
            files[name] = {"sha256": digest, "bytes": os.path.getsize(path)}
        manifest: dict[str, Any] = {
            "version": pack_format.MANIFEST_VERSION,
            **plan.manifest_head,
            "tokenizer": plan.tokenizer_file,
            "atom_file": pack_format.ATOMS,
            "atom_size": header.atom_size,
            "dtype": header.dtype_name,
            "hash": files[pack_format.ATOMS]["sha256"],
            "vocab_size": header.vocab_size,
            "pad_id": plan.pad_id,
            "eos_id": plan.eos_id,
            "tokens": header.token_count - padding,
            "padding": padding,
            "token_count": header.token_count,
            "atom_count": header.atom_count,
            "documents": idx_header.doc_count,
            **plan.tokenizer_meta,
            "doc_index": pack_format.DOC_INDEX,
            "svgt": (
                {"file": pack_format.SVGT, "grid": f"{plan.grid[0]}x{plan.grid[1]}"}
                if plan.grid
                else None
            ),
            "files": files,
            **manifest_tail,
            "tool": {"name": "matrixctl", "version": __version__},
            "created": created_stamp(),
        }
        write_json(os.path.join(self.tmp, pack_format.MANIFEST), manifest)
        publish(self.tmp, self.dest)
        self.done = True
        return manifest

    def _sync(self, fp: Any) -> None:
        fp.flush()
        os.fsync(fp.fileno())
        fp.close()

    def _project(self, header: matrix_atom.AtomHeader) -> None:
        from matrixctl.io import Source

        assert self.plan.grid is not None
        rows, cols = self.plan.grid
        with Source.open(os.path.join(self.tmp, pack_format.ATOMS)) as src:
            tokens = matrix_atom.token_view(src.buf, header)
            step = max(1, (1 << 22) // header.atom_size) * header.atom_size
            chunks = (tokens[i : i + step] for i in range(0, tokens.size, step))
            with open(os.path.join(self.tmp, pack_format.SVGT), "wb") as fp:
                svgt.write_svgt(fp, chunks, rows=rows, cols=cols, atom_count=header.atom_count)
                fp.flush()
                os.fsync(fp.fileno())
            del tokens

    def abort(self) -> None:
        if self.done:
            return
        for fp in (self._atoms_fp, self._index_fp):
            with contextlib.suppress(OSError):
                fp.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> PackBuilder:
        self._create()
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()
