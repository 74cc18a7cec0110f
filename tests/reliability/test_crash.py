"""Crash consistency: SIGKILL every writer at 20 points spread over its run, then check the
destination is absent, the previous version, or complete (the same bytes a full run writes,
which passes verify); the next run leaves no temporary file behind.

The writer runs in a forked child of the test process (no interpreter start-up), so the 20
kill times, spread evenly over a full run's measured duration, land in the writing itself.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import run_cli

POINTS = 20


class Runner:
    """The fork server (tests/helpers/forkrunner.py) in a subprocess."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve().parents[1] / "helpers" / "forkrunner.py"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(Path(__file__).resolve().parents[2]),
            text=True,
        )

    def run(self, argv: list[str], kill_after: float | None = None) -> tuple[int | None, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "kill_after": kill_after}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert not answer["hung"], f"{argv} did not finish"
        return answer["code"], answer["took"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


_RUNNER: Runner | None = None


def run_forked(argv: list[str], kill_after: float | None = None) -> tuple[int | None, float]:
    """Run matrixctl ARGV in a forked child; SIGKILL it after `kill_after` seconds. Returns
    (exit code, or None when killed; duration)."""
    global _RUNNER
    if _RUNNER is None or _RUNNER.proc.poll() is not None:
        _RUNNER = Runner()
    return _RUNNER.run(argv, kill_after)


def digest(path: Path) -> str | None:
    """Bytes of a file, or of every file under a folder with their names; None if absent."""
    if not os.path.lexists(path):
        return None
    h = hashlib.sha256()
    if path.is_dir():
        for p in sorted(path.rglob("*")):
            h.update(str(p.relative_to(path)).encode() + b"\0")
            if p.is_file():
                h.update(p.read_bytes())
    else:
        h.update(path.read_bytes())
    return h.hexdigest()


def leftovers(folder: Path) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.startswith(".") and ".mx" in p)


def crash_campaign(
    tmp_path: Path,
    argv: list[str],
    outputs: list[Path],
    previous: Callable[[], None] | None = None,
    clear: Callable[[], None] | None = None,
    torn_reported: Callable[[], bool] | None = None,
) -> None:
    """Kill ARGV at POINTS times; outputs must each be absent / previous / complete.

    A multi-file output may be caught between its files only where the writer documents a
    roll-forward (an STB set killed after its commit point): then `torn_reported` must confirm
    that `verify` names the torn set, and the next run must complete it (checked at the end)."""

    def reset(with_previous: bool) -> None:
        for out in outputs:
            if out.is_dir():
                import shutil

                shutil.rmtree(out)
            elif os.path.lexists(out):
                out.unlink()
        if clear is not None:
            clear()
        if with_previous and previous is not None:
            previous()

    reset(True)
    old = [digest(o) for o in outputs]
    reset(False)
    run_forked(argv)  # a first run fills what later runs reuse (the π map cache): not timed
    reset(False)
    code, took = run_forked(argv)
    assert code == 0, f"a full run of {argv} failed with {code}"
    complete = [digest(o) for o in outputs]
    for _ in range(2):  # the shortest of three full runs: a slow outlier on a loaded machine
        reset(False)  # would put most kill points after the end of the next runs
        code, again = run_forked(argv)
        assert code == 0 and [digest(o) for o in outputs] == complete
        took = min(took, again)
    assert all(c is not None for c in complete)
    killed = 0
    for i in range(POINTS):
        with_previous = previous is not None and i % 2 == 1
        reset(with_previous)
        before = [digest(o) for o in outputs]
        # A killed run of the last round may have left the previous version set aside (moved
        # away, the new one not yet in place): this run puts it back first (io.restore_aside),
        # so finding that previous version is a correct outcome even where none was given.
        aside = any(".old." in name for name in leftovers(tmp_path))
        code, ran = run_forked(argv, kill_after=took * (i + 0.5) / POINTS)
        killed += code is None
        if code is not None:
            # The run ended before its kill point: a loaded machine made the timed run slow.
            # Spread the remaining points over the fastest run seen, so they land mid-run.
            took = min(took, ran)
        after = [digest(o) for o in outputs]
        states = {
            "absent"
            if a is None
            else "previous"
            if a == b or (aside and a == o)
            else "complete"
            if a == c
            else "MIXED"
            for a, b, c, o in zip(after, before, complete, old, strict=True)
        }
        assert "MIXED" not in states, (i, argv, after)
        # Multi-file outputs appear whole or not at all.
        whole = len(states) == 1 or (states == {"previous", "complete"} and not with_previous)
        # A set killed after its commit point, over a previous version or over none (then its
        # files not yet moved in are absent): verify must name it torn; the next run completes it.
        if not whole and torn_reported is not None and "complete" in states:
            whole = torn_reported()
        assert whole, (i, states)
        if with_previous:
            assert old == before
    # The next full run completes and removes the temporary files of the killed runs.
    reset(False)
    code, _ = run_forked(argv)
    assert code == 0
    assert [digest(o) for o in outputs] == complete
    assert leftovers(tmp_path) == [], leftovers(tmp_path)
    assert killed >= POINTS // 2, f"only {killed} of {POINTS} runs were killed mid-run"


