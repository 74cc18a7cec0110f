"""An ingest pack read back as a training dataset (`matrixctl.open_pack`; docs/api.md).

    pack = matrixctl.open_pack("pack/")
    len(pack)            # atoms
    pack[i]              # atom i: atom_size token ids, a read-only row of a memory map
    pack[a:b], pack[[i, j]], pack[np.array(...)]   # a batch: a new (n, atom_size) array
    pack.document(j)     # the token ids of document j, through the document index
    for atom in pack.iter(seed=0):  # epoch 0, shuffled; pack.state_dict() resumes it
        ...

Checked on open, cheaply: the manifest's fields and artifact names, every artifact present with
the size the manifest records, the atom file's and the document index's headers (their CRCs
and sizes), and those headers against the manifest. `verify=True` runs every check of
`matrixctl verify PACKDIR` first (SHA-256 of every artifact, payload CRC, id ranges, the index
against the payload): it reads the whole pack. Errors carry the codes `verify` reports.

The map-style protocol PyTorch's `Dataset` uses is `__len__` and `__getitem__`; a pack satisfies
it without importing torch. A random atom costs about one page read: rows are read-only views
of one memory map of the payload (advised MADV_RANDOM), nothing is read until a row is used.

`iter(seed=, shuffle=, epoch=, start=)` is a pure function of its arguments: the same call
gives the same atoms in the same order, however often it is made. Resuming follows MosaicML's
StreamingDataset and torchdata's StatefulDataLoader: `state_dict()` is a small JSON-able dict
`{"epoch", "position", "seed", "shuffle"}` that tells where the most recent iteration stands; a
training loop saves it with its checkpoint, and `iter(start=state)`, or `load_state_dict(state)`
followed by one `iter()` (the loaded state applies to the next call only, as in torchdata),
continues from the same atom. Epoch `e`'s order is a permutation drawn from
`numpy.random.default_rng([seed, e])`: the same on every machine and numpy version that keeps
the PCG64 stream (numpy's documented stream-compatibility policy).

A dataset pickles by path (`__reduce__`: path, id dtype, the atom file's recorded hash and the
pending state, a few hundred bytes whatever the pack's size) and maps the pack again where it is
unpickled, so a DataLoader worker started with spawn or forkserver holds one shared page-cache
mapping, not a copy. A pack that changed between the two (another atom file hash) is refused
with PACK_MISMATCH.

`dtype=` (for example "int64", what `torch.nn.Embedding` takes) makes every read return new,
writable arrays of that dtype; without it a single atom is a read-only view of the mapping and a
batch is a new array of the pack's own dtype.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError, UsageError

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

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = False,
        dtype: str | np.dtype[Any] | type | None = None,
    ) -> None:
        import numpy as np

        from matrixctl.formats import doc_index, ingest_pack, matrix_atom
        from matrixctl.io import Folder, Source
        from matrixctl.opening import open_checked, open_sniffed
        from matrixctl.validate.manifest_folder import PACK_MISSING

        self.path = os.fspath(path)
        asked_dtype = dtype
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
        self.out_dtype: np.dtype[Any] | None = _out_dtype(asked_dtype, self.vocab_size)
        self._state: dict[str, Any] = {"epoch": 0, "position": 0, "seed": 0, "shuffle": True}
        self._pending: dict[str, Any] | None = None  # a loaded state, for the next iter() only

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by path (see the module docstring): a few hundred bytes."""
        dtype = None if self.out_dtype is None else self.out_dtype.name
        return (_reopen, (self.path, dtype, self.manifest.get("hash"), self._pending))

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

    def __getitem__(self, index: Any) -> np.ndarray:
        """Atom `index` (negative counts from the end): a read-only memmap row, or a new
        writable array of the `dtype` option. A slice, a list or an integer array of indexes
        is a batch: a new (n, atom_size) array, rows in the order asked."""
        if isinstance(index, slice):
            import numpy as np

            start, stop, step = index.indices(self._count)
            rows = np.arange(start, stop, step, dtype=np.int64)
            return self._gather(rows)
        if not _is_scalar(index):
            return self._gather(self._rows(index))
        i = _index(index, self._count, "atom")
        row: np.ndarray = self._atoms[i]
        if self.out_dtype is not None:
            return row.astype(self.out_dtype)
        return row

    def __getitems__(self, indices: Any) -> list[np.ndarray]:
        """The batched read PyTorch's DataLoader calls with a batch sampler's indexes: one
        gather of every row, returned as the list of samples the DataLoader expects (writable
        rows of one new array, so `default_collate` stacks them without a warning)."""
        batch = self._gather(self._rows(indices))
        return list(batch)

    def _rows(self, index: Any) -> np.ndarray:
        import numpy as np

        try:
            rows = np.asarray(index)
        except (TypeError, ValueError):
            rows = np.asarray([], dtype=object)
        if rows.dtype == bool or rows.dtype.kind not in "iu" or rows.ndim != 1:
            if rows.size == 0 and rows.ndim == 1 and rows.dtype.kind in "fO":
                return np.zeros(0, dtype=np.int64)  # an empty list
            raise TypeError(
                "atom indexes are an int, a slice, or a 1-D sequence of ints, got "
                f"{type(index).__name__}"
            )
        rows = rows.astype(np.int64, copy=False)
        if rows.size:
            low, high = int(rows.min()), int(rows.max())
            if low < -self._count or high >= self._count:
                bad = low if low < -self._count else high
                raise IndexError(f"atom {bad} out of range ({self._count} atoms)")
            if low < 0:
                rows = np.where(rows < 0, rows + self._count, rows)
        return rows

    def _gather(self, rows: np.ndarray) -> np.ndarray:
        import numpy as np

        if rows.size == 0:
            return np.zeros((0, self.atom_size), dtype=self.out_dtype or self.dtype)
        out: np.ndarray = np.take(self._atoms, rows, axis=0)  # a new, writable array
        if self.out_dtype is not None and self.out_dtype != out.dtype:
            out = out.astype(self.out_dtype)
        return out

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
        epoch: int | None = None,
        start: dict[str, Any] | None = None,
    ) -> Iterator[np.ndarray]:
        """The atoms of one epoch in its order: a pure function of the arguments. Without
        `start`, epoch `epoch` (default 0) of `seed` (default 0) from its first atom; with
        `start` (a `state_dict()`), from the atom that state points at. A state given to
        `load_state_dict` is the `start` of the next call that has none (once). `seed`,
        `shuffle` and `epoch` default to the start's; asking for other ones than a mid-epoch
        start's is refused (PACK_STATE): it would not continue the same order. `state_dict()`
        follows each atom yielded, and after the last atom it is the next epoch's first
        position."""
        if start is None and self._pending is not None:
            start, self._pending = self._pending, None
        if start is None:
            state: dict[str, Any] = {
                "epoch": 0 if epoch is None else epoch,
                "position": 0,
                "seed": 0 if seed is None else seed,
                "shuffle": True if shuffle is None else shuffle,
            }
            state = self._checked(state)
        else:
            state = self._checked(start)
            mid = state["position"] > 0
            for key, asked in (("seed", seed), ("shuffle", shuffle), ("epoch", epoch)):
                if asked is not None and mid and state[key] != asked:
                    raise FormatError(
                        PACK_STATE,
                        f"the state is inside an epoch with {key}={state[key]!r}; iter() asks "
                        f"for {asked!r}, which would not resume the same order",
                        field=key,
                    )
                if asked is not None:
                    state[key] = asked
            state = self._checked(state)
        return self._epoch(state["epoch"], state["position"], state["seed"], state["shuffle"])

    def _epoch(self, epoch: int, position: int, seed: int, shuffle: bool) -> Iterator[np.ndarray]:
        self._state = {"epoch": epoch, "position": position, "seed": seed, "shuffle": shuffle}
        order = self.order(epoch, seed=seed, shuffle=shuffle)
        for k in range(position, self._count):
            self._state = {"epoch": epoch, "position": k + 1, "seed": seed, "shuffle": shuffle}
            yield self[int(order[k])]
        self._state = {"epoch": epoch + 1, "position": 0, "seed": seed, "shuffle": shuffle}

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.iter()

    def state_dict(self) -> dict[str, Any]:
        """Where the most recent iteration stands (or the state loaded for the next one):
        `{"epoch", "position", "seed", "shuffle"}` (JSON-able); `position` counts the atoms of
        the epoch already yielded."""
        return dict(self._pending if self._pending is not None else self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (a `state_dict()` of this pack) at the next `iter()` called
        without `start` (that call only)."""
        self._pending = self._checked(state)

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


def _reopen(
    path: str, dtype: str | None, atoms_hash: Any, pending: dict[str, Any] | None
) -> PackDataset:
    """Unpickling: the pack mapped again from its path, refused if it changed meanwhile."""
    pack = PackDataset(path, dtype=dtype)
    if pack.manifest.get("hash") != atoms_hash:
        raise FormatError(
            _pack_code("PACK_MISMATCH"),
            f"the pack changed since it was pickled: its atom file hash is "
            f"{pack.manifest.get('hash')}, the pickled dataset's {atoms_hash}",
            path=path,
            field="hash",
        )
    if pending is not None:
        pack.load_state_dict(pending)
    return pack


def _out_dtype(dtype: Any, vocab_size: int) -> np.dtype[Any] | None:
    """The `dtype` option: None, or an integer dtype that holds every id below vocab_size."""
    import numpy as np

    if dtype is None:
        return None
    try:
        out = np.dtype(dtype)
    except TypeError:
        raise UsageError(f"dtype {dtype!r} is not a numpy dtype") from None
    if out.kind not in "iu" or (vocab_size and int(np.iinfo(out).max) < vocab_size - 1):
        raise UsageError(
            f"dtype {out.name} cannot hold token ids below {vocab_size}",
            hint="int64 (torch.nn.Embedding's index type) or int32",
        )
    return out


def _is_scalar(index: Any) -> bool:
    import operator

    if isinstance(index, (list, tuple)):
        return False
    if getattr(index, "ndim", 0) != 0:
        return False
    try:
        operator.index(index)
    except TypeError:
        return not hasattr(index, "__len__")
    return True


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
