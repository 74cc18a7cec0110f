"""The third verdict across the commands: an intact file matrixctl does not convert passes
`verify` (exit 0, one info finding, "intact, not convertible" on the terminal, `"verdict":
"unsupported"` in --json), `inspect --stats` describes it without numbers, and `convert` and
`matrixctl.open` refuse it with CONVERT_NOT_TENSOR (docs/reliability.md, "Verdict classes")."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import matrixctl
from matrixctl.errors import UsageError
from tests.helpers.cli import run_cli


def files(folder: Path) -> dict[str, Path]:
    rec = folder / "rec.npy"
    np.save(rec, np.zeros(3, dtype=[("x", "<i4"), ("y", "<f8")]))
    npz = folder / "mixed.npz"
    np.savez(npz, s=np.array(["a", "bc"]), t=np.arange(3.0))
    header = (
        b'{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]},'
        b'"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}}'
    )
    st = folder / "f4.safetensors"
    st.write_bytes(struct.pack("<Q", len(header)) + header + bytes(5))
    return {"rec.npy": rec, "mixed.npz": npz, "f4.safetensors": st}


@pytest.mark.parametrize("name", ["rec.npy", "mixed.npz", "f4.safetensors"])
def test_the_third_verdict_through_every_command(tmp_path: Path, name: str) -> None:
    path = files(tmp_path)[name]
    human = run_cli("verify", str(path))
    assert human.code == 0 and "intact, not convertible" in human.out + human.stderr
    doc = run_cli("verify", "--json", str(path)).json()
    entry = doc["files"][0]
    assert doc["ok"] is True and entry["verdict"] == "unsupported"
    assert [f["severity"] for f in entry["findings"]] == ["info"]
    assert run_cli("verify", "--strict", str(path)).code == 0  # info is no warning
    stats = run_cli("inspect", "--stats", "--json", str(path))
    assert stats.code == 0, stats.stderr
    out = tmp_path / "out.zt"
    refused = run_cli("convert", str(path), str(out))
    assert refused.code == 2 and "error[CONVERT_NOT_TENSOR]" in refused.stderr
    assert not out.exists()
    with pytest.raises(UsageError) as err:
        matrixctl.open(path)
    assert err.value.code == "CONVERT_NOT_TENSOR"
    assert matrixctl.verify(path).verdict() == "unsupported"


def test_an_intact_tensor_file_is_intact_and_a_damaged_one_damaged(tmp_path: Path) -> None:
    good = tmp_path / "good.npy"
    np.save(good, np.arange(4.0))
    assert run_cli("verify", "--json", str(good)).json()["files"][0]["verdict"] == "intact"
    bad = tmp_path / "bad.npy"
    bad.write_bytes(good.read_bytes()[:-3])
    run = run_cli("verify", "--json", str(bad))
    assert run.code == 1 and run.json()["files"][0]["verdict"] == "damaged"
    missing = run_cli("verify", "--json", str(tmp_path / "missing.npy"))
    assert missing.code == 2 and missing.json()["files"][0]["verdict"] == "unreadable"
