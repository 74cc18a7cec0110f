"""The reliability contracts of docs/reliability.md: full disks and size limits, damaged
integrity fields, key pairs whole or not at all, inputs that change underneath, stale
temporary files, bounded spooling."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.cli import ROOT, run_cli

TRACEBACK = "Traceback"


def sub(
    *args: str, fsize: int | None = None, stdout: int | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[bytes]:
    """`python -m matrixctl ARGS` in a subprocess, optionally with `ulimit -f` (bytes)."""

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, "-m", "matrixctl", *args],
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        preexec_fn=limit,
        check=False,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "MATRIXCTL_NO_FSYNC": "1"},
    )


@pytest.fixture
def npz(tmp_path: Path) -> Path:
    path = tmp_path / "src.npz"
    np.savez(path, x=np.arange(100_000, dtype=np.float32), y=np.ones(1000, dtype=np.float32))
    return path


# Full disks and size limits ------------------------------------------------------------------


@pytest.mark.parametrize("dest", ["out.npz", "out.zt", "out.safetensors", "out.stb"])
def test_efbig_is_an_output_error_and_leaves_nothing(tmp_path: Path, npz: Path, dest: str) -> None:
    """EFBIG (ulimit -f) while writing: one line with OUT_TOO_LARGE naming the destination,
    exit 2, no traceback (the .npz writer printed one from ZipFile.__del__), nothing left."""
    before = sorted(os.listdir(tmp_path))
    res = sub("convert", str(npz), str(tmp_path / dest), fsize=64 << 10)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert "error[OUT_TOO_LARGE]" in err and dest in err
    assert TRACEBACK not in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == before


def test_efbig_with_zstd_components_is_an_output_error(tmp_path: Path, npz: Path) -> None:
    """zTensor 1.1 with --compress zstd under `ulimit -f`: OUT_TOO_LARGE, not INTERNAL (zstd's
    "Src size is incorrect" from ending the frame replaced the write error), nothing left."""
    before = sorted(os.listdir(tmp_path))
    res = sub("convert", str(npz), str(tmp_path / "out.zt"), "--compress", "zstd", fsize=64 << 10)
    err = res.stderr.decode()
    assert res.returncode == 2, err
    assert "error[OUT_TOO_LARGE]" in err and "out.zt" in err
    assert TRACEBACK not in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == before


def test_enospc_with_zstd_components_is_an_output_error(
    tmp_path: Path, npz: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC while a zstd component is written (injected at the file the compressor writes
    to): OUT_NO_SPACE naming the output, exit 2, no temporary file left."""
    import errno

    from matrixctl.formats import ztensor

    class Full:
        def __init__(self, fp: object) -> None:
            self.fp = fp
            self.left = 16 << 10

        def write(self, data: bytes) -> int:
            n = memoryview(data).nbytes
            if n > self.left:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.left -= n
            return self.fp.write(data)  # type: ignore[attr-defined,no-any-return]

    real = ztensor._Counting.__init__

    def counting(self: ztensor._Counting, fp: object, digester: object) -> None:
        real(self, Full(fp), digester)  # type: ignore[arg-type]

    monkeypatch.setattr(ztensor._Counting, "__init__", counting)
    before = sorted(os.listdir(tmp_path))
    res = run_cli("convert", str(npz), str(tmp_path / "out.zt"), "--compress", "zstd")
    assert res.code == 2, res.stderr
    assert "error[OUT_NO_SPACE]" in res.stderr and "out.zt" in res.stderr
    assert TRACEBACK not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
@pytest.mark.parametrize("to", ["npz", "ztensor", "safetensors", "npy"])
def test_enospc_on_stdout_is_an_output_error(npz: Path, to: str) -> None:
    """ENOSPC on stdout (/dev/full): OUT_NO_SPACE, exit 2, not IO_READ."""
    args = ["convert", str(npz), "-", "--to", to] + (["--select", "x"] if to == "npy" else [])
    with open("/dev/full", "wb") as full:
        res = sub(*args, stdout=full.fileno())
    err = res.stderr.decode()
    assert res.returncode == 2 and "error[OUT_NO_SPACE]" in err, err
    assert TRACEBACK not in err


def test_keygen_under_a_full_disk_leaves_no_half_pair(tmp_path: Path) -> None:
    """A key pair appears whole or not at all: with no room for any byte (ulimit -f 0) keygen
    fails with an output code and leaves neither file, so a rerun needs no --force."""
    key = tmp_path / "pi.key"
    res = sub("tokenize", "scx", "keygen", "-o", str(key), fsize=0)
    err = res.stderr.decode()
    assert res.returncode == 2 and "error[OUT_TOO_LARGE]" in err, err
    assert os.listdir(tmp_path) == []
    again = run_cli("tokenize", "scx", "keygen", "-o", str(key))
    assert again.code == 0 and key.exists() and Path(str(key) + ".pub").exists()


