"""A lossy conversion says so, in one warning line and in `--json` (`lossy`); bool bytes other
than 0/1 are written as 0x01 and counted (`normalised_bools`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers import ggufcraft
from tests.helpers.cli import run_cli
from tests.validate.differential import verify_report


def test_dequantizing_a_gguf_is_reported_as_lossy(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    ggufcraft.write_model(model)
    out = tmp_path / "m.safetensors"
    done = run_cli("convert", "--json", str(model), str(out))
    assert done.code == 0, done.stderr
    lossy = done.json()["lossy"]
    assert len(lossy) == 1 and lossy[0].startswith("dequantized 4 "), lossy
    assert "Q8_0" in lossy[0] and "--keep-quantized" in lossy[0]
    warned = [line for line in done.stderr.splitlines() if "lossy conversion" in line]
    assert len(warned) == 1, done.stderr
    kept = run_cli("convert", "--json", "--keep-quantized", str(model), str(tmp_path / "k.zt"))
    assert kept.code == 0 and kept.json()["lossy"] == [], kept.stderr


def test_a_narrowing_cast_is_lossy_and_a_widening_one_is_not(tmp_path: Path) -> None:
    src = tmp_path / "a.npz"
    np.savez(src, f=np.arange(4, dtype=np.float32), h=np.ones(3, dtype=np.float16))
    narrow = run_cli("convert", "--json", "--dtype", "f=f16", str(src), str(tmp_path / "n.zt"))
    assert narrow.code == 0, narrow.stderr
    assert narrow.json()["lossy"] == [
        "cast 1 tensor to a narrower dtype (f32 -> f16): values are rounded"
    ]
    wide = run_cli("convert", "--json", "--dtype", "h=f32", str(src), str(tmp_path / "w.zt"))
    assert wide.code == 0 and wide.json()["lossy"] == [], wide.stderr
    assert "lossy" not in wide.stderr


def test_bool_bytes_above_one_are_written_as_one_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "b.npy"
    np.save(src, np.frombuffer(b"\x00\x01\x02\x07\x01", dtype=np.bool_))
    assert verify_report(src).verdict() == "intact"  # a warning only: numpy reads it
    for name in ("b.safetensors", "b.zt", "b2.zt", "b.npz"):
        out = tmp_path / name
        extra = ["--zt-version", "2"] if name == "b2.zt" else []
        done = run_cli("convert", "--json", str(src), str(out), *extra)
        assert done.code == 0, done.stderr
        assert done.json()["normalised_bools"] == {"b": 2}
        assert "written as 0x01" in done.stderr
        report = verify_report(out)
        assert report.ok(strict=True), report.findings
    with np.load(tmp_path / "b.npz") as loaded:
        assert loaded["b"].view(np.uint8).tolist() == [0, 1, 1, 1, 1]
