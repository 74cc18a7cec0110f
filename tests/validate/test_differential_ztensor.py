"""zTensor: `verify` agrees with the reference implementations, ztensor 1.1.1 (v1.1 files, in
this environment) and ztensor 2.1.2 (v2 files, in a child Python with .venv/ztensor2 first on
its path, as tests/formats/test_ztensor2_interop.py runs it).

The reference verdict of a v1 file: `ztensor.Reader` opens it and its checksum-verifying read
(`ztensor_reader_read_tensor(..., verify=1)`) reads every tensor. Of a v2 file: `ztensor.open`
reads every part and `ztensor.verify(deep=True)` passes. The cases: files each reference writes
and files matrixctl writes, then the same cut short at every structure, with bytes after them,
a flipped data byte (caught by a digest, or not where there is none), a damaged magic, and a
bool byte 0x02 (a warning in v1.1, whose spec has no MUST for it; an error in v2, whose spec
says readers MUST reject it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import ROOT, run_cli
from tests.validate.differential import Case, assert_agrees, verify_report

ztensor = pytest.importorskip("ztensor")
REF2 = ROOT / ".venv" / "ztensor2"


def variants(label: str, base: bytes, data_at: int | None) -> Iterator[Case]:
    """The file, and the same damaged: cut at structure boundaries, trailing bytes, a damaged
    first byte, and one data byte flipped (at `data_at`)."""
    yield Case(label, f"{label}.zt", base)
    for where, cut in {
        "magic": 4,
        "after-magic": 8,
        "early": 40,
        "middle": len(base) // 2,
        "footer": len(base) - 9,
        "last-byte": len(base) - 1,
    }.items():
        yield Case(f"{label}-cut-in-{where}", f"{label}.zt", base[:cut])
    yield Case(f"{label}-trailing-bytes", f"{label}.zt", base + bytes(16))
    bad = bytearray(base)
    bad[1] ^= 0x20
    yield Case(f"{label}-damaged-magic", f"{label}.zt", bytes(bad))
    if data_at is not None:
        flipped = bytearray(base)
        flipped[data_at] ^= 0x01
        yield Case(f"{label}-data-byte-flipped", f"{label}.zt", bytes(flipped))


def data_offset(base: bytes, marker: bytes) -> int:
    at = base.find(marker)
    assert at >= 0
    return at


# zTensor 1.1 ----------------------------------------------------------------------------------

MARK = np.arange(1000, 1012, dtype=np.float32)  # a recognisable run of data bytes


def v1_cases(tmp: Path) -> Iterator[Case]:
    ref = tmp / "ref.zt"
    with ztensor.Writer(str(ref)) as w:
        w.add_tensor("a", MARK.reshape(3, 4))
        w.add_tensor("b", np.array([True, False]))
        w.add_tensor("c", np.arange(100, dtype=np.int64), compress=True)
    base = ref.read_bytes()
    yield from variants("v1-reference", base, data_offset(base, MARK.tobytes()))
    bool2 = tmp / "bool2.zt"
    with ztensor.Writer(str(bool2)) as w:
        w.add_tensor("b", np.frombuffer(b"\x01\x02\x00", dtype=np.bool_))
    yield Case("v1-reference-bool-byte-2", "bool2.zt", bool2.read_bytes())
    src = tmp / "in.npz"
    np.savez(src, a=MARK.reshape(3, 4), b=np.array([True, False]), c=np.arange(100))
    for digest in ("crc32c", "sha256"):
        for compress in ("none", "zstd"):
            out = tmp / f"ours-{digest}-{compress}.zt"
            done = run_cli(
                "convert", str(src), str(out), "--digest", digest, "--compress", compress
            )
            assert done.code == 0, done.stderr
            base = out.read_bytes()
            at = data_offset(base, MARK.tobytes()) if compress == "none" else len(base) // 3
            yield from variants(f"v1-matrixctl-{digest}-{compress}", base, at)


def ztensor1_reads(path: Path) -> bool:
    from ztensor import ffi, lib

    try:
        with ztensor.Reader(str(path)) as r:
            for name in r.tensor_names:
                view = lib.ztensor_reader_read_tensor(r._ptr, name.encode(), 1)
                if view == ffi.NULL:
                    return False
                lib.ztensor_free_tensor_view(view)
                r.read_tensor(name)
    except Exception:
        return False
    return True


@pytest.fixture(scope="module")
def cases_v1(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return list(v1_cases(tmp_path_factory.mktemp("zt1")))


def test_verify_agrees_with_ztensor_1_1_1(tmp_path: Path, cases_v1: list[Case]) -> None:
    assert len(cases_v1) > 40
    refused = 0
    for case in cases_v1:
        folder = tmp_path / case.id
        folder.mkdir()
        path = case.write(folder)
        reads = ztensor1_reads(path)
        refused += not reads
        # A damaged magic is no format's bytes: UNKNOWN_FORMAT is the specific answer.
        prefixes = ("ZT_", "UNKNOWN_FORMAT") if "magic" in case.id else ("ZT_",)
        assert_agrees(verify_report(path), reads, prefixes, case.id)
    assert 0 < refused < len(cases_v1)


def test_a_v1_bool_byte_2_is_a_warning(tmp_path: Path, cases_v1: list[Case]) -> None:
    case = next(c for c in cases_v1 if c.id == "v1-reference-bool-byte-2")
    report = verify_report(case.write(tmp_path))
    assert report.exit_code() == 0 and not report.ok(strict=True)
    assert "ZT_BOOL" in {f.code for f in report.findings}


# zTensor 2 ------------------------------------------------------------------------------------

WRITE_V2 = """
import sys
import numpy as np
import ztensor
out, mode = sys.argv[1], sys.argv[2]
canonical = mode == "canonical"
enc = None if canonical else "zt.zstd-seekable/1"
w = ztensor.Writer(out, canonical=canonical, align=None if canonical else 4096)
w.add("a", np.arange(1000, 1012, dtype=np.float32).tobytes(), shape=[3, 4], dtype="f32",
      encoding=enc)