def test_keygen_refuses_when_either_file_exists(tmp_path: Path) -> None:
    key = tmp_path / "pi.key"
    Path(str(key) + ".pub").write_text("someone's\n")
    res = run_cli("tokenize", "scx", "keygen", "-o", str(key))
    assert res.code == 2 and not key.exists()
    assert Path(str(key) + ".pub").read_text() == "someone's\n"


# Damaged integrity fields --------------------------------------------------------------------


def _zt(tmp_path: Path, npz: Path) -> Path:
    dest = tmp_path / "a.zt"
    assert run_cli("convert", str(npz), str(dest)).code == 0
    return dest


def test_an_unknown_digest_algorithm_fails_verify(tmp_path: Path, npz: Path) -> None:
    """crc32c -> crc32d plus a damaged payload: verify exits 1 (it exited 0 before), and
    --allow-unknown-digest relaxes the unknown algorithm to a warning."""
    path = _zt(tmp_path, npz)
    data = bytearray(path.read_bytes())
    at = data.index(b"crc32c:")
    data[at + 5] = ord("d")
    data[200] ^= 0xFF  # inside the first tensor's payload
    path.write_bytes(bytes(data))
    res = run_cli("verify", str(path))
    assert res.code == 1 and "ZT_DIGEST_UNKNOWN" in res.stderr
    relaxed = run_cli("verify", "--allow-unknown-digest", str(path))
    assert relaxed.code == 0 and "ZT_DIGEST_UNKNOWN" in relaxed.stderr


# Inputs that change underneath ---------------------------------------------------------------

SIGBUS_SCRIPT = """
import os, sys
from matrixctl import io
path, dest = sys.argv[1], sys.argv[2]
src = io.Source.open(path)
target = io.AtomicFile(dest)
target.create().write(b"partial")
os.truncate(path, 10)
sys.stdout.write(str(src.buf[len(src.buf) - 1]))  # a page past the new end: SIGBUS
"""


