"""Run the CLI in-process or as a subprocess; paths to the bundled fixtures and golden files."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Everything the tests read is in the repository (fixtures/README.md says where it came from).
FIXTURES = ROOT / "fixtures"
GOLDEN = ROOT / "tests" / "golden"
FUZZ_REGRESSIONS = ROOT / "tests" / "fuzz_regressions"
# The π map cache (matrixctl/tokenizers/pi_cache.py) of the test run: never the user's own.
os.environ.setdefault("MATRIXCTL_CACHE_DIR", tempfile.mkdtemp(prefix="matrixctl-test-cache-"))


@dataclass
class Run:
    code: int
    stdout: bytes
    stderr: str

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8")

    def json(self):
        import json

        return json.loads(self.stdout)


class _Stream(io.TextIOWrapper):
    def isatty(self) -> bool:  # the in-process runner is never a terminal
        return False


def run_cli(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None) -> Run:
    """Run `matrixctl ARGS` in this process through main(), capturing the byte streams."""
    from matrixctl.cli import common
    from matrixctl.cli.app import main

    old = sys.stdin, sys.stdout, sys.stderr
    out_buf, err_buf = io.BytesIO(), io.BytesIO()
    # Keep the wrappers referenced: a collected TextIOWrapper closes the buffer it wraps.
    streams = (
        _Stream(io.BytesIO(stdin), encoding="utf-8"),
        _Stream(out_buf, encoding="utf-8", write_through=True),
        _Stream(err_buf, encoding="utf-8", write_through=True),
    )
    sys.stdin, sys.stdout, sys.stderr = streams
    saved_env = {}
    for k, v in (env or {}).items():
        saved_env[k] = os.environ.get(k)
        os.environ[k] = v
    common.reset_console()
    try:
        code = main(list(args))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        out, err = out_buf.getvalue(), err_buf.getvalue()
        sys.stdin, sys.stdout, sys.stderr = old
        common.reset_console()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for stream in streams:
        stream.detach()
    return Run(code, out, err.decode("utf-8"))


def run_sub(
    *args: str, stdin: bytes = b"", env: dict[str, str] | None = None, timeout: float = 120
) -> Run:
    """Run `python -m matrixctl ARGS` in a subprocess (for start-up, signals, real pipes)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "matrixctl", *args],
        input=stdin,
        capture_output=True,
        check=False,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))
