"""Mutated files of every format through the commands that read them: each run ends with exit
0, 1 or 2 and one-line errors, never an internal error (exit 70) or a traceback. Seeded, so a
failure reproduces; the wider campaign that found the MATRIX-ATOM preview bug ran the same
mutations with more seeds and iterations."""

from __future__ import annotations

import io
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from matrixctl.cli.app import main
from tests.helpers.cli import ROOT

MAP = str(ROOT / "matrixctl" / "data" / "pi_symbol_map.json")
ITERATIONS = 6  # mutations per file here; the wider campaign ran 300 per format


def _call(args: list[str]) -> tuple[object, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code: object = main(args)
    except BaseException as exc:  # anything escaping main() is the bug
        code = repr(exc)
    finally:
        sys.stdout, sys.stderr = saved
    return code, err.getvalue()


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    if rng.random() < 0.3 and len(b) > 1:
        return bytes(b[: rng.randrange(len(b))])
    for _ in range(rng.choice([1, 1, 2, 4, 8])):
        i = rng.randrange(len(b))
        if rng.random() < 0.5:
            b[i] ^= 1 << rng.randrange(8)
        else:
            b[i] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    if rng.random() < 0.1:
        i = rng.randrange(len(b) + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    return bytes(b)


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from safetensors.numpy import save_file

    from tests.formats.test_hf_model import make_model
    from tests.helpers import ggufcraft

    d = tmp_path_factory.mktemp("samples")
    ids = d / "ids.txt"
    ids.write_text(" ".join(str(i) for i in range(1, 300)))
    for args in (
        ["pack", "atoms", str(ids), "-n", "16", "-o", str(d / "a.bin")],
        ["pack", "svgt", str(d / "a.bin"), "--grid", "4x4", "-o", str(d / "a.svgt")],
        ["tokenize", "pi", "encode", str(ids), "-o", str(d / "t.mxt")],
        ["convert", str(make_model(d / "model")), str(d / "m.weights"), "--meta", "x=1"],
    ):
        assert _call([*args, "-q"])[0] == 0, args
    save_file({"a": np.arange(12, dtype=np.float32).reshape(3, 4)}, str(d / "s.safetensors"))
    for name, extra in (("x.zt", []), ("z.zt", ["--compress", "zstd"])):
        args = ["convert", str(d / "s.safetensors"), str(d / name), "-q", *extra]
        assert _call(args)[0] == 0
    for name, extra in (("v2.zt", []), ("v2z.zt", ["--compress", "zstd"])):
        args = ["convert", str(d / "s.safetensors"), str(d / name), "--zt-version", "2", *extra]
        assert _call([*args, "-q"])[0] == 0
    np.save(d / "n.npy", np.arange(10, dtype=np.int16))
    np.save(d / "v.npy", np.arange(300, 330, dtype=np.uint32))
    np.save(d / "m.npy", np.arange(24, dtype=np.uint16).reshape(6, 4))
    np.savez(d / "n.npz", a=np.arange(5), b=np.ones((2, 2)))
    ggufcraft.write_model(str(d / "g.gguf"), extra=False, embd_type="Q8_0")
    assert (
        _call(["convert", str(d / "m.weights"), str(d / "m.stb"), "-q", "--exclude", "*pos*"])[0]
        == 0
    )
    pack = d / "pack"
    corpus = ROOT / "fixtures" / "corpus" / "guide.html"
    assert _call(["ingest", "docs", str(corpus), "-o", str(pack), "-q"])[0] == 0
    (d / "doc_index.bin").write_bytes((pack / "doc_index.bin").read_bytes())
    return d


def _commands(name: str, path: str, out: str) -> list[list[str]]:
    cmds = [["verify", path], ["inspect", path], ["inspect", "--json", path]]
    tensor = (".zt", ".safetensors", ".npy", ".npz", ".weights", ".stb", ".gguf")
    if name.endswith(tensor):
        cmds.append(["convert", path, os.path.join(out, "o.zt"), "-q"])
        cmds.append(["convert", path, os.path.join(out, "o.safetensors"), "-q"])
    if name == "a.bin":
        cmds.append(["pack", "svgt", path, "--grid", "4x4", "-o", os.path.join(out, "o.svgt")])
    if name in ("a.bin", "t.mxt"):  # id previews and ids to .npy
        cmds.append(["inspect", "--json", "--ids", "5:300", "-s", MAP, path])
        cmds.append(["convert", path, os.path.join(out, "o.npy"), "-q"])
    if name == "t.mxt":
        cmds.append(["pack", "atoms", path, "-n", "8", "-o", os.path.join(out, "o.bin")])
        cmds.append(["tokenize", "pi", "decode", path, "-o", os.path.join(out, "o.txt")])
    if name in ("n.npy", "v.npy", "m.npy"):  # .npy back to ids
        cmds.append(["convert", path, os.path.join(out, "o.mxt"), "-q"])
        cmds.append(["convert", path, os.path.join(out, "o.bin"), "-q"])
    if name == "a.svgt":
        cmds.append(["convert", path, os.path.join(out, "o.svg")])
    return cmds


NAMES = [
    "a.bin",
    "a.svgt",
    "t.mxt",
    "doc_index.bin",
    "x.zt",
    "z.zt",
    "v2.zt",
    "v2z.zt",
    "s.safetensors",
    "n.npy",
    "v.npy",
    "m.npy",
    "n.npz",
    "m.weights",
    "m.stb",
    "g.gguf",
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # gguf dequantizing mutated scales
@pytest.mark.parametrize("name", NAMES)
def test_mutated_files_never_crash(samples: Path, tmp_path: Path, name: str) -> None:
    rng = random.Random(f"{name}-2026")
    original = (samples / name).read_bytes()
    path = tmp_path / name
    if name == "m.stb":  # the sidecar names the .stb beside it
        (tmp_path / "m.stb.json").write_bytes((samples / "m.stb.json").read_bytes())
    failures: list[str] = []
    check: Callable[[list[str]], None]

    def check(args: list[str]) -> None:
        code, err = _call(args)
        if code not in (0, 1, 2) or "Traceback" in err:
            failures.append(f"{args[0]} {code} {err.strip()[-300:]}")

    for _ in range(ITERATIONS):
        data = _mutate(rng, original)
        path.write_bytes(data)
        for args in _commands(name, str(path), str(tmp_path)):
            check(args)
        if failures:
            (tmp_path / "crash").write_bytes(data)
            break
    assert failures == [], failures
