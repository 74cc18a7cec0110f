"""safetensors and NumPy codecs, and `convert` between every pair of tensor containers."""

from __future__ import annotations

import json
import re
import struct
import tempfile
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies
from safetensors.numpy import save, save_file

from matrixctl.converters import tensors as convert_tensors
from matrixctl.formats import npy, st_container
from matrixctl.formats import ztensor as ztensor_v1
from matrixctl.validate.engine import examine
from tests.helpers.cli import run_cli, run_sub


def report_of(tmp_path: Path, data: bytes, name: str, scan: bool = True):
    path = tmp_path / name
    path.write_bytes(data)
    return examine(str(path), scan=scan)[0]


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def st_file(header: dict, data: bytes, pad: bytes = b"") -> bytes:
    raw = json.dumps(header).encode() + pad
    return struct.pack("<Q", len(raw)) + raw + data


# safetensors --------------------------------------------------------------------------------


def test_safetensors_writer_gives_the_package_bytes(tmp_path: Path) -> None:
    """The writer's layout is the safetensors package's: tensors by dtype (widest first) then
    name, header padded with spaces to 8 bytes."""
    arrays = {
        "b": np.arange(3, dtype=np.float32),
        "a": np.array([1, -2], np.int8),
        "h": np.array(2, np.float32),
        "f": np.array([1.5, -2], ml_dtypes.bfloat16),
        "e": np.zeros((2, 0), np.float16),
        "m": np.array([True, False]),
        "k": np.arange(2, dtype=np.uint64),
        "c": np.array([1 + 2j], np.complex64),
        "g": np.array([0.5], ml_dtypes.float8_e4m3fn),
    }
    src = tmp_path / "in.npz"
    reference = save(arrays, metadata={"format": "pt"})
    ref_path = tmp_path / "ref.safetensors"
    ref_path.write_bytes(reference)
    out = tmp_path / "out.safetensors"
    assert run_cli("convert", str(ref_path), str(tmp_path / "mid.zt")).code == 0
    assert run_cli("convert", str(tmp_path / "mid.zt"), str(out)).code == 0
    assert out.read_bytes() == reference
    del src


def test_safetensors_metadata_is_sorted(tmp_path: Path) -> None:
    """Decision: __metadata__ keys are written sorted; the package writes them in a hash map's
    order, which changes from run to run, so its files are not reproducible."""
    raw = st_container.header_bytes([], {"z": "1", "a": "2", "m": "3"})
    header = json.loads(raw[8:])
    assert list(header["__metadata__"]) == ["a", "m", "z"]