@pytest.fixture
def tensors(tmp_path: Path) -> Path:
    path = tmp_path / "src.npz"
    rng = np.random.default_rng(7)
    np.savez(
        path,
        a=rng.standard_normal(1_500_000).astype(np.float32),
        b=rng.standard_normal((300, 1000)).astype(np.float32),
    )
    return path


@pytest.mark.parametrize("dest", ["out.zt", "out.safetensors", "out.npz", "out.stb", "out.npy"])
def test_convert_survives_sigkill(tmp_path: Path, tensors: Path, dest: str) -> None:
    out = tmp_path / dest
    argv = ["convert", str(tensors), str(out)] + (["--select", "a"] if dest == "out.npy" else [])
    # STB writes a set (data and the .stb.json sidecar); see docs/reliability.md.
    outputs = [out, Path(str(out) + ".json")] if dest == "out.stb" else [out]
    small = tmp_path / "small.npz"
    np.savez(small, a=np.ones(10, dtype=np.float32), b=np.ones((1, 2), dtype=np.float32))

    def previous() -> None:
        extra = ["--select", "a"] if dest == "out.npy" else []
        assert run_cli("convert", str(small), str(out), *extra).code == 0

    def torn_reported() -> bool:
        # docs/reliability.md: a set killed after its commit point is completed by the next
        # run; until then verify reports TORN_SET.
        run = run_cli("verify", str(out))
        return run.code == 1 and "TORN_SET" in run.stderr

    torn = torn_reported if dest == "out.stb" else None
    crash_campaign(tmp_path, argv, outputs, previous, torn_reported=torn)
    assert run_cli("verify", str(out)).code == 0


EMBD_META = {
    "model_name": "m",
    "model_version": "1.0.0",
    "embedding_dim": "1000",
    "vocab_size": "300",
    "num_layers": "1",
    "num_attention_heads": "1",
    "hidden_size": "1000",
    "intermediate_size": "4",
    "max_position_emb": "8",
    "created_at": "2026-01-01T00:00:00Z",
}


@pytest.mark.parametrize(
    "dest, extra",
    [
        ("out.weights", [a for k, v in EMBD_META.items() for a in ("--meta", f"{k}={v}")]),
        ("out.zt", ["--zt-version", "2"]),
        ("out.gguf", ["--meta", "general.architecture=test"]),
    ],
    ids=["embd", "ztensor2", "gguf"],
)
def test_convert_to_embd_ztensor2_and_gguf_survives_sigkill(
    tmp_path: Path, dest: str, extra: list[str]
) -> None:
    """The destinations of convert the first campaign left out: EMBD `.weights` (it needs
    the --meta values), zTensor 2 and GGUF."""
    out = tmp_path / dest
    big = tmp_path / "big.npz"  # 4x the shared input: these writers copy fast, and the kill
    rng = np.random.default_rng(8)  # points must land inside the writing on a loaded machine
    np.savez(big, a=rng.standard_normal(6_000_000).astype(np.float32),
             b=rng.standard_normal((1200, 1000)).astype(np.float32))  # fmt: skip
    argv = ["convert", str(big), str(out), *extra]
    small = tmp_path / "small.npz"
    np.savez(small, a=np.ones(10, dtype=np.float32), b=np.ones((1, 2), dtype=np.float32))

    def previous() -> None:
        assert run_cli("convert", str(small), str(out), *extra).code == 0

    crash_campaign(tmp_path, argv, [out], previous)
    assert run_cli("verify", str(out)).code == 0


