"""safetensors: `verify` agrees with the installed safetensors package
(`safetensors.deserialize`, its Rust reader: header, dtypes, offsets, coverage).

The cases follow the package's own header tests (`safetensors/src/tensor.rs`,
`bindings/python/tests/test_simple.py`): files its writer gives, whitespace before and after the
header JSON, `"__metadata__": null`, every dtype it names (those matrixctl has no type for are
intact and not convertible), sub-byte tensors that do not end on a byte boundary, and broken
headers (bad length, not UTF-8, not JSON, an array, a string), holes, overlaps, trailing bytes,
reversed offsets. Broken headers are named safetensors by their length-plus-`{` shape or by a
`.safetensors` name.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.validate.differential import Case, assert_agrees, verify_report

safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import save as st_save  # noqa: E402

# Every dtype the package's reader names (0.8), with bits per element; and two it does not know.
DTYPE_BITS = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I4": 4,
    "Q4": 4,
}


def st(header: bytes, data: bytes = b"", size: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if size is None else size) + header + data


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def js(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


F32 = js({"a": entry("F32", [2], 0, 8)})


def cases() -> Iterator[Case]:
    arrays = {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
        "i64": np.arange(3, dtype=np.int64),
        "u8": np.arange(5, dtype=np.uint8),
        "bool": np.array([True, False]),
        "f16": np.ones(4, dtype=np.float16),
        "empty": np.zeros((0, 3), dtype=np.float32),
        "scalar": np.array(1.5, dtype=np.float64),
    }
    yield Case("package-writer", "w.safetensors", st_save(arrays))
    yield Case("package-writer-metadata", "m.safetensors", st_save(arrays, {"k": "v"}))
    yield Case("package-writer-no-tensors", "n.safetensors", st_save({}))
    yield Case("plain", "p.safetensors", st(F32, bytes(8)))
    for name, pad in {"spaces": b"   ", "newline-tab": b"\n\t ", "cr": b"\r\n"}.items():
        yield Case(f"whitespace-before-{name}", "ws.safetensors", st(pad + F32, bytes(8)))
        # Without a .safetensors name: the bytes alone must say safetensors.
        yield Case(f"whitespace-before-{name}-unnamed", "ws.bin", st(pad + F32, bytes(8)))
    yield Case("whitespace-after", "wa.safetensors", st(F32 + b"      ", bytes(8)))
    nulled = js({"__metadata__": None, "a": entry("F32", [2], 0, 8)})
    yield Case("metadata-null", "mn.safetensors", st(nulled, bytes(8)))
    yield Case("metadata-empty", "me.safetensors", st(js({"__metadata__": {}}), b""))
    yield Case("metadata-not-text", "mt.safetensors", st(js({"__metadata__": {"a": 1}})))
    yield Case("metadata-array", "ma.safetensors", st(js({"__metadata__": []})))
    yield Case("empty-header", "eh.safetensors", st(b"{}"))
    for dtype, bits in DTYPE_BITS.items():
        n = 4 * bits // 8
        yield Case(
            f"dtype-{dtype}",
            f"{dtype}.safetensors",
            st(js({"a": entry(dtype, [4], 0, n)}), bytes(n)),
        )
        yield Case(
            f"dtype-{dtype}-short",
            f"{dtype}s.safetensors",
            st(js({"a": entry(dtype, [4], 0, n - 1)}), bytes(n - 1)),
        )
    for dtype in ("F4", "F6_E2M3"):
        yield Case(
            f"dtype-{dtype}-not-byte-aligned",
            f"{dtype}u.safetensors",
            st(js({"a": entry(dtype, [3], 0, 2)}), bytes(2)),
        )
    yield Case(
        "bool-byte-2", "b2.safetensors", st(js({"a": entry("BOOL", [2], 0, 2)}), b"\x02\x01")
    )
    yield Case("zero-size", "z.safetensors", st(js({"a": entry("F32", [0, 4], 0, 0)})))
    yield Case("bad-length-past-file", "bl.safetensors", st(F32, bytes(8), size=1000))
    yield Case("bad-length-huge", "bh.safetensors", st(F32, bytes(8), size=1 << 40))
    yield Case("bad-length-zero", "bz.safetensors", st(b"", bytes(8)))
    yield Case("shorter-than-length-field", "s.safetensors", b"\x01\x00")
    yield Case("not-utf8", "u.safetensors", st(b'{"\xff":1}'))
    yield Case("not-utf8-unnamed", "u.bin", st(b'{"\xff":1}'))
    yield Case("not-json", "j.safetensors", st(b"{abc"))
    yield Case("not-json-unnamed", "j.bin", st(b"{abc"))
    yield Case("an-array", "a.safetensors", st(b"[]"))
    yield Case("a-string", "str.safetensors", st(b'"abc"'))
    yield Case("a-number", "num.safetensors", st(b"42"))
    yield Case("cut-json", "cj.safetensors", st(F32[:-3]))
    yield Case("hole", "h.safetensors", st(js({"a": entry("F32", [2], 4, 12)}), bytes(12)))
    two = {"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}
    yield Case("overlap", "o.safetensors", st(js(two), bytes(8)))
    yield Case("trailing-bytes", "t.safetensors", st(F32, bytes(12)))
    yield Case(
        "reversed-offsets", "r.safetensors", st(js({"a": entry("F32", [0], 8, 0)}), bytes(8))
    )
    yield Case(
        "past-the-buffer", "pb.safetensors", st(js({"a": entry("F32", [4], 0, 16)}), bytes(8))
    )
    yield Case("cut-data", "cd.safetensors", st(F32, bytes(4)))
    yield Case("negative-dim", "nd.safetensors", st(js({"a": entry("F32", [-2], 0, 8)}), bytes(8)))
    yield Case("shape-not-list", "sl.safetensors", st(js({"a": entry("F32", 2, 0, 8)}), bytes(8)))  # type: ignore[arg-type]
    dup = b'{"a":' + js(entry("F32", [1], 0, 4)) + b',"a":' + js(entry("F32", [2], 0, 8)) + b"}"
    yield Case("repeated-tensor-key", "dup.safetensors", st(dup, bytes(8)))
    yield Case("repeated-tensor-key-first-fits", "dup1.safetensors", st(dup, bytes(4)))
    dup_meta = b'{"__metadata__":{"k":"1","k":"2"}}'
    yield Case("repeated-metadata-key", "dupm.safetensors", st(dup_meta))
    extra = js({"a": {**entry("F32", [2], 0, 8), "x": 1}})
    yield Case("extra-entry-field", "xf.safetensors", st(extra, bytes(8)))
    yield Case(
        "missing-dtype",
        "md.safetensors",
        st(js({"a": {"shape": [2], "data_offsets": [0, 8]}}), bytes(8)),
    )


def package_reads(path: Path) -> bool:
    try:
        safetensors.deserialize(path.read_bytes())
    except Exception:
        return False
    return True


CASES = list(cases())


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_verify_agrees_with_safetensors(tmp_path: Path, case: Case) -> None:
    path = case.write(tmp_path)
    report = verify_report(path)
    assert_agrees(report, package_reads(path), ("ST_",), case.id)
    # Named by its format: the bytes (length plus `{`) or the .safetensors name say it.
    shaped = case.data[8:9] == b"{" and len(case.data) > 9
    if shaped or case.name.endswith(".safetensors"):
        assert report.format == "safetensors", (case.id, report.findings)


@pytest.mark.parametrize(
    ("case_id", "verdict", "code"),
    [
        ("whitespace-before-spaces-unnamed", "intact", None),
        ("metadata-null", "intact", None),
        ("dtype-F4", "unsupported", "ST_NOT_TENSOR"),
        ("dtype-F8_E8M0", "unsupported", "ST_NOT_TENSOR"),
        ("dtype-I4", "damaged", "ST_DTYPE"),
        ("bool-byte-2", "intact", "ST_BOOL"),
        ("not-utf8", "damaged", "ST_JSON"),
        ("not-json", "damaged", "ST_JSON"),
        ("an-array", "damaged", "ST_JSON"),
        ("bad-length-past-file", "damaged", "ST_HEADER_SIZE"),
        ("repeated-tensor-key", "intact", "ST_DUPLICATE_KEY"),
        ("trailing-bytes", "damaged", "ST_LAYOUT"),
    ],
)
def test_verdict_classes(tmp_path: Path, case_id: str, verdict: str, code: str | None) -> None:
    case = next(c for c in CASES if c.id == case_id)
    report = verify_report(case.write(tmp_path))
    assert report.format == "safetensors"
    assert report.verdict() == verdict, report.findings
    if code is not None:
        assert code in {f.code for f in report.findings}, report.findings
