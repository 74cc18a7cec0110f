"""Putting a finished output folder in place, and cleaning what killed runs left behind.

Contract (docs/reliability.md, "Ingest packs"):

* A writer builds its folder under a hidden sibling name that carries its owner
  (`matrixctl.io.sibling_temp_name`: `.NAME.mxPID-START-HOST-RANDOM.tmp`); the fallback's old
  folder is `.NAME.old.mxPID-START-HOST-RANDOM.tmp` (`matrixctl.io.aside_name`), so
  `verify` of the folder holding it reports it as STALE_TEMP when its owner is dead.
* The folder is complete, manifest included, before it is published. Publishing is one
  `renameat2(RENAME_EXCHANGE)` when PACKDIR exists (readers see the old or the new folder,
  never none), or one `rename` when it does not. Where the exchange is not supported the
  old folder is first renamed aside, then the new one into place.
* Every run that writes PACKDIR first removes the temporary and set-aside siblings whose
  owner is dead; a dead set-aside folder whose PACKDIR is missing (a kill between the two
  fallback renames) is renamed back to PACKDIR first, so the previous version is never lost.
  Set-aside names of earlier versions (`.NAME.PID-START.RANDOM.old`) are handled alike.
"""

from __future__ import annotations

import contextlib
import os
import shutil

from matrixctl.errors import from_os_error

RENAME_EXCHANGE = 2
AT_FDCWD = -100


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    try:
        # Field 22; the command name (field 2) may hold spaces, so split after its ')'.
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def owner_tag() -> str:
    pid = os.getpid()
    return f"{pid}-{_start_time(pid) or 0}"


def temp_name(dest: str, kind: str = "tmp") -> str:
    folder = os.path.dirname(os.path.abspath(dest))
    base = os.path.basename(os.path.abspath(dest))
    return os.path.join(folder, f".{base}.{owner_tag()}.{os.urandom(6).hex()}.{kind}")


def make_temp_dir(dest: str, holder: list[str]) -> str:
    """Create the owner-tagged temporary folder beside `dest` (`matrixctl.io.make_temp_dir`,
    `.NAME.mxPID-START-HOST-RANDOM.tmp`); its name is in `holder` before it exists."""
    from matrixctl import io

    return io.make_temp_dir(dest, holder)


def clean_stale(dest: str) -> list[str]:
    """Remove the temporary siblings of `dest` left by dead runs; return their names.

    A dead set-aside folder (`.NAME.old.mx...tmp`, or `.NAME.PID-START.RANDOM.old` of earlier
    versions) whose `dest` is missing is renamed back to `dest` instead (the previous version,
    moved aside by a run killed before it put the new one in place)."""
    from matrixctl import io

    folder = os.path.dirname(os.path.abspath(dest))
    base = os.path.basename(os.path.abspath(dest))
    before = {os.path.basename(p) for p, _pid in io.stale_temps(folder, base + ".old")}
    restored = io.restore_aside(dest)
    removed = sorted(
        n
        for n in before
        if not os.path.lexists(os.path.join(folder, n))
        and (restored is None or n != os.path.basename(restored))
    )
    for path, _pid in io.stale_temps(folder, base):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(os.path.basename(path))
    return removed


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically; False when the system or file system cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL, EOPNOTSUPP: use the two renames
        return False
    raise OSError(err, os.strerror(err), b)


def _sync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish(tmp: str, dest: str) -> None:
    """Put the complete folder `tmp` at `dest`, replacing what is there (checked by the caller).
    On success `tmp` no longer exists; the replaced folder is removed."""
    _sync_dir(tmp)
    parent = os.path.dirname(os.path.abspath(dest))
    old = None
    try:
        if not os.path.lexists(dest):
            os.rename(tmp, dest)
        elif _exchange(tmp, dest):
            old = tmp  # now holds the previous folder
        else:
            from matrixctl import io

            old = io.aside_name(dest)  # `.NAME.old.mx...tmp`: verify FOLDER reports it
            os.rename(dest, old)
            try:
                os.rename(tmp, dest)
            except OSError:
                with contextlib.suppress(OSError):
                    os.rename(old, dest)  # put the old folder back
                old = None
                raise
    except OSError as exc:
        raise from_os_error(exc, dest, writing=True) from None
    _sync_dir(parent)
    if old is not None:
        from matrixctl import io

        io.discard_aside(old, dest)
