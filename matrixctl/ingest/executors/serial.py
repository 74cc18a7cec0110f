"""The serial executor (`--jobs 1`): every unit in this process, in input order.

Its tricks (docs/benchmarks.md, "ingest --jobs 1"): a large JSON Lines file as stored is read
once, its pieces handed over with their bytes (`Cutting.keep_stored`); a compressed one is
decompressed on a helper thread while the piece before is tokenized (`Cutting.ahead`); a
Parquet file is decoded ahead and its hash finished while its last piece is tokenized
(`Step.ahead`, `Cutting.defer_hash`); and under `--on-error fail` a unit's tokens past what
it keeps in memory go straight into the pack (`WriteThrough`): the units run in input order in
the writer's own process, so everything before them is written already, and a failure ends the
build (no unit's tokens have to be held back in case it is skipped).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from matrixctl.ingest import units
from matrixctl.ingest.executors import Output, plan
from matrixctl.ingest.sources import SourceFile
from matrixctl.ingest.step import FileResult, Step, TokenSink, process_file, process_piece

if TYPE_CHECKING:
    import numpy as np

CUTTING = units.Cutting(keep_stored=True, ahead=True, defer_hash=True)


class WriteThrough(TokenSink):
    """Tokens past a unit's memory go to the pack's writer at once."""

    def __init__(self, write: Callable[[list[np.ndarray]], None]) -> None:
        self.write = write

    def overflow(self, parts: list[np.ndarray]) -> bool:
        self.write(parts)
        return True


def _prefetch_parquet(unit: Any, step: Step) -> None:
    """Start decoding `unit` now when it is the first piece of a Parquet file."""
    if isinstance(unit, units.Piece) and unit.kind == "parquet" and unit.index == 0 and unit.groups:
        from matrixctl.ingest.kinds import columnar

        columnar.prefetch(
            unit.source.path, unit.source.recorded, step.opts.text_field, unit.groups[0]
        )


class Serial:
    def __init__(self, step: Step) -> None:
        self.step = step

    def results(self, files: list[SourceFile], out: Output) -> Iterator[FileResult]:
        step = dataclasses.replace(
            self.step, spill_dir=out.spill_dir, ahead=True, on_bytes=out.within
        )
        if step.on_error == "fail":
            step.sink = WriteThrough(out.write_through)
        work = plan(files, step, 1, CUTTING)
        try:
            following = next(work, None)
            while following is not None:
                unit, following = following, None
                if isinstance(unit, units.Piece) and unit.kind == "parquet" and unit.last:
                    # The next unit is cut now: a Parquet file's first piece starts decoding
                    # while this last piece of the file before is tokenized.
                    following = next(work, None)
                    _prefetch_parquet(following, step)
                if isinstance(unit, units.Piece):
                    yield process_piece(unit, step)
                else:
                    for sf in unit:
                        yield process_file(sf, step)
                if following is None:
                    following = next(work, None)
        finally:
            if "matrixctl.ingest.kinds.columnar" in sys.modules:  # a Parquet file's decoder
                sys.modules["matrixctl.ingest.kinds.columnar"].release_readers()

    def report(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        pass
