"""Interoperability with the reference implementation, ztensor 1.1.1 (installed by the test extra).

Both directions: files ztensor 1.1.1 writes are read and verified by matrixctl, and files
matrixctl writes open in ztensor 1.1.1 with the same names, shapes and values (digests checked
by its own reader).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import ztensor
from ztensor import ffi, lib

from matrixctl.formats import ztensor as ztensor_v1
from matrixctl.io import Source
from matrixctl.opening import open_checked
from matrixctl.validate.engine import examine
from tests.helpers.cli import run_cli

REFERENCE_NUMPY = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "u64": np.uint64,
    "u32": np.uint32,
    "u16": np.uint16,
    "u8": np.uint8,
    "bool": np.bool_,
}


def sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dtype in ("f64", "f32", "f16", "bf16"):
        return rng.standard_normal(n).astype(REFERENCE_NUMPY[dtype]).reshape(shape)
    info = np.iinfo(REFERENCE_NUMPY[dtype])
    return rng.integers(info.min, info.max, n, dtype=REFERENCE_NUMPY[dtype], endpoint=True).reshape(
        shape
    )


def matrixctl_tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    with Source.open(str(path)) as src:
        source = ztensor_v1.ZtSource(src, open_checked(src, ztensor_v1.FORMAT))
        return {
            i.name: (i.dtype, i.shape, b"".join(bytes(p) for p in source.stream(i)))
            for i in source.tensors()
        }


def reference_verified_read(path: Path, name: str) -> None:
    """ztensor 1.1.1's checksum-verifying read (its numpy API skips digests for raw data)."""
    with ztensor.Reader(str(path)) as r:
        view = lib.ztensor_reader_read_tensor(r._ptr, name.encode(), 1)
        if view == ffi.NULL:
            raise ztensor.ZTensorError(ffi.string(lib.ztensor_last_error_message()).decode())
        lib.ztensor_free_tensor_view(view)


def test_the_pinned_reference_release_is_installed() -> None:
    assert importlib.metadata.version("ztensor") == "1.1.1"


@pytest.mark.parametrize("compress", [False, True])
def test_files_written_by_ztensor_are_read_and_verified(tmp_path: Path, compress: bool) -> None:
    path = tmp_path / "ref.zt"
    arrays = {f"t.{d}": sample(d, (3, 5), i) for i, d in enumerate(REFERENCE_NUMPY)}
    arrays["empty"] = np.zeros((0, 4), np.float32)
    with ztensor.Writer(str(path)) as w:
        for name, arr in arrays.items():
            w.add_tensor(name, arr, compress=compress)
    report = examine(str(path), scan=True)[0]
    assert report.ok(strict=True), report.findings
    got = matrixctl_tensors(path)
    assert set(got) == set(arrays)
    for name, arr in arrays.items():
        dtype, shape, data = got[name]
        assert dtype == name.removeprefix("t.") or name == "empty"
        assert shape == arr.shape and data == arr.tobytes(), name


def test_sparse_files_written_by_ztensor_verify_and_densify(tmp_path: Path) -> None:
    path = tmp_path / "sparse.zt"
    with ztensor.Writer(str(path)) as w:
        w.add_sparse_csr(
            "csr",
            np.array([1.0, 2.0, 3.0], np.float32),
            np.array([0, 2, 1]),
            np.array([0, 2, 3]),
            (2, 3),
        )
        w.add_sparse_coo(
            "coo", np.array([4.0, 5.0], np.float32), np.array([[0, 1], [2, 0]]), (2, 3)
        )
    report = examine(str(path), scan=True)[0]
    assert report.ok(), report.findings
    out = tmp_path / "dense.npz"
    result = run_cli("convert", str(path), str(out), "--densify")
    assert result.code == 0, result.stderr
    loaded = np.load(out)
    assert loaded["csr"].tolist() == [[1, 0, 2], [0, 3, 0]]
    assert loaded["coo"].tolist() == [[0, 0, 4], [5, 0, 0]]


