"""Batched reads, the id dtype option, pickling by path and the pure `iter()` of `open_pack`
(issue 30, item 1 and 2)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

import matrixctl
from matrixctl.errors import FormatError, UsageError
from tests.helpers.cli import FIXTURES, run_cli


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("batches") / "pack"
    res = run_cli("ingest", "docs", str(FIXTURES / "corpus"), "-o", str(out), "--atom-size", "16")
    assert res.code == 0, res.stderr
    return out


def _raw_atoms(pack: Path) -> np.ndarray:
    """The payload read without matrixctl: the 64-byte header's counts, then uint16/32 ids."""
    data = (pack / "matrix_atoms.bin").read_bytes()
    dtype = {1: "<u2", 2: "<u4"}[data[0x0C]]
    atom_size = int.from_bytes(data[0x14:0x18], "little")
    return np.frombuffer(data[64:], dtype=dtype).reshape(-1, atom_size)


def test_slices_index_arrays_and_getitems_are_batches(pack: Path) -> None:
    ds = matrixctl.open_pack(pack)
    raw = _raw_atoms(pack)
    for index in (slice(0, 4), slice(-5, None), slice(None, None, 3), slice(7, 2, -2)):
        batch = ds[index]
        np.testing.assert_array_equal(batch, raw[index])
        assert batch.flags.writeable and batch.dtype == raw.dtype
    picks = [5, 0, -1, 5]
    np.testing.assert_array_equal(ds[picks], raw[picks])
    np.testing.assert_array_equal(ds[np.array(picks, dtype=np.int32)], raw[picks])
    rows = ds.__getitems__([3, 1, 2])
    assert isinstance(rows, list) and len(rows) == 3
    for got, want in zip(rows, raw[[3, 1, 2]], strict=True):
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable
    assert ds[[]].shape == (0, ds.atom_size) and ds[5:5].shape == (0, ds.atom_size)
    with pytest.raises(IndexError):
        ds[[0, len(ds)]]
    with pytest.raises(IndexError):
        ds[np.array([-len(ds) - 1])]
    with pytest.raises(TypeError):
        ds[[0.5, 1.5]]
    with pytest.raises(TypeError):
        ds[np.zeros(len(ds), dtype=bool)]
    with pytest.raises(TypeError):
        ds["0"]


def test_dtype_option_gives_writable_arrays_of_that_dtype(pack: Path) -> None:
    ds = matrixctl.open_pack(pack, dtype="int64")
    raw = _raw_atoms(pack)
    one = ds[2]
    assert one.dtype == np.int64 and one.flags.writeable
    np.testing.assert_array_equal(one, raw[2])
    assert ds[0:3].dtype == np.int64 and ds[[1, 2]].dtype == np.int64
    assert all(r.dtype == np.int64 for r in ds.__getitems__([0, 1]))
    assert next(iter(ds)).dtype == np.int64
    with pytest.raises(UsageError):
        matrixctl.open_pack(pack, dtype="float32")
    with pytest.raises(UsageError):
        matrixctl.open_pack(pack, dtype="int8")  # the π map's ids do not fit


def test_pickles_by_path_in_under_a_kilobyte(pack: Path, tmp_path: Path) -> None:
    ds = matrixctl.open_pack(pack, dtype="int64")
    blob = pickle.dumps(ds)
    assert len(blob) < 1024
    assert str(pack).encode() in blob  # the path, not the payload
    back = pickle.loads(blob)
    np.testing.assert_array_equal(back[0 : len(back)], ds[0 : len(ds)])
    assert back.out_dtype == np.int64
    ds.load_state_dict({"epoch": 2, "position": 3, "seed": 5, "shuffle": True})
    resumed = pickle.loads(pickle.dumps(ds))  # a pending state travels with it
    assert resumed.state_dict() == {"epoch": 2, "position": 3, "seed": 5, "shuffle": True}


def test_unpickling_a_changed_pack_is_refused(pack: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(pack, copy)
    blob = pickle.dumps(matrixctl.open_pack(copy))
    manifest = json.loads((copy / "ingest_manifest.json").read_text())
    manifest["hash"] = "sha256:" + "0" * 64
    (copy / "ingest_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    with pytest.raises(FormatError) as err:
        pickle.loads(blob)
    assert err.value.code == "PACK_MISMATCH"


def test_iter_is_a_pure_function_of_its_arguments(pack: Path) -> None:
    ds = matrixctl.open_pack(pack)
    first = [a.tolist() for a in ds.iter(seed=0)]
    assert [a.tolist() for a in ds.iter(seed=0)] == first  # twice: the same order
    it = ds.iter(seed=1)
    next(it)  # a loop left early
    assert [a.tolist() for a in ds.iter(seed=3)] == [
        ds[int(i)].tolist() for i in ds.order(0, seed=3)
    ]
    assert [a.tolist() for a in ds.iter(seed=0, epoch=2)] == [
        ds[int(i)].tolist() for i in ds.order(2, seed=0)
    ]
    with pytest.raises(FormatError) as err:
        ds.iter(epoch=1, start={"epoch": 0, "position": 2, "seed": 0, "shuffle": True})
    assert err.value.code == "PACK_STATE"


def test_a_dataloader_over_open_pack_batches_without_warnings(pack: Path) -> None:
    """Map-style through a DataLoader: the batch sampler's indexes go to `__getitems__` (one
    gather), the rows are writable (default_collate's "not writable" warning never shows) and
    already of the Embedding's dtype."""
    import warnings

    pytest.importorskip("torch")
    import torch
    from torch.utils.data import DataLoader

    ds = matrixctl.open_pack(pack, dtype="int64")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = list(DataLoader(ds, batch_size=4))
    assert all(b.dtype == torch.int64 for b in batches)
    np.testing.assert_array_equal(torch.cat(batches).numpy(), _raw_atoms(pack))