def test_a_mapped_input_truncated_underneath_is_io_changed_not_sigbus(tmp_path: Path) -> None:
    """Reading a page of a mapped input past its new end raises SIGBUS; the guard turns it into
    one IO_CHANGED line naming the file, exit 2, and removes this process's temporary output
    (without it: "Bus error", exit 135, the temporary file left behind)."""
    path = tmp_path / "in.bin"
    path.write_bytes(bytes(1 << 20))
    proc = subprocess.run(
        [sys.executable, "-c", SIGBUS_SCRIPT, str(path), str(tmp_path / "out.bin")],
        capture_output=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2, (proc.returncode, err)
    assert f"error[IO_CHANGED]: {path}: truncated from 1,048,576 to 10 bytes" in err
    assert sorted(os.listdir(tmp_path)) == ["in.bin"]


@pytest.mark.parametrize("change", ["truncate", "extend", "rewrite"])
def test_no_output_appears_from_an_input_that_changed(tmp_path: Path, change: str) -> None:
    """An atomic output is not renamed into place when a mapped input was truncated,
    extended or rewritten in place since it was opened: IO_CHANGED naming the input."""
    from matrixctl import io
    from matrixctl.errors import InputError

    path = tmp_path / "in.bin"
    path.write_bytes(bytes(range(256)) * 64)
    dest = tmp_path / "out.bin"
    with io.Source.open(str(path)) as src, pytest.raises(InputError) as info:  # noqa: SIM117
        with io.atomic_output(str(dest)) as fp:
            fp.write(bytes(src.buf[:100]))
            if change == "truncate":
                os.truncate(path, 100)
            elif change == "extend":
                with open(path, "ab") as more:
                    more.write(b"x")
            else:
                with open(path, "r+b") as same:
                    same.write(b"\xff")
                st = path.stat()
                os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert info.value.code == io.IO_CHANGED and info.value.path == str(path)
    assert sorted(os.listdir(tmp_path)) == ["in.bin"]


def test_an_input_replaced_by_rename_gives_the_old_version_whole(tmp_path: Path) -> None:
    """A file renamed over the input path while it is read is not a change: the mapping holds
    the old inode, so the output is the old version, whole."""
    from matrixctl import io

    path = tmp_path / "in.bin"
    path.write_bytes(b"old" * 100)
    dest = tmp_path / "out.bin"
    with io.Source.open(str(path)) as src:
        (tmp_path / "new.bin").write_bytes(b"new")
        os.replace(tmp_path / "new.bin", path)
        with io.atomic_output(str(dest)) as fp:
            fp.write(bytes(src.buf))
    assert dest.read_bytes() == b"old" * 100


# Temporary files of dead runs ----------------------------------------------------------------


def _dead_pid() -> int:
    """The pid of a process that has exited (reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _stale_name(tmp_path: Path, base: str, pid: int) -> Path:
    from matrixctl import io

    live = os.path.basename(io.sibling_temp_name(str(tmp_path / base)))
    # The same host tag and form, another (dead) owner.
    _, _, rest = live.partition(".mx")
    _pid, start, host_and_rand = rest.split("-", 2)
    return tmp_path / f".{base}.mx{pid}-{start}-{host_and_rand}"


def test_a_later_run_removes_the_temporary_files_of_dead_runs(tmp_path: Path, npz: Path) -> None:
    """Temporary names carry the owner's pid, start time and host: the next run writing the same
    destination removes those of dead runs, keeps other destinations' and live runs' ones."""
    dead = _stale_name(tmp_path, "out.zt", _dead_pid())
    dead.write_bytes(b"x" * 1000)
    other = _stale_name(tmp_path, "other.zt", _dead_pid())
    other.write_bytes(b"y")
    from matrixctl import io

    live = Path(io.sibling_temp_name(str(tmp_path / "out.zt")))  # this (live) process's
    live.write_bytes(b"z")
    assert stale_reported(tmp_path) == {dead.name, other.name}
    assert run_cli("convert", str(npz), str(tmp_path / "out.zt")).code == 0
    assert not dead.exists() and other.exists() and live.exists()
    assert stale_reported(tmp_path) == {other.name}


def stale_reported(folder: Path) -> set[str]:
    res = run_cli("verify", "--json", str(folder))
    (report,) = res.json()["files"]
    return {f["field"] for f in report["findings"] if f["code"] == "STALE_TEMP"}


def test_kill_then_rerun_leaves_no_stale_file(tmp_path: Path) -> None:
    """SIGKILL of convert mid-write leaves its temporary file; the next convert to the same
    destination removes it."""
    big = tmp_path / "big.npy"
    np.save(big, np.zeros(20_000_000, dtype=np.float32))
    dest = tmp_path / "out.zt"
    proc = subprocess.Popen(
        [sys.executable, "-m", "matrixctl", "convert", str(big), str(dest)],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MATRIXCTL_NO_FSYNC": "1"},
    )
    import time

    deadline = time.time() + 60
    while time.time() < deadline and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]:
        time.sleep(0.005)
    proc.kill()
    proc.wait()
    left = [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert left, "the writer never started"
    assert run_cli("convert", str(big), str(dest)).code == 0
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


# Bounded spooling ----------------------------------------------------------------------------


def test_verify_dev_zero_ends_with_a_clear_error() -> None:
    """`verify /dev/zero` used to spool without end (6.6 GB after 8 s): now SPOOL_LIMIT at the
    limit (here 8M), exit 2."""
    res = subprocess.run(
        [sys.executable, "-m", "matrixctl", "verify", "--spool-limit", "8M", "/dev/zero"],
        capture_output=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )
    err = res.stderr.decode()
    assert res.returncode == 2 and "SPOOL_LIMIT" in err and TRACEBACK not in err


@pytest.mark.parametrize(
    "args",
    [
        ["verify", "-"],
        ["inspect", "-"],
        ["convert", "-", "OUT/x.zt"],
        ["tokenize", "pi", "encode", "-", "-o", "OUT/t.bin"],
        ["pack", "atoms", "-", "-n", "4", "-o", "OUT/p.atoms"],
    ],
)
def test_stdin_longer_than_the_limit_is_refused(tmp_path: Path, args: list[str]) -> None:
    """Every command that reads stdin stops at MATRIXCTL_SPOOL_LIMIT with SPOOL_LIMIT, exit 2,
    and writes nothing."""
    argv = [a.replace("OUT", str(tmp_path)) for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "matrixctl", *argv],
        input=bytes(3 << 20),
        capture_output=True,
        check=False,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "MATRIXCTL_SPOOL_LIMIT": "1M"},
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "SPOOL_LIMIT" in err, err
    assert TRACEBACK not in err and os.listdir(tmp_path) == []


def test_a_bad_spool_limit_is_a_usage_error() -> None:
    res = run_cli("verify", "--spool-limit", "lots", "-", stdin=b"x")
    assert res.code == 2 and "USAGE" in res.stderr


def test_spooling_stops_when_the_temporary_folder_fills(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the free-space reserve of the temporary folder, spooling stops: SPOOL_NO_SPACE."""
    from matrixctl import io
    from matrixctl.errors import InputError

    monkeypatch.setattr(io, "_free_space", lambda fd: 1 << 20)
    with pytest.raises(InputError) as info:
        io.Source._spool("-", __import__("io").BytesIO(b"x" * 100))
    assert info.value.code == io.SPOOL_NO_SPACE


# Concurrency ---------------------------------------------------------------------------------


def test_two_writers_of_one_destination_leave_one_whole_winner(tmp_path: Path) -> None:
    """Two converts to one destination at once: the result is one of the two complete
    outputs, never a mix, and no temporary file is left."""
    srcs, wholes = [], []
    for i, n in enumerate((3_000_000, 2_000_000)):
        src = tmp_path / f"s{i}.npz"
        np.savez(src, x=np.full(n, i + 1, dtype=np.float32))
        srcs.append(src)
        ref = tmp_path / f"ref{i}.zt"
        assert run_cli("convert", str(src), str(ref)).code == 0
        wholes.append(ref.read_bytes())
    dest = tmp_path / "out.zt"
    for _ in range(3):
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "matrixctl", "convert", str(s), str(dest), "-q"],
                cwd=ROOT,
                env={**os.environ, "MATRIXCTL_NO_FSYNC": "1"},
            )
            for s in srcs
        ]
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
        assert dest.read_bytes() in wholes
        assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []


