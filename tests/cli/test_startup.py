"""Start-up cost: `--help` and `inspect` of a small file must not import the heavy modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import golden_bytes
from tests.helpers.cli import ROOT

HEAVY = (
    "numpy",
    "rich",
    "gguf",
    "safetensors",
    "cbor2",
    "zstandard",
    "blake3",
    "pyarrow",  # optional extras of ingest docs
    "isal",
    "dask",  # ingest docs --executor dask only
    "distributed",
)

PROBE = """
import sys
from matrixctl.cli.app import main
code = main(sys.argv[1:])
sys.stdout.flush()
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
sys.stderr.write("LOADED:" + ",".join(heavy) + "\\n")
raise SystemExit(code)
"""


def loaded_after(*args: str) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("LOADED:")][-1]
    return [m for m in line[len("LOADED:") :].split(",") if m]


def test_help_imports_no_heavy_module() -> None:
    assert loaded_after("--help") == []
    assert loaded_after("pack", "atoms", "--help") == []
    assert loaded_after("ingest", "docs", "--help") == []


def test_inspect_json_of_a_small_atom_file_imports_no_heavy_module(tmp_path: Path) -> None:
    path = tmp_path / "a.bin"
    path.write_bytes(golden_bytes.MATRIX_ATOM)
    assert loaded_after("inspect", "--json", str(path)) == []


# `tokenize pi encode` without typer (cli/entry.py) -----------------------------------------

ENTRY_PROBE = """
import sys
from matrixctl.cli.entry import main
code = main(sys.argv[1:])
sys.stdout.flush()
loaded = sorted(m for m in {watch!r} if m in sys.modules)
sys.stderr.write("LOADED:" + ",".join(loaded) + "\\n")
raise SystemExit(code)
"""


def test_one_line_pi_encode_imports_neither_typer_nor_other_commands() -> None:
    heavy = [m for m in HEAVY if m != "blake3"]  # the map cache's key (tokenizers/pi_cache.py)
    # The π path defines records, not dataclasses (whose import, with inspect, and class
    # building took 10-20 ms of this command's start: docs/architecture.md, rule 13).
    watch = (
        *heavy,
        "typer",
        "click",
        "matrixctl.cli.app",
        "matrixctl.cli.tokenize_scx",
        "dataclasses",
        "inspect",
    )
    proc = subprocess.run(
        [sys.executable, "-c", ENTRY_PROBE.format(watch=watch), "tokenize", "pi", "encode"],
        input=b"one line\n",
        capture_output=True,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(b"MXTOKENS")
    line = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("LOADED:")][-1]
    assert line == "LOADED:"


def test_fast_path_knows_every_option_of_the_typer_command() -> None:
    """The fast path's option table is the typer command's, spelling by spelling."""
    from matrixctl.cli.app import command_tree
    from matrixctl.cli.entry import PI_ENCODE_OPTIONS

    encode = command_tree().commands["tokenize"].commands["pi"].commands["encode"]
    spellings = {}
    for param in encode.params:
        if param.name in ("help", "input_path"):
            continue
        for opt in [*param.opts, *param.secondary_opts]:
            spellings[opt] = (param.name, not param.is_flag)
    assert spellings == PI_ENCODE_OPTIONS


def _both_paths(monkeypatch: pytest.MonkeyPatch, words: list[str], stdin: bytes) -> list[tuple]:
    """(exit code, stdout, stderr, output file) of `words` by the full command line and by
    the fast path (or the full one again, when the fast path passes them on)."""
    from matrixctl.cli import app, entry
    from tests.helpers.cli import run_cli

    full = app.main
    results = []
    for fast in (False, True):

        def main(args: list[str], fast: bool = fast) -> int:
            params = entry.parse_pi_encode(list(args)) if fast else None
            return full(args) if params is None else entry.run_pi_encode(params)

        monkeypatch.setattr(app, "main", main)
        run = run_cli("tokenize", "pi", "encode", *words, stdin=stdin)
        out = Path(OUT_FILE[0])
        written = out.read_bytes() if out.exists() else None
        if out.exists():
            out.unlink()
        results.append((run.code, run.stdout, run.stderr, written))
    monkeypatch.setattr(app, "main", full)
    return results


OUT_FILE: list[str] = [""]


def test_fast_path_and_typer_give_the_same_outputs_errors_and_exit_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matrixctl.cli.entry import parse_pi_encode

    monkeypatch.chdir(tmp_path)  # `-o --ids` writes a file named --ids
    text = tmp_path / "in.txt"
    text.write_bytes(b"hello world, one line\n" * 3)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok \xff no\n")
    out = tmp_path / "out.mxt"
    OUT_FILE[0] = str(out)
    symbols = tmp_path / "map.json"
    symbols.write_text(
        '{"version": 1, "vocab_size": 300, "unk_id": 0, "byte_fallback": true, '
        '"byte_base_id": 10, "normalization": "nfkc", "symbols": [{"id": 2, "text": "he"}]}'
    )
    t, b, o, s = str(text), str(bad), str(out), str(symbols)
    fast_cases = [
        [],
        ["-q"],
        [t, "-o", o],
        [t, "--output=" + o, "--label", "L", "-j", "2"],
        ["--ids", t],
        ["--json", t],
        ["--json", t, "-o", o, "--quiet"],
        ["-s", s, t, "--ids"],
        ["--symbols=" + s, "-", "--jobs=3"],
        [str(tmp_path / "missing.txt")],
        [b],
        ["--json", b],
        [t, "-o", str(tmp_path / "no" / "dir" / "x.mxt")],
        [str(tmp_path)],
    ]
    typer_cases = [
        ["--help"],
        ["-j", "0"],
        ["--jobs", "65"],
        ["--bogus"],
        [t, t],
        ["-qo", o],
        ["-o"],
        ["--ids=1"],
        ["-o", "--ids"],
        ["--", t],
        ["-q", "-q"],
    ]
    for words in fast_cases + typer_cases:
        assert (parse_pi_encode(["tokenize", "pi", "encode", *words]) is not None) == (
            words in fast_cases
        ), words
        full, fast = _both_paths(monkeypatch, words, b"from stdin\n")
        assert fast == full, words


def test_the_console_command_flushes_its_output_and_keeps_its_exit_code(tmp_path: Path) -> None:
    """Decision (entry.exit_now): `python -m matrixctl tokenize pi encode` ends without the
    interpreter's teardown, after flushing stdout and stderr: the whole JSON document on a
    pipe, the error line and exit 2 of a failure, a committed output file."""
    from tests.helpers.cli import run_sub

    ok = run_sub("tokenize", "pi", "encode", "--json", stdin=b"hello world\n" * 5000)
    assert ok.code == 0 and ok.stderr == ""
    doc = ok.json()
    assert doc["ok"] is True and len(doc["ids"]) == doc["tokens"] > 0
    out = tmp_path / "o.mxt"
    two = run_sub("tokenize", "pi", "encode", "-j", "2", "-", "-o", str(out), stdin=b"a b\n")
    assert two.code == 0 and "encoded 4 bytes" in two.stderr and out.read_bytes()[:8] == b"MXTOKENS"
    bad = run_sub("tokenize", "pi", "encode", str(tmp_path / "missing.txt"))
    assert bad.code == 2 and bad.stderr.startswith("matrixctl: error[IO_NOT_FOUND]")
    assert bad.stdout == b""


TEARDOWN_PROBE = """
import atexit, sys
sys.argv = ["matrixctl", *sys.argv[1:]]
atexit.register(lambda: sys.stderr.write("TEARDOWN\\n"))
from matrixctl.cli.entry import main
main()
sys.stderr.write("RETURNED\\n")
"""


def test_every_console_command_ends_without_the_interpreters_teardown(tmp_path: Path) -> None:
    """Decision (entry.exit_now): any command run as the console command ends once its
    streams are flushed, without the teardown (exit handlers, freeing every object: 0.28 s
    after an `ingest docs --executor dask`); its output, error line and exit code are kept."""
    src = tmp_path / "d.txt"
    src.write_text("a small document\n", encoding="utf-8")
    pack = tmp_path / "pack"
    runs = {
        "ok": ["ingest", "docs", str(src), "-o", str(pack), "--json"],
        "bad": ["verify", str(tmp_path / "missing.bin")],
    }
    got = {}
    for name, words in runs.items():
        got[name] = subprocess.run(
            [sys.executable, "-c", TEARDOWN_PROBE, *words],
            capture_output=True,
            cwd=ROOT,
            check=False,
        )
        assert b"TEARDOWN" not in got[name].stderr and b"RETURNED" not in got[name].stderr
    assert got["ok"].returncode == 0
    assert json.loads(got["ok"].stdout)["ok"] is True and (pack / "matrix_atoms.bin").exists()
    assert got["bad"].returncode == 2 and got["bad"].stdout == b""
    assert (
        "IO_NOT_FOUND" in got["bad"].stderr.decode() and "missing.bin" in got["bad"].stderr.decode()
    )
    # A caller's process (main(argv)) returns as before.
    caller = subprocess.run(
        [sys.executable, "-c", "from matrixctl.cli.entry import main; print(main(['--version']))"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert caller.returncode == 0 and caller.stdout.strip().endswith("0")


BLAS_PROBE = """
import os, sys
sys.argv = ["matrixctl", *sys.argv[1:]]
from matrixctl.cli import entry

