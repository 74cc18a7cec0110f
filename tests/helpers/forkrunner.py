"""A single-threaded helper for tests/reliability/test_crash.py: imports matrixctl once, then
for each
request line (JSON: argv, kill_after) forks a child that runs the command, SIGKILLs it after
`kill_after` seconds (when given) and answers one JSON line (code or null when killed, took).
Forking here, not in the (multi-threaded) pytest worker, keeps the children free of locks
held by other threads."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import matrixctl.cli.app
from matrixctl.cli import docgen

# Imported and built once, before any fork: the commands are built on first use (cli/lazy.py),
# and a child that had to do it would spend its first milliseconds importing.
docgen.commands()
assert matrixctl.cli.app.command_tree() is not None

TIMEOUT = 60.0


def run(argv: list[str], kill_after: float | None) -> dict[str, object]:
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        code = 99
        try:
            from matrixctl.cli.app import main

            code = main(argv)
        finally:
            os._exit(code)
    wait = TIMEOUT if kill_after is None else kill_after
    deadline = start + wait
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() >= deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.0005)
    took = time.perf_counter() - start
    code = None if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return {"code": code, "took": took, "hung": kill_after is None and code is None}


def serve() -> None:
    os.environ["MATRIXCTL_NO_FSYNC"] = "1"
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.write(json.dumps(run(req["argv"], req.get("kill_after"))) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
