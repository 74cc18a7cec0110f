"""GGUF: `verify` agrees with gguf-py (`gguf.GGUFReader`, every tensor's data read) and, where
gguf-py is laxer, with the rules llama.cpp's loader (`ggml/src/gguf.cpp`) applies.

gguf-py reads some files llama.cpp refuses: a tensor offset that is no multiple of the
alignment, tensors that overlap (gguf.cpp requires each tensor to start where the previous one's
padded data ends), more than 4 dimensions (GGML_MAX_DIMS), a name of 64 bytes or more
(GGML_MAX_NAME), and a bool value other than 0/1 (the GGUF spec calls it invalid). Each such case
is labelled with its gguf.cpp rule (`CPP_REFUSES`); for them the reference verdict is "refuses".
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ggufcraft as craft
from tests.validate.differential import Case, assert_agrees, verify_report

gguf = pytest.importorskip("gguf")

ARCH = craft.kv_str("general.architecture", "llama")
F32 = np.arange(8, dtype=np.float32).tobytes()

# Cases gguf-py reads and llama.cpp's gguf.cpp refuses, with the rule that refuses them.
CPP_REFUSES = {
    "misaligned-offset": "tensor offset not a multiple of the alignment",
    "overlap": "tensor offset is not the end of the previous tensor's padded data",
    "ndims-5": "n_dims > GGML_MAX_DIMS (4)",
    "name-64-bytes": "tensor name length >= GGML_MAX_NAME (64)",
    "bool-2": "bool value other than 0/1 (the GGUF spec: invalid)",
    "bool-array-7": "bool value other than 0/1 (the GGUF spec: invalid)",
    "string-length-past-the-end": "a read past the end of the file fails",
}


def one(type_id: int, dims: list[int], data: bytes, **kw: int) -> bytes:
    return craft.gguf([ARCH], [craft.tensor_info("t", dims, type_id, 0)], data, **kw)  # type: ignore[arg-type]


def model_bytes(tmp: Path) -> bytes:
    path = tmp / "model.gguf"
    craft.write_model(path)
    return path.read_bytes()


def cases(model: bytes) -> Iterator[Case]:
    yield Case("writer-model", "m.gguf", model)
    for label, cut in {
        "magic": 3,
        "counts": 20,
        "first-pair": 100,
        "pairs": 1000,
        "middle": len(model) // 2,
        "last-byte": len(model) - 1,
    }.items():
        yield Case(f"writer-model-cut-in-{label}", "cut.gguf", model[:cut])
    yield Case("minimal", "a.gguf", craft.gguf([ARCH]))
    yield Case("no-padding-no-data", "np.gguf", craft.gguf([ARCH], pad=False))
    yield Case("one-f32", "f.gguf", one(0, [8], F32))
    yield Case("version-2", "v2.gguf", one(0, [8], F32, version=2))
    yield Case("version-1", "v1.gguf", one(0, [8], F32, version=1))
    yield Case("version-4", "v4.gguf", one(0, [8], F32, version=4))
    yield Case("f16", "h.gguf", one(1, [8], np.ones(8, np.float16).tobytes()))
    yield Case("i8", "i8.gguf", one(24, [8], bytes(8)))
    yield Case("i32", "i32.gguf", one(26, [2], bytes(8)))
    yield Case("q8_0", "q.gguf", one(8, [32], bytes(34)))
    yield Case("q8_0-row-not-whole-blocks", "qb.gguf", one(8, [16], bytes(34)))
    yield Case("unknown-tensor-type", "ty.gguf", one(99, [8], F32))
    yield Case("zero-elements", "z.gguf", one(0, [0], b""))
    yield Case("data-cut", "dc.gguf", one(0, [8], F32[:16]))
    yield Case("data-missing", "dm.gguf", one(0, [8], b""))
    yield Case("trailing-bytes", "tb.gguf", one(0, [8], F32 + bytes(32)))
    yield Case(
        "misaligned-offset",
        "mo.gguf",
        craft.gguf([ARCH], [craft.tensor_info("t", [4], 0, 4)], bytes(32)),
    )
    two = [craft.tensor_info("a", [8], 0, 0), craft.tensor_info("b", [8], 0, 0)]
    yield Case("overlap", "ov.gguf", craft.gguf([ARCH], two, F32))
    dup = [craft.tensor_info("t", [8], 0, 0), craft.tensor_info("t", [8], 0, 32)]
    yield Case("duplicate-tensor", "dt.gguf", craft.gguf([ARCH], dup, F32 + F32))
    yield Case("duplicate-key", "dk.gguf", craft.gguf([ARCH, ARCH]))
    yield Case("ndims-5", "n5.gguf", one(0, [1, 1, 1, 1, 8], F32))
    yield Case(
        "name-64-bytes",
        "nm.gguf",
        craft.gguf([ARCH], [craft.tensor_info("n" * 64, [8], 0, 0)], F32),
    )
    yield Case(
        "name-63-bytes",
        "n63.gguf",
        craft.gguf([ARCH], [craft.tensor_info("n" * 63, [8], 0, 0)], F32),
    )
    align64 = [ARCH, craft.kv_u32("general.alignment", 64)]
    yield Case(
        "alignment-64",
        "a64.gguf",
        craft.gguf(align64, [craft.tensor_info("t", [8], 0, 0)], F32, alignment=64),
    )
    for bad in (0, 3, 48):
        kvs = [ARCH, craft.kv_u32("general.alignment", bad)]
        yield Case(
            f"alignment-{bad}",
            f"al{bad}.gguf",
            craft.gguf(kvs, [craft.tensor_info("t", [8], 0, 0)], F32),
        )
    yield Case("kv-count-past-the-end", "kc.gguf", craft.gguf([ARCH], kv_count=5))
    yield Case("tensor-count-past-the-end", "tc.gguf", craft.gguf([ARCH], tensor_count=3))
    yield Case("header-cut", "hc.gguf", b"GGUF\x03\x00\x00\x00\x00")
    yield Case("bad-magic", "bm.gguf", b"GGUE" + craft.gguf([ARCH])[4:])
    yield Case("bool-2", "b2.gguf", craft.gguf([ARCH, craft.kv_bool("x.y", 2)]))
    yield Case("bool-1", "b1.gguf", craft.gguf([ARCH, craft.kv_bool("x.y", 1)]))
    bools = craft.kv("x.y", craft.ARR, struct.pack("<IQ", craft.BOOL, 3) + b"\x01\x00\x07")
    yield Case("bool-array-7", "ba.gguf", craft.gguf([ARCH, bools]))
    yield Case("unknown-value-type", "vt.gguf", craft.gguf([ARCH, craft.kv("x.y", 13, b"\x00")]))
    yield Case("string-not-utf8", "su.gguf", craft.gguf([ARCH, craft.kv_str("x.y", b"\xff\xfe")]))
    nested = craft.kv(
        "x.y", craft.ARR, struct.pack("<IQ", craft.ARR, 1) + craft.arr_num(craft.U8, "B", [1])
    )
    yield Case("array-of-arrays", "aa.gguf", craft.gguf([ARCH, nested]))
    long_string = craft.kv("x.y", craft.STR, struct.pack("<Q", 1 << 40))
    yield Case("string-length-past-the-end", "sl.gguf", craft.gguf([ARCH, long_string]))


def gguf_py_reads(path: Path) -> bool:
    try:
        reader = gguf.GGUFReader(str(path))
        for t in reader.tensors:
            np.asarray(t.data).sum()
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def all_cases(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return list(cases(model_bytes(tmp_path_factory.mktemp("model"))))


CASE_IDS = [c.id for c in cases(b"\x00" * 4096)]


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_verify_agrees_with_gguf_py_and_gguf_cpp(
    tmp_path: Path, all_cases: list[Case], case_id: str
) -> None:
    case = next(c for c in all_cases if c.id == case_id)
    path = case.write(tmp_path)
    py_reads = gguf_py_reads(path)
    if case.id in CPP_REFUSES:
        assert py_reads, f"{case.id}: gguf-py refuses it now; drop it from CPP_REFUSES"
    reads = py_reads and case.id not in CPP_REFUSES
    # A damaged magic is bytes of no format: UNKNOWN_FORMAT is the specific answer.
    prefixes = ("GGUF_", "UNKNOWN_FORMAT") if case.id == "bad-magic" else ("GGUF_",)
    assert_agrees(verify_report(path), reads, prefixes, case.id)
