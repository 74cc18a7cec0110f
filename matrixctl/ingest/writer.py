"""The one ordered writer of `ingest docs`: the executor's results, in input order, into one
pack (`ingest/pack.py`'s `PackBuilder`). The pack does not depend on the executor, on `--jobs`,
or on how the inputs were cut into units: every unit's tokens and records are appended in input
order, a file cut into pieces gets one manifest entry, and a plain text file cut into pieces
its one end-of-document token and record after its last piece.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.errors import FormatError, InputError
from matrixctl.ingest.executors import Executor
from matrixctl.ingest.sources import SourceFile, enumerate_sources, shard_of
from matrixctl.ingest.step import FileResult

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.ingest.pack import PackPlan

INGEST_NO_INPUT = codes.define(
    "INGEST_NO_INPUT", "The sources hold no file to ingest (in this shard).", group="ingest"
)
INGEST_NO_DOCUMENTS = codes.define(
    "INGEST_NO_DOCUMENTS",
    "The inputs hold no document at all (every file empty, skipped or without the text "
    "field); an empty pack would look like a successful build.",
    group="ingest",
)
SHARED_COPY = 1 << 16  # fewer tokens in a slot than this are copied into one larger write

Tick = Callable[[int, int, int], None]  # files, bytes, tokens done so far


class _Output:
    """What the executor may ask of the writer (`executors.Output`)."""

    def __init__(self, spill_dir: str, tokens: TokenBuffer, within: Callable[[int], None] | None):
        self.spill_dir = spill_dir
        self.write_through = tokens.write_through
        self.within = within


def write_pack(
    srcs: list[str],
    out_dir: str,
    plan: PackPlan,
    executor: Executor,
    *,
    options: dict[str, Any],
    shard: tuple[int, int] | None,
    serial: bool,
    tick: Tick | None,
) -> dict[str, Any]:
    """The inputs `srcs`, run by `executor`, into a complete pack at `out_dir` (written beside
    and published whole). `options` are recorded in the manifest; `serial`: the executor runs
    the units in this process (progress moves within a file, stdin is read where it is).
    Returns the summary."""
    from matrixctl.ingest.pack import PackBuilder

    on_error = options["on_error"]
    files, skipped = enumerate_sources(srcs, exclude=[out_dir], on_error=on_error)
    total = len(files)
    if shard is not None:
        files = [f for f in files if shard_of(f.recorded, shard[1]) == shard[0]]
    if not files and (shard is None or total == 0):
        raise InputError(
            INGEST_NO_INPUT,
            "no input files" + (f" in shard {shard[0]}/{shard[1]}" if shard else ""),
            path=", ".join(srcs),
        )
    started = time.monotonic()
    nbytes = ntokens = done = 0
    skipped_bytes = 0  # bytes of the files skipped while they were read
    within = None
    if tick is not None and serial:
        # --jobs 1: the bar moves with the bytes read inside each file.
        def within(n: int) -> None:
            assert tick is not None
            tick(done, nbytes + n, ntokens)

    with PackBuilder(out_dir, plan) as pb:
        if not serial and any(f.path == "-" for f in files):
            files = [_spool_stdin(f, pb.spill_dir) if f.path == "-" else f for f in files]
        tokens = TokenBuffer(pb)
        results = executor.results(files, _Output(pb.spill_dir, tokens, within))
        split_at = 0  # stored bytes of the file being read in pieces, already counted
        lines_before = 0  # lines of the file being read in pieces, before this piece
        for res in results:
            if res.piece is not None:
                if res.piece.first_line < 0:  # a piece whose lines its worker counted
                    lines_before = 0 if res.piece.index == 0 else lines_before
                    res.item_base = lines_before
                    lines_before += res.lines
                ntokens += res.tokens
                _append_piece(pb, res, tokens)
                nbytes += res.piece.stored_end - split_at
                split_at = 0 if res.piece.last else res.piece.stored_end
                done += res.piece.last
                if tick:
                    tick(done, nbytes, ntokens)
                continue
            done += 1
            nbytes += res.source.size
            if res.skip_reason is not None:
                skipped_bytes += res.source.size
                pb.skipped.append(
                    {
                        "path": res.source.recorded,
                        "reason": res.skip_reason,
                        "ordinal": res.source.ordinal,
                        "code": res.skip_code,
                    }
                )
            else:
                ntokens += res.tokens
                _append(pb, res, tokens)
            if tick:
                tick(done, nbytes, ntokens)
        tokens.flush()
        if shard is None and pb.index.docs == 0:
            raise FormatError(
                INGEST_NO_DOCUMENTS,
                f"the inputs hold no document ({len(files):,} files read, "
                f"{len(skipped) + len(pb.skipped):,} skipped); no pack is written",
                path=", ".join(srcs),
                hint="the manifest would list them: see the skipped files above, or --text-field",
            )
        tail = {
            "sources": pb.sources,
            "skipped": [
                {"path": s.recorded, "reason": s.reason, "ordinal": None, "code": s.code}
                for s in skipped
            ]
            + pb.skipped,
            "shard": (
                {"index": shard[0], "count": shard[1], "sources_total": total} if shard else None
            ),
            "options": options,
        }
        manifest = pb.finish(tail)
    elapsed = time.monotonic() - started
    # The counts of what was ingested, from the manifest (a file read in pieces is one source;
    # stdin's bytes are those read, its size not being known beforehand); skipped files are
    # counted apart, with their bytes where they were read, and so are the records skipped
    # inside the files that were ingested (no text field, a bad record with --on-error skip).
    ingested = manifest["sources"]
    return {
        "pack": out_dir,
        "files": len(ingested),
        "bytes": sum(s["bytes"] for s in ingested),
        "skipped_bytes": skipped_bytes,
        "skipped_records": sum(s.get("skipped_records", 0) for s in ingested),
        "documents": manifest["documents"],
        "tokens": manifest["tokens"],
        "atoms": manifest["atom_count"],
        "atom_size": manifest["atom_size"],
        "dtype": manifest["dtype"],
        "vocab_size": manifest["vocab_size"],
        "skipped": len(manifest["skipped"]),
        "skipped_files": [
            {"path": s["path"], "reason": s["reason"], "code": s["code"]}
            for s in manifest["skipped"]
        ],
        "hash": manifest["hash"],
        "seconds": round(elapsed, 3),
    }


class TokenBuffer:
    """In-memory token arrays of consecutive files, appended to the atoms in one write."""

    LIMIT = 1 << 20

    def __init__(self, pb: Any) -> None:
        self.pb = pb
        self.parts: list[np.ndarray] = []
        self.n = 0

    def add(self, ids: np.ndarray) -> None:
        self.parts.append(ids)
        self.n += ids.size
        if self.n >= self.LIMIT:
            self.flush()

    def flush(self) -> None:
        import numpy as np

        if self.parts:
            parts = self.parts
            self.parts, self.n = [], 0
            self.pb.add_tokens(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def write_through(self, parts: list[np.ndarray]) -> None:
        """Tokens of the unit being tokenized (the serial executor's `WriteThrough`): after
        the ones waiting here, part by part (no joined copy)."""
        self.flush()
        for part in parts:
            self.pb.add_tokens(part)


def _spool_stdin(sf: SourceFile, spill_dir: str) -> SourceFile:
    """With --jobs > 1, stdin is first copied as it is into the pack's temporary folder, so
    the workers can read it like a file (and a large JSON Lines stream is cut into pieces)."""
    import shutil

    from matrixctl.io import open_input_stream

    path = os.path.join(spill_dir, "stdin")
    with open_input_stream("-") as src, open(path, "wb") as out:  # bounded: --spool-limit
        shutil.copyfileobj(src, out, 1 << 20)
    return dataclasses.replace(sf, path=path, size=os.path.getsize(path))


def _append_piece(pb: Any, res: FileResult, tokens: TokenBuffer) -> None:
    """A piece's tokens and records; its counts go into its file's manifest entry."""
    assert res.piece is not None
    if res.piece.index == 0:
        _append(pb, res, tokens)
        if res.piece.kind == "text" and res.piece.last:
            _end_text(pb, tokens)
        return
    entry = pb.sources[-1]
    for key, value in (
        ("documents", res.documents),
        ("tokens", res.tokens),
        ("skipped_records", res.skipped_records),
        ("empty_documents", res.empty_documents),
    ):
        entry[key] += value
    if res.piece.last:
        entry.update(
            bytes=res.size,
            sha256=res.sha256,
            compression=res.compression,
            decompressed_bytes=res.decompressed,
        )
    _append(pb, res, tokens, len(pb.sources) - 1)
    if res.piece.kind == "text" and res.piece.last:
        _end_text(pb, tokens)


def _end_text(pb: Any, tokens: TokenBuffer) -> None:
    """After the last piece of a plain text file: the document's end-of-document token and
    index record, as one whole-file unit would have them (or it is counted empty)."""
    import numpy as np

    entry = pb.sources[-1]
    n = entry["tokens"]
    if n == 0:
        entry["empty_documents"] += 1
        return
    if pb.plan.eos_id is not None:
        tokens.add(np.array([pb.plan.eos_id], dtype=pb.plan.dtype))
        n += 1
        entry["tokens"] = n
    pb.add_record(n, len(pb.sources) - 1, 0)
    entry["documents"] += 1


def _append(pb: Any, res: FileResult, tokens: TokenBuffer, index: int | None = None) -> None:

    if index is not None:
        _add_payload(pb, res, tokens, index)
        return
    index = len(pb.sources)
    pb.sources.append(
        {
            "path": res.source.recorded,
            "ordinal": res.source.ordinal,
            "kind": res.kind,
            "bytes": res.size,
            "sha256": res.sha256,
            "compression": res.compression,
            "decompressed_bytes": res.decompressed,
            "documents": res.documents,
            "tokens": res.tokens,
            "skipped_records": res.skipped_records,
            "empty_documents": res.empty_documents,
        }
    )
    _add_payload(pb, res, tokens, index)


def _add_payload(pb: Any, res: FileResult, tokens: TokenBuffer, index: int) -> None:
    import numpy as np

    if res.shared is not None:
        if res.shared.size < SHARED_COPY:  # a small file's: batched with its neighbours'
            tokens.add(res.shared.copy())
        else:
            tokens.flush()
            pb.add_tokens_shared(res.shared, res.raw_max, res.raw_crc)
    elif res.raw_ids is not None:
        tokens.flush()
        pb.atoms.append_file(res.raw_ids, res.raw_count, res.raw_max, res.raw_crc)
        os.unlink(res.raw_ids)
    elif res.staged_ids is not None:
        tokens.flush()
        pb.add_tokens_range(*res.staged_ids)
    elif res.ids is not None:
        tokens.add(res.ids)
    if res.spill_records is not None:
        with open(res.spill_records, "rb") as fp:
            while True:
                block = fp.read(16 << 16)
                if not block:
                    break
                pb.add_records(
                    np.frombuffer(block, dtype="<u8").reshape(-1, 2), index, res.item_base
                )
        os.unlink(res.spill_records)
    if len(res.records) > 8:  # a piece's many records: one write, one CRC-32
        pb.add_records(np.array(res.records, dtype="<u8").reshape(-1, 2), index, res.item_base)
        return
    for length, item in res.records:
        pb.add_record(length, index, item + res.item_base)
