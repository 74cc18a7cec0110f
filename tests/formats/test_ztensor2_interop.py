"""zTensor 2 interop with the reference implementation, ztensor 2.1.2.

ztensor 2.1.2 cannot share the environment with ztensor 1.1.1 (the v1 peer of
tests/formats/test_ztensor_interop.py): `make`
installs it with `pip --target .venv/ztensor2`, and these
tests run it in a child Python with that folder first on PYTHONPATH. Files it writes, in every
dtype, logical type, layout and encoding it offers, are read by matrixctl with identical bytes;
matrixctl writes the same canonical (and zstd) bytes for the same tensors; files matrixctl
writes are read and deep-verified by it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.formats.test_ztensor2 import described
from tests.helpers.cli import ROOT, run_cli

REF = ROOT / ".venv" / "ztensor2"


def _ref_available() -> bool:
    return (REF / "ztensor" / "__init__.py").exists()


pytestmark = pytest.mark.skipif(
    not _ref_available(),
    reason="ztensor 2.1.2 is not installed in .venv/ztensor2 (make .venv/.installed puts it "
    "there; it cannot share .venv with ztensor 1.1.1)",
)

PRELUDE = """
import json, sys
import numpy as np
import ztensor
"""


def ref(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REF), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def ref_dump(path: Path) -> dict[str, object]:
    """What the reference reads: every part's bytes (hex), layout, shape, and deep verify."""
    out = ref(
        """
src = ztensor.open(sys.argv[1])
doc = {"tensors": {}, "attributes": src.attributes}
for t in src.values():
    doc["tensors"][t.name] = {
        "layout": t.layout, "shape": list(t.shape),
        "parts": {p: [t[p].dtype, t[p].logical, t[p].tobytes().hex()] for p in t.parts},
    }
v = ztensor.verify(sys.argv[1], deep=True)
doc["verify"] = [v.checked, v.undigested]
print(json.dumps(doc))
""",
        str(path),
    )
    result: dict[str, object] = json.loads(out)
    return result


def our_parts(path: Path) -> dict[str, dict[str, tuple[str, str | None, bytes]]]:
    """Every part as matrixctl reads it (decoded, digest-checked)."""
    from matrixctl.formats import ztensor2
    from matrixctl.io import Source
    from matrixctl.validate import ztensor2 as handler

    out: dict[str, dict[str, tuple[str, str | None, bytes]]] = {}
    with Source.open(str(path)) as src:
        s = handler.load(src)
        for o in s.zt.objects.values():
            out[o.name] = {
                role: (
                    p.dtype,
                    p.type,
                    b"".join(bytes(x) for x in ztensor2.stream_part(src.buf, p)),
                )
                for role, p in o.parts.items()
            }
    return out


WRITE_EVERYTHING = """
out, canonical = sys.argv[1], sys.argv[2] == "canonical"
rng = np.random.default_rng(7)
def raw(n): return rng.integers(0, 256, n, dtype=np.uint8).tobytes()
enc = None if canonical else "zt.zstd-seekable/1"
w = ztensor.Writer(out, canonical=canonical, align=None if canonical else 4096)
widths = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1,
          "u64": 8, "u32": 4, "u16": 2, "u8": 1}
for d, width in sorted(widths.items()):
    w.add("dense_" + d, raw(6 * width), shape=[2, 3], dtype=d, encoding=enc)
logical = {"bool": ("u8", np.array([0, 1, 1, 0, 1, 0], np.uint8).tobytes()),
           "complex128": ("f64", raw(96)), "complex64": ("f32", raw(48)),
           "f4_e2m1": ("u8", raw(2) + bytes([0x07])),
           "f8_e4m3fn": ("u8", raw(6)), "f8_e4m3fnuz": ("u8", raw(6)),
           "f8_e5m2": ("u8", raw(6)), "f8_e5m2fnuz": ("u8", raw(6)), "f8_e8m0": ("u8", raw(6))}
for t, (d, b) in sorted(logical.items()):
    shape = [5] if t == "f4_e2m1" else [6]
    w.add("logical_" + t, b, shape=shape, dtype=d, logical=t, encoding=enc)
big = (np.arange(3 << 18, dtype=np.float32) % 97).tobytes()
w.add("m_big", big, shape=[3 << 18], dtype="f32", encoding=enc)
w.add("m_empty", b"", shape=[0, 4], dtype="f32", encoding=enc)
u32 = lambda *v: np.array(v, np.uint32).tobytes()
def part(b, d, logical=None):
    p = {"data": b, "dtype": d}
    if logical: p["logical"] = logical
    if enc: p["encoding"] = enc
    return p
w.add_object("s_coo", [3, 4], {"coords": part(u32(0, 2, 1, 3), "u32"),
             "values": part(np.array([1, 2], np.float32).tobytes(), "f32")},
             layout="zt.sparse_coo/1")
w.add_object("s_csr", [3, 4], {"indices": part(u32(0, 2), "u32"),
             "indptr": part(u32(0, 1, 2, 2), "u32"),
             "values": part(np.array([1, 2], np.float32).tobytes(), "f32")},
             layout="zt.sparse_csr/1", attributes={"note": "csr"})
w.add_object("s_gguf", [2, 64], {"data": part(raw(136), "u8")}, layout="gguf.q8_0/1",
             attributes={"elems_per_block": 32, "block_bytes": 34})
w.add_object("s_mx", [2, 64], {"data": part(raw(64), "u8", "f4_e2m1"),
             "scales": part(bytes([127] * 4), "u8", "f8_e8m0")}, layout="zt.mx/1",
             attributes={"block_size": 32, "scale_form": "e8m0_exponent"})
w.add_object("s_quant", [2, 64], {"data": part(raw(64), "u32"), "scales": part(raw(16), "f32")},
             layout="zt.quant_group/1", attributes={
                 "bits": 4, "group_size": 32, "axis": 1,
                 "packing": {"word": "u32", "order": "lsb_first", "per_word": 8},
                 "scale_form": "f32_factors", "zero_point": {"form": "implied", "value": 8}})
w.add("tied_a", big[:4096], shape=[1024], dtype="f32", encoding=enc)
w.add("tied_b", big[:4096], shape=[1024], dtype="f32", encoding=enc)
w.set_attributes({"model": "interop", "n": 3, "x": 0.5, "list": [1, "two", None, True],
                  "map": {"k": -1}})
w.finish()
"""


