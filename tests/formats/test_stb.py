"""STB `.stb` and its sidecar: golden bytes, decisions, every rule, hostile files, round trips."""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl.codes import Severity
from matrixctl.converters.tensors import open_source
from matrixctl.formats import stb
from matrixctl.validate.engine import examine
from tests.helpers import golden_embd
from tests.helpers.cli import run_cli

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
ARRAYS = {
    "a": np.array([1, 2], np.float32),
    "foobar": np.array([[1, -2, 3]], np.int8),
    "q": np.array([7], np.int32).reshape(1, 1, 1, 1),
}


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def errors_of(report) -> set[str]:
    return {f.code for f in report.findings if f.severity is Severity.ERROR}


def report_of(tmp_path: Path, data: bytes, name: str = "f.stb", scan: bool = True):
    path = tmp_path / name
    path.write_bytes(data)
    return examine(str(path), scan=scan)[0]


def patched(fmt: str, offset: int, value: int, base: bytes = golden_embd.STB) -> bytes:
    data = bytearray(base)
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def write_tiny(tmp_path: Path, *extra: str) -> Path:
    src = tmp_path / "t.npz"
    np.savez(src, **ARRAYS)
    out = tmp_path / "tiny.stb"
    result = run_cli("convert", str(src), str(out), *extra)
    assert result.code == 0, result.stderr
    return out


# Golden bytes -------------------------------------------------------------------------------


def test_golden_file_on_disk_is_the_hand_typed_bytes() -> None:
    assert (GOLDEN / "stb_v01_tiny.stb").read_bytes() == golden_embd.STB


def test_writer_reproduces_the_golden_file_and_sidecar(tmp_path: Path) -> None:
    """Decision: the writer puts the table right after the header, data_offset at the next
    multiple of 64, each tensor at a multiple of 64 with zero padding, tensor ids 0..N-1 in
    the source's order, and ends the file at the last tensor's last byte; names, shapes, the
    bin-file table and metadata go to the sidecar NAME.stb.json (same input, same bytes)."""
    out = write_tiny(tmp_path)
    assert out.read_bytes() == golden_embd.STB
    sidecar = tmp_path / "tiny.stb.json"
    assert json.loads(sidecar.read_text()) == golden_embd.STB_SIDECAR
    report = examine(str(out), scan=True)[0]
    assert report.ok(strict=True) and codes_of(report) == set()
    again = tmp_path / "again"
    again.mkdir()
    write_tiny(again)
    assert (again / "tiny.stb.json").read_bytes() == sidecar.read_bytes()


def test_golden_reads_back_with_and_without_sidecar(tmp_path: Path) -> None:
    """Decision: without a sidecar, tensors are named tensor_<id> (STB stores no names) and a
    rank above 3 cannot be read (its shape is in the sidecar's shape table); with the sidecar
    NAME.stb.json beside the file, names and shapes come from it."""
    lone = tmp_path / "lone.stb"
    lone.write_bytes(golden_embd.STB)
    result = run_cli("convert", str(lone), str(tmp_path / "x.npz"))
    assert result.code == 1 and "STB_RANK" in result.stderr
    ok = run_cli("convert", str(lone), str(tmp_path / "x.npz"), "--exclude", "tensor_2")
    assert ok.code == 1  # excluding happens after the shapes are read: still refused
    report = examine(str(lone), scan=True)[0]
    assert codes_of(report) == {stb.STB_NO_SIDECAR} and report.ok(strict=True)
    out = write_tiny(tmp_path)
    with open_source(str(out)) as src:
        got = {i.name: (i.dtype, i.shape, src.array(i).tolist()) for i in src.tensors()}
    assert got == {
        "a": ("f32", (2,), [1.0, 2.0]),
        "foobar": ("i8", (1, 3), [1, -2, 3]),
        "q": ("i32", (1, 1, 1, 1), [7]),
    }
    two = tmp_path / "two.stb"
    two.write_bytes(
        golden_embd.STB[:96].replace(b"\x03\x00", b"\x02\x00", 1)
        + bytes(32)
        + golden_embd.STB[128:256]
    )
    data = bytearray(two.read_bytes())
    struct.pack_into("<Q", data, 24, 256)
    struct.pack_into("<H", data, 6, 2)
    two.write_bytes(bytes(data))
    with open_source(str(two)) as src:
        assert [i.name for i in src.tensors()] == ["tensor_0", "tensor_1"]