def test_package_files_verify_and_read(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    save_file(
        {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "s": np.array(1, np.int64)}, str(path)
    )
    report = examine(str(path), scan=True)[0]
    assert report.ok(strict=True) and report.findings == []
    out = tmp_path / "p.npz"
    assert run_cli("convert", str(path), str(out)).code == 0
    loaded = np.load(out)
    assert loaded["w"].tolist() == [[0, 1, 2], [3, 4, 5]] and loaded["s"].shape == ()


@pytest.mark.parametrize(
    ("header", "data", "code"),
    [
        # A cut file: one root cause (the findings that follow are counted, not listed).
        ({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4), "ST_TRUNCATED"),
        (
            {"x": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
            bytes(8),
            st_container.ST_OFFSETS,
        ),
        (
            {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}},
            bytes(8),
            st_container.ST_LENGTH,
        ),
        (
            {"x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
            bytes(8),
            st_container.ST_LAYOUT,
        ),
        (
            {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
            bytes(8),
            st_container.ST_LAYOUT,
        ),
        (
            {
                "x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "y": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            bytes(8),
            st_container.ST_LAYOUT,
        ),
        (
            {"x": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}},
            bytes(1),
            st_container.ST_DTYPE,
        ),
        (
            {"x": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}},
            bytes(8),
            st_container.ST_SCHEMA,
        ),
        ({"__metadata__": {"a": 1}}, b"", st_container.ST_METADATA),
        (
            {"x": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}},
            b"\x01\x07",
            st_container.ST_BOOL,
        ),
    ],
)
def test_safetensors_rules(tmp_path: Path, header: dict, data: bytes, code: str) -> None:
    report = report_of(tmp_path, st_file(header, data), "h.safetensors")
    assert code in codes_of(report), report.findings
    # A BOOL byte above 1 is deliberate strictness (the package reads it): a warning.
    assert not report.ok(strict=code == st_container.ST_BOOL)


def test_safetensors_hostile_headers(tmp_path: Path) -> None:
    """Decision: sniffing does not compare the header size with the file, so a truncated or
    hostile file is named safetensors and reported (ST_HEADER_SIZE), not "unknown"."""
    huge = struct.pack("<Q", 200_000_000) + b'{"a":' + bytes(100)
    assert codes_of(report_of(tmp_path, huge, "a.safetensors")) == {st_container.ST_HEADER_SIZE}
    entry = b'{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
    dup = b'{"x":' + entry + b',"x":' + entry + b"}"
    report = report_of(tmp_path, struct.pack("<Q", len(dup)) + dup + b"\x01", "b.safetensors")
    # A repeated key: the package reads the last one, so matrixctl does too, with a warning.
    assert codes_of(report) == {st_container.ST_DUPLICATE_KEY} and report.ok()
    deep = b"{" + b'"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    report = report_of(tmp_path, struct.pack("<Q", len(deep)) + deep, "c.safetensors")
    assert codes_of(report) == {st_container.ST_JSON}
    nan = b'{"x":{"dtype":"U8","shape":[NaN],"data_offsets":[0,1]}}'
    report = report_of(tmp_path, struct.pack("<Q", len(nan)) + nan + b"\x01", "d.safetensors")
    assert codes_of(report) == {st_container.ST_JSON}


def test_safetensors_truncation_at_every_length(tmp_path: Path) -> None:
    data = save({"w": np.arange(3, dtype=np.float32), "b": np.array([True])}, metadata={"k": "v"})
    path = tmp_path / "t.safetensors"
    for n in range(len(data)):
        path.write_bytes(data[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n


# NumPy --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3), (1, 2, 3, 4)])
@pytest.mark.parametrize("dtype", ["<f4", "<i8", "|b1", "<c16", "|u1", "<f2"])
def test_npy_writer_gives_numpy_save_bytes(tmp_path: Path, shape: tuple, dtype: str) -> None:
    arr = np.zeros(shape, dtype=dtype)
    ref = tmp_path / "ref.npy"
    np.save(ref, arr)
    name = next(
        d.name for d in npy.DTYPES.values() if d.numeric and np.dtype(d.storage) == arr.dtype
    )
    assert npy.header_bytes(name, shape) + arr.tobytes() == ref.read_bytes()


def test_npy_header_descr_is_numpy_dtype_str_for_every_numeric_dtype(tmp_path: Path) -> None:
    """Decision: the .npy writer takes `descr` from the dtype table's storage string, without
    importing numpy (convert's start-up); it must be numpy's own `dtype.str` for every dtype
    .npy output accepts, so the header is what `numpy.save` writes."""
    for d in npy.DTYPES.values():
        if not d.numeric:
            continue
        arr = np.zeros((2,), dtype=d.storage)
        ref = tmp_path / f"{d.name}.npy"
        np.save(ref, arr)
        assert npy.header_bytes(d.name, (2,)) + arr.tobytes() == ref.read_bytes(), d.name


def test_npy_big_endian_and_fortran_are_read_as_little_endian_c_order(tmp_path: Path) -> None:
    """Decision: big-endian and Fortran-ordered arrays are converted to little-endian C order
    (both lossless); the output is what numpy would save for the same values."""
    src = tmp_path / "f.npy"
    arr = np.asfortranarray(np.arange(12, dtype=">i4").reshape(3, 4))
    np.save(src, arr)
    out = tmp_path / "c.npy"
    assert run_cli("convert", str(src), str(out)).code == 0
    back = np.load(out)
    assert back.dtype == np.dtype("<i4") and back.flags["C_CONTIGUOUS"]
    assert np.array_equal(back, arr)


def test_npy_tensor_name_is_the_file_stem(tmp_path: Path) -> None:
    """Decision: a .npy holds no name; the tensor is named after the file's stem (arr_0, numpy's
    default, when it comes from stdin)."""
    src = tmp_path / "embeddings.npy"
    np.save(src, np.ones(2, np.float32))
    out = tmp_path / "e.safetensors"
    assert run_cli("convert", str(src), str(out)).code == 0
    n = struct.unpack("<Q", out.read_bytes()[:8])[0]
    assert list(json.loads(out.read_bytes()[8 : 8 + n])) == ["embeddings"]
    assert npy.tensor_name("-") == "arr_0"


def test_object_arrays_are_refused_without_unpickling(tmp_path: Path) -> None:
    src = tmp_path / "o.npy"
    np.save(src, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    report = examine(str(src), scan=True)[0]
    assert codes_of(report) == {npy.NPY_DTYPE}
    result = run_cli("convert", str(src), str(tmp_path / "o.zt"))
    assert result.code == 1 and "NPY_DTYPE" in result.stderr
    assert not (tmp_path / "o.zt").exists()


def test_npy_hostile_headers(tmp_path: Path) -> None:
    long = b"\x93NUMPY\x01\x00" + struct.pack("<H", 60000) + b" " * 60000
    assert codes_of(report_of(tmp_path, long, "l.npy")) == {npy.NPY_HEADER}
    code = b"{'descr': __import__('os').system('true'), 'fortran_order': False, 'shape': (1,)}"
    data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(code)) + code
    assert codes_of(report_of(tmp_path, data, "c.npy")) == {npy.NPY_HEADER}
    big = npy.header_bytes("f32", (1 << 40,)) + bytes(8)
    assert codes_of(report_of(tmp_path, big, "b.npy")) == {npy.NPY_SIZE}


def test_npy_truncation_at_every_length(tmp_path: Path) -> None:
    src = tmp_path / "full.npy"
    np.save(src, np.arange(5, dtype=np.float32))
    data = src.read_bytes()
    path = tmp_path / "t.npy"
    for n in range(1, len(data)):
        path.write_bytes(data[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n


def test_npz_stored_and_deflated(tmp_path: Path) -> None:
    arrays = {"a": np.arange(3.0), "b": np.array([[1, 2]], np.uint16), "c": np.array(True)}
    for fn in (np.savez, np.savez_compressed):
        src = tmp_path / f"{fn.__name__}.npz"
        fn(src, **arrays)
        assert examine(str(src), scan=True)[0].ok(strict=True)
        out = tmp_path / f"{fn.__name__}.safetensors"
        assert run_cli("convert", str(src), str(out)).code == 0
        back = tmp_path / f"{fn.__name__}.back.npz"
        assert run_cli("convert", str(out), str(back)).code == 0
        loaded = np.load(back)
        assert {k: loaded[k].tolist() for k in loaded} == {k: v.tolist() for k, v in arrays.items()}


def test_npz_output_is_reproducible(tmp_path: Path) -> None:
    """Decision: .npz members are stored with the timestamp 1980-01-01 00:00 (or
    SOURCE_DATE_EPOCH), so the same tensors give the same bytes; numpy.savez stamps the
    current time."""
    src = tmp_path / "in.safetensors"
    save_file({"x": np.ones(3, np.float32)}, str(src))
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    assert run_cli("convert", str(src), str(a)).code == 0
    assert run_cli("convert", str(src), str(b)).code == 0
    assert a.read_bytes() == b.read_bytes()
    assert zipfile.ZipFile(a).infolist()[0].date_time == (1980, 1, 1, 0, 0, 0)
    c = tmp_path / "c.npz"
    assert run_cli("convert", str(src), str(c), env={"SOURCE_DATE_EPOCH": "1700000000"}).code == 0
    assert zipfile.ZipFile(c).infolist()[0].date_time[0] == 2023


def test_npz_bomb_and_damage(tmp_path: Path) -> None:
    src = tmp_path / "z.npz"
    np.savez_compressed(src, a=np.zeros(1000))
    data = bytearray(src.read_bytes())
    info = zipfile.ZipFile(src).infolist()[0]
    # Declare a 10 GB member in the central directory and the local header.
    cd = data.rindex(b"PK\x01\x02")
    struct.pack_into("<I", data, cd + 24, 0xFFFFFFF0)
    struct.pack_into("<I", data, info.header_offset + 22, 0xFFFFFFF0)
    report = report_of(tmp_path, bytes(data), "bomb.npz")
    assert not report.ok()
    flipped = bytearray(src.read_bytes())
    flipped[info.header_offset + 60] ^= 0xFF
    assert not report_of(tmp_path, bytes(flipped), "flip.npz").ok()


# convert ------------------------------------------------------------------------------------

FORMATS = {"ztensor": ".zt", "safetensors": ".safetensors", "npz": ".npz"}
COMMON = ["f64", "f32", "f16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool"]


@settings(max_examples=25, deadline=None)
@given(
    tensors=strategies.dictionaries(
        strategies.text("abcxyz._/0123", min_size=1, max_size=8),
        strategies.tuples(
            strategies.sampled_from(COMMON),
            strategies.lists(strategies.integers(0, 4), max_size=3),
            strategies.binary(max_size=48),
        ),
        min_size=1,
        max_size=4,
    ),
    route=strategies.permutations(list(FORMATS)),
    compress=strategies.sampled_from([None, "zstd:1"]),
)
def test_round_trip_through_every_pair_of_formats(tensors, route, compress) -> None:
    arrays = {}
    for name, (dtype, shape, seed) in tensors.items():
        d = npy.DTYPES[dtype]
        n = int(np.prod(shape)) * d.itemsize
        raw = (seed * (n // max(len(seed), 1) + 1))[:n] if seed else bytes(n)
        if dtype == "bool":
            raw = bytes(b & 1 for b in raw)
        arrays[name] = np.frombuffer(raw, dtype=np.dtype(d.storage)).reshape(shape)
    with tempfile.TemporaryDirectory() as tmp:
        first = Path(tmp) / "start.npz"
        np.savez(first, **arrays)
        current = first
        only = next(iter(arrays))
        if len(arrays) == 1 and re.fullmatch(r"[a-z0-9_][a-z0-9_.]*", only):
            route = [*route, "npy"]  # a .npy holds one tensor, named after the file
        for i, fmt in enumerate([*route, "npz"]):
            ext = ".npy" if fmt == "npy" else FORMATS[fmt]
            nxt = Path(tmp) / (f"{only}{ext}" if fmt == "npy" else f"step{i}{ext}")
            args = ["convert", str(current), str(nxt)]
            if compress and fmt == "ztensor":
                args += ["--compress", compress]
            result = run_cli(*args)
            assert result.code == 0, result.stderr
            assert examine(str(nxt), scan=True)[0].ok()
            current = nxt
        loaded = np.load(current)
        assert sorted(loaded) == sorted(arrays)
        for name, arr in arrays.items():
            assert loaded[name].dtype == arr.dtype and loaded[name].shape == arr.shape
            assert loaded[name].tobytes() == arr.tobytes(), name


def test_same_input_same_bytes(tmp_path: Path) -> None:
    """Decision: zstd output is single-threaded with the frame content size and checksum, so
    the same tensors and level give the same bytes on any machine."""
    src = tmp_path / "in.npz"
    np.savez(src, w=np.arange(100, dtype=np.float32), b=np.ones(3, bool))
    outs = []
    for i in range(2):
        out = tmp_path / f"o{i}.zt"
        assert run_cli("convert", str(src), str(out), "--compress", "zstd").code == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]


def test_refusals_name_the_tensor_and_write_nothing(tmp_path: Path) -> None:
    src = tmp_path / "b.safetensors"
    save_file({"ok": np.ones(2, np.float32), "w": np.ones(2, ml_dtypes.bfloat16)}, str(src))
    out = tmp_path / "b.npz"
    result = run_cli("convert", str(src), str(out))
    assert result.code == 1
    assert "CONVERT_REFUSED" in result.stderr and "'w'" in result.stderr and "bf16" in result.stderr
    assert "--dtype f32" in result.stderr
    assert not out.exists()
    assert run_cli("convert", str(src), str(out), "--dtype", "w=f32").code == 0
    assert np.load(out)["w"].dtype == np.float32


def test_casts_are_refused_when_they_change_values(tmp_path: Path) -> None:
    src = tmp_path / "c.npz"
    np.savez(src, big=np.array([1.0, 1e6], np.float32), frac=np.array([1.5]), ints=np.array([300]))
    out = tmp_path / "c.zt"
    result = run_cli("convert", str(src), str(out), "--dtype", "big=f16")
    assert result.code == 1 and "CONVERT_CAST" in result.stderr and "element 1" in result.stderr
    assert not out.exists()
    assert "fraction" in run_cli("convert", str(src), str(out), "--dtype", "frac=i32").stderr
    assert "out of range" in run_cli("convert", str(src), str(out), "--dtype", "ints=u8").stderr
    ok = run_cli("convert", str(src), str(out), "--dtype", "f16", "--select", "frac")
    assert ok.code == 0
    assert (
        ztensor_v1.parse(out.read_bytes(), out.stat().st_size)
        .objects["frac"]
        .components["data"]
        .dtype
        == "f16"
    )


def test_cast_chunks_across_every_dtype_pair() -> None:
    values = np.array([0, 1, 2, 100], dtype=np.int64)
    for src in convert_tensors.DTYPES:
        for dst in convert_tensors.DTYPES:
            d = convert_tensors.DTYPES[src]
            if d.kind == "bool":
                raw = np.array([0, 1, 1, 0], dtype=np.uint8).view(np.bool_)
            elif d.numeric:
                raw = values.astype(np.dtype(d.storage))
            else:
                raw = values.astype(getattr(ml_dtypes, d.ml_dtypes)).view(np.dtype(d.storage))
            try:
                out = convert_tensors.cast_chunk(raw, src, dst, "t", 0)
            except convert_tensors.FormatError as err:
                assert err.code == convert_tensors.CONVERT_CAST
                continue
            assert out.dtype == np.dtype(convert_tensors.DTYPES[dst].storage), (src, dst)


def test_select_and_densify(tmp_path: Path) -> None:
    ref = tmp_path / "s.zt"
    import ztensor

    with ztensor.Writer(str(ref)) as w:
        w.add_sparse_csr(
            "sp", np.array([3.0], np.float32), np.array([1]), np.array([0, 1, 1]), (2, 2)
        )
        w.add_tensor("dense.a", np.ones(2, np.float32))
        w.add_tensor("dense.b", np.zeros(2, np.float32))
    out = tmp_path / "s.safetensors"
    refused = run_cli("convert", str(ref), str(out))
    assert refused.code == 1 and "--densify" in refused.stderr and "'sp'" in refused.stderr
    assert run_cli("convert", str(ref), str(out), "--densify").code == 0
    assert run_cli("convert", str(ref), str(tmp_path / "a.npz"), "--select", "dense.*").code == 0
    assert sorted(np.load(tmp_path / "a.npz")) == ["dense.a", "dense.b"]
    none = run_cli("convert", str(ref), str(tmp_path / "n.npz"), "--select", "zzz")
    assert none.code == 2 and "CONVERT_EMPTY" in none.stderr


def test_damaged_source_leaves_no_output(tmp_path: Path) -> None:
    src = tmp_path / "in.npz"
    np.savez(src, w=np.arange(64, dtype=np.float32))
    good = tmp_path / "good.zt"
    assert run_cli("convert", str(src), str(good)).code == 0
    data = bytearray(good.read_bytes())
    data[100] ^= 1
    bad = tmp_path / "bad.zt"
    bad.write_bytes(bytes(data))
    out = tmp_path / "out.safetensors"
    result = run_cli("convert", str(bad), str(out))
    assert result.code == 1 and "ZT_DIGEST" in result.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.zt", "good.zt", "in.npz"]


@pytest.mark.parametrize("out", ["out.stb", "out.zt", "out.npz", "out.weights"])
def test_damaged_source_leaves_no_output_from_a_checksumming_sink(tmp_path: Path, out: str) -> None:
    """A sink that checksums what it writes reads the source once: the source's digest is
    checked as the bytes go by, and the damaged copy never appears."""
    src = tmp_path / "in.npz"
    np.savez(src, w=np.arange(64, dtype=np.float32))
    good = tmp_path / "good.zt"
    assert run_cli("convert", str(src), str(good), "--digest", "crc32c").code == 0
    data = bytearray(good.read_bytes())
    data[100] ^= 1
    bad = tmp_path / "bad.zt"
    bad.write_bytes(bytes(data))
    meta = [f"--meta={k}=1" for k in ("embedding_dim", "vocab_size", "num_layers")]
    meta += [f"--meta={k}=1" for k in ("num_attention_heads", "hidden_size")]
    meta += ["--meta=intermediate_size=1", "--meta=max_position_emb=1", "--meta=model_name=m"]
    result = run_cli("convert", str(bad), str(tmp_path / out), *(meta if "weights" in out else []))
    assert result.code == 1 and "ZT_DIGEST" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.zt", "good.zt", "in.npz"]


# CLI contract -------------------------------------------------------------------------------


def test_cli_exit_codes_and_streams(tmp_path: Path) -> None:
    src = tmp_path / "in.npz"
    np.savez(src, w=np.arange(4, dtype=np.float32))
    ok = run_cli("convert", str(src), str(tmp_path / "o.zt"), "--json")
    assert ok.code == 0 and ok.json()["tensors"] == 1 and ok.json()["to"] == "ztensor"
    piped = run_cli("convert", str(src), "-", "--to", "safetensors")
    assert piped.code == 0 and piped.stdout.startswith(struct.pack("<Q", len(piped.stdout) - 24))
    assert run_cli("convert", str(src), str(tmp_path / "o.bin")).code == 2  # unknown extension
    assert run_cli("convert", str(tmp_path / "missing.npz"), str(tmp_path / "x.zt")).code == 2
    assert run_cli("convert", str(src), str(tmp_path / "x.zt"), "--dtype", "f7").code == 2
    assert run_cli("convert", str(src), str(tmp_path / "x.zt"), "--compress", "lz4").code == 2
    assert run_cli("convert", str(src), str(tmp_path / "x.npz"), "--compress", "zstd").code == 2
    assert run_cli("convert", str(src), str(tmp_path / "x.zt"), "--atoms", "0:1").code == 2
    stdin = run_cli("convert", "-", str(tmp_path / "s.zt"), stdin=src.read_bytes())
    assert stdin.code == 0
    inspect = run_cli("inspect", "--json", str(tmp_path / "o.zt"))
    assert inspect.code == 0 and inspect.json()["files"][0]["tensors"][0]["name"] == "w"
    verify = run_cli("verify", "--json", str(tmp_path / "o.zt"), str(src))
    assert verify.code == 0 and verify.json()["ok"] is True


def test_cli_in_a_subprocess_never_shows_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.zt"
    bad.write_bytes(b"ZTEN1000" + bytes(30))
    result = run_sub("convert", str(bad), str(tmp_path / "o.safetensors"))
    assert result.code == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("matrixctl: error[")


def test_unknown_and_foreign_inputs(tmp_path: Path) -> None:
    v2 = tmp_path / "v2.zt"
    v2.write_bytes(
        b"\x89ZT2\r\n\x1a\n"
        + bytes(4096)
        + struct.pack("<QQQII", 4104, 0, 0, 2, 0)
        + b"\x89ZT2\r\n\x1a\n"
    )
    result = run_cli("convert", str(v2), str(tmp_path / "o.zt"))
    # A data-shard footer (length 0) must have offset and hash 0 too (docs/formats/ztensor2.md).
    assert result.code == 1 and "ZT2_MANIFEST_BOUNDS" in result.stderr
    assert run_cli("verify", str(v2)).code == 1
    pickle = tmp_path / "model.bin"
    pickle.write_bytes(b"\x80\x04\x95" + bytes(20))
    result = run_cli("convert", str(pickle), str(tmp_path / "o.zt"))
    assert result.code == 1 and "pickle" in result.stderr


def test_svgt_to_svg_still_converts(tmp_path: Path) -> None:
    from tests.helpers import golden_bytes

    src = tmp_path / "a.svgt"
    src.write_bytes(golden_bytes.SVGT)
    out = tmp_path / "a.svg"
    assert run_cli("convert", str(src), str(out)).code == 0
    assert out.read_text().startswith("<svg")


def test_quantized_group_passes_through_ztensor_and_is_refused_elsewhere(tmp_path: Path) -> None:
    """quantized_group components are carried as they are (never cast or dequantized)."""
    from tests.helpers.ztcraft import blob_file

    q = {
        "q": (
            {
                "shape": [4, 8],
                "format": "quantized_group",
                "attributes": {"bits": 4, "group_size": 8},
            },
            {
                "packed_weight": ({"dtype": "i32"}, bytes(range(16))),
                "scales": ({"dtype": "f16"}, np.ones(4, "<f2").tobytes()),
                "zeros": ({"dtype": "f16"}, np.zeros(4, "<f2").tobytes()),
            },
        )
    }
    src = tmp_path / "q.zt"
    src.write_bytes(blob_file(q))
    out = tmp_path / "q2.zt"
    assert run_cli("convert", str(src), str(out), "--compress", "zstd").code == 0
    f = ztensor_v1.parse(out.read_bytes(), out.stat().st_size)
    assert f.objects["q"].layout == "quantized_group"
    assert f.objects["q"].attributes == {"bits": 4, "group_size": 8}
    assert examine(str(out), scan=True)[0].ok()
    refused = run_cli("convert", str(src), str(tmp_path / "q.safetensors"))
    assert refused.code == 1 and "quantized_group" in refused.stderr
    cast = run_cli("convert", str(src), str(tmp_path / "q3.zt"), "--dtype", "q=f32")
    assert cast.code == 1 and "not cast" in cast.stderr


def test_names_a_destination_cannot_hold(tmp_path: Path) -> None:
    src = tmp_path / "m.zt"
    from tests.helpers.ztcraft import blob_file, dense

    src.write_bytes(blob_file({"__metadata__": dense([1], "u8", b"\x01")}))
    result = run_cli("convert", str(src), str(tmp_path / "m.safetensors"))
    assert result.code == 1 and "reserves the name" in result.stderr
    empty = tmp_path / "e.safetensors"
    empty.write_bytes(st_file({}, b""))
    result = run_cli("convert", str(empty), str(tmp_path / "e.npy"))
    assert result.code == 1 and "at least 1" in result.stderr
    assert run_cli("convert", str(empty), str(tmp_path / "e.zt")).code == 0


class _NamesSidecarSink(convert_tensors.TensorSink):
    """A sink like STB: data in the main file, names in a sidecar; fails on a tensor named
    'boom' after writing part of both."""

    format = "test-sidecar"
    keeps_names = False

    def begin(self, out, plan, metadata) -> None:
        self.main = out.main
        self.names = out.sidecar(out.path + ".names")

    def add(self, info, parts) -> None:
        self.names.write(info.name.encode() + b"\n")
        for piece in parts("data"):
            self.main.write(piece)
        if info.name == "boom":
            raise convert_tensors.FormatError(convert_tensors.CONVERT_REFUSED, "boom")

    def finish(self) -> dict:
        return {}


@pytest.mark.parametrize("names", [["a", "b"], ["a", "boom"]])
def test_sidecars_appear_only_with_the_main_output(tmp_path: Path, names: list[str]) -> None:
    from matrixctl.formats.npy import NpzSource
    from matrixctl.io import Source

    src = tmp_path / "in.npz"
    np.savez(src, **{n: np.ones(2, np.float32) for n in names})
    out = tmp_path / "out.bin"
    with Source.open(str(src)) as source:
        call = lambda: convert_tensors.convert(  # noqa: E731
            source,
            str(out),
            {},
            src_fmt="npz",
            dst_fmt="test-sidecar",
            source_cls=NpzSource,
            sink_cls=_NamesSidecarSink,
        )
        if "boom" in names:
            with pytest.raises(convert_tensors.FormatError):
                call()
            assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]
        else:
            call()
            assert (tmp_path / "out.bin.names").read_bytes() == b"a\nb\n"
            assert out.stat().st_size == 16