@pytest.mark.parametrize("compress", [None, "zstd", "zstd:9"])
@pytest.mark.parametrize("digest", ["crc32c", "sha256"])
def test_files_written_by_matrixctl_open_in_ztensor(
    tmp_path: Path, compress: str | None, digest: str
) -> None:
    arrays = {f"t.{d}": sample(d, (4, 3), i) for i, d in enumerate(REFERENCE_NUMPY) if d != "bf16"}
    arrays["scalar"] = np.array(7.25, np.float32)
    src = tmp_path / "in.npz"
    np.savez(src, **arrays)
    out = tmp_path / "out.zt"
    args = ["convert", str(src), str(out), "--digest", digest]
    if compress:
        args += ["--compress", compress]
    assert run_cli(*args).code == 0
    with ztensor.Reader(str(out)) as r:
        assert sorted(r.tensor_names) == sorted(arrays)
        for name, arr in arrays.items():
            got = r.read_tensor(name, verify_checksum=True)
            assert got.shape == arr.shape, name
            assert np.array_equal(np.asarray(got), arr), name
            assert r.metadata(name).checksum.startswith(digest + ":")
    for name in arrays:
        reference_verified_read(out, name)


def test_bf16_written_by_matrixctl_reads_in_ztensor(tmp_path: Path) -> None:
    arr = sample("bf16", (8,))
    src = tmp_path / "b.safetensors"
    from safetensors.numpy import save_file

    save_file({"w": arr}, str(src), metadata={"format": "pt"})
    out = tmp_path / "b.zt"
    assert run_cli("convert", str(src), str(out)).code == 0
    with ztensor.Reader(str(out)) as r:
        assert (
            np.asarray(r.read_tensor("w")).view(np.uint16).tolist() == arr.view(np.uint16).tolist()
        )


def test_ztensor_refuses_what_matrixctl_refuses(tmp_path: Path) -> None:
    """A flipped data byte in a digested file: both readers refuse it."""
    arrays = {"w": np.arange(64, dtype=np.float32)}
    src = tmp_path / "in.npz"
    np.savez(src, **arrays)
    out = tmp_path / "out.zt"
    assert run_cli("convert", str(src), str(out)).code == 0
    data = bytearray(out.read_bytes())
    data[64] ^= 0x40
    out.write_bytes(bytes(data))
    with pytest.raises(ztensor.ZTensorError, match="Checksum mismatch"):
        reference_verified_read(out, "w")
    assert run_cli("verify", str(out)).code == 1


def test_sparse_written_by_matrixctl_reads_in_ztensor(tmp_path: Path) -> None:
    ref = tmp_path / "ref.zt"
    with ztensor.Writer(str(ref)) as w:
        w.add_sparse_csr(
            "csr", np.array([1.0, 2.0], np.float32), np.array([1, 0]), np.array([0, 1, 2]), (2, 2)
        )
    out = tmp_path / "copy.zt"
    assert run_cli("convert", str(ref), str(out), "--compress", "zstd").code == 0
    with ztensor.Reader(str(out)) as r:
        # Keep each view handle while copying: the reference frees the buffer with it.
        got = {}
        for role, dtype in (("values", np.float32), ("indices", np.uint64), ("indptr", np.uint64)):
            arr, handle = r._read_component("csr", role, lambda d=dtype: d)
            got[role] = arr.copy()
            del arr, handle
        values, indices, indptr = got["values"], got["indices"], got["indptr"]
    assert values.tolist() == [1.0, 2.0]
    assert indices.tolist() == [1, 0] and indptr.tolist() == [0, 1, 2]


def test_metadata_written_by_matrixctl_opens_in_ztensor(tmp_path: Path) -> None:
    """Decision: file metadata becomes text root attributes, the only kind ztensor 1.1.1 reads."""
    from safetensors.numpy import save_file

    src = tmp_path / "m.safetensors"
    save_file({"x": np.ones(2, np.float32)}, str(src), metadata={"format": "pt", "step": "10"})
    out = tmp_path / "m.zt"
    assert run_cli("convert", str(src), str(out)).code == 0
    f = ztensor_v1.parse(out.read_bytes(), out.stat().st_size)
    assert f.attributes == {"format": "pt", "step": "10"}
    with ztensor.Reader(str(out)) as r:
        assert r.tensor_names == ["x"]