@pytest.fixture(scope="module")
def ref_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("zt2ref")
    files = {}
    for mode in ("canonical", "zstd"):
        path = d / f"{mode}.zt"
        ref(WRITE_EVERYTHING, str(path), mode)
        files[mode] = path
    return files


@pytest.mark.parametrize("mode", ["canonical", "zstd"])
def test_reference_files_read_identically(ref_files: dict[str, Path], mode: str) -> None:
    path = ref_files[mode]
    result = run_cli("verify", str(path))
    assert result.code == 0, result.stderr
    theirs = ref_dump(path)
    ours = our_parts(path)
    tensors = theirs["tensors"]
    assert isinstance(tensors, dict) and set(tensors) == set(ours)
    for name, t in tensors.items():
        assert set(t["parts"]) == set(ours[name]), name
        for role, (dtype, logical, hexed) in t["parts"].items():
            assert ours[name][role] == (dtype, logical, bytes.fromhex(hexed)), (name, role)
    doc = described(run_cli("inspect", "--json", str(path)))
    assert doc["attributes"] == theirs["attributes"]
    shapes = {row["name"]: row["shape"] for row in doc["tensors"]}
    assert shapes == {n: t["shape"] for n, t in tensors.items()}


@pytest.mark.parametrize("mode", ["canonical", "zstd"])
def test_rewriting_reference_files_gives_their_bytes(
    ref_files: dict[str, Path], mode: str, tmp_path: Path
) -> None:
    """Canonical output (and zstd output: same frames, level and window) equals ztensor
    2.1.2's bytes for the same tensors, through matrixctl's own reader and writer; objects
    matrixctl does not interpret are carried as they are (docs/formats/ztensor2.md)."""
    path = ref_files[mode]
    # Every object, the ones matrixctl does not interpret (mx, quant_group, f4, fnuz, e8m0)
    # included: zTensor 2 output copies those as they are.
    subset = tmp_path / "subset.zt"
    assert run_cli("convert", str(path), str(subset)).code == 0
    # The reference writes the same subset from the same bytes: its own rewrite.
    again = tmp_path / "again.zt"
    ref(
        """
src = ztensor.open(sys.argv[1])
canonical = sys.argv[3] == "canonical"
enc = None if canonical else "zt.zstd-seekable/1"
w = ztensor.Writer(sys.argv[2], canonical=canonical, align=None if canonical else 4096)
for name in sorted(src.keys(), key=lambda n: n.encode()):
    t = src[name]
    parts = {}
    for p in t.parts:
        q = {"data": t[p].tobytes(), "dtype": t[p].dtype}
        if t[p].logical: q["logical"] = t[p].logical
        if enc: q["encoding"] = enc
        parts[p] = q
    attrs = None
    if name == "s_gguf": attrs = {"elems_per_block": 32, "block_bytes": 34}
    if name == "s_csr": attrs = {"note": "csr"}
    if name == "s_mx": attrs = {"block_size": 32, "scale_form": "e8m0_exponent"}
    if name == "s_quant": attrs = {
        "bits": 4, "group_size": 32, "axis": 1,
        "packing": {"word": "u32", "order": "lsb_first", "per_word": 8},
        "scale_form": "f32_factors", "zero_point": {"form": "implied", "value": 8}}
    w.add_object(name, list(t.shape), parts, layout=t.layout, attributes=attrs)
w.set_attributes(src.attributes)
w.finish()
""",
        str(subset),
        str(again),
        mode,
    )
    ours = tmp_path / "ours.zt"
    args = ["--compress", "zstd"] if mode == "zstd" else []
    assert run_cli("convert", str(subset), str(ours), *args).code == 0
    assert ours.read_bytes() == again.read_bytes()


