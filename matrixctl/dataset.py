"""An ingest pack read back as a training dataset (`matrixctl.open_pack`; docs/api.md).

    pack = matrixctl.open_pack("pack/")
    len(pack)            # atoms
    pack[i]              # atom i: atom_size token ids, a read-only row of a memory map
    pack.document(j)     # the token ids of document j, through the document index
    for atom in pack.iter(seed=0):  # one epoch, shuffled; pack.state_dict() resumes it
        ...

Checked on open, cheaply: the manifest's fields and artifact names, every artifact present with
the size the manifest records, the atom file's and the document index's headers (their CRCs
and sizes), and those headers against the manifest. `verify=True` runs every check of
`matrixctl verify PACKDIR` first (SHA-256 of every artifact, payload CRC, id ranges, the index
against the payload): it reads the whole pack. Errors carry the codes `verify` reports.

The map-style protocol PyTorch's `Dataset` uses is `__len__` and `__getitem__`; a pack satisfies
it without importing torch. A random atom costs about one page read: rows are read-only views
of one memory map of the payload (advised MADV_RANDOM), nothing is read until a row is used.

Resuming follows MosaicML's StreamingDataset and torchdata's StatefulDataLoader:
`state_dict()` is a small JSON-able dict `{"epoch", "position", "seed", "shuffle"}` that a
training loop saves with its checkpoint; `load_state_dict(state)` (or `iter(start=state)`)
continues from the same atom. Epoch `e`'s order is a permutation drawn from
`numpy.random.default_rng([seed, e])`: the same on every machine and numpy version that keeps
the PCG64 stream (numpy's documented stream-compatibility policy).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError

if TYPE_CHECKING:
    import numpy as np

PACK_STATE = codes.define(
    "PACK_STATE",
    "Python API: a dataset state (state_dict) that does not fit this pack (another seed or "
    "order, a position beyond the atoms, missing keys).",
    group="api",
)


class PackDataset:
    """Atoms and documents of one ingest pack (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        import numpy as np

        from matrixctl.formats import doc_index, ingest_pack, matrix_atom
        from matrixctl.io import Folder, Source
        from matrixctl.opening import open_checked, open_sniffed
        from matrixctl.validate.manifest_folder import PACK_MISSING

        self.path = os.fspath(path)
        with open_sniffed(self.path) as (_, fmt):
            pass
        if fmt != ingest_pack.FORMAT:
            raise FormatError(
                codes.UNKNOWN_FORMAT,
                f"not an ingest pack (format: {fmt}); open_pack needs a folder with "
                f"{ingest_pack.MANIFEST}",
                path=self.path,
                offset=0,
            )
        if verify:
            _verify_all(self.path)
        pack = open_checked(Folder(self.path), ingest_pack.FORMAT)
        manifest: dict[str, Any] = pack.manifest
        self.manifest = manifest
        atoms_path = pack.file(manifest["atom_file"])
        index_name = manifest.get("doc_index")
        index_path = pack.file(index_name) if isinstance(index_name, str) else None
        if atoms_path is None or index_path is None:
            raise FormatError(
                PACK_MISSING,
                "the manifest names no atom file or no document index inside the pack",
                path=self.path,
                field="doc_index" if atoms_path else "atom_file",
            )
        with Source.open(atoms_path) as src:
            header: matrix_atom.AtomHeader = open_checked(src, matrix_atom.FORMAT).header
        with Source.open(index_path) as src:
            index_header: doc_index.IndexHeader = open_checked(src, doc_index.FORMAT).header
        self._agree(manifest, header, index_header)
        self.atom_size: int = header.atom_size
        self.vocab_size: int = header.vocab_size
        self.pad_id: int = int(manifest["pad_id"])
        eos = manifest.get("eos_id")
        self.eos_id: int | None = eos if isinstance(eos, int) else None
        dtype = np.dtype(matrix_atom.DTYPES[header.dtype_id][1])
        self.dtype = dtype
        self._count = header.atom_count
        self._docs = index_header.doc_count
        tokens = _memmap(atoms_path, dtype, header.data_offset, header.token_count)
        self._tokens: np.ndarray = tokens
        self._atoms = tokens.reshape(header.atom_count, header.atom_size)
        record = np.dtype(doc_index.RECORD_DTYPE)
        self._records = _memmap(index_path, record, doc_index.HEADER_SIZE, index_header.doc_count)
        self._state: dict[str, Any] = {"epoch": 0, "position": 0, "seed": 0, "shuffle": True}

    def _agree(self, manifest: dict[str, Any], header: Any, index_header: Any) -> None:
        """The headers against the manifest (PACK_MISMATCH, as `verify` reports it)."""
        pairs = [
            ("atom_size", header.atom_size),
            ("atom_count", header.atom_count),
            ("token_count", header.token_count),
            ("vocab_size", header.vocab_size),
            ("dtype", header.dtype_name),
            ("documents", index_header.doc_count),
        ]
        for key, value in pairs:
            if manifest.get(key) != value:
                raise FormatError(
                    _pack_code("PACK_MISMATCH"),
                    f"manifest {key} is {manifest.get(key)!r}, the file's header says {value!r}",
                    path=self.path,
                    field=key,
                )
        if index_header.token_count > header.token_count:
            raise FormatError(
                _pack_code("PACK_INDEX"),
                f"the document index covers {index_header.token_count} tokens, the atom file "
                f"holds {header.token_count}",
                path=self.path,
                field="doc_index",
            )

    # The map-style Dataset protocol -----------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> np.ndarray:
        """Atom `index` (negative counts from the end): a read-only memmap row."""
        i = _index(index, self._count, "atom")
        row: np.ndarray = self._atoms[i]
        return row

    @property
    def documents(self) -> int:
        return self._docs

    def document(self, index: int) -> np.ndarray:
        """The token ids of document `index` (its end-of-document token included, padding not),
        a read-only slice of the payload."""
        j = _index(index, self._docs, "document")
        rec = self._records[j]
        start, length = int(rec["token_offset"]), int(rec["token_length"])
        ids: np.ndarray = self._tokens[start : start + length]
        return ids

    # Resumable iteration ------------------------------------------------------------------------

    def order(self, epoch: int, *, seed: int = 0, shuffle: bool = True) -> np.ndarray:
        """The atom indexes of `epoch` in the order `iter` yields them."""
        import numpy as np

        if not shuffle:
            return np.arange(self._count, dtype=np.int64)
        rng = np.random.default_rng([int(seed), int(epoch)])
        perm: np.ndarray = rng.permutation(self._count)
        return perm

    def iter(
        self,
        *,
        seed: int | None = None,
        shuffle: bool | None = None,
        start: dict[str, Any] | None = None,
    ) -> Iterator[np.ndarray]:
        """The atoms of one epoch from `start` (default: this dataset's state, at first epoch 0
        position 0), in the epoch's order; `state_dict()` follows each atom yielded, and after
        the last atom it is the next epoch's first position. `seed` and `shuffle` default to the
        state's (0 and True at first). Resuming mid-epoch with another seed or shuffle than the
        state's is refused (PACK_STATE): it would not continue the same order."""
        state = self._checked(start if start is not None else self._state)
        mid = state["position"] > 0
        for key, asked in (("seed", seed), ("shuffle", shuffle)):
            if asked is not None and mid and state[key] != asked:
                raise FormatError(
                    PACK_STATE,
                    f"the state is inside an epoch shuffled with {key}={state[key]!r}; iter() "
                    f"asks for {asked!r}, which would not resume the same order",
                    field=key,
                )
        seed = state["seed"] if seed is None else int(seed)
        shuffle = state["shuffle"] if shuffle is None else bool(shuffle)
        return self._epoch(state["epoch"], state["position"], seed, shuffle)

    def _epoch(self, epoch: int, position: int, seed: int, shuffle: bool) -> Iterator[np.ndarray]:
        self._state = {"epoch": epoch, "position": position, "seed": seed, "shuffle": shuffle}
        order = self.order(epoch, seed=seed, shuffle=shuffle)
        for k in range(position, self._count):
            self._state = {"epoch": epoch, "position": k + 1, "seed": seed, "shuffle": shuffle}
            yield self._atoms[int(order[k])]
        self._state = {"epoch": epoch + 1, "position": 0, "seed": seed, "shuffle": shuffle}

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.iter()

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands: `{"epoch", "position", "seed", "shuffle"}` (JSON-able);
        `position` counts the atoms of the epoch already yielded."""
        return dict(self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (a `state_dict()` of this pack) at the next `iter()`."""
        self._state = self._checked(state)

    def _checked(self, state: Any) -> dict[str, Any]:
        if not isinstance(state, dict):
            raise FormatError(PACK_STATE, f"a state is a dict, got {type(state).__name__}")
        for key in ("epoch", "position", "seed"):
            value = state.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FormatError(PACK_STATE, f"state {key} must be an int >= 0, got {value!r}",
                                  field=key)  # fmt: skip
        if not isinstance(state.get("shuffle"), bool):
            raise FormatError(PACK_STATE, "state shuffle must be true or false", field="shuffle")
        if state["position"] > self._count:
            raise FormatError(
                PACK_STATE,
                f"state position {state['position']} is beyond the pack's {self._count} atoms",
                field="position",
            )
        return {k: state[k] for k in ("epoch", "position", "seed", "shuffle")}

    def __repr__(self) -> str:
        return (
            f"<PackDataset {self.path!r}: {self._count} atoms of {self.atom_size}, "
            f"{self._docs} documents>"
        )


def _pack_code(name: str) -> str:
    from matrixctl.validate import ingest_pack

    code: str = getattr(ingest_pack, name)
    return code


def _index(index: int, count: int, what: str) -> int:
    import operator

    try:
        i = operator.index(index)
    except TypeError:
        raise TypeError(f"{what} index must be an integer, got {type(index).__name__}") from None
    if i < 0:
        i += count
    if not 0 <= i < count:
        raise IndexError(f"{what} {index} out of range ({count} {what}s)")
    return i


def _memmap(path: str, dtype: np.dtype[Any], offset: int, count: int) -> np.ndarray:
    """A read-only array over `count` items of `path` from `offset`, mapped, not read. The
    mapping is advised MADV_RANDOM: without it the kernel's read-ahead reads ~128 KiB around
    every touched page (measured in docs/api.md: 50 random 4 KiB atoms read the whole 1.5 MiB
    payload; with it, 388 KiB, two pages per atom because rows start 64 bytes into a page)."""
    import mmap

    import numpy as np

    if count == 0:
        return np.zeros(0, dtype=dtype)
    with builtins.open(path, "rb") as fp:
        mapped = mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        mapped.madvise(mmap.MADV_RANDOM)
    array: np.ndarray = np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
    return array


def _verify_all(path: str) -> None:
    """Every check of `matrixctl verify PACKDIR`; the first error raised with its code."""
    from matrixctl.codes import Severity
    from matrixctl.validate.engine import examine

    report = examine(path, scan=True)[0]
    for f in report.findings:
        if f.severity is Severity.ERROR:
            raise FormatError(f.code, f.message, path=path, offset=f.offset, field=f.field)


__all__ = ["PackDataset"]