def test_sidecar_converts_the_whole_set(tmp_path: Path) -> None:
    out = write_tiny(tmp_path)
    back = tmp_path / "back.npz"
    result = run_cli("convert", str(out) + ".json", str(back))
    assert result.code == 0, result.stderr
    loaded = np.load(back)
    for name, arr in ARRAYS.items():
        assert loaded[name].dtype == arr.dtype and np.array_equal(loaded[name], arr)
    doc = run_cli("inspect", "--json", str(out) + ".json").json()["files"][0]
    assert doc["format"] == "stb-sidecar" and doc["tensor_count"] == 3


# Decisions ----------------------------------------------------------------------------------


def test_split_into_several_files(tmp_path: Path) -> None:
    """Decision: at most --per-file tensors (default 256, the u8 tensor_id's reach) per .stb;
    further files are NAME.1.stb, NAME.2.stb, ..., numbered by bin_file_id in the sidecar's
    bin-file table; each part finds the sidecar NAME.stb.json."""
    src = tmp_path / "many.npz"
    np.savez(src, **{f"t{i:03d}": np.full(3, i, np.float32) for i in range(300)})
    out = tmp_path / "many.stb"
    result = run_cli("convert", str(src), str(out), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["files"] == [str(out), str(tmp_path / "many.1.stb")]
    side = json.loads((tmp_path / "many.stb.json").read_text())
    assert [(b["bin_file_id"], b["path"], b["tensor_count"]) for b in side["bin_files"]] == [
        (0, "many.stb", 256),
        (1, "many.1.stb", 44),
    ]
    assert side["tensors"][256] == {
        "name": "t256",
        "bin_file_id": 1,
        "tensor_id": 0,
        "dtype": "float32",
        "shape": [3],
        "layout": "ROW_MAJOR",
    }
    report = examine(str(tmp_path / "many.1.stb"), scan=True)[0]
    assert report.ok(strict=True), report.findings
    assert examine(str(tmp_path / "many.stb.json"), scan=True)[0].ok()
    back = tmp_path / "back.npz"
    assert run_cli("convert", str(tmp_path / "many.stb.json"), str(back)).code == 0
    loaded = np.load(back)
    assert len(loaded.files) == 300 and loaded["t299"].tolist() == [299.0] * 3
    with open_source(str(tmp_path / "many.1.stb")) as part:
        assert [i.name for i in part.tensors()][:2] == ["t256", "t257"]


def test_glyph_reach_is_noted(tmp_path: Path) -> None:
    """Decision: tensor ids above 15 are valid STB but G_LOAD_BIN_TENSOR's 4-bit shape_id
    cannot name them: convert warns (suggesting --per-file 16) and verify reports an info
    finding; --per-file 16 keeps every tensor addressable."""
    src = tmp_path / "m.npz"
    np.savez(src, **{f"t{i:02d}": np.zeros(1, np.int8) for i in range(20)})
    result = run_cli("convert", str(src), str(tmp_path / "m.stb"))
    assert result.code == 0 and "--per-file 16" in result.stderr
    assert codes_of(examine(str(tmp_path / "m.stb"), scan=True)[0]) == {stb.STB_GLYPH_REACH}
    result = run_cli("convert", str(src), str(tmp_path / "k.stb"), "--per-file", "16")
    assert result.code == 0 and "G_LOAD" not in result.stderr
    assert codes_of(examine(str(tmp_path / "k.1.stb"), scan=True)[0]) == set()
    assert run_cli("convert", str(src), str(tmp_path / "z.stb"), "--per-file", "0").code == 2
    assert run_cli("convert", str(src), str(tmp_path / "z.zt"), "--per-file", "4").code == 2


def test_dtypes_outside_the_enum_are_refused_unless_cast(tmp_path: Path) -> None:
    """Decision: STB holds float32, float16, int8 and int32 only; any other dtype is refused
    (nothing written) unless --dtype asks for a cast; casts that change a value are refused."""
    from safetensors.numpy import save_file

    src = tmp_path / "b.safetensors"
    save_file({"w": np.ones(2, ml_dtypes.bfloat16), "ids": np.arange(3, dtype=np.int64)}, str(src))
    out = tmp_path / "b.stb"
    result = run_cli("convert", str(src), str(out))
    assert result.code == 1 and "CONVERT_REFUSED" in result.stderr
    assert not out.exists() and not (tmp_path / "b.stb.json").exists()
    ok = run_cli("convert", str(src), str(out), "--dtype", "f32", "--dtype", "ids=i32")
    assert ok.code == 0, ok.stderr
    side = json.loads((tmp_path / "b.stb.json").read_text())
    assert {t["name"]: t["dtype"] for t in side["tensors"]} == {"ids": "int32", "w": "float32"}


def test_ranks_zero_to_eight_and_empty_tensors(tmp_path: Path) -> None:
    """Decision: rank 0 (a scalar: dims all 0, one element) and empty tensors (size 0) are
    stored; ranks 4-8 go through the sidecar's shape table; rank 9+ is refused."""
    arrays = {
        "s": np.array(3.5, np.float32),
        "e": np.zeros((2, 0), np.int8),
        "r5": np.arange(32, dtype=np.int32).reshape(2, 2, 2, 2, 2),
        "r8": np.ones((1,) * 8, np.float16),
    }
    src = tmp_path / "r.npz"
    np.savez(src, **arrays)
    out = tmp_path / "r.stb"
    assert run_cli("convert", str(src), str(out)).code == 0
    assert examine(str(out) + ".json", scan=True)[0].ok(strict=True)
    back = tmp_path / "back.npz"
    assert run_cli("convert", str(out), str(back)).code == 0
    loaded = np.load(back)
    for name, arr in arrays.items():
        assert loaded[name].shape == arr.shape and np.array_equal(loaded[name], arr)
    side = json.loads((tmp_path / "r.stb.json").read_text())
    assert side["shape_table"] == [[2, 2, 2, 2, 2], [1] * 8]
    np.savez(src, x=np.ones((1,) * 9, np.float32))
    refused = run_cli("convert", str(src), str(tmp_path / "n.stb"))
    assert refused.code == 1 and "rank 9" in refused.stderr


def col_major_file() -> bytes:
    """One float32 [2, 3] tensor stored COL_MAJOR: columns (1,4), (2,5), (3,6)."""
    values = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    head = b"STB0" + bytes([1, 0]) + struct.pack("<HIIQQ", 1, 0, 0, 64, 64 + 24)
    entry = bytes([0, 0, 2, 1]) + struct.pack("<QQIII", 64, 24, 2, 3, 0)
    return head + entry + values.T.tobytes()


def test_col_major_is_read_as_row_major(tmp_path: Path) -> None:
    """Decision: a COL_MAJOR tensor is converted to row-major on the way out (lossless, one
    copy of the tensor), as NumPy's Fortran order is; CHANNELS_LAST passes verify but convert
    refuses it (the spec gives no element order for it)."""
    path = tmp_path / "c.stb"
    path.write_bytes(col_major_file())
    assert examine(str(path), scan=True)[0].ok()
    out = tmp_path / "c.npz"
    assert run_cli("convert", str(path), str(out)).code == 0
    assert np.load(out)["tensor_0"].tolist() == [[1, 2, 3], [4, 5, 6]]
    data = bytearray(col_major_file())
    data[35] = 2
    path.write_bytes(bytes(data))
    assert examine(str(path), scan=True)[0].ok()
    result = run_cli("convert", str(path), str(out))
    assert result.code == 1 and "CHANNELS_LAST" in result.stderr


def test_stdout_is_refused_for_stb(tmp_path: Path) -> None:
    """STB output needs a sidecar file, so it cannot go to stdout."""
    src = tmp_path / "x.npz"
    np.savez(src, a=np.ones(2, np.float32))
    result = run_cli("convert", str(src), "-", "--to", "stb")
    assert result.code == 2 and result.stdout == b""


def test_metadata_and_vocabulary_travel_in_the_sidecar(tmp_path: Path) -> None:
    """Decision: file metadata (an EMBD vocabulary included, under GGUF's keys) is kept in the
    sidecar's "metadata", so .weights -> .stb -> .weights loses nothing."""
    golden = GOLDEN / "embd_v1_tiny.weights"
    mid = tmp_path / "m.stb"
    back = tmp_path / "b.weights"
    assert run_cli("convert", str(golden), str(mid)).code == 0
    assert run_cli("convert", str(mid), str(back)).code == 0
    assert back.read_bytes() == golden.read_bytes()


# Rules and hostile files --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "offset", "value", "code"),
    [
        ("<B", 5, 1, stb.STB_FLAGS),
        ("<Q", 24, 300, stb.STB_FILE_SIZE),
        ("<Q", 16, 96, stb.STB_DATA_OFFSET),  # not 64-aligned
        ("<Q", 16, 64, stb.STB_DATA_OFFSET),  # inside the table
        ("<Q", 16, 320, stb.STB_DATA_OFFSET),  # past file_size
        ("<H", 6, 300, stb.STB_COUNT),
        ("<H", 6, 4000, stb.STB_TRUNCATED),  # the table runs past EOF
        ("<B", 64, 0, stb.STB_TENSOR_ID),
        ("<B", 65, 4, stb.STB_DTYPE),
        ("<B", 67, 3, stb.STB_LAYOUT),
        ("<B", 66, 9, stb.STB_RANK),
        ("<I", 92, 1, stb.STB_RANK),  # dims[2] non-zero at rank 2
        ("<Q", 76, 4, stb.STB_SIZE),
        ("<Q", 68, 136, stb.STB_ALIGN),
        ("<Q", 68, 64, stb.STB_BOUNDS),  # before data_offset
        ("<Q", 68, 10**12, stb.STB_BOUNDS),  # past EOF
        ("<Q", 44, 2**63, stb.STB_SIZE),  # size_bytes huge
        ("<Q", 100, 192, stb.STB_OVERLAP),
    ],
)
def test_rules(tmp_path: Path, fmt: str, offset: int, value: int, code: str) -> None:
    """Decision: beyond section 7 (magic, version, data_offset bounds and alignment, each
    tensor inside [data_offset, file_size) and 64-aligned), an unknown dtype or layout is an
    error (unsupported), as are duplicate tensor ids, a tensor_count above 256, size_bytes
    other than the dimensions' product times the itemsize, non-zero dims past the rank, and
    overlapping tensors."""
    report = report_of(tmp_path, patched(fmt, offset, value))
    assert code in errors_of(report), report.findings
    result = run_cli("convert", str(tmp_path / "f.stb"), str(tmp_path / "o.npz"))
    assert result.code == 1 and not (tmp_path / "o.npz").exists()


