"""Every command that reads stdin (`-`) or a path that is a pipe or a device is bounded by the
spool limit (`--spool-limit SIZE`, one option shared by every such command, or
MATRIXCTL_SPOOL_LIMIT): `/dev/zero` and `/dev/urandom` on stdin, or named as the input, end
with one clear error (SPOOL_LIMIT, the format error the first bytes already give, or a
device path refused), exit 1 or 2, no traceback, nothing written. docs/reliability.md,
"Bounds on stdin"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import ROOT, run_cli

LIMIT = "2M"


def _scx_files(folder: Path) -> dict[str, str]:
    from tests.helpers import scx_golden

    key = folder / "k.key"
    assert run_cli("tokenize", "scx", "keygen", "-o", str(key)).code == 0
    src = folder / "src.json"
    # Shards of 512 KiB (the golden's are 16 bytes: 2M of input would be 131,072 shards).
    src.write_text(
        json.dumps(
            {
                **scx_golden.SOURCE,
                "alignment": {"bundle_lanes": 2, "chunk_bytes": 4096, "shard_bundles": 64},
            }
        )
    )
    reg = folder / "reg.scxr"
    assert run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(key)).code == 0
    return {"REG": str(reg), "PUB": str(key) + ".pub"}


# (command, whether it needs the SCX registry); IN is the input, OUT the output folder.
COMMANDS = {
    "inspect": ["inspect", "IN"],
    "verify": ["verify", "IN"],
    "convert": ["convert", "IN", "OUT/x.zt"],
    "ingest-docs": ["ingest", "docs", "IN", "-o", "OUT/pack"],
    "ingest-gguf": ["ingest", "gguf", "IN", "-o", "OUT/tok"],
    "pack-atoms": ["pack", "atoms", "IN", "-n", "4", "-o", "OUT/p.atoms"],
    "pack-svgt": ["pack", "svgt", "IN", "--grid", "2x2", "-o", "OUT/scx_golden.svgt"],
    "pack-shards": ["pack", "shards", "IN", "-o", "OUT/sh", "-r", "REG", "--trust", "PUB"],
    "tokenize-pi-encode": ["tokenize", "pi", "encode", "IN", "-o", "OUT/t.mxt"],
    "tokenize-pi-decode": ["tokenize", "pi", "decode", "IN", "-o", "OUT/t.txt"],
    "tokenize-scx-encode": ["tokenize", "scx", "encode", "IN", "-r", "REG", "--trust", "PUB",
                            "-o", "OUT/s.scx"],
    "tokenize-scx-decode": ["tokenize", "scx", "decode", "IN", "-r", "REG", "--trust", "PUB",
                            "-o", "OUT/s.bin"],
}  # fmt: skip
# An error line, or verify's / inspect's report of the error finding.
ERROR = re.compile(
    r"^matrixctl: error\[[A-Z][A-Z0-9_]+\]: |^error +[A-Z][A-Z0-9]*_[A-Z0-9_]+ ", re.M
)


def _run(argv: list[str], stdin: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    with open(stdin, "rb") as fp:
        return subprocess.run(
            [sys.executable, "-m", "matrixctl", *argv],
            stdin=fp,
            capture_output=True,
            check=False,
            cwd=ROOT,
            timeout=120,
            env={**os.environ, "MATRIXCTL_NO_FSYNC": "1", **env},
        )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_endless_stdin_or_device_ends_with_one_clear_error(tmp_path: Path, name: str) -> None:
    keys = _scx_files(tmp_path) if "REG" in COMMANDS[name] else {}
    out = tmp_path / "out"
    out.mkdir()

    def argv(src: str, option: bool) -> list[str]:
        args = [keys.get(a, a.replace("OUT", str(out))) for a in COMMANDS[name]]
        args = [src if a == "IN" else a for a in args]
        return args + (["--spool-limit", LIMIT] if option else [])

    cases = [
        # /dev/zero on stdin, bounded by the option
        (argv("-", True), "/dev/zero", {}),
        # /dev/urandom on stdin, bounded by the environment variable
        (argv("-", False), "/dev/urandom", {"MATRIXCTL_SPOOL_LIMIT": LIMIT}),
        # a device named as the input path
        (argv("/dev/zero", True), "/dev/null", {}),
    ]
    for args, stdin, env in cases:
        res = _run(args, stdin, env)
        err = res.stderr.decode("utf-8", "replace")
        assert res.returncode in (1, 2), (args, stdin, res.returncode, err)
        assert "Traceback" not in err, (args, err)
        assert len(ERROR.findall(err)) == 1, (args, stdin, err)
        assert os.listdir(out) == [], (args, os.listdir(out))
        if res.returncode == 2:  # bounded (SPOOL_LIMIT) or a device path refused (IO_READ)
            assert "SPOOL_LIMIT" in err or "IO_READ" in err, (args, stdin, err)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ingest_docs_of_endless_text_on_stdin_ends_at_the_limit(tmp_path: Path, jobs: str) -> None:
    """`yes | matrixctl ingest docs -` used to read stdin without a bound (one endless text
    document with --jobs 1; the copy made for the workers with --jobs 2) until killed."""
    import threading

    out = tmp_path / "pack"
    proc = subprocess.Popen(
        [sys.executable, "-m", "matrixctl", "ingest", "docs", "-", "-o", str(out),
         "--jobs", jobs, "--spool-limit", LIMIT],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "MATRIXCTL_NO_FSYNC": "1"},
    )  # fmt: skip
    assert proc.stdin is not None and proc.stderr is not None

    def feed() -> None:
        line = b"the same line of text, again and again\n" * 1024
        try:
            for _ in range(100_000):  # 4 GB at most; the reader stops long before
                proc.stdin.write(line)  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
    finally:
        proc.kill()
    assert code == 2 and "SPOOL_LIMIT" in err and "Traceback" not in err, err
    assert not out.exists() and [p for p in os.listdir(tmp_path) if p.startswith(".")] == []