def test_pack_atoms_and_svgt_survive_sigkill(tmp_path: Path) -> None:
    ids = tmp_path / "ids.txt"
    ids.write_text(" ".join(str(i % 50_000) for i in range(100_000)))
    atoms = tmp_path / "a.atoms"
    crash_campaign(tmp_path, ["pack", "atoms", str(ids), "-n", "8", "-o", str(atoms)], [atoms])
    assert run_cli("verify", str(atoms)).code == 0
    grid = tmp_path / "scx_golden.svgt"
    crash_campaign(tmp_path, ["pack", "svgt", str(atoms), "-o", str(grid), "--grid", "2x4"], [grid])
    assert run_cli("verify", str(grid)).code == 0


def test_tokenize_to_a_file_survives_sigkill(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox, jumps over the lazy dog. 0123456789\n" * 8_000)
    out = tmp_path / "t.mxt"
    crash_campaign(tmp_path, ["tokenize", "pi", "encode", str(text), "-o", str(out)], [out])
    assert run_cli("verify", str(out)).code == 0


def test_scx_shard_packing_survives_sigkill(tmp_path: Path) -> None:
    import json as _json

    from tests.helpers import scx_golden

    key = tmp_path / "pi.key"
    assert run_cli("tokenize", "scx", "keygen", "-o", str(key)).code == 0
    src = tmp_path / "src.json"
    src.write_text(_json.dumps(scx_golden.SOURCE))
    reg = tmp_path / "reg.scxr"
    assert run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(key)).code == 0
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 2)
    out = tmp_path / "pack"
    argv = ["pack", "shards", str(blob), "-o", str(out), "-r", str(reg), "--trust",
            str(key) + ".pub", "--created-at", "2024-01-31T12:00:00Z", "--force"]  # fmt: skip
    small = tmp_path / "small.bin"
    small.write_bytes(bytes(range(64)))

    def previous() -> None:
        args = [str(small) if a == str(blob) else a for a in argv]
        assert run_cli(*args).code == 0

    crash_campaign(tmp_path, argv, [out], previous)
    env = {"MATRIXCTL_SCX_TRUST": str(key) + ".pub"}
    assert run_cli("verify", str(out / "manifest.json"), env=env).code == 0


def test_scx_encode_to_a_file_survives_sigkill(tmp_path: Path) -> None:
    import json as _json

    from tests.helpers import scx_golden

    key = tmp_path / "pi.key"
    assert run_cli("tokenize", "scx", "keygen", "-o", str(key)).code == 0
    src = tmp_path / "src.json"
    src.write_text(_json.dumps(scx_golden.SOURCE))
    reg = tmp_path / "reg.scxr"
    assert run_cli("tokenize", "scx", "sign", str(src), "-o", str(reg), "--key", str(key)).code == 0
    text = tmp_path / "t.txt"
    text.write_bytes(b"the quick brown fox 0000 then more " * 60_000)
    out = tmp_path / "t.scx"
    argv = ["tokenize", "scx", "encode", str(text), "-r", str(reg), "--trust",
            str(key) + ".pub", "-o", str(out)]  # fmt: skip
    crash_campaign(tmp_path, argv, [out])
    assert run_cli("verify", str(out), env={"MATRIXCTL_SCX_TRUST": str(key) + ".pub"}).code == 0


GGUF = Path(__file__).resolve().parents[2] / "fixtures" / "gguf" / "ggml-vocab-llama-spm.gguf"


def test_ingest_gguf_survives_sigkill(tmp_path: Path) -> None:
    """Destination absent, or a previous pack (of another model) in place."""
    from tests.helpers import ggufcraft

    out = tmp_path / "tok"
    other = tmp_path / "other.gguf"
    ggufcraft.write_model(str(other), extra=False, embd_type="Q8_0")

    def previous() -> None:
        assert run_cli("ingest", "gguf", str(other), "-o", str(out)).code == 0

    argv = ["ingest", "gguf", str(GGUF), "-o", str(out)]
    crash_campaign(tmp_path, argv, [out], previous)
    assert run_cli("verify", str(out)).code == 0


CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"


def test_ingest_merge_survives_sigkill(tmp_path: Path) -> None:
    parts = []
    for i in range(2):
        part = tmp_path / f"part{i}"
        run = run_cli("ingest", "docs", str(CORPUS), "-o", str(part), "--shard", f"{i}/2")
        assert run.code == 0, run.stderr
        parts.append(str(part))
    out = tmp_path / "m"
    crash_campaign(tmp_path, ["ingest", "merge", *parts, "-o", str(out)], [out])
    assert run_cli("verify", str(out)).code == 0
