"""The per-user cache folder of the tokenizers' built tables (the π maps' compiled matchers,
`pi_cache.py`; the byte-level BPE kernel's tables, `model/bpe_cache.py`) and the one way an
entry is written there. Imports nothing heavy: a cache hit must stay cheap."""

from __future__ import annotations

import contextlib
import os

ENV_DIR = "MATRIXCTL_CACHE_DIR"
ENV_OFF = "MATRIXCTL_NO_CACHE"


def cache_dir() -> str | None:
    """The cache folder, or None when the cache is turned off."""
    if os.environ.get(ENV_OFF, "") not in ("", "0"):
        return None
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME")
    if not base or not os.path.isabs(base):  # XDG: a relative path is invalid, ignore it
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "matrixctl")


def write_entry(path: str, *parts: bytes) -> None:
    """Write `parts` to `path` as one file: a temporary name in its folder (made 0700), then a
    rename, so a reader sees a whole entry or none. Best effort: an error leaves no file and
    costs only the cache."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        import tempfile

        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as fp:
            for part in parts:
                fp.write(part)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
