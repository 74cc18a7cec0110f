"""zTensor v1.1: golden bytes, decisions, every finding, hostile files, round trips."""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings, strategies

from matrixctl import cbor
from matrixctl.codes import Severity
from matrixctl.errors import FormatError
from matrixctl.formats import ztensor
from matrixctl.io import Source
from matrixctl.opening import open_checked
from matrixctl.tensors import DTYPES, chunked
from matrixctl.validate.engine import examine
from tests.helpers import golden_ztensor
from tests.helpers.ztcraft import blob_file, dense, with_manifest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
F32 = np.arange(4, dtype="<f4").tobytes()


def report_of(tmp_path: Path, data: bytes, name: str = "f.zt", scan: bool = True):
    path = tmp_path / name
    path.write_bytes(data)
    return examine(str(path), scan=scan)[0]


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def write(tensors: list[tuple[str, np.ndarray]], **kwargs) -> bytes:
    fp = io.BytesIO()
    w = ztensor.ZtWriter(fp, **kwargs)
    for name, arr in tensors:
        dt = next(d.name for d in DTYPES.values() if d.numeric and np.dtype(d.storage) == arr.dtype)
        w.add(name, arr.shape, "dense", [("data", dt, arr.nbytes, chunked(arr.tobytes()))])
    w.finish()
    return fp.getvalue()


def read_all(tmp_path: Path, data: bytes) -> dict[str, bytes]:
    path = tmp_path / "r.zt"
    path.write_bytes(data)
    with Source.open(str(path)) as src:
        source = ztensor.ZtSource(src, open_checked(src, ztensor.FORMAT))
        return {i.name: b"".join(bytes(p) for p in source.stream(i)) for i in source.tensors()}


# Golden files -------------------------------------------------------------------------------


def test_golden_files_on_disk_are_the_hand_written_bytes() -> None:
    assert (GOLDEN / "ztensor_v1_dense.zt").read_bytes() == golden_ztensor.DENSE
    assert (GOLDEN / "ztensor_v1_multi.zt").read_bytes() == golden_ztensor.MULTI


def test_writer_produces_the_golden_dense_file() -> None:
    assert write([("w", np.array([1.0, 2.0], "<f4"))], digest="crc32c") == golden_ztensor.DENSE


def test_writer_produces_the_golden_multi_file() -> None:
    data = write(
        [
            ("b", np.array([True, False, True])),
            ("i", np.array(-2, dtype="|i1")),
            ("h", np.array([1, 513], "<u2")),
        ],
        digest=None,
        attributes={"framework": "numpy"},
    )
    assert data == golden_ztensor.MULTI


def test_golden_files_verify_clean(tmp_path: Path) -> None:
    dense_report = report_of(tmp_path, golden_ztensor.DENSE)
    assert dense_report.findings == [] and dense_report.ok(strict=True)
    multi = report_of(tmp_path, golden_ztensor.MULTI, "m.zt")
    assert [f.code for f in multi.findings] == [ztensor.ZT_NO_DIGEST]
    assert multi.findings[0].severity is Severity.INFO


def test_golden_values_read_back(tmp_path: Path) -> None:
    got = read_all(tmp_path, golden_ztensor.MULTI)
    assert got == {"b": b"\x01\x00\x01", "i": b"\xfe", "h": bytes.fromhex("01000102")}


def test_crc32c_reference_vector() -> None:
    assert golden_ztensor.crc32c_reference(b"123456789") == 0xE3069283  # the standard check value
    d = ztensor.Digester("crc32c")
    d.update(b"123456789")
    assert d.text() == "crc32c:0xE3069283"


# Decisions ----------------------------------------------------------------------------------


def test_digest_covers_the_stored_bytes_after_zstd(tmp_path: Path) -> None:
    """Decision: a digest covers the component's stored bytes (compressed, for zstd), as
    ztensor 1.1.1 computes and checks it."""
    arr = np.zeros(1000, "<f4")
    data = write([("z", arr)], digest="sha256", level=3)
    f = ztensor.parse(data, len(data))
    c = f.objects["z"].components["data"]
    import hashlib

    assert c.digest == "sha256:" + hashlib.sha256(data[c.offset : c.end]).hexdigest()
    assert c.digest != "sha256:" + hashlib.sha256(arr.tobytes()).hexdigest()
    assert report_of(tmp_path, data).ok(strict=True)


