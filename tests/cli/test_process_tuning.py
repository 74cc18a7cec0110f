"""The command's own process settings: the allocator kept warm for streaming commands."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from typing import Any

import pytest

from matrixctl.cli import common
from tests.helpers.cli import ROOT


class _Mallopt:
    argtypes: Any = None

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


class _FakeLibc:
    def __init__(self) -> None:
        self.mallopt = _Mallopt()
        self.calls = self.mallopt.calls


@pytest.fixture
def libc(monkeypatch: pytest.MonkeyPatch) -> _FakeLibc:
    fake = _FakeLibc()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: fake)
    return fake


def test_the_allocator_keeps_freed_memory_below_32_mib_and_256_mib(libc: _FakeLibc) -> None:
    assert common.keep_freed_memory({}) is True
    # M_MMAP_THRESHOLD (-3), M_TRIM_THRESHOLD (-1).
    assert libc.calls == [(-3, 32 << 20), (-1, 256 << 20)]


def test_a_setting_from_the_users_environment_is_kept(libc: _FakeLibc) -> None:
    assert common.keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0"}) is True
    assert libc.calls == [(-3, 32 << 20)]
    libc.calls.clear()
    env = {"MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_MMAP_THRESHOLD_": "65536"}
    assert common.keep_freed_memory(env) is True
    assert libc.calls == []


def test_without_mallopt_nothing_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_libc(name: Any) -> Any:
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert common.keep_freed_memory({}) is False


FAULTS = """
import resource, sys
from matrixctl.cli.common import keep_freed_memory
if sys.argv[1] == "tuned" and not keep_freed_memory({}):
    print("untuned")
    raise SystemExit
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for mib in range(1, 21):  # growing blocks, each freed before the next: a batch's buffers
    block = b"x" * (mib << 20)
    del block
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    """The point of the setting: 20 growing blocks (1 to 20 MiB, 210 MiB in all) freed one
    after the other cost a page fault per page each time by default (each is a fresh
    mapping), and little more than the largest once the heap keeps them."""

    def faults(mode: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", FAULTS, mode],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout.strip()

    tuned, plain = faults("tuned"), faults("plain")
    if tuned == "untuned":
        pytest.skip("no glibc mallopt")
    pages = (210 << 20) // 4096
    assert int(plain) > pages // 2  # every block faulted in again
    assert int(tuned) < pages // 4  # about the largest block's pages once


# `tokenize pi encode|decode`: tuned for a large regular file only ---------------------------------


def test_tokenize_tunes_the_allocator_for_a_large_file_only(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(common, "keep_freed_memory", lambda: calls.append(True) or True)
    large = tmp_path / "large.txt"
    large.write_bytes(b"the quick brown fox\n" * (common.LARGE_INPUT // 20 + 1))
    small = tmp_path / "small.txt"
    small.write_bytes(b"one line\n")
    assert common.tune_for_input(str(large)) is True
    assert calls == [True]
    assert common.tune_for_input(str(small)) is False
    assert common.tune_for_input(str(tmp_path / "missing.txt")) is False
    assert common.tune_for_input(str(tmp_path)) is False  # a folder: the command refuses it
    assert calls == [True]


@pytest.mark.parametrize("command", ["encode", "decode"])
def test_both_pi_commands_ask_for_the_tuning(
    tmp_path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    from matrixctl.cli.app import main

    asked: list[str] = []
    monkeypatch.setattr(common, "tune_for_input", lambda path: asked.append(path) or False)
    src = tmp_path / "in.txt"
    src.write_bytes(b"1 2 3\n" if command == "decode" else b"some text\n")
    assert main(["tokenize", "pi", command, str(src), "-o", str(tmp_path / "out"), "-q"]) == 0
    assert asked == [str(src)]


def test_stdin_is_tuned_when_stdin_is_a_large_file(tmp_path) -> None:
    probe = (
        "from matrixctl.cli import common\n"
        "common.keep_freed_memory = lambda: True\n"
        "print(common.tune_for_input('-'))\n"
    )
    large = tmp_path / "large.txt"
    large.write_bytes(b"x" * common.LARGE_INPUT)

    def tuned(stdin: Any) -> str:
        return subprocess.run(
            [sys.executable, "-c", probe],
            stdin=stdin,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout.strip()

    with large.open("rb") as fp:
        assert tuned(fp) == "True"
    assert tuned(subprocess.PIPE) == "False"  # a pipe: its size is not known
