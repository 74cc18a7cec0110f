"""`convert` without typer (cli/convert_fast.py): what it imports, and the same outputs, errors
and exit codes as the full command line on the same words."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, run_cli

PROBE = """
import sys
from matrixctl.cli.entry import main
code = main(sys.argv[1:])
sys.stdout.flush()
loaded = sorted(m for m in {watch!r} if m in sys.modules)
sys.stderr.write("LOADED:" + ",".join(loaded) + "\\n")
raise SystemExit(code)
"""
WATCH = ("typer", "click", "rich", "numpy", "matrixctl.cli.app", "matrixctl.cli.convert")
# The modules on a convert's path define records (matrixctl.records), not dataclasses, which
# compile each class's methods at import and import inspect; GGUF's codec only for GGUF.
NO_DATACLASSES = ("dataclasses", "inspect", "matrixctl.formats.gguf")


def safetensors_bytes(tensors: dict[str, list[float]]) -> bytes:
    """A safetensors file of float32 vectors, written by hand (no numpy, no safetensors)."""
    header: dict[str, object] = {}
    data = b""
    for name, values in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {
            "dtype": "F32",
            "shape": [len(values)],
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + data


EMBD_META = [
    f"--meta={k}=1"
    for k in (
        "embedding_dim",
        "vocab_size",
        "num_layers",
        "num_attention_heads",
        "hidden_size",
        "intermediate_size",
        "max_position_emb",
    )
]


@pytest.mark.parametrize("out", ["o.zt", "o.npz", "o.stb", "o.weights", "o.npy"])
def test_convert_of_stored_bytes_imports_neither_typer_nor_rich_nor_numpy(
    tmp_path: Path, out: str
) -> None:
    src = tmp_path / "in.safetensors"
    src.write_bytes(safetensors_bytes({"w": [1.0, 2.0, 3.0, 4.0]}))
    extra = [*EMBD_META, "--meta=model_name=m"] if out.endswith(".weights") else []
    watch = (*WATCH, *NO_DATACLASSES)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE.format(watch=watch),
            "convert",
            str(src),
            str(tmp_path / out),
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / out).stat().st_size > 16
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED:")][-1]
    assert line == "LOADED:"


@pytest.mark.parametrize("out", ["o.safetensors", "o.npz"])
def test_convert_from_ztensor_imports_no_dataclasses(tmp_path: Path, out: str) -> None:
    src = tmp_path / "in.safetensors"
    src.write_bytes(safetensors_bytes({"w": [1.0, 2.0, 3.0, 4.0], "b": [0.5]}))
    zt = tmp_path / "in.zt"
    assert run_cli("convert", "-q", str(src), str(zt)).code == 0
    probe = PROBE.format(watch=(*WATCH, *NO_DATACLASSES))
    proc = subprocess.run(
        [sys.executable, "-c", probe, "convert", str(zt), str(tmp_path / out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED:")][-1]
    assert line == "LOADED:"


def test_fast_path_knows_every_option_of_the_typer_command() -> None:
    from matrixctl.cli.app import command_tree
    from matrixctl.cli.convert_fast import CONVERT_OPTIONS

    command = command_tree().commands["convert"]
    spellings = {}
    for param in command.params:
        if param.name in ("help", "src", "dst"):
            continue
        kind = "flag" if param.is_flag else "list" if param.multiple else "str"
        if getattr(param.type, "name", "") == "int":
            kind = "int"
        for opt in [*param.opts, *param.secondary_opts]:
            spellings[opt] = (param.name, kind)
    assert spellings == CONVERT_OPTIONS


def _both_paths(
    monkeypatch: pytest.MonkeyPatch, words: list[str], out: Path
) -> list[tuple[object, ...]]:
    """(exit code, stdout, stderr, output bytes) of `convert WORDS` by the full command line
    and by the fast path (or the full one again, when the fast path passes them on)."""
    from matrixctl.cli import app, convert_fast

    full = app.main
    results = []
    for fast in (False, True):

        def main(args: list[str], fast: bool = fast) -> int:
            params = convert_fast.parse_convert(list(args)) if fast else None
            return full(args) if params is None else convert_fast.run_convert(params)

        monkeypatch.setattr(app, "main", main)
        run = run_cli("convert", *words)
        written = out.read_bytes() if out.exists() else None
        if out.exists():
            out.unlink()
        results.append((run.code, run.stdout, run.stderr, written))
    monkeypatch.setattr(app, "main", full)
    return results


def test_fast_path_and_typer_give_the_same_outputs_errors_and_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matrixctl.cli.convert_fast import parse_convert

    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in.safetensors"
    src.write_bytes(safetensors_bytes({"a.w": [1.0, 2.5], "b.w": [3.0, -4.0, 0.5]}))
    one = tmp_path / "one.safetensors"
    one.write_bytes(safetensors_bytes({"w": [1.0, 2.0]}))
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(src.read_bytes()[:-3])
    out = tmp_path / "out.zt"
    s, o = str(src), str(out)
    fast_cases = [
        [s, o],
        ["-q", s, o],
        [s, o, "--json"],
        ["--json", s, o, "--quiet"],
        [s, o, "--select", "a.*"],
        [s, o, "--select=a.*", "--select", "b.*", "--exclude", "b.*"],
        [s, o, "--select", "zzz"],
        [s, o, "--dtype", "f16"],
        [s, o, "--dtype", "a.w=f64", "--dtype", "b.w=i8"],
        [s, o, "--compress", "zstd:5", "--digest", "sha256"],
        [s, o, "--digest", "bogus"],
        [s, o, "--zt-version", "2"],
        [s, o, "--zt-version", "3"],
        [s, o, "--zt-version=1", "--meta", "k=v", "--meta=k2=v2"],
        [s, o, "--meta", "novalue"],
        [s, o, "--per-file", "4"],
        [s, o, "--to", "st"],
        [s, o, "--to", "bogus"],
        [s, o, "--to", "gguf", "--quantize", "Q8_0"],
        [s, o, "--densify", "--keep-quantized"],
        [s, o, "--vocab-size", "10"],
        [s, o, "--atoms", "0:2"],
        [s, o, "--spool-limit", "1K"],
        [s, o, "--spool-limit", "nonsense", "--json"],
        ["--json", "--spool-limit", "nonsense", s, o],
        [s, str(tmp_path / "out.unknown")],
        [s, str(tmp_path / "no" / "dir" / "o.zt")],
        [str(tmp_path / "missing.safetensors"), o],
        [str(bad), o],
        ["--json", str(bad), o],
        [s, "-", "--json"],
        [str(one), str(tmp_path / "out.npy"), "--to", "zt"],
        [str(tmp_path), o],
    ]
    typer_cases = [
        ["--help"],
        [s],
        [s, o, o],
        [s, o, "--bogus"],
        [s, o, "--to"],
        [s, o, "--to", "zt", "--to", "st"],
        [s, o, "-q", "-q"],
        [s, o, "--json=1"],
        [s, o, "--zt-version", "two"],
        [s, o, "--per-file", "-1"],
        [s, o, "--select", "-x"],
        ["--", s, o],
        ["-qq", s, o],
    ]
    for words in fast_cases + typer_cases:
        assert (parse_convert(["convert", *words]) is not None) == (words in fast_cases), words
        full, fast = _both_paths(monkeypatch, words, out)
        assert fast == full, words


def test_console_convert_ends_without_teardown_and_keeps_its_outputs(tmp_path: Path) -> None:
    """`python -m matrixctl convert` (the console command) leaves the process by `exit_now`
    once the command is done: stdout (a --json document, or the output itself for `-`) and
    stderr are flushed first, and the exit code is the command's."""
    src = tmp_path / "in.safetensors"
    src.write_bytes(safetensors_bytes({"a.w": [1.0, 2.5], "b.w": [3.0, -4.0, 0.5]}))

    def run(*words: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "matrixctl", "convert", *words],
            capture_output=True,
            cwd=ROOT,
            check=False,
        )

    done = run("--json", str(src), str(tmp_path / "o.zt"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tensors"] == 2
    piped = run(str(src), "-", "--to", "st", "-q")
    assert piped.returncode == 0 and piped.stdout == src.read_bytes()
    failed = run(str(tmp_path / "missing.safetensors"), str(tmp_path / "p.zt"))
    assert failed.returncode == 2 and b"IO_NOT_FOUND" in failed.stderr
    assert not (tmp_path / "p.zt").exists()


def test_a_convert_leaves_no_cyclic_garbage(tmp_path: Path) -> None:
    """The console convert runs with the cyclic garbage collector off (cli/entry.py): every
    object a conversion makes is freed by its reference count, for each container pair."""
    import gc

    src = tmp_path / "in.safetensors"
    src.write_bytes(safetensors_bytes({f"t{i}": [float(i)] * 8 for i in range(20)}))
    meta = [*EMBD_META, "--meta=model_name=m"]
    inputs = {"safetensors": src}
    for ext in ("zt", "npz", "stb", "weights"):
        inputs[ext] = tmp_path / f"in.{ext}"
        extra = meta if ext == "weights" else []
        assert run_cli("convert", "-q", str(src), str(inputs[ext]), *extra).code == 0
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        for s, path in inputs.items():
            for ext in ("safetensors", "zt", "npz", "stb", "weights"):
                if ext == s:
                    continue
                extra = meta if ext == "weights" else []
                done = run_cli("convert", "-q", str(path), str(tmp_path / f"o.{ext}"), *extra)
                assert done.code == 0, done.stderr
                assert gc.collect() == 0, (s, ext)
    finally:
        if was:
            gc.enable()