def test_digest_text_forms() -> None:
    """Decision: crc32c is written `crc32c:0x` + 8 upper-case hex digits (the reference's form);
    reading accepts either case; sha256 is 64 hex digits."""
    assert ztensor.parse_digest("crc32c:0x0a0B0c0D") == ("crc32c", "0A0B0C0D")
    assert ztensor.same_digest("crc32c:0xabcdef01", "crc32c:0xABCDEF01")
    for bad in ("crc32c:abcdef01", "crc32c:0x123", "sha256:00", "nocolon"):
        with pytest.raises(ValueError):
            ztensor.parse_digest(bad)
    assert ztensor.parse_digest("blake3:00") is None


def test_manifest_follows_the_last_blob_without_padding() -> None:
    """Decision: the spec's diagram has no padding before the manifest; like ztensor 1.1.1 the
    writer puts the manifest right after the last blob (the file's tail needs no alignment)."""
    f = ztensor.parse(golden_ztensor.DENSE, len(golden_ztensor.DENSE))
    c = f.objects["w"].components["data"]
    assert f.manifest_offset == c.end == 72


def test_manifest_is_deterministic_cbor() -> None:
    """Decision: the manifest is deterministic CBOR (RFC 8949 4.2.1), so the same tensors give
    the same bytes whatever order attributes arrive in."""
    a = write([("x", np.ones(2, "<f4"))], attributes={"a": "1", "b": "2"})
    b = write([("x", np.ones(2, "<f4"))], attributes={"b": "2", "a": "1"})
    assert a == b
    f = ztensor.parse(a, len(a))
    raw = a[f.manifest_offset : f.manifest_offset + f.manifest_size]
    import cbor2

    assert cbor2.dumps(cbor2.loads(raw), canonical=True) == raw


def test_scalar_is_an_empty_shape(tmp_path: Path) -> None:
    """Decision: a rank-0 tensor is written with shape [] (one element), as the spec's v1.0
    wording and ztensor 1.1.1's reader take it; ztensor 1.1.1's own writer turns () into [1]."""
    data = write([("s", np.array(3.5, "<f4"))])
    assert ztensor.parse(data, len(data)).objects["s"].shape == ()
    assert read_all(tmp_path, data) == {"s": np.float32(3.5).tobytes()}


def test_non_text_root_attributes_are_a_warning(tmp_path: Path) -> None:
    """Decision: the spec allows any map for attributes, but ztensor 1.1.1 refuses a root map
    whose values are not text: reported as a warning (ZT_ATTRIBUTES); the writer stores
    non-text metadata as JSON text."""
    data = blob_file({"x": dense([4], "f32", F32)}, attributes={"n": 1})
    report = report_of(tmp_path, data)
    assert ztensor.ZT_ATTRIBUTES in codes_of(report)
    assert report.ok() and not report.ok(strict=True)


def test_dtypes_unknown_to_the_reference_are_noted(tmp_path: Path) -> None:
    """Decision: f8_e4m3, f8_e5m2, complex64 and complex128 are written (the spec lists them),
    with an info finding: ztensor 1.1.1 knows only 13 dtypes and cannot open such files."""
    data = blob_file({"x": dense([4], "f8_e4m3", bytes(4))})
    report = report_of(tmp_path, data)
    assert [f.code for f in report.findings if f.code != ztensor.ZT_NO_DIGEST] == [
        ztensor.ZT_REFERENCE_DTYPE
    ]
    assert report.ok(strict=True)


def test_zero_length_components_may_share_an_offset(tmp_path: Path) -> None:
    """Decision: an empty component occupies no bytes, so it overlaps nothing (ztensor 1.1.1
    gives it the next blob's offset)."""
    data = blob_file(
        {
            "e": dense([0, 4], "u16", b"", offset=64),
            "t": dense([2], "bool", b"\x01\x00", offset=64),
        }
    )
    report = report_of(tmp_path, data)
    assert ztensor.ZT_OVERLAP not in codes_of(report) and report.ok()


def test_identical_ranges_are_an_overlap(tmp_path: Path) -> None:
    """Decision: the spec is silent on two components sharing bytes; like safetensors,
    matrixctl refuses any sharing (even identical ranges), so one range can never be read
    under two interpretations."""
    data = blob_file(
        {"a": dense([4], "f32", F32), "b": dense([4], "f32", b"", offset=64, length=16)}
    )
    assert ztensor.ZT_OVERLAP in codes_of(report_of(tmp_path, data))