def test_version_and_reserved(tmp_path: Path) -> None:
    """Decision: a version other than 0x01 is not read at all; flags other than 0 are an error
    (the spec says must be 0); non-zero reserved0/reserved1 are a warning."""
    report = report_of(tmp_path, patched("<B", 4, 2))
    assert errors_of(report) == {stb.STB_VERSION}
    report = report_of(tmp_path, patched("<I", 8, 1))
    assert stb.STB_RESERVED in codes_of(report) and report.ok()


def test_padding_and_gaps(tmp_path: Path) -> None:
    """Decision: bytes between the table and data_offset and between tensors must be zero
    (STB_PADDING); 64 or more unreferenced bytes in the data region are a warning (STB_GAP)."""
    data = bytearray(golden_embd.STB)
    data[150] = 1
    assert stb.STB_PADDING in errors_of(report_of(tmp_path, bytes(data)))
    moved = (
        golden_embd.STB[:256] + bytes(64) + golden_embd.STB[256:]
    )  # tensor 2 moved 64 bytes further
    gap = patched("<Q", 100, 320, patched("<Q", 24, 324, moved))
    report = report_of(tmp_path, gap)
    assert stb.STB_GAP in codes_of(report) and report.ok()


def test_truncation_at_every_length(tmp_path: Path) -> None:
    path = tmp_path / "t.stb"
    for n in range(len(golden_embd.STB)):
        path.write_bytes(golden_embd.STB[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n


def test_every_bit_flip_is_caught_with_the_sidecar(tmp_path: Path) -> None:
    """STB has no checksum; the sidecar records each file's CRC-32, so `verify` of a file with
    its sidecar beside it catches every flipped bit."""
    out = write_tiny(tmp_path)
    for i in range(len(golden_embd.STB)):
        data = bytearray(golden_embd.STB)
        data[i] ^= 1 << (i % 8)
        out.write_bytes(bytes(data))
        report = examine(str(out), scan=True)[0]
        assert not report.ok(), i


@pytest.mark.parametrize(
    ("edit", "code"),
    [
        (lambda d: d.update(format="x"), None),
        (lambda d: d["bin_files"][0].update(path="../tiny.stb"), stb.STB_SIDECAR),
        (lambda d: d["bin_files"][0].update(path="/etc/passwd"), stb.STB_SIDECAR),
        (lambda d: d["bin_files"][0].update(path="missing.stb"), stb.STB_SIDECAR_FILE),
        (lambda d: d["bin_files"][0].update(file_size=1), stb.STB_SIDECAR_FILE),
        (lambda d: d["bin_files"][0].update(tensor_count=2), stb.STB_SIDECAR_FILE),
        (lambda d: d["bin_files"][0].update(crc32="0x00000000"), stb.STB_SIDECAR_FILE),
        (lambda d: d["tensors"][1].update(name="a"), stb.STB_SIDECAR),
        (lambda d: d["tensors"][1].update(dtype="float16"), stb.STB_SIDECAR_MISMATCH),
        (lambda d: d["tensors"][1].update(shape=[3, 1]), stb.STB_SIDECAR_MISMATCH),
        (lambda d: d["tensors"][1].update(tensor_id=9), stb.STB_SIDECAR_MISMATCH),
        (lambda d: d["tensors"].pop(), stb.STB_SIDECAR_MISMATCH),
        (lambda d: d["tensors"][2].update(shape_id=3), stb.STB_SIDECAR),
        (lambda d: d["tensors"][2].update(shape=[1, 1, 1, 2]), stb.STB_SIDECAR),
        (lambda d: d.update(shape_table=[[1, 1, 1, 2]]), stb.STB_SIDECAR),
        (lambda d: d["tensors"][0].update(bin_file_id=5), stb.STB_SIDECAR),
    ],
)
def test_sidecar_rules(tmp_path: Path, edit, code: str | None) -> None:
    out = write_tiny(tmp_path)
    side = tmp_path / "tiny.stb.json"
    doc = json.loads(side.read_text())
    edit(doc)
    side.write_text(json.dumps(doc))
    report = examine(str(side), scan=True)[0]
    if code is None:
        assert report.format is None  # no longer a sidecar: not sniffed as one
        return
    assert code in errors_of(report), report.findings
    assert not examine(str(out), scan=True)[0].ok() or code == stb.STB_SIDECAR_FILE
    result = run_cli("convert", str(side), str(tmp_path / "o.npz"))
    assert result.code == 1 and not (tmp_path / "o.npz").exists()


def test_hostile_sidecar_json(tmp_path: Path) -> None:
    side = tmp_path / "h.stb.json"
    for text in (
        '{"format": "matrixctl-stb-sidecar", "version": 1, "bin_files": 3, "tensors": []}',
        '{"format": "matrixctl-stb-sidecar", ' + '"x": [' * 100_000,
        '{"format": "matrixctl-stb-sidecar", "version": 1, "bin_files": [], "tensors": [{}]}',
    ):
        side.write_text(text)
        report = examine(str(side), scan=True)[0]
        assert report.format == "stb-sidecar" and errors_of(report) == {stb.STB_SIDECAR}


# Round trips and the CLI --------------------------------------------------------------------

STB_DTYPES = ["f32", "f16", "i8", "i32"]


@settings(max_examples=25, deadline=None)
@given(
    tensors=strategies.dictionaries(
        strategies.text("abcxyz._/0123", min_size=1, max_size=8),
        strategies.tuples(
            strategies.sampled_from(STB_DTYPES),
            strategies.lists(strategies.integers(0, 3), max_size=5),
            strategies.binary(max_size=48),
        ),
        min_size=1,
        max_size=6,
    ),
    per_file=strategies.sampled_from([None, "1", "2", "16"]),
    route=strategies.permutations([".zt", ".safetensors", ".stb.json"]),
)
def test_round_trip_through_stb(tensors, per_file, route) -> None:
    arrays = {}
    for name, (dtype, shape, seed) in tensors.items():
        d = stb.DTYPES[dtype]
        n = int(np.prod(shape)) * d.itemsize
        raw = (seed * (n // max(len(seed), 1) + 1))[:n] if seed else bytes(n)
        arrays[name] = np.frombuffer(raw, d.storage).reshape(shape)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        current = t / "start.npz"
        np.savez(current, **arrays)
        for i, ext in enumerate([*route, ".npz"]):
            if ext == ".stb.json":
                out = t / f"s{i}.stb"
                args = ["--per-file", per_file] if per_file else []
                result = run_cli("convert", str(current), str(out), *args)
                assert result.code == 0, result.stderr
                assert examine(str(out) + ".json", scan=True)[0].ok()
                current = Path(str(out) + ".json")
                continue
            out = t / f"s{i}{ext}"
            result = run_cli("convert", str(current), str(out))
            assert result.code == 0, result.stderr
            current = out
        loaded = np.load(current)
        assert sorted(loaded.files) == sorted(arrays)
        for name, arr in arrays.items():
            assert loaded[name].dtype == arr.dtype and loaded[name].shape == arr.shape
            assert loaded[name].tobytes() == arr.tobytes()
    shutil.rmtree(t, ignore_errors=True)


def test_cli_exit_codes(tmp_path: Path) -> None:
    out = write_tiny(tmp_path)
    assert run_cli("verify", str(out), str(out) + ".json").code == 0
    assert run_cli("inspect", "--json", str(out)).json()["files"][0]["tensors"][2]["name"] == "q"
    bad = tmp_path / "bad.stb"
    bad.write_bytes(golden_embd.STB[:100])
    assert run_cli("verify", str(bad)).code == 1
    assert run_cli("inspect", str(bad)).code == 1
    assert run_cli("verify", str(tmp_path / "nope.stb")).code == 2
    crc = zlib.crc32(out.read_bytes())
    assert json.loads((tmp_path / "tiny.stb.json").read_text())["bin_files"][0]["crc32"] == (
        f"0x{crc:08x}"
    )


def test_a_smaller_set_removes_the_old_sets_extra_members(tmp_path: Path) -> None:
    """Decision (docs/formats/stb.md, "Sets"): rewriting NAME.stb with fewer files removes
    the members of the previous set (as its sidecar lists them) that the new set has not,
    once the new set is in place; nothing else beside it is touched."""
    three = tmp_path / "three.npz"
    np.savez(three, **{k: np.full(4, i, dtype=np.float32) for i, k in enumerate("abc")})
    one = tmp_path / "one.npz"
    np.savez(one, a=np.ones(4, dtype=np.float32))
    out = tmp_path / "s.stb"
    assert run_cli("convert", str(three), str(out), "--per-file", "1").code == 0
    assert {p.name for p in tmp_path.glob("s.*")} == {"s.stb", "s.1.stb", "s.2.stb", "s.stb.json"}
    (tmp_path / "s.3.stb").write_bytes(b"not listed by the old sidecar")
    result = run_cli("convert", str(one), str(out))
    assert result.code == 0, result.stderr
    left = {p.name for p in tmp_path.glob("s.*")}
    assert left == {"s.stb", "s.stb.json", "s.3.stb"}
    assert run_cli("verify", str(tmp_path / "s.stb.json")).code == 0


def test_a_failed_rewrite_keeps_the_old_set_whole(tmp_path: Path) -> None:
    three = tmp_path / "three.npz"
    np.savez(three, **{k: np.full(4, i, dtype=np.float32) for i, k in enumerate("abc")})
    out = tmp_path / "s.stb"
    assert run_cli("convert", str(three), str(out), "--per-file", "1").code == 0
    bad = tmp_path / "bad.npz"
    np.savez(bad, a=np.ones(4, dtype=np.uint64))  # STB has no u64: refused before any write
    assert run_cli("convert", str(bad), str(out)).code == 1
    assert {p.name for p in tmp_path.glob("s.*")} == {"s.stb", "s.1.stb", "s.2.stb", "s.stb.json"}
    assert run_cli("verify", str(tmp_path / "s.stb.json")).code == 0
