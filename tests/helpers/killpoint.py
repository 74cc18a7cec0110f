"""Run `matrixctl ARGS` and SIGKILL it at its Nth file-system step (a test driver).

    python -m tests.helpers.killpoint N COUNTFILE ARGS...

Every call of the steps a writer takes (open for writing, write through a file object is not
counted, fsync, mkdir, rename, exchange, rmtree, unlink) counts as one step; at step N the
process sends itself SIGKILL, so it dies exactly there with nothing cleaned up. N = 0 never
kills: the run's total number of steps is written to COUNTFILE at exit, to choose the points.
"""

from __future__ import annotations

import atexit
import builtins
import os
import shutil
import signal
import sys
from typing import Any

STEP = 0


def main() -> int:
    target = int(sys.argv[1])
    countfile = sys.argv[2]
    args = sys.argv[3:]

    def step() -> None:
        global STEP
        STEP += 1
        if target == STEP:
            os.kill(os.getpid(), signal.SIGKILL)

    def counted(fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            step()
            result = fn(*a, **k)
            step()
            return result

        return wrapper

    real_open = builtins.open

    def open_(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        if any(c in mode for c in "wax+"):
            step()
        return real_open(file, mode, *a, **k)

    builtins.open = open_
    for name in ("rename", "replace", "mkdir", "fsync", "unlink", "rmdir"):
        setattr(os, name, counted(getattr(os, name)))
    shutil.rmtree = counted(shutil.rmtree)  # type: ignore[assignment]

    from matrixctl.ingest import swap

    swap._exchange = counted(swap._exchange)  # type: ignore[attr-defined]

    if target == 0:

        def record() -> None:
            with real_open(countfile, "w") as fp:
                fp.write(str(STEP))

        atexit.register(record)
    from matrixctl.cli.app import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    sys.exit(main())
