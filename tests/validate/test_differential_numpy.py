""".npy and .npz: `verify` agrees with numpy (`np.load`, which refuses pickled objects unless
`allow_pickle=True`).

The cases are generated the way numpy's own `numpy/lib/tests/test_format.py` generates its
cases: every basic scalar type in both byte orders and six shapes (empty, rank 0, 1-D, 2-D C-
and Fortran-contiguous, 2-D strided), each also cut one byte short and with bytes after it; its
plain and nested record arrays; the padded, nested and titled structured dtypes; a version 3.0
header with unicode field names; a version 2.0 header too long for numpy's default limit; long
unicode strings; datetimes; dtypes carrying metadata; a Python 2 header (`(2L,)`); the bad and
malformed magics; headers with a key missing or one too many; a cut header length field; and
.npz archives (empty, compressed, with a structured member, cut).
"""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.validate.differential import Case, assert_agrees, verify_report

SCALARS = [
    np.uint8,
    np.int8,
    np.uint16,
    np.int16,
    np.uint32,
    np.int32,
    np.uint64,
    np.int64,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
    object,
]


def npy_bytes(arr: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy notes the version it picks, metadata dropped
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=True)
    return buf.getvalue()


def npz_bytes(compressed: bool = False, **arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def basic_arrays() -> Iterator[tuple[str, np.ndarray]]:
    for scalar in SCALARS:
        for endian in "<>":
            dtype = np.dtype(scalar).newbyteorder(endian)
            base = np.arange(1500).astype(dtype)
            label = f"{np.dtype(scalar).name}{endian}"
            yield f"{label}-empty", np.array([], dtype=dtype)
            yield f"{label}-rank0", np.array(10, dtype=dtype)
            yield f"{label}-1d", base
            yield f"{label}-2d-c", base.reshape((30, 50))
            yield f"{label}-2d-fortran", base.reshape((30, 50)).T
            yield f"{label}-2d-strided", base.reshape((30, 50))[::-1, ::2]


# The record arrays: a plain table (x: 2 x i4, y: 2x2 f8, z: u1) and a nested one.
PLAIN = [("x", "i4", (2,)), ("y", "f8", (2, 2)), ("z", "u1")]
PLAIN_ROWS = [([3, 2], [[6.0, 4.0], [6.0, 4.0]], 8), ([4, 3], [[7.0, 5.0], [7.0, 5.0]], 9)]
NESTED = [
    ("x", "i4", (2,)),
    (
        "Info",
        [
            ("value", "c16"),
            ("y2", "f8"),
            (
                "Info2",
                [("name", "S2"), ("value", "c16", (2,)), ("y3", "f8", (2,)), ("z3", "u4", (2,))],
            ),
            ("name", "S2"),
            ("z2", "b1"),
        ],
    ),
    ("color", "S2"),
    ("info", [("Name", "U8"), ("Value", "c16")]),
    ("y", "f8", (2, 2)),
    ("z", "u1"),
]
NESTED_ROWS = [
    ([3, 2], (6j, 6.0, ("nn", [6j, 4j], [6.0, 4.0], [1, 2]), "NN", True), "cc", ("NN", 6j),
     [[6.0, 4.0], [6.0, 4.0]], 8),
    ([4, 3], (7j, 7.0, ("oo", [7j, 5j], [7.0, 5.0], [2, 1]), "OO", False), "dd", ("OO", 7j),
     [[7.0, 5.0], [7.0, 5.0]], 9),
]  # fmt: skip


def record_arrays() -> Iterator[tuple[str, np.ndarray]]:
    for endian in "<>":
        yield f"plain-record{endian}", np.array(PLAIN_ROWS, np.dtype(PLAIN).newbyteorder(endian))
        yield f"nested-record{endian}", np.array(NESTED_ROWS, np.dtype(NESTED).newbyteorder(endian))
    yield "subarray-field", np.zeros(1, dtype=[("c", ("<f8", (5,)), (2,))])


def padded_dtypes() -> Iterator[tuple[str, np.dtype]]:
    offsets = np.dtype({"names": ["a", "b"], "formats": ["i4", "i4"], "offsets": [1, 6]})
    yield "aligned", np.dtype("i1, i4, i1", align=True)
    yield "explicit-offsets", offsets
    yield "nested-struct", np.dtype({"names": ["c", "d"], "formats": ["i4", offsets]})
    yield "empty-field-name", np.dtype({"names": ["a", "", "b"], "formats": ["i4"] * 3})
    yield (
        "titles",
        np.dtype(
            {
                "names": ["a", "b"],
                "formats": ["i4", "i4"],
                "offsets": [1, 6],
                "titles": ["aa", "bb"],
            }
        ),
    )
    yield "no-fields", np.dtype({"names": [], "formats": [], "itemsize": 8})
    gapped = np.dtype(
        {"names": ["a", "b"], "formats": ["i1", "i1"], "offsets": [0, 4], "itemsize": 8}
    )
    yield "aligned-three", np.dtype([("a", np.int8), ("b", np.int16), ("c", np.int32)], align=True)
    yield "subarray-of-gapped", np.dtype([("x", np.dtype((gapped, (3,))), (4,))])
    yield "nested-subarrays", np.dtype([("x", np.dtype((np.dtype((gapped, (3,))), (4,))))])
    yield (
        "deep",
        np.dtype(
            [("a", np.dtype((np.dtype((np.dtype([("a", int), ("b", gapped)]), (3,))), (4,))))]
        ),
    )


def header(text: bytes, version: tuple[int, int] = (1, 0)) -> bytes:
    """A .npy header block for a dict literal written by hand (padded as numpy pads)."""
    fmt = "<H" if version == (1, 0) else "<I"
    prefix = 8 + struct.calcsize(fmt)
    body = text + b" " * ((-(prefix + len(text) + 1)) % 64) + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(body)) + body


