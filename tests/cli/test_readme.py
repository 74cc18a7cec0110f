"""The README's tour runs as written: its shell blocks, in order, in an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.cli import ROOT

README = ROOT / "README.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```\n", re.S | re.M)


def section(text: str, title: str) -> str:
    """The text of the README's `## title` section, up to the next `## ` heading."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def tour_script() -> str:
    blocks = BLOCK.findall(section(README.read_text(encoding="utf-8"), "A short tour"))
    assert blocks, "the README has no ```sh block in its tour"
    return "\n".join(blocks)


def run_tour(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run `script` with bash -euo pipefail in `folder`, as a user in a clone would: the repo's
    fixtures/ and tools/ beside it, `.venv` the environment running the tests (its bin first
    on PATH)."""
    for name in ("fixtures", "tools"):
        (folder / name).symlink_to(ROOT / name)
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").is_file():
        (folder / ".venv").symlink_to(venv)
    else:  # not a venv: PATH below already has this interpreter's bin first
        (folder / ".venv" / "bin").mkdir(parents=True)
        (folder / ".venv" / "bin" / "activate").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATRIXCTL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def test_readme_starts_with_make_demo_and_make_test() -> None:
    text = README.read_text(encoding="utf-8")
    first = BLOCK.search(text)
    assert first is not None
    commands = [ln.split("#", 1)[0].strip() for ln in first.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert text.index(first.group(0)) < text.index("\n## ")


def test_readme_tour_runs_as_written(tmp_path: Path) -> None:
    """Every command of the tour, in order, exits 0 (bash -euo pipefail), from an empty folder
    that holds only what a clone has beside the commands (fixtures/, tools/, .venv)."""
    script = tour_script()
    for needed in ("fixtures/corpus", "fixtures/gguf/", "sharded-model", "tokenize scx encode"):
        assert needed in script
    proc = run_tour(script, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "intact" in proc.stdout and "same bytes" in proc.stdout
    assert "Traceback" not in proc.stderr
    for made in ("atoms.bin", "pack/ingest_manifest.json", "merged.safetensors", "minilm.weights"):
        assert (tmp_path / made).exists(), made


def test_a_broken_tour_command_fails_the_run(tmp_path: Path) -> None:
    """The runner fails on a command that fails, also in the middle of a pipe."""
    proc = run_tour("matrixctl inspect no-such-file.bin | cat\necho after", tmp_path)
    assert proc.returncode == 2 and "after" not in proc.stdout