REPLACER = """
import os, sys, time
folder, dest, a, b = sys.argv[1:5]
end = time.time() + float(sys.argv[5])
i = 0
while time.time() < end:
    src = (a, b)[i % 2]
    tmp = os.path.join(folder, ".x.tmp")
    with open(src, "rb") as f, open(tmp, "wb") as g:
        g.write(f.read())
    os.replace(tmp, dest)
    i += 1
"""


def test_verify_while_a_file_is_replaced_sees_one_version_whole(tmp_path: Path) -> None:
    """A file renamed over (the way every matrixctl writer replaces one) while verify reads it:
    verify sees the old or the new file, whole, so a valid file is always valid."""
    a, b = tmp_path / "a.zt", tmp_path / "b.zt"
    for path, n in ((a, 200_000), (b, 300_000)):
        src = tmp_path / f"{path.stem}.npz"
        np.savez(src, x=np.arange(n, dtype=np.float32))
        assert run_cli("convert", str(src), str(path)).code == 0
    dest = tmp_path / "live.zt"
    dest.write_bytes(a.read_bytes())
    replacer = subprocess.Popen(
        [sys.executable, "-c", REPLACER, str(tmp_path), str(dest), str(a), str(b), "8"]
    )
    try:
        for _ in range(15):
            res = run_cli("verify", "-q", str(dest))
            assert res.code == 0, res.stderr
    finally:
        replacer.kill()
        replacer.wait()


PACK_SWAPPER = """
import os, shutil, sys, time
folder, dest, a, b = sys.argv[1:5]
end = time.time() + float(sys.argv[5])
i = 0
while time.time() < end:
    src = (a, b)[i % 2]
    new = os.path.join(folder, ".pack.mx1-0-0000-000000000000.tmp")
    old = os.path.join(folder, ".pack.old.mx1-0-0000-000000000001.tmp")
    shutil.copytree(src, new)
    os.rename(dest, old)  # the two renames of a writer replacing a folder
    os.rename(new, dest)
    shutil.rmtree(old)
    i += 1
    time.sleep(0.02)
"""


def test_verify_of_a_pack_while_it_is_replaced_is_never_corrupt(tmp_path: Path) -> None:
    """verify PACKDIR while another process replaces the pack (two renames) used to report
    PACK_INDEX/PACK_MISMATCH on a valid pack: a swap seen during the read is read again."""
    from tests.helpers.cli import ROOT as root

    corpus = root / "fixtures" / "corpus"
    packs = []
    for i in range(2):
        out = tmp_path / f"p{i}"
        args = ["ingest", "docs", str(corpus), "-o", str(out)]
        if i:
            args += ["--svgt", "16x16"]
        assert run_cli(*args).code == 0
        packs.append(out)
    dest = tmp_path / "pack"
    import shutil

    shutil.copytree(packs[0], dest)
    swapper = subprocess.Popen(
        [sys.executable, "-c", PACK_SWAPPER, str(tmp_path), str(dest), *map(str, packs), "10"]
    )
    try:
        for _ in range(8):
            res = run_cli("verify", "-q", str(dest))
            assert res.code == 0, res.stderr
    finally:
        swapper.kill()
        swapper.wait()
