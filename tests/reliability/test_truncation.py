"""One root cause, one finding: a file of every format cut at many lengths gives exactly one
error-level finding (the truncation, naming the actual and the expected size, or the header's
own error where the cut lands inside the header); findings that only follow from it are counted
in the report's `suppressed`, never listed."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from matrixctl.codes import Severity
from matrixctl.validate.engine import examine
from tests.helpers.cli import FIXTURES, run_cli

# The codes that name a cut file's actual and expected sizes, per sample.
SIZE_CODES = {
    "a.bin": {"ATOM_TRUNCATED", "ATOM_TRUNCATED_HEADER"},
    "a.svgt": {"SVGT_TRUNCATED", "SVGT_TRUNCATED_HEADER"},
    "t.mxt": {"TOKS_HEADER"},
    "doc_index.bin": {"DIDX_SIZE", "DIDX_TRUNCATED_HEADER"},
    "x.zt": {"ZT_TRUNCATED"},
    "z.zt": {"ZT_TRUNCATED"},
    "s.safetensors": {"ST_TRUNCATED", "ST_HEADER_SIZE"},
    "n.npy": {"NPY_SIZE"},
    "n.npz": {"NPZ_TRUNCATED"},
    "m.weights": {"EMBD_FILE_SIZE", "EMBD_TRUNCATED"},
    "m.stb": {"STB_FILE_SIZE", "STB_TRUNCATED"},
    "g.gguf": {"GGUF_TRUNCATED"},
    "s.scxs": {"SCX_SHARD_TRUNCATED"},
}
# Cuts inside a header or a streamed format without a declared size: the header's own error.
HEADER_CODES = {
    "t.mxt": {"TOKS_NO_END"},  # a token stream declares no size: it ends inside a frame
    "x.zt": {"ZT_FOOTER_MAGIC"},  # the footer (which holds the manifest size) is gone
    "z.zt": {"ZT_FOOTER_MAGIC"},
    "n.npy": {"NPY_HEADER"},
    "g.gguf": {"GGUF_COUNT"},  # an array count larger than the bytes left
    "s.scxs": {"SCX_SHARD_HEADER"},
}
ANY_FORMAT = {"UNKNOWN_FORMAT"}  # too few bytes to sniff


def _ok(args: list[str]) -> None:
    result = run_cli(*args, "-q")
    assert result.code == 0, (args, result.stderr)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.numpy import save_file

    from tests.formats.test_hf_model import make_model
    from tests.helpers import ggufcraft

    d = tmp_path_factory.mktemp("cut")
    ids = d / "ids.txt"
    ids.write_text(" ".join(str(i) for i in range(1, 300)))
    _ok(["pack", "atoms", str(ids), "-n", "16", "-o", str(d / "a.bin")])
    _ok(["pack", "svgt", str(d / "a.bin"), "--grid", "4x4", "-o", str(d / "a.svgt")])
    _ok(["tokenize", "pi", "encode", str(ids), "-o", str(d / "t.mxt")])
    # Forty tensors: a cut in the data used to give a finding per tensor.
    tensors = {f"t{i:02d}": np.full((3, 5), i, dtype=np.float32) for i in range(40)}
    save_file(tensors, str(d / "s.safetensors"))
    _ok(["convert", str(d / "s.safetensors"), str(d / "x.zt")])
    _ok(["convert", str(d / "s.safetensors"), str(d / "z.zt"), "--compress", "zstd"])
    np.save(d / "n.npy", np.arange(10, dtype=np.int16))
    np.savez(d / "n.npz", a=np.arange(5), b=np.ones((2, 2)))
    _ok(["convert", str(make_model(d / "model")), str(d / "m.weights")])
    _ok(["convert", str(d / "m.weights"), str(d / "m.stb"), "--exclude", "*pos*"])
    ggufcraft.write_model(d / "g.gguf", extra=False, embd_type="Q8_0")
    pack = d / "pack"
    _ok(["ingest", "docs", str(FIXTURES / "corpus" / "guide.html"), "-o", str(pack)])
    (d / "doc_index.bin").write_bytes((pack / "doc_index.bin").read_bytes())
    from tests.tokenizers.test_scx_files import make_pack

    shards, _ = make_pack(d, bytes(range(256)) * 4, "scx")
    (d / "s.scxs").write_bytes((shards / "shard-000000.scxs").read_bytes())
    return d


def _lengths(n: int) -> list[int]:
    """Every length up to 160, then 60 spread over the rest, and the last few bytes."""
    spread = {n * k // 60 for k in range(60)}
    return sorted(x for x in {*range(1, 161), *spread, n - 1, n - 2, n - 8} if 0 < x < n)


def _numbers(message: str) -> set[int]:
    return {int(m.replace(",", "")) for m in re.findall(r"\d[\d,]*", message)}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", sorted(SIZE_CODES))
def test_cut_file_gives_one_finding(samples: Path, tmp_path: Path, name: str) -> None:
    data = (samples / name).read_bytes()
    assert examine(str(samples / name), scan=True)[0].findings == [] or name == "m.stb"
    path = tmp_path / name
    if name == "m.stb":  # the sidecar beside it records the whole file's size and CRC
        (tmp_path / "m.stb.json").write_bytes((samples / "m.stb.json").read_bytes())
    allowed = SIZE_CODES[name] | HEADER_CODES.get(name, set()) | ANY_FORMAT
    for cut in _lengths(len(data)):
        path.write_bytes(data[:cut])
        report = examine(str(path), scan=True)[0]
        errors = [f for f in report.findings if f.severity is Severity.ERROR]
        assert len(errors) == 1, (cut, report.findings)
        (err,) = errors
        assert err.code in allowed, (cut, err)
        if err.code in SIZE_CODES[name]:
            numbers = _numbers(err.message)
            assert cut in numbers, (cut, err.message)  # the actual size
            assert max(numbers) > cut, (cut, err.message)  # the expected one


def test_cascade_is_counted_not_listed(samples: Path, tmp_path: Path) -> None:
    """Cut in the middle of forty tensors' data: one ST_TRUNCATED finding; the tensors past
    the cut are counted in `suppressed` (JSON) and summed up on the terminal."""
    data = (samples / "s.safetensors").read_bytes()
    path = tmp_path / "cut.safetensors"
    cut = len(data) - 20 * 60  # the last twenty 60-byte tensors are gone
    path.write_bytes(data[:cut])
    result = run_cli("verify", "--json", str(path))
    assert result.code == 1
    (doc,) = result.json()["files"]
    assert [f["code"] for f in doc["findings"]] == ["ST_TRUNCATED"]
    assert doc["findings"][0]["offset"] == cut
    assert doc["suppressed"] >= 20  # one ST_OFFSETS per missing tensor, and the layout
    shown = run_cli("verify", str(path))
    assert f"{doc['suppressed']} further findings follow from this" in shown.stderr
    assert "ST_OFFSETS" not in shown.stderr
    (inspected,) = run_cli("inspect", "--json", str(path)).json()["files"]
    assert inspected["suppressed"] == doc["suppressed"]
    assert [f["code"] for f in inspected["findings"]] == ["ST_TRUNCATED"]


def test_whole_files_suppress_nothing(samples: Path) -> None:
    for name in ("s.safetensors", "g.gguf", "m.weights"):
        report = examine(str(samples / name), scan=True)[0]
        assert report.suppressed == 0 and report.findings == [], name


def test_convert_refuses_a_cut_file_with_the_root_cause(samples: Path, tmp_path: Path) -> None:
    data = (samples / "g.gguf").read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: len(data) - 100])
    result = run_cli("convert", str(path), str(tmp_path / "o.safetensors"))
    assert result.code == 1 and "GGUF_TRUNCATED" in result.stderr
    assert not (tmp_path / "o.safetensors").exists()


def test_a_cut_pack_artifact_is_the_packs_one_finding(samples: Path, tmp_path: Path) -> None:
    import shutil

    pack = tmp_path / "pack"
    shutil.copytree(samples / "pack", pack)
    atoms = pack / "matrix_atoms.bin"
    data = atoms.read_bytes()
    atoms.write_bytes(data[: len(data) // 2])
    (report,) = run_cli("verify", "--json", str(pack)).json()["files"]
    assert [f["code"] for f in report["findings"]] == ["PACK_SIZE"]
    assert f"cut at byte {len(data) // 2}" in report["findings"][0]["message"]
    assert report["suppressed"] >= 2  # the hash and the atom file's own ATOM_TRUNCATED