def cases() -> Iterator[Case]:
    for label, arr in basic_arrays():
        data = npy_bytes(arr)
        yield Case(label, f"{label}.npy", data)
        if arr.dtype != object:
            yield Case(f"{label}-cut-by-one", f"{label}.npy", data[:-1])
            yield Case(f"{label}-trailing", f"{label}.npy", data + b"\x00" * 16)
    for label, arr in record_arrays():
        yield Case(label, f"{label}.npy", npy_bytes(arr))
        yield Case(f"{label}-cut-by-one", f"{label}.npy", npy_bytes(arr)[:-1])
    for label, dt in padded_dtypes():
        arr = np.zeros(3, dt)
        for i in range(3):
            arr[i] = i + 5
        yield Case(f"padded-{label}", f"{label}.npy", npy_bytes(arr))
        yield Case(f"padded-{label}-npz", f"{label}.npz", npz_bytes(arr=arr))
    wide = [(str(i) * 100, float) for i in range(500)]
    yield Case("version-2.0-long-header", "v2.npy", npy_bytes(np.ones(1000, dtype=wide), (2, 0)))
    yield Case("huge-header", "huge.npy", npy_bytes(np.array(1, dtype="i," * 10000 + "i"), (2, 0)))
    yield Case(
        "version-2.0-small",
        "v2s.npy",
        npy_bytes(np.ones((3, 6)), (2, 0)),
    )
    unicode_fields = np.array(
        [(1, 3), (1, 2), (1, 3), (1, 2)], dtype=[("int", int), ("\u6574\u5f62", int)]
    )
    yield Case("unicode-field-names-3.0", "uni.npy", npy_bytes(unicode_fields, (3, 0)))
    yield Case(
        "long-unicode-string",
        "long.npy",
        npy_bytes(np.ones(1, dtype=np.dtype((str, np.lib.format.BUFFER_SIZE + 1)))),
    )
    yield Case("unicode-strings", "u.npy", npy_bytes(np.array(["ab", "cde"])))
    yield Case("bytes-strings", "s.npy", npy_bytes(np.array([b"ab", b"c"])))
    yield Case("void", "v.npy", npy_bytes(np.zeros(3, dtype="V5")))
    yield Case("datetime64", "dt.npy", npy_bytes(np.array(["2020-01-01"], dtype="M8[D]")))
    yield Case("timedelta64", "td.npy", npy_bytes(np.array([1, 2], dtype="m8[s]")))
    yield Case("float16", "h.npy", npy_bytes(np.arange(4, dtype=np.float16)))
    yield Case("bool", "b.npy", npy_bytes(np.array([True, False])))
    yield Case("bool-byte-2", "b2.npy", npy_bytes(np.frombuffer(b"\x00\x01\x02", dtype=np.bool_)))
    meta_dtypes = [
        np.dtype({"names": ["a", "b"], "formats": [float, np.dtype("S3", metadata={"k": "v"})]}),
        np.dtype(int, metadata={"k": "v"}),
        np.dtype([("subarray", (int, (2,)))], metadata={"k": "v"}),
    ]
    for i, dt in enumerate(meta_dtypes):
        yield Case(f"metadata-dtype-{i}", f"meta{i}.npy", npy_bytes(np.ones(10, dtype=dt)))
    py2 = header(b"{'descr': '<f8', 'fortran_order': False, 'shape': (2L,), }")
    yield Case("python2-long-shape", "py2.npy", py2 + np.ones(2).tobytes())
    py2_v2 = header(b"{'descr': '<i4', 'fortran_order': False, 'shape': (2L, 1L), }", (2, 0))
    yield Case("python2-long-shape-2.0", "py2b.npy", py2_v2 + bytes(8))
    bad_version = [
        b"\x93NUMPY\x01\x01",
        b"\x93NUMPY\x00\x00",
        b"\x93NUMPY\x00\x01",
        b"\x93NUMPY\x02\x02",
        b"\x93NUMPY\xff\xff",
    ]
    malformed = [b"\x92NUMPY\x01\x00", b"\x00NUMPY\x01\x00", b"\x93numpy\x01\x00"]
    malformed += [b"\x93MATLB\x01\x00", b"\x93NUMPY\x01", b"\x93NUMPY"]
    body = npy_bytes(np.ones((3, 6)))[8:]
    for i, magic in enumerate(bad_version + malformed):
        yield Case(f"bad-magic-{i}", f"m{i}.npy", magic)
        yield Case(f"bad-magic-{i}-with-body", f"mb{i}.npy", magic + body)
    yield Case("empty-file", "e.npy", b"")
    yield Case("cut-length-1.0", "c1.npy", b"\x93NUMPY\x01\x00\x10")
    yield Case("cut-length-2.0", "c2.npy", b"\x93NUMPY\x02\x00\x10\x00\x00")
    yield Case("cut-header", "c3.npy", npy_bytes(np.ones(3))[:40])
    yield Case(
        "missing-fortran-order",
        "k1.npy",
        b"\x93NUMPY\x01\x006\x00{'descr': 'x', 'shape': (1, 2), }                    \n",
    )
    yield Case(
        "extra-key",
        "k2.npy",
        header(b"{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), 'extrakey': -1, }")
        + bytes(16),
    )
    yield Case(
        "descr-not-a-dtype",
        "k3.npy",
        header(b"{'descr': 'x', 'fortran_order': False, 'shape': (1, 2), }") + bytes(16),
    )
    yield Case(
        "header-not-a-literal",
        "k4.npy",
        header(b"{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), } + 1") + bytes(16),
    )
    yield Case("object-npz", "o.npz", npz_bytes(x=np.array([None, 1], dtype=object)))
    yield Case("empty-npz", "empty.npz", npz_bytes())
    yield Case("compressed-npz", "z.npz", npz_bytes(True, a=np.arange(100.0), b=np.ones(3)))
    structured = np.array(PLAIN_ROWS, np.dtype(PLAIN))
    yield Case("structured-member-npz", "st.npz", npz_bytes(arr=structured))
    yield Case("mixed-npz", "mx.npz", npz_bytes(arr=structured, t=np.arange(4)))
    yield Case("string-member-npz", "sm.npz", npz_bytes(s=np.array(["a", "bc"])))
    mixed_zip = io.BytesIO()
    with zipfile.ZipFile(mixed_zip, "w") as zf:
        zf.writestr("readme.txt", "not an array")
        zf.writestr("a.npy", npy_bytes(np.arange(3)))
    yield Case("npz-first-member-not-an-array", "first.npz", mixed_zip.getvalue())
    text_zip = io.BytesIO()
    with zipfile.ZipFile(text_zip, "w") as zf:
        zf.writestr("notes.txt", "no arrays at all")
    yield Case("npz-without-arrays", "none.npz", text_zip.getvalue())
    py2_file = Path(np.lib.__file__).parent / "tests" / "data" / "win64python2.npy"
    if py2_file.exists():  # numpy's own Python 2 file, where its wheel ships its tests
        yield Case("numpy-win64python2", "win64python2.npy", py2_file.read_bytes())
    whole = npz_bytes(a=np.arange(100.0), b=np.ones(3))
    yield Case("npz-cut-in-half", "cut.npz", whole[: len(whole) // 2])
    yield Case("npz-cut-in-directory", "cutd.npz", whole[:-10])


def numpy_reads(path: Path) -> bool:
    """The reference verdict: `np.load` (allow_pickle False, its default) reads the file and,
    for an archive, every member."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Python 2 headers are read with a warning
            got = np.load(path)
            if isinstance(got, np.lib.npyio.NpzFile):
                with got:
                    for key in got.files:
                        got[key]
    except Exception:
        return False
    return True


CASES = list(cases())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verify_agrees_with_numpy(tmp_path: Path, case: Case) -> None:
    path = case.write(tmp_path)
    reads = numpy_reads(path)
    prefixes = ("NPZ_", "NPY_") if case.name.endswith(".npz") else ("NPY_",)
    if case.data == b"":
        prefixes = ("UNKNOWN_FORMAT",)  # an empty file is no format at all
    assert_agrees(verify_report(path), reads, prefixes, case.id)


def test_the_cases_cover_both_verdicts_and_the_third() -> None:
    """The generated set is not one-sided: numpy reads some and refuses others, and some it
    reads are intact files matrixctl does not convert (the third verdict)."""
    ids = {c.id for c in CASES}
    assert len(CASES) > 300
    assert {"plain-record<", "unicode-field-names-3.0", "python2-long-shape", "empty-npz"} <= ids


@pytest.mark.parametrize(
    ("case_id", "verdict", "code"),
    [
        ("plain-record<", "unsupported", "NPY_NOT_TENSOR"),
        ("nested-record>", "unsupported", "NPY_NOT_TENSOR"),
        ("unicode-field-names-3.0", "unsupported", "NPY_NOT_TENSOR"),
        ("datetime64", "unsupported", "NPY_NOT_TENSOR"),
        ("structured-member-npz", "unsupported", "NPY_NOT_TENSOR"),
        ("python2-long-shape", "intact", None),
        ("empty-npz", "intact", None),
        ("bool-byte-2", "intact", "NPY_BOOL"),
        ("float64<-1d-trailing", "intact", "NPY_TRAILING"),
        ("object-npz", "damaged", "NPY_DTYPE"),
        ("cut-length-1.0", "damaged", "NPY_HEADER"),
        ("huge-header", "damaged", "NPY_HEADER"),
    ],
)
def test_verdict_classes(tmp_path: Path, case_id: str, verdict: str, code: str | None) -> None:
    """The verdict class and its finding, for the cases the issue names."""
    case = next(c for c in CASES if c.id == case_id)
    report = verify_report(case.write(tmp_path))
    assert report.verdict() == verdict, report.findings
    if code is not None:
        assert code in {f.code for f in report.findings}, report.findings
    if case_id == "cut-length-1.0":
        assert "magic" not in report.findings[0].message
        assert "header length" in report.findings[0].message
