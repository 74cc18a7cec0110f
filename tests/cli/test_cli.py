"""The command contract: every command, every exit code, streams, terminals, signals."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import golden_bytes
from tests.helpers.cli import ROOT, run_cli, run_sub


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, data in {
        "atoms.bin": golden_bytes.MATRIX_ATOM,
        "legacy.bin": golden_bytes.MATRIX_ATOM_LEGACY,
        "grid.svgt": golden_bytes.SVGT,
        "tokens.mxt": golden_bytes.TOKEN_STREAM,
        "junk.dat": b"not a known format at all",
        "empty.dat": b"",
    }.items():
        (tmp_path / name).write_bytes(data)
        out[name] = str(tmp_path / name)
    bad = bytearray(golden_bytes.MATRIX_ATOM)
    bad[0x34] ^= 0xFF
    (tmp_path / "bad.bin").write_bytes(bytes(bad))
    out["bad.bin"] = str(tmp_path / "bad.bin")
    out["dir"] = str(tmp_path)
    return out


def one_error_line(stderr: str, code: str) -> None:
    lines = [ln for ln in stderr.splitlines() if "error[" in ln]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"matrixctl: error[{code}]"), stderr
    assert "Traceback" not in stderr


# Help and version ---------------------------------------------------------------------------


def test_every_command_has_help_text() -> None:
    from matrixctl.cli.docgen import commands

    for path, cmd in commands():
        assert (cmd.help or "").strip(), f"{' '.join(path)} has no help text"
        for param in cmd.params:
            if param.name != "help":
                assert getattr(param, "help", None), f"{' '.join(path)} {param.name} has no help"
        r = run_cli(*path[1:], "--help")
        assert r.code == 0 and "Usage:" in r.out


def test_version() -> None:
    r = run_cli("--version")
    assert r.code == 0 and r.out.startswith("matrixctl ")


def test_no_arguments_is_a_usage_error_with_help() -> None:
    r = run_cli()
    assert r.code == 2 and "Usage:" in r.stderr and r.stdout == b""


@pytest.mark.parametrize(
    "args",
    [
        ["pack", "atoms", "--bogus"],
        ["pack", "atoms", "-o", "x.bin"],  # --atom-size missing
        ["pack", "atoms", "-o", "x.bin", "--atom-size", "0"],
        ["pack", "atoms", "-o", "x.bin", "--atom-size", "four"],
        ["pack", "atoms", "-o", "x.bin", "--atom-size", "4", "--dtype", "int8"],
        ["verify"],
        ["nonsense-command"],
        ["convert", "only-one-arg"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str]) -> None:
    r = run_cli(*args)
    assert r.code == 2
    one_error_line(r.stderr, "USAGE")
    assert r.stdout == b""


# pack atoms ---------------------------------------------------------------------------------


def test_pack_atoms_from_text_on_stdin(tmp_path: Path) -> None:
    out = tmp_path / "a.bin"
    r = run_cli(
        "pack",
        "atoms",
        "-o",
        str(out),
        "--atom-size",
        "4",
        "--vocab-size",
        "100",
        stdin=b"5 17 99 0 42\n",
    )
    assert r.code == 0, r.stderr
    assert out.read_bytes() == golden_bytes.MATRIX_ATOM
    assert r.stdout == b"" and "packed 5 tokens" in r.stderr


def test_pack_atoms_from_a_token_stream_file_with_json(tmp_path: Path, files: dict) -> None:
    out = tmp_path / "s.bin"
    r = run_cli("pack", "atoms", files["tokens.mxt"], "-o", str(out), "--atom-size", "4", "--json")
    assert r.code == 0, r.stderr
    doc = r.json()
    assert doc["input_kind"] == "token-stream" and doc["documents"] == 2
    assert (doc["tokens"], doc["padding"], doc["vocab_size"]) == (5, 3, 100)
    assert out.read_bytes() == golden_bytes.MATRIX_ATOM  # same ids, same vocabulary, same bytes


def test_pack_atoms_bad_text_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "a.bin"
    r = run_cli("pack", "atoms", "-o", str(out), "--atom-size", "4", stdin=b"1 2 three")
    assert r.code == 1
    one_error_line(r.stderr, "TEXT_IDS")
    assert "offset 4" in r.stderr
    assert not out.exists() and os.listdir(tmp_path) == []


def test_pack_atoms_cut_stream_exits_1_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "a.bin"
    r = run_cli(
        "pack", "atoms", "-o", str(out), "--atom-size", "4", stdin=golden_bytes.TOKEN_STREAM[:70]
    )
    assert r.code == 1
    one_error_line(r.stderr, "TOKS_NO_END")
    assert os.listdir(tmp_path) == []


def test_pack_atoms_id_over_uint16_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "a.bin"
    r = run_cli(
        "pack", "atoms", "-o", str(out), "--atom-size", "2", "--dtype", "uint16", stdin=b"1 70000"
    )
    assert r.code == 1
    one_error_line(r.stderr, "ATOM_ID_OVERFLOW")
    assert "token 1" in r.stderr and not out.exists()


def test_pack_atoms_missing_input_exits_2(tmp_path: Path) -> None:
    r = run_cli(
        "pack", "atoms", str(tmp_path / "nope"), "-o", str(tmp_path / "a.bin"), "--atom-size", "4"
    )
    assert r.code == 2
    one_error_line(r.stderr, "IO_NOT_FOUND")


def test_pack_atoms_vocab_disagreement_is_usage(tmp_path: Path, files: dict) -> None:
    r = run_cli(
        "pack",
        "atoms",
        files["tokens.mxt"],
        "-o",
        str(tmp_path / "a.bin"),
        "--atom-size",
        "4",
        "--vocab-size",
        "101",
    )
    assert r.code == 2
    one_error_line(r.stderr, "USAGE")


def test_json_and_stdout_output_conflict(tmp_path: Path) -> None:
    r = run_cli("pack", "atoms", "-o", "-", "--atom-size", "4", "--json", stdin=b"1")
    assert r.code == 2


def test_pack_atoms_to_stdout_pipe() -> None:
    r = run_sub(
        "pack",
        "atoms",
        "-",
        "-o",
        "-",
        "--atom-size",
        "4",
        "--vocab-size",
        "100",
        stdin=b"5 17 99 0 42",
    )
    assert r.code == 0, r.stderr
    assert r.stdout == golden_bytes.MATRIX_ATOM


def test_output_path_equal_to_input_path(tmp_path: Path) -> None:
    path = tmp_path / "ids"
    path.write_bytes(b"5 17 99 0 42")
    r = run_cli(
        "pack", "atoms", str(path), "-o", str(path), "--atom-size", "4", "--vocab-size", "100"
    )
    assert r.code == 0
    assert path.read_bytes() == golden_bytes.MATRIX_ATOM


# verify and inspect --------------------------------------------------------------------------


def test_verify_exit_codes(files: dict) -> None:
    assert run_cli("verify", files["atoms.bin"]).code == 0
    assert run_cli("verify", files["bad.bin"]).code == 1
    assert run_cli("verify", files["junk.dat"]).code == 1
    assert run_cli("verify", files["empty.dat"]).code == 1
    assert run_cli("verify", files["atoms.bin"] + ".missing").code == 2
    assert run_cli("verify", files["dir"]).code == 2
    # the worst wins
    assert run_cli("verify", files["atoms.bin"], files["bad.bin"]).code == 1
    assert run_cli("verify", files["bad.bin"], files["atoms.bin"] + ".x").code == 2


def test_verify_strict_fails_on_warnings(files: dict) -> None:
    assert run_cli("verify", files["legacy.bin"]).code == 0
    assert run_cli("verify", "--strict", files["legacy.bin"]).code == 1


def test_verify_json_document(files: dict) -> None:
    r = run_cli("verify", "--json", files["atoms.bin"], files["bad.bin"], files["junk.dat"])
    assert r.code == 1
    doc = r.json()
    assert doc["ok"] is False and len(doc["files"]) == 3
    good, bad, junk = doc["files"]
    assert good["ok"] and good["format"] == "matrix-atom" and good["findings"] == []
    assert not bad["ok"]
    f = bad["findings"][0]
    assert set(f) == {"code", "severity", "message", "offset", "field"}
    assert {x["code"] for x in bad["findings"]} >= {"ATOM_HEADER_CRC", "ATOM_PAYLOAD_CRC"}
    assert junk["format"] is None and junk["findings"][0]["code"] == "UNKNOWN_FORMAT"


def test_verify_human_report_goes_to_stderr(files: dict) -> None:
    r = run_cli("verify", files["bad.bin"])
    assert r.stdout == b""
    assert "FAIL" in r.stderr and "ATOM_PAYLOAD_CRC" in r.stderr and "0x34" in r.stderr


def test_verify_reads_stdin() -> None:
    r = run_cli("verify", "--json", "-", stdin=golden_bytes.SVGT)
    assert r.code == 0 and r.json()["files"][0]["path"] == "<stdin>"


def test_inspect_json_single_and_many(files: dict) -> None:
    r = run_cli("inspect", "--json", files["atoms.bin"])
    assert r.code == 0
    top = r.json()
    assert list(top)[:2] == ["schema_version", "ok"] and top["ok"] is True
    (doc,) = top["files"]  # one path: the same shape as several
    assert doc["format"] == "matrix-atom" and doc["path"] == files["atoms.bin"]
    assert doc["header"]["token_count"] == 8
    r = run_cli("inspect", "--json", files["grid.svgt"], files["tokens.mxt"])
    assert [d["format"] for d in r.json()["files"]] == ["svgt", "token-stream"]


def test_inspect_exit_codes_and_stderr(files: dict) -> None:
    r = run_cli("inspect", files["atoms.bin"])
    assert r.code == 0 and r.stdout == b"" and "matrix-atom" in r.stderr
    assert run_cli("inspect", files["junk.dat"]).code == 1
    assert run_cli("inspect", files["atoms.bin"] + ".missing").code == 2


def test_hostile_strings_are_neutralized_for_people(tmp_path: Path) -> None:
    evil = tmp_path / "evil\x1b[31mred.dat"
    evil.write_bytes(b"\x1b]0;pwned\x07junk")
    r = run_cli("inspect", str(evil))
    assert "\x1b" not in r.stderr and "\\x1b" in r.stderr


# pack svgt and convert ------------------------------------------------------------------------


def test_pack_svgt_and_convert(tmp_path: Path, files: dict) -> None:
    out = tmp_path / "g.svgt"
    r = run_cli("pack", "svgt", files["atoms.bin"], "-o", str(out), "--grid", "2x2")
    assert r.code == 0 and out.read_bytes() == golden_bytes.SVGT
    svg = tmp_path / "g.svg"
    r = run_cli("convert", str(out), str(svg), "--json")
    assert r.code == 0, r.stderr
    assert r.json()["to"] == "svg" and svg.read_text().startswith("<svg")


def test_pack_svgt_grid_mismatch_is_usage(tmp_path: Path, files: dict) -> None:
    r = run_cli("pack", "svgt", files["atoms.bin"], "-o", str(tmp_path / "g.svgt"), "--grid", "3x3")
    assert r.code == 2
    one_error_line(r.stderr, "USAGE")


def test_pack_svgt_of_a_damaged_file_exits_1(tmp_path: Path, files: dict) -> None:
    r = run_cli("pack", "svgt", files["bad.bin"], "-o", str(tmp_path / "g.svgt"), "--grid", "2x2")
    assert r.code == 1
    one_error_line(r.stderr, "ATOM_HEADER_CRC")
    assert not (tmp_path / "g.svgt").exists()


def test_pack_svgt_of_the_wrong_format_exits_1(tmp_path: Path, files: dict) -> None:
    r = run_cli("pack", "svgt", files["grid.svgt"], "-o", str(tmp_path / "g.svgt"), "--grid", "2x2")
    assert r.code == 1
    one_error_line(r.stderr, "UNKNOWN_FORMAT")


def test_convert_errors(tmp_path: Path, files: dict) -> None:
    r = run_cli("convert", files["atoms.bin"], str(tmp_path / "a.svg"))
    assert r.code == 2
    one_error_line(r.stderr, "CONVERT_UNSUPPORTED")
    r = run_cli("convert", files["grid.svgt"], str(tmp_path / "a.unknown"))
    assert r.code == 2
    r = run_cli("convert", files["grid.svgt"], str(tmp_path / "a.svg"), "--atoms", "5:9")
    assert r.code == 2 and not (tmp_path / "a.svg").exists()
    r = run_cli("convert", files["junk.dat"], str(tmp_path / "a.svg"))
    assert r.code == 1
    one_error_line(r.stderr, "UNKNOWN_FORMAT")
    r = run_cli("convert", str(tmp_path / "missing"), str(tmp_path / "a.svg"))
    assert r.code == 2


# Streams, terminals and signals (real processes) --------------------------------------------


def test_closed_stdout_ends_quietly(files: dict) -> None:
    for cmd in (
        f"{sys.executable} -m matrixctl inspect --json {files['atoms.bin']} | head -c 1",
        f"seq 1 2000000 | {sys.executable} -m matrixctl pack atoms -o - -n 1 -q | head -c 1",
    ):
        proc = subprocess.run(
            ["bash", "-o", "pipefail", "-c", cmd], capture_output=True, cwd=ROOT, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == b"", proc.stderr


def run_with_tty(args: list[str], env: dict[str, str], tty: str) -> tuple[int, bytes, bytes]:
    """Run matrixctl with stdout or stderr attached to a pseudo-terminal."""
    master, slave = pty.openpty()
    kwargs = (
        {"stdout": slave, "stderr": subprocess.PIPE}
        if tty == "stdout"
        else {"stdout": subprocess.PIPE, "stderr": slave}
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "matrixctl", *args],
        stdin=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **env},
        **kwargs,
    )
    os.close(slave)
    proc.stdin.close()  # type: ignore[union-attr]
    out_pipe = proc.stderr if tty == "stdout" else proc.stdout
    piped = out_pipe.read()  # type: ignore[union-attr]
    proc.wait(timeout=60)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return proc.returncode, seen, piped


def test_binary_output_to_a_terminal_is_refused(tmp_path: Path) -> None:
    code, on_tty, err = run_with_tty(["pack", "atoms", "-o", "-", "--atom-size", "4"], {}, "stdout")
    assert code == 2
    assert b"error[OUT_TTY]" in err and b"hint" in err
    assert on_tty == b""


@pytest.mark.parametrize("args", [["verify"], ["pack", "atoms", "-n", "4", "-o", "x.bin"]])
def test_no_color_is_honoured_on_a_terminal(files: dict, args: list[str]) -> None:
    missing = files["atoms.bin"] + ".missing"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    sgr = re.compile(rb"\x1b\[[0-9;]*m")  # color and style sequences
    code, colored, _ = run_with_tty([*args, missing], {**env}, "stderr")
    assert code == 2 and sgr.search(colored)
    code, plain, _ = run_with_tty([*args, missing], {"NO_COLOR": "1"}, "stderr")
    assert code == 2 and not sgr.search(plain) and b"IO_NOT_FOUND" in plain


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_pack_leaves_no_output(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "a.bin"
    proc = subprocess.Popen(
        [sys.executable, "-m", "matrixctl", "pack", "atoms", "-", "-o", str(out), "-n", "4"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    proc.stdin.write(b"1 2 3 4 5 6 7 8 " * 1000)  # type: ignore[union-attr]
    proc.stdin.flush()  # type: ignore[union-attr]
    deadline = time.time() + 30
    while time.time() < deadline and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]:
        time.sleep(0.05)
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")], "writer never started"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err and b"interrupted" in err
    assert os.listdir(tmp_path) == []


def test_every_command_but_inspect_takes_quiet() -> None:
    """--quiet is one flag with one meaning everywhere a command can print a success note."""
    from matrixctl.cli.docgen import commands

    missing = [
        " ".join(path)
        for path, cmd in commands()
        if not getattr(cmd, "commands", None)
        and path[-1] != "inspect"
        and not any("--quiet" in p.opts for p in cmd.params)
    ]
    assert missing == []


def test_quiet_prints_nothing_on_success_but_still_reports_failures(tmp_path: Path) -> None:
    corpus = ROOT / "fixtures" / "corpus"
    pack = tmp_path / "pack"
    runs = [
        run_cli("ingest", "docs", str(corpus), "-o", str(pack), "-q"),
        run_cli("verify", "-q", str(pack)),
        run_cli("pack", "atoms", "-", "-n", "4", "-o", str(tmp_path / "a.bin"), "-q", stdin=b"1 2"),
        run_cli(
            "pack",
            "svgt",
            str(tmp_path / "a.bin"),
            "-o",
            str(tmp_path / "a.svgt"),
            "--grid",
            "2x2",
            "-q",
        ),
        run_cli("convert", str(tmp_path / "a.svgt"), str(tmp_path / "a.svg"), "-q"),
        run_cli("tokenize", "pi", "encode", "-q", "-o", str(tmp_path / "t.mxt"), stdin=b"hi"),
    ]
    for run in runs:
        assert (run.code, run.stderr) == (0, ""), run.stderr
    loud = run_cli("verify", str(pack))
    assert loud.code == 0 and "OK" in loud.stderr
    data = bytearray((tmp_path / "a.bin").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "bad.bin").write_bytes(bytes(data))
    bad = run_cli("verify", "-q", str(pack), str(tmp_path / "bad.bin"))
    assert bad.code == 1 and "ATOM_PAYLOAD_CRC" in bad.stderr
    assert str(pack) not in bad.stderr  # the clean file stays silent