def test_versions(tmp_path: Path) -> None:
    """Decision: major version 1 is required; a newer 1.x minor is a warning (its new fields
    are ignored); 1.0 and 1.1 are read alike."""
    newer = report_of(tmp_path, blob_file({"x": dense([4], "f32", F32)}, version="1.2.0"))
    assert ztensor.ZT_VERSION_NEWER in codes_of(newer) and newer.ok()
    other = report_of(tmp_path, blob_file({"x": dense([4], "f32", F32)}, version="2.0.0"))
    assert ztensor.ZT_VERSION in codes_of(other) and not other.ok()


def test_padding_must_be_zero_and_gaps_are_warned(tmp_path: Path) -> None:
    """Decision: non-zero padding is an error (the spec's writer MUST); a gap of 64 bytes or
    more that no component covers is a warning (hidden, unreferenced data)."""
    padded = blob_file(
        {"a": dense([1], "u8", b"\x01"), "b": dense([1], "u8", b"\x02")}, pad_byte=0x55
    )
    assert ztensor.ZT_PADDING in codes_of(report_of(tmp_path, padded))
    gap = blob_file({"a": dense([1], "u8", bytes(64) + b"\x01", offset=128, length=1)})
    report = report_of(tmp_path, gap, "g.zt")
    assert codes_of(report) == {ztensor.ZT_GAP, ztensor.ZT_NO_DIGEST} and report.ok()