bools = bytes([1, 0, 2]) if mode == "bool2" else bytes([1, 0, 1])
w.add("b", bools, shape=[3], dtype="u8", logical="bool", encoding=enc)
w.add("c", np.arange(100, dtype=np.int64).tobytes(), shape=[100], dtype="i64", encoding=enc)
w.finish()
"""

VERDICTS_V2 = """
import json, sys
import ztensor
out = {}
for path in sys.argv[1:]:
    try:
        src = ztensor.open(path)
        for t in src.values():
            for p in t.parts:
                t[p].tobytes()
        ztensor.verify(path, deep=True)
        out[path] = True
    except Exception:
        out[path] = False
print(json.dumps(out))
"""


def ref2(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REF2), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def v2_cases(tmp: Path) -> Iterator[Case]:
    for mode in ("canonical", "zstd", "bool2"):
        path = tmp / f"ref-{mode}.zt"
        ref2(WRITE_V2, str(path), mode)
        base = path.read_bytes()
        if mode == "bool2":
            yield Case("v2-reference-bool-byte-2", "bool2.zt", base)
            continue
        at = data_offset(base, MARK.tobytes()) if mode == "canonical" else len(base) // 3
        yield from variants(f"v2-reference-{mode}", base, at)
    src = tmp / "in.npz"
    np.savez(src, a=MARK.reshape(3, 4), b=np.array([True, False]), c=np.arange(100))
    for compress in ("none", "zstd"):
        out = tmp / f"ours-{compress}.zt"
        done = run_cli("convert", str(src), str(out), "--zt-version", "2", "--compress", compress)
        assert done.code == 0, done.stderr
        base = out.read_bytes()
        at = data_offset(base, MARK.tobytes()) if compress == "none" else len(base) // 3
        yield from variants(f"v2-matrixctl-{compress}", base, at)


@pytest.mark.skipif(
    not (REF2 / "ztensor" / "__init__.py").exists(),
    reason="ztensor 2.1.2 is not installed in .venv/ztensor2 (make .venv/.installed puts it there)",
)
def test_verify_agrees_with_ztensor_2_1_2(tmp_path: Path) -> None:
    cases = list(v2_cases(tmp_path))
    paths = []
    for case in cases:
        folder = tmp_path / case.id
        folder.mkdir()
        paths.append(case.write(folder))
    verdicts = json.loads(ref2(VERDICTS_V2, *map(str, paths)))
    refused = 0
    for case, path in zip(cases, paths, strict=True):
        reads = verdicts[str(path)]
        refused += not reads
        prefixes = ("ZT", "UNKNOWN_FORMAT") if "magic" in case.id else ("ZT",)
        assert_agrees(verify_report(path), reads, prefixes, case.id)
    assert 0 < refused < len(cases)
    assert not verdicts[str(paths[[c.id for c in cases].index("v2-reference-bool-byte-2")])]