def test_safetensors_to_zt2_is_what_the_reference_writes(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    arrays = {
        "b.weight": np.arange(12, dtype="<f4").reshape(3, 4),
        "a.bias": np.arange(3, dtype="<i8"),
        "c.é": np.ones((2, 2), dtype="<f2"),
        "tied": np.arange(12, dtype="<f4").reshape(3, 4),
        "empty": np.zeros((0,), dtype="<f4"),
    }
    st = tmp_path / "m.safetensors"
    save_file(arrays, str(st))
    ours = tmp_path / "ours.zt"
    assert run_cli("convert", str(st), str(ours), "--zt-version", "2").code == 0
    theirs = tmp_path / "theirs.zt"
    ref(
        """
import safetensors.numpy
arrays = safetensors.numpy.load_file(sys.argv[1])
import ztensor.numpy as ztnp
ztnp.save_file(arrays, sys.argv[2])
""",
        str(st),
        str(theirs),
    )
    assert ours.read_bytes() == theirs.read_bytes()


def test_matrixctl_files_read_by_the_reference(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    arrays = {
        "w": np.arange(3 << 18, dtype="<f4") % 13,
        "m": (np.arange(12) % 2).astype(bool).reshape(3, 4),
        "c": np.arange(4, dtype="<c8"),
        "i": np.arange(10, dtype="<u2"),
    }
    npz = tmp_path / "a.npz"
    np.savez(npz, **arrays)
    for args in ([], ["--compress", "zstd:5"], ["--digest", "sha256"], ["--digest", "none"]):
        out = tmp_path / "o.zt"
        result = run_cli("convert", str(npz), str(out), "--zt-version", "2", "--meta", "k=v", *args)
        assert result.code == 0, result.stderr
        theirs = ref_dump(out)
        assert theirs["attributes"] == {"k": "v"}
        ours = our_parts(out)
        for name, t in theirs["tensors"].items():  # type: ignore[attr-defined]
            for role, (_, _, hexed) in t["parts"].items():
                assert ours[name][role][2] == bytes.fromhex(hexed)
        checked, undigested = theirs["verify"]  # type: ignore[misc]
        assert (checked, undigested) == ((0, 4) if args == ["--digest", "none"] else (4, 0))
    # A sparse tensor and GGUF blocks, through v1 zTensor into v2.
    st = tmp_path / "s.safetensors"
    save_file({"x": np.zeros(2, dtype="<f4")}, str(st))
    from tests.helpers import zt2craft

    src = tmp_path / "sp.zt"
    src.write_bytes(zt2craft.csr())
    out = tmp_path / "sp2.zt"
    assert run_cli("convert", str(src), str(out), "--zt-version", "2").code == 0
    assert ref_dump(out)["tensors"]["t"]["layout"] == "zt.sparse_csr/1"  # type: ignore[index]


def test_api_save_file_is_what_the_reference_saves(tmp_path: Path) -> None:
    from matrixctl.formats.ztensor2 import save_file

    arrays = {
        "w": np.arange(40, dtype="<f4").reshape(5, 8),
        "b": np.array([True, False, True]),
        "i": np.arange(7, dtype="<i2"),
        "w2": np.arange(40, dtype="<f4").reshape(5, 8),
    }
    ours = tmp_path / "ours.zt"
    save_file(arrays, str(ours))
    npz = tmp_path / "a.npz"
    np.savez(npz, **arrays)
    theirs = tmp_path / "theirs.zt"
    ref(
        """
import ztensor.numpy as ztnp
arrays = dict(np.load(sys.argv[1]))
ztnp.save_file(arrays, sys.argv[2])
""",
        str(npz),
        str(theirs),
    )
    assert ours.read_bytes() == theirs.read_bytes()
    zstd = tmp_path / "z.zt"
    save_file(arrays, str(zstd), compress="zstd")
    zref = tmp_path / "zref.zt"
    ref(
        """
import ztensor.numpy as ztnp
ztnp.save_file(dict(np.load(sys.argv[1])), sys.argv[2], compression=True)
""",
        str(npz),
        str(zref),
    )
    assert zstd.read_bytes() == zref.read_bytes()
