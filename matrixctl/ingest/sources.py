"""The inputs of `ingest docs`: which files, in which order, and which shard takes each.

Order: the SRC arguments in the order given; inside a folder, every file below it sorted by its
relative path as UTF-8 bytes (so the file system's listing order never matters). Hidden names
(starting with `.`) and symbolic links inside folders are skipped; a file named directly is
always taken. The pack being written is never read. Each file gets an ordinal (its position in
this list) and a recorded path (`SRC/relative/path` with `/` separators), the key for shards:
`--shard I/N` takes the files whose SHA-256 of the recorded path, read as a big-endian integer
from its first 8 bytes, is I modulo N.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

from matrixctl import codes
from matrixctl.errors import InputError, UsageError, from_os_error

MAX_FILES = 10_000_000


@dataclass(frozen=True)
class SourceFile:
    ordinal: int
    path: str  # path to open
    recorded: str  # path written in the manifest (as given, '/' separated)
    size: int
    named: bool  # named on the command line (not found in a folder walk)


@dataclass(frozen=True)
class Skipped:
    recorded: str
    reason: str
    code: str | None = None  # the error's code when --on-error skip left it out


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.split("/")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise UsageError(f"--shard must look like I/N (for example 0/4), got {text!r}")
    index, count = int(parts[0]), int(parts[1])
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"--shard {text}: need 0 <= I < N and N >= 1")
    return index, count


def shard_of(recorded: str, count: int) -> int:
    digest = hashlib.sha256(recorded.encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") % count


def _display(path: str) -> str:
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def enumerate_sources(
    srcs: list[str], exclude: list[str], on_error: str = "fail"
) -> tuple[list[SourceFile], list[Skipped]]:
    """Every input file in the deterministic order; `exclude` are folders never read.

    Inside a folder, a file or subfolder that cannot be read stops the listing, or with
    `on_error="skip"` is listed in `skipped` with the error's code."""
    excluded = {os.path.realpath(p) for p in exclude}
    files: list[SourceFile] = []
    skipped: list[Skipped] = []
    seen: set[str] = set()

    def add(path: str, recorded: str, size: int, named: bool, real: str | None = None) -> None:
        real = os.path.realpath(path) if real is None else real
        if real in seen:
            skipped.append(Skipped(_display(recorded), "duplicate of an earlier input"))
            return
        seen.add(real)
        if len(files) >= MAX_FILES:
            raise UsageError(f"more than {MAX_FILES:,} input files; split the ingest with --shard")
        files.append(SourceFile(len(files), path, _display(recorded), size, named))

    for src in srcs:
        if src == "-":
            files.append(SourceFile(len(files), "-", "-", 0, True))  # stdin: one stream
            continue
        try:
            st = os.stat(src)
        except OSError as exc:
            raise from_os_error(exc, src) from None
        if stat.S_ISREG(st.st_mode):
            add(src, src, st.st_size, True)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(codes.IO_READ, "not a regular file or folder", path=src)
        base = src.rstrip("/") or "/"
        # The walk neither follows nor takes symbolic links, so below the folder's own real
        # path every file's real path is that path joined with its relative path.
        real_src = os.path.realpath(src)
        for rel in _walk(src, excluded, skipped, base, on_error):
            full = os.path.join(src, rel)
            try:
                size = os.lstat(full).st_size
            except OSError as exc:
                err = from_os_error(exc, full)
                if on_error != "skip":
                    raise err from None
                skipped.append(Skipped(_display(f"{base}/{rel}"), err.message, err.code))
                continue
            recorded = f"{base}/{rel}" if base != "/" else f"/{rel}"
            add(full, recorded, size, False, os.path.join(real_src, rel))
    return files, skipped


def _walk(
    root: str, excluded: set[str], skipped: list[Skipped], base: str, on_error: str = "fail"
) -> list[str]:
    """Relative paths of the regular files below `root`, sorted as UTF-8 bytes."""
    out: list[str] = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        folder = os.path.join(root, rel_dir) if rel_dir else root
        if os.path.realpath(folder) in excluded:
            continue
        try:
            entries = list(os.scandir(folder))
        except OSError as exc:
            err = from_os_error(exc, folder)
            if on_error != "skip" or not rel_dir:
                raise err from None
            where = _display(f"{base}/{rel_dir}")
            skipped.append(Skipped(where, f"unreadable folder: {err.message}", err.code))
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.name.startswith("."):
                continue
            if entry.is_symlink():
                skipped.append(Skipped(_display(f"{base}/{rel}"), "symbolic link"))
                continue
            if entry.is_dir(follow_symlinks=False):
                pending.append(rel)
            elif entry.is_file(follow_symlinks=False):
                out.append(rel)
            else:
                skipped.append(Skipped(_display(f"{base}/{rel}"), "not a regular file"))
    out.sort(key=lambda r: r.encode("utf-8", "surrogateescape"))
    return out