def probe(code):  # where the console command ends (entry.exit_now)
    import numpy  # imported by the command already; a no-op here
    threads = len(os.listdir("/proc/self/task"))
    sys.stderr.write("BLAS:%s:%d\\n" % (os.environ.get("OPENBLAS_NUM_THREADS"), threads))
    raise SystemExit(code)

entry.exit_now = probe
entry.main()
"""


@pytest.mark.parametrize("preset", [None, "3"])
def test_the_console_command_starts_no_blas_thread_pool(tmp_path: Path, preset: str | None) -> None:
    """Decision (entry.quiet_blas): the command's own process runs OpenBLAS without server
    threads (they spin ~0.1 CPU s at every start, and `ingest --jobs N` restarts them at each
    fork); a value the user set is kept. A caller's process (main(argv)) is left alone."""
    import os

    atoms = tmp_path / "a.bin"
    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "matrixctl",
            "pack",
            "atoms",
            "-",
            "-o",
            str(atoms),
            "--atom-size",
            "4",
        ],
        input=b"1 2 3 4\n",
        capture_output=True,
        cwd=ROOT,
        check=True,
    )
    assert made.returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    proc = subprocess.run(
        [sys.executable, "-c", BLAS_PROBE, "verify", str(atoms)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("BLAS:")][-1]
    _, value, threads = line.split(":")
    assert value == (preset or "1")
    if preset is None:
        assert int(threads) == 1  # numpy loaded, no pool beside the main thread
    in_process = subprocess.run(
        [
            sys.executable,
            "-c",
            "from matrixctl.cli.entry import main; import os; main(['--help']);"
            " print(os.environ.get('OPENBLAS_NUM_THREADS'))",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )
    assert in_process.stdout.strip().splitlines()[-1] == str(preset)


SNIFF_PROBE = """
import sys
from matrixctl.formats import registry
from tests.helpers import golden_bytes
heads = [b"STB0" + bytes(60), b"ZTEN1000" + bytes(56), b"GGUF" + bytes(60), b"EMBD" + bytes(60),
         golden_bytes.MATRIX_ATOM[:64]]
print([registry.sniff_bytes(h, 1 << 20) for h in heads])
print(sorted(m for m in {watch!r} if m in sys.modules))
"""


def test_sniffing_other_formats_imports_no_codec_it_rules_out() -> None:
    """The sniffers that need their codec (safetensors, npz, the STB sidecar) look at the bytes
    first: a file of another format does not import them (the npz codec pulls in zipfile,
    about 10 ms of a `convert`'s start-up)."""
    watch = (
        "zipfile",
        "matrixctl.formats.npy",
        "matrixctl.formats.st_container",
        "matrixctl.formats.stb",
    )
    proc = subprocess.run(
        [sys.executable, "-c", SNIFF_PROBE.format(watch=watch)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    formats, loaded = proc.stdout.splitlines()
    assert formats == "['stb', 'ztensor', 'gguf', 'embd', 'matrix-atom']"
    assert loaded == "[]"
