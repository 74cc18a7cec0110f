"""Executors of `ingest docs`: where the work units run.

Every executor is an `Executor`: given the inputs in order, it yields each unit's results in
input order, so the one writer (`ingest/writer.py`) builds the same pack whatever runs them.
Each hands the planner its own `units.Cutting` and the step its own `step.TokenSink`; its I/O
tricks stay inside it.

- `serial`: the units one after the other in this process (`--jobs 1`);
- `processes`: N forked worker processes, tokens back through shared memory (`--jobs N`);
- `dask`: units as tasks on a Dask cluster, staged beside the pack (`--executor dask`).

Adding an executor is one module here with a class of this shape and one line in `start`
(docs/architecture.md, "Adding an executor").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from matrixctl.ingest import units
from matrixctl.ingest.sources import SourceFile

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.ingest.step import FileResult, Step

NAMES = ("local", "dask")  # --executor: local is serial for --jobs 1, processes above


class Output(Protocol):
    """What an executor may ask of the writer it feeds."""

    spill_dir: str  # the pack's temporary folder, for files the writer consumes
    within: Callable[[int], None] | None  # progress inside one file (bytes read of it)

    def write_through(self, parts: list[np.ndarray]) -> None:
        """Tokens of the unit being tokenized, written to the pack now (serial executor)."""


class Executor(Protocol):
    def results(self, files: list[SourceFile], out: Output) -> Iterator[FileResult]:
        """Each unit's results, in input order."""

    def report(self) -> dict[str, Any] | None:
        """What the summary says of the executor (None: nothing)."""

    def close(self) -> None:
        """Stop its workers; called once, also after an error."""


def plan(files: list[SourceFile], step: Step, jobs: int, cutting: units.Cutting) -> Iterator[Any]:
    """The work units of `files` for an executor of `jobs` workers cutting as `cutting` says."""
    assert step.tok is not None
    followers = None if step.opts.encoding_errors == "skip-file" else step.tok.cut_followers
    return units.plan(
        files,
        jobs,
        cutting,
        can_cut=step.on_error == "fail",
        split=lambda sf: units.split_file(sf, step.opts, cutting, followers),
    )


def start(
    name: str,
    step: Step,
    jobs: int,
    *,
    out_dir: str,
    scheduler: str | None,
    resume: bool,
    recipe: Any,
) -> Executor:
    """The executor for --executor/--jobs, started (worker processes forked, a Dask cluster
    being started) while the caller lists the inputs."""
    if name == "dask":
        from matrixctl.ingest.executors.dask import DaskExecutor

        return DaskExecutor(step, jobs, out_dir, scheduler, resume, recipe)
    if step.tok is None:
        step.tok = recipe.build()
    if jobs > 1:
        from matrixctl.ingest.executors.processes import Processes

        return Processes(step, jobs)
    from matrixctl.ingest.executors.serial import Serial

    return Serial(step)