def test_unknown_digest_algorithm_is_an_error_unless_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision: a digest algorithm other than crc32c and sha256 cannot be checked: an error
    (ZT_DIGEST_UNKNOWN), so one changed byte (crc32c -> crc32d) cannot turn a checked file
    into an unchecked one; MATRIXCTL_ALLOW_UNKNOWN_DIGEST=1 (or verify
    --allow-unknown-digest) relaxes it to a warning, as ztensor 1.1.1 silently skips it."""
    data = blob_file({"x": dense([4], "f32", F32, digest="blake3:00ff")})
    report = report_of(tmp_path, data)
    assert ztensor.ZT_DIGEST_UNKNOWN in codes_of(report) and not report.ok()
    monkeypatch.setenv("MATRIXCTL_ALLOW_UNKNOWN_DIGEST", "1")
    report = report_of(tmp_path, data)
    assert ztensor.ZT_DIGEST_UNKNOWN in codes_of(report) and report.ok()
    assert not report.ok(strict=True)


def test_a_damaged_digest_key_is_an_error(tmp_path: Path) -> None:
    """Decision: a component key one byte away from 'digest' (and no 'digest') is a damaged
    integrity field: ZT_DIGEST_UNKNOWN, an error, not a component without a digest."""
    good = blob_file({"x": dense([4], "f32", F32, digest="crc32c:0x00000000")})
    assert good.count(b"fdigest") == 1
    bad = good.replace(b"fdigest", b"fdigesu")
    report = report_of(tmp_path, bad)
    assert ztensor.ZT_DIGEST_UNKNOWN in codes_of(report) and not report.ok()


# Findings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("objects", "code"),
    [
        ({"x": dense([4], "f32", F32, offset=8)}, ztensor.ZT_ALIGN),
        ({"x": dense([4], "f32", F32, length=1 << 40)}, ztensor.ZT_BOUNDS),
        ({"x": dense([4], "f32", F32, offset=0)}, ztensor.ZT_BOUNDS),
        ({"x": dense([5], "f32", F32)}, ztensor.ZT_LENGTH),
        ({"x": dense([4], "f32", F32[:15])}, ztensor.ZT_LENGTH),
        ({"x": dense([4], "f32", F32, digest="crc32c:0x00000000")}, ztensor.ZT_DIGEST),
        ({"x": dense([4], "f32", F32, digest="crc32c:0xZZ")}, ztensor.ZT_DIGEST_FORMAT),
        ({"x": dense([2], "bool", b"\x01\x02")}, ztensor.ZT_BOOL),
        ({"x": dense([4], "f99", F32)}, ztensor.ZT_SCHEMA),
        ({"x": dense([4], "f32", F32, encoding="lz4")}, ztensor.ZT_SCHEMA),
        ({"x": ({"shape": [-1], "format": "dense"}, {})}, ztensor.ZT_SCHEMA),
        ({"x": ({"shape": [4], "format": "dense"}, {})}, ztensor.ZT_COMPONENTS),
        ({"x": ({"shape": [4], "format": "mystery"}, {})}, ztensor.ZT_LAYOUT),
        (
            {
                "x": (
                    {"shape": [4], "format": "dense"},
                    {"data": ({"dtype": "f32"}, F32), "e": ({"dtype": "u8"}, b"")},
                )
            },
            ztensor.ZT_EXTRA_COMPONENT,
        ),
    ],
)
def test_each_rule_reports(tmp_path: Path, objects: dict, code: str) -> None:
    report = report_of(tmp_path, blob_file(objects))
    assert code in codes_of(report), report.findings
    hit = next(f for f in report.findings if f.code == code)
    assert hit.field is not None and hit.offset is not None


def test_sparse_rules(tmp_path: Path) -> None:
    """Decision: sparse index components may be any integer dtype (the spec allows u16
    indices; ztensor 1.1.1 writes u64); a non-integer index dtype is an error. sparse_csr
    needs a 2-D shape; coords are ndim x nnz in structure-of-arrays order."""
    u64 = lambda xs: np.array(xs, "<u8").tobytes()  # noqa: E731
    good = {
        "c": (
            {"shape": [2, 3], "format": "sparse_csr"},
            {
                "values": ({"dtype": "f32"}, np.array([1, 2], "<f4").tobytes()),
                "indices": ({"dtype": "u64"}, u64([0, 2])),
                "indptr": ({"dtype": "u64"}, u64([0, 1, 2])),
            },
        ),
        "o": (
            {"shape": [2, 3], "format": "sparse_coo"},
            {
                "values": ({"dtype": "f32"}, np.array([1, 2], "<f4").tobytes()),
                "coords": ({"dtype": "u64"}, u64([0, 1, 2, 0])),
            },
        ),
    }
    assert report_of(tmp_path, blob_file(good)).ok()
    bad = dict(good)
    bad["c"] = (good["c"][0], {**good["c"][1], "indices": ({"dtype": "u64"}, u64([0, 3]))})
    assert ztensor.ZT_SPARSE in codes_of(report_of(tmp_path, blob_file(bad), "b.zt"))
    worse = dict(good)
    worse["o"] = (good["o"][0], {**good["o"][1], "coords": ({"dtype": "f32"}, bytes(16))})
    assert ztensor.ZT_COMPONENT_DTYPE in codes_of(report_of(tmp_path, blob_file(worse), "w.zt"))


def test_index_dtype_findings_follow_the_manifest_order(tmp_path: Path) -> None:
    """Same file, same report: the index components' findings come in the manifest's order
    (they came in the order of a set of role names, which changes with the hash seed)."""
    import subprocess
    import sys

    for roles in (("indptr", "indices"), ("indices", "indptr")):
        comps = {"values": ({"dtype": "f32"}, bytes(8))}
        comps.update(
            {role: ({"dtype": "f32"}, bytes(8 if role == "indices" else 12)) for role in roles}
        )
        path = tmp_path / f"{roles[0]}.zt"
        path.write_bytes(blob_file({"c": ({"shape": [2, 3], "format": "sparse_csr"}, comps)}))
        script = (
            "import sys; from matrixctl.validate.engine import examine; "
            "r = examine(sys.argv[1], scan=False)[0]; "
            "print([f.field for f in r.findings if f.code == 'ZT_COMPONENT_DTYPE'])"
        )
        outs = {
            subprocess.run(
                [sys.executable, "-c", script, str(path)],
                env={**os.environ, "PYTHONHASHSEED": str(seed)},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for seed in range(6)
        }
        want = [f"objects/c/components/{role}/dtype" for role in roles]
        assert outs == {f"{want}\n"}


def test_zstd_component_of_partial_elements_is_refused_on_read(tmp_path: Path) -> None:
    """Opening runs the structural rules only; a sparse zstd component whose bytes decode to
    a partial element (found by verify's scan) is refused with the scan rule's error when it
    is read, not handed to numpy (which raised ValueError)."""
    from matrixctl.converters.tensors import open_source

    coords = zstandard.ZstdCompressor().compress(bytes(7))
    data = blob_file(
        {
            "o": (
                {"shape": [4], "format": "sparse_coo"},
                {
                    "values": ({"dtype": "f32"}, bytes(4)),
                    "coords": ({"dtype": "i32", "encoding": "zstd"}, coords),
                },
            )
        }
    )
    path = tmp_path / "p.zt"
    path.write_bytes(data)
    message = "o/coords: decodes to 7 bytes, not a whole number of i32 elements"
    report = examine(str(path), scan=True)[0]
    assert [(f.code, f.message) for f in report.findings if f.code == ztensor.ZT_ZSTD_SIZE] == [
        (ztensor.ZT_ZSTD_SIZE, message)
    ]
    with open_source(str(path)) as src:
        (info,) = src.tensors()
        assert src.array(info, "values").tolist() == [0.0]
        with pytest.raises(FormatError) as err:
            src.array(info, "coords")
    assert (err.value.code, err.value.message) == (ztensor.ZT_ZSTD_SIZE, message)
    assert err.value.field == "objects/o/components/coords"


def test_quantized_group_sizes(tmp_path: Path) -> None:
    """Decision: the spec requires packed_weight, scales and zeros but defines no attribute;
    when `bits` and `group_size` are present (as in its example) the component sizes are
    checked against them, as warnings (other packings may exist)."""
    q = {
        "q": (
            {
                "shape": [4, 8],
                "format": "quantized_group",
                "attributes": {"bits": 4, "group_size": 8},
            },
            {
                "packed_weight": ({"dtype": "i32"}, bytes(16)),  # 32 x 4 bits = 16 bytes
                "scales": ({"dtype": "f16"}, bytes(8)),  # 4 groups
                "zeros": ({"dtype": "f16"}, bytes(8)),
            },
        )
    }
    assert report_of(tmp_path, blob_file(q)).findings[0].code == ztensor.ZT_NO_DIGEST
    q["q"][1]["scales"] = ({"dtype": "f16"}, bytes(6))
    assert ztensor.ZT_QUANT_SIZE in codes_of(report_of(tmp_path, blob_file(q), "q.zt"))


# Hostile files ------------------------------------------------------------------------------


@pytest.mark.parametrize("golden", [golden_ztensor.DENSE, golden_ztensor.MULTI])
def test_truncation_at_every_length(tmp_path: Path, golden: bytes) -> None:
    path = tmp_path / "t.zt"
    for n in range(len(golden)):
        path.write_bytes(golden[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n
        assert report.exit_code() == 1, n


def test_every_bit_flip_outside_the_manifest_is_reported(tmp_path: Path) -> None:
    """Decision (a limit of the format): v1.1 has no manifest checksum, so a flipped bit in a
    name or an attribute can give another valid file. Every flip in the magic, the padding,
    the data (digest), the manifest size and the footer is reported; a flip inside the
    manifest is reported whenever it breaks the CBOR, the schema, an offset, a length or the
    digest, and never crashes the reader."""
    path = tmp_path / "flip.zt"
    f = ztensor.parse(golden_ztensor.DENSE, len(golden_ztensor.DENSE))
    manifest = range(f.manifest_offset, f.manifest_offset + f.manifest_size)
    digest_at = golden_ztensor.DENSE.index(golden_ztensor.DENSE_DIGEST.encode()) + len("crc32c:0x")
    unnoticed = []
    for bit in range(len(golden_ztensor.DENSE) * 8):
        pos, mask = bit // 8, 1 << (bit % 8)
        data = bytearray(golden_ztensor.DENSE)
        data[pos] ^= mask
        path.write_bytes(bytes(data))
        report = examine(str(path), scan=True)[0]
        if report.ok():
            unnoticed.append(pos)
            assert pos in manifest, f"flip of bit {bit % 8} in byte {pos} went unnoticed"
    hex_case = [p for p in unnoticed if digest_at <= p < digest_at + 8]
    assert len(unnoticed) < len(manifest) * 2  # most manifest flips are caught too
    assert all(chr(golden_ztensor.DENSE[p]).isalpha() for p in hex_case)


def test_huge_manifest_size_is_refused_before_reading(tmp_path: Path) -> None:
    body = bytearray(golden_ztensor.DENSE)
    struct.pack_into("<Q", body, len(body) - 16, (1 << 30) + 1)
    report = report_of(tmp_path, bytes(body))
    assert [f.code for f in report.findings] == [ztensor.ZT_MANIFEST_SIZE]
    assert "1 GiB" in report.findings[0].message
    struct.pack_into("<Q", body, len(body) - 16, 1 << 63)
    assert codes_of(report_of(tmp_path, bytes(body))) == {ztensor.ZT_MANIFEST_SIZE}


@pytest.mark.parametrize(
    "raw",
    [
        bytes.fromhex("9bffffffffffffffff"),  # an array of 2**64 - 1 items
        bytes.fromhex("81") * 100 + b"\x01",  # nesting 100 deep
        bytes.fromhex("c100"),  # a tag
        bytes.fromhex("a2616101616102"),  # a duplicate key
        bytes.fromhex("a1010203"),  # a non-text key, and trailing bytes
        bytes.fromhex("7a7fffffff"),  # a 2 GiB string in a few bytes
    ],
)
def test_hostile_cbor_is_refused(tmp_path: Path, raw: bytes) -> None:
    """Decision: the manifest decoder refuses tags, duplicate keys, non-text keys, nesting
    beyond 64 and more than 16M items, and checks every count against the bytes left; it
    accepts indefinite lengths (RFC 7049, which the spec cites)."""
    report = report_of(tmp_path, with_manifest(raw))
    assert codes_of(report) <= {ztensor.ZT_CBOR, ztensor.ZT_SCHEMA} and not report.ok()


def test_manifest_schema_errors(tmp_path: Path) -> None:
    import cbor2

    for root in ([1, 2], {"objects": {}}, {"version": "1.1.0"}, {"version": 1, "objects": {}}):
        report = report_of(tmp_path, with_manifest(cbor2.dumps(root)))
        assert codes_of(report) == {ztensor.ZT_SCHEMA}, root


def test_zstd_bomb_stops_at_the_shape_cap(tmp_path: Path) -> None:
    """100 MiB of zeros in ~3 KiB of zstd, declared as 1000 f32: the frame header gives it
    away without decoding, and decoding stops at 4000 bytes."""
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=False)
    chunks = cctx.compressobj()
    bomb = b"".join(chunks.compress(bytes(1 << 20)) for _ in range(100)) + chunks.flush()
    assert len(bomb) < 10_000
    data = blob_file({"x": dense([1000], "f32", bomb, encoding="zstd")})
    report = report_of(tmp_path, data)
    assert ztensor.ZT_ZSTD_SIZE in codes_of(report)
    with_size = zstandard.ZstdCompressor(level=1).compress(bytes(1 << 20))
    data = blob_file({"x": dense([1000], "f32", with_size, encoding="zstd")})
    assert ztensor.ZT_ZSTD_SIZE in codes_of(report_of(tmp_path, data, "s.zt", scan=False))


def test_a_shape_no_zstd_data_can_fill_is_refused_without_decoding(tmp_path: Path) -> None:
    tiny = zstandard.ZstdCompressor().compress(bytes(64))
    data = blob_file({"x": dense([1 << 40], "f32", tiny, encoding="zstd")})
    report = report_of(tmp_path, data)
    hit = [f for f in report.findings if f.code == ztensor.ZT_ZSTD_SIZE]
    assert hit and "32768" in hit[0].message


def test_corrupt_zstd(tmp_path: Path) -> None:
    data = blob_file({"x": dense([4], "f32", b"\x28\xb5\x2f\xfd" + b"\xff" * 12, encoding="zstd")})
    report = report_of(tmp_path, data)
    assert codes_of(report) & {ztensor.ZT_ZSTD, ztensor.ZT_ZSTD_SIZE} and not report.ok()


def test_footer_magic_missing(tmp_path: Path) -> None:
    report = report_of(tmp_path, golden_ztensor.DENSE[:-1] + b"X")
    assert codes_of(report) == {ztensor.ZT_FOOTER_MAGIC}


def test_source_refuses_a_damaged_digest_before_handing_out_bytes(tmp_path: Path) -> None:
    """Decision: the digest is checked before the first byte leaves the source: making the
    stream reads nothing, its first read (or kernel copy) raises ZT_DIGEST."""
    data = bytearray(golden_ztensor.DENSE)
    data[64] ^= 1
    path = tmp_path / "d.zt"
    path.write_bytes(bytes(data))
    with Source.open(str(path)) as src:
        source = ztensor.ZtSource(src, open_checked(src, ztensor.FORMAT))
        stream = source.stream(source.tensors()[0])
        with pytest.raises(FormatError) as info:
            next(iter(stream))
    assert info.value.code == ztensor.ZT_DIGEST


# Round trips --------------------------------------------------------------------------------

NUMERIC = [d.name for d in DTYPES.values()]


@settings(max_examples=40, deadline=None)
@given(
    tensors=strategies.lists(
        strategies.tuples(
            strategies.sampled_from(NUMERIC),
            strategies.lists(strategies.integers(0, 5), max_size=3),
            strategies.binary(min_size=0, max_size=64),
        ),
        max_size=4,
    ),
    level=strategies.sampled_from([None, 1, 3]),
    digest=strategies.sampled_from([None, "crc32c", "sha256"]),
)
def test_round_trip_property(tensors, level, digest) -> None:
    import tempfile

    fp = io.BytesIO()
    w = ztensor.ZtWriter(fp, digest=digest, level=level)
    expected = {}
    for i, (dtype, shape, seed) in enumerate(tensors):
        n = int(np.prod(shape)) * DTYPES[dtype].itemsize
        data = (seed * (n // max(len(seed), 1) + 1))[:n] if seed else bytes(n)
        if dtype == "bool":
            data = bytes(b & 1 for b in data)
        name = f"t{i}"
        w.add(name, tuple(shape), "dense", [("data", dtype, n, iter([data]))])
        expected[name] = data
    w.finish()
    blob = fp.getvalue()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.zt"
        path.write_bytes(blob)
        report = examine(str(path), scan=True)[0]
        assert report.ok(), report.findings
        assert read_all(Path(tmp), blob) == expected


def test_cbor_encoder_matches_cbor2_canonical() -> None:
    import cbor2

    value = {
        "version": "1.1.0",
        "objects": {"a": {"shape": [1, 2**40], "x": 1.5, "y": -3, "z": None, "f": 0.1}},
        "bytes": b"\x00\x01",
        "flags": [True, False],
    }
    assert cbor.dumps(value) == cbor2.dumps(value, canonical=True)
    assert cbor.loads(cbor.dumps(value)) == value


def test_truncated_zstd_is_caught_even_where_the_size_is_not_exact(tmp_path: Path) -> None:
    """zstd's streaming decoder returns short output without an error for a cut frame; the
    frame walk catches it (here in sparse values, whose decoded size the shape only bounds)."""
    values = zstandard.ZstdCompressor(write_content_size=False).compress(
        np.arange(300, dtype="<f4").tobytes()
    )[:-4]
    idx = np.arange(300, dtype="<u8")
    sparse = {
        "o": (
            {"shape": [300], "format": "sparse_coo"},
            {
                "values": ({"dtype": "f32", "encoding": "zstd"}, values),
                "coords": ({"dtype": "u64"}, idx.tobytes()),
            },
        )
    }
    report = report_of(tmp_path, blob_file(sparse))
    assert ztensor.ZT_ZSTD in codes_of(report) and not report.ok()
    with pytest.raises(ValueError, match="truncated"):
        ztensor.zstd_frames(values)


def test_digests_are_on_by_default() -> None:
    """Decision: digests are on by default, crc32c: what ztensor 1.1.1 writes and checks, at
    ~13 GiB/s (sha256, ~1.3 GiB/s here, is `--digest sha256`)."""
    data = write([("x", np.ones(3, "<f4"))])
    f = ztensor.parse(data, len(data))
    assert f.objects["x"].components["data"].digest.startswith("crc32c:0x")


def test_unknown_layouts_are_checked_but_not_converted(tmp_path: Path) -> None:
    """Decision: an object whose format the spec does not define is a warning for verify (its
    components are still bounds- and overlap-checked) and an error for convert."""
    data = blob_file(
        {"x": ({"shape": [4], "format": "mystery"}, {"blob": ({"dtype": "u8"}, bytes(4))})}
    )
    report = report_of(tmp_path, data)
    assert ztensor.ZT_LAYOUT in codes_of(report) and report.ok()
    path = tmp_path / "m.zt"
    path.write_bytes(data)
    with Source.open(str(path)) as src, pytest.raises(FormatError) as info:
        ztensor.ZtSource(src, open_checked(src, ztensor.FORMAT))
    assert info.value.code == ztensor.ZT_LAYOUT


def test_blob_order_is_kept(tmp_path: Path) -> None:
    """Decision: the manifest's objects map is sorted by name (deterministic CBOR), so the
    reader orders tensors by blob offset; convert writes them in that order, keeping reads
    sequential and a file's layout."""
    data = golden_ztensor.MULTI
    path = tmp_path / "m.zt"
    path.write_bytes(data)
    with Source.open(str(path)) as src:
        assert [
            i.name for i in ztensor.ZtSource(src, open_checked(src, ztensor.FORMAT)).tensors()
        ] == [
            "b",
            "i",
            "h",
        ]


# The writer's helper thread ------------------------------------------------------------------


MIB = 1 << 20


class _Recording(io.BytesIO):
    """A file that records how many bytes had been written when each piece was asked for."""


def test_background_writes_give_the_same_bytes_and_respect_piece_order() -> None:
    """Pieces large enough for the helper thread (and sliced inside) give the same file as
    small direct writes; with overlap_pieces=False every piece is in the file before the
    stream is asked for the next one (what lets `convert` release a mapped piece's pages)."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal(3 * MIB // 4 + 17).astype(np.float32)
    tensors = [("a", big), ("b", big[:1000].copy()), ("c", big[::-1].copy())]
    plain = write(tensors)
    old = ztensor.BACKGROUND_MIN
    try:
        ztensor.BACKGROUND_MIN = 1 << 62  # every write direct
        assert write(tensors) == plain
    finally:
        ztensor.BACKGROUND_MIN = old
    for overlap in (True, False):
        fp = _Recording()
        w = ztensor.ZtWriter(fp, overlap_pieces=overlap)
        seen: list[tuple[int, int]] = []

        def pieces(
            arr: np.ndarray,
            w: ztensor.ZtWriter = w,
            fp: _Recording = fp,
            seen: list[tuple[int, int]] = seen,
        ):
            raw = arr.tobytes()
            step = len(raw) // 3 + 1
            for i in range(0, len(raw), step):
                if i:  # the stream resumed: the piece it gave last must be in the file
                    seen.append((w.pos, fp.tell()))  # no buffer export: a write may be in flight
                yield memoryview(raw)[i : i + step]

        for name, arr in tensors:
            w.add(name, arr.shape, "dense", [("data", "f32", arr.nbytes, pieces(arr))])
        w.finish()
        assert fp.getvalue() == plain
        if not overlap:
            assert seen and all(pos == written for pos, written in seen), seen


def test_an_error_mid_tensor_waits_for_queued_writes() -> None:
    """A stream that fails mid-tensor raises its own error after the queued writes finished
    (none outlives the call), and the writer's thread is gone."""
    big = np.zeros(2 * MIB, dtype=np.uint8)

    def failing():
        yield big.data
        raise RuntimeError("source went away")

    fp = io.BytesIO()
    w = ztensor.ZtWriter(fp)
    with pytest.raises(RuntimeError, match="source went away"):
        w.add("x", (4 * MIB,), "dense", [("data", "u8", 4 * MIB, failing())])
    assert w._bg is None
    assert len(fp.getvalue()) == w.pos


@pytest.mark.parametrize(
    "comp",
    [
        {"dtype": "f32", "offset": 64, "length": 16, "encoding": "raw", "digest": "crc32c:0x1"},
        {"dtype": "f32", "offset": 64, "length": 16},  # no digest, as ztensor 1.1.1 writes
        {"dtype": "f32", "offset": 64, "length": 16, "encoding": "zstd"},
        {"dtype": "f32", "offset": 64, "length": 16, "digest": None},
        {"dtype": "f32", "offset": 64, "length": 16, "note": "x"},  # an unknown key
        {"dtype": "f32", "offset": 64, "length": 16, "digezt": "crc32c:0x1"},  # damaged key
    ],
)
def test_a_component_made_at_once_is_the_one_the_full_checks_make(comp: dict) -> None:
    """`_parse_object` makes well-formed components itself (with a digest, or without one and
    with no other key that could be a damaged 'digest'); any other goes through
    `_parse_component`. Both must give the same component and the same problems."""
    fast: list = []
    obj = ztensor._parse_object(
        "x", {"shape": [4], "format": "dense", "components": {"data": comp}}, fast
    )
    slow: list = []
    made = ztensor._parse_component("x", "data", comp, slow)
    assert [(p.code, p.field) for p in fast] == [(p.code, p.field) for p in slow]
    assert obj is not None and made is not None
    assert obj.components["data"] == made


@pytest.mark.parametrize("sent", [10, 30])
def test_a_compressed_component_of_the_wrong_size_is_zt_write(sent: int) -> None:
    """zstd with a pledged size: a stream shorter or longer than the shape says is ZT_WRITE
    naming the component; ending the frame anyway gave zstd's "Src size is incorrect"
    (INTERNAL)."""
    from matrixctl.errors import FormatError

    w = ztensor.ZtWriter(io.BytesIO(), level=3)
    with pytest.raises(FormatError) as err:
        w.add("x", (20,), "dense", [("data", "u8", 20, iter([bytes(sent)]))])
    assert err.value.code == "ZT_WRITE" and "x/data" in err.value.message
