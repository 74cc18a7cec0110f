"""Load, describe and validate STB `.stb` files (rules for `inspect` and `verify`).

The spec's section 7 rules, plus what it leaves out: unique tensor ids, sizes against the
dimensions, no overlapping tensors, zero padding; and, when the sidecar NAME.stb.json is beside
the file, the sidecar's view of it (names, shapes, size, CRC-32).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding, has_error
from matrixctl.formats import stb
from matrixctl.io import Source
from matrixctl.tensors import crc_range, human_bytes, tensor_row
from matrixctl.validate.engine import cut_short, first_nonzero, problem_rule, rule

FMT = stb.FORMAT


class StbSubject:
    def __init__(self, src: Source, parsed: stb.StbFile) -> None:
        self.src = src
        self.stb = parsed
        self.side_path = stb.sidecar_for(src.path)
        self.side: stb.Sidecar | None = None
        self.side_error: FormatError | None = None
        self.bin: stb.BinFile | None = None
        if self.side_path is not None:
            try:
                self.side = stb.read_sidecar(self.side_path)
            except FormatError as err:
                self.side_error = err
            else:
                base = os.path.basename(src.path)
                self.bin = next(
                    (b for b in self.side.bin_files if os.path.basename(b.path) == base), None
                )

    def names(self) -> dict[int, stb.SideTensor]:
        if self.side is None or self.bin is None:
            return {}
        fid = self.bin.bin_file_id
        return {t.tensor_id: t for t in self.side.tensors if t.bin_file_id == fid}

    def broken(self) -> bool:
        return has_error(self.stb.problems)


def load(src: Source) -> StbSubject:
    return StbSubject(src, stb.parse(src.buf, src.size))


def describe(s: StbSubject) -> dict[str, Any]:
    f = s.stb
    h = f.header
    names = s.names()
    out: dict[str, Any] = {
        "size": f.size,
        "version": h.version,
        "tensor_count": h.tensor_count,
        "data_offset": h.data_offset,
        "data": human_bytes(max(0, h.file_size - h.data_offset)),
        "sidecar": s.side_path,
    }
    if s.bin is not None:
        out["bin_file_id"] = s.bin.bin_file_id
    rows = []
    for e in f.entries:
        side = names.get(e.tensor_id)
        shape = side.shape if side is not None else e.direct_shape()
        extra: dict[str, Any] = {
            "tensor_id": e.tensor_id,
            "layout": e.layout or f"?{e.layout_code}",
        }
        if e.dtype is None:
            extra["dtype_code"] = e.dtype_code
        if shape is None:
            extra["shape_id"] = e.dims[0]
        rows.append(
            tensor_row(
                side.name if side is not None else None,
                e.dtype,
                shape,
                e.offset,
                e.size_bytes,
                extra,
            )
        )
    out["tensors"] = rows
    return out


@rule(FMT, "file length against file_size", cause=True)
def check_length(s: StbSubject) -> Iterator[Finding]:
    """Root cause of a cut file (the header rule repeats STB_FILE_SIZE: not counted)."""
    yield from cut_short(stb.STB_FILE_SIZE, s.stb.size, s.stb.header.file_size, "file_size")


for _name in (stb.R_HEADER, stb.R_TABLE, stb.R_DATA):
    problem_rule(FMT, _name, lambda s: s.stb.problems)


@rule(FMT, "tensor ids reachable by G_LOAD_BIN_TENSOR")
def check_glyph_reach(s: StbSubject) -> Iterator[Finding]:
    far = stb.glyph_unreachable(s.stb)
    if far:
        yield finding(
            stb.STB_GLYPH_REACH,
            f"{len(far)} tensor id(s) above 15 ({far[0]}..{far[-1]}): G_LOAD_BIN_TENSOR's 4-bit "
            "shape_id cannot name them",
            offset=stb.HEADER_SIZE,
            field="tensor_id",
        )


@rule(FMT, "the sidecar agrees with the file")
def check_sidecar(s: StbSubject) -> Iterator[Finding]:
    if s.side_path is None:
        yield finding(
            stb.STB_NO_SIDECAR,
            "no sidecar NAME.stb.json beside the file: no tensor names",
            field="sidecar",
        )
        return
    if s.side_error is not None:
        err = s.side_error
        yield finding(err.code, f"{s.side_path}: {err.message}", field=err.field)
        return
    if s.bin is None:
        yield finding(
            stb.STB_SIDECAR_MISMATCH,
            f"{s.side_path} does not list {os.path.basename(s.src.path)} in its bin_files",
            field="sidecar",
        )
        return
    yield from compare(s.stb, s.bin, s.names(), s.src.name)


def compare(
    f: stb.StbFile, bin_file: stb.BinFile, named: dict[int, stb.SideTensor], where: str
) -> Iterator[Finding]:
    """Findings where a sidecar's bin-file entry and tensors disagree with the file."""
    if bin_file.file_size != f.size:
        yield finding(
            stb.STB_SIDECAR_FILE,
            f"{where}: the sidecar records {bin_file.file_size:,} bytes, the file has {f.size:,}",
            field=f"bin_files[{bin_file.bin_file_id}].file_size",
        )
    if bin_file.tensor_count != len(f.entries):
        yield finding(
            stb.STB_SIDECAR_FILE,
            f"{where}: the sidecar records {bin_file.tensor_count} tensors, the file has "
            f"{len(f.entries)}",
            field=f"bin_files[{bin_file.bin_file_id}].tensor_count",
        )
    by_id = {e.tensor_id: e for e in f.entries}
    for tid, t in sorted(named.items()):
        e = by_id.get(tid)
        if e is None:
            yield finding(
                stb.STB_SIDECAR_MISMATCH,
                f"{t.name!r}: {where} has no tensor_id {tid}",
                field=f"{t.name}.tensor_id",
            )
            continue
        problems = []
        if stb.SPEC_DTYPES.get(e.dtype_code) != t.dtype:
            problems.append(f"dtype {stb.SPEC_DTYPES.get(e.dtype_code)} vs {t.dtype}")
        if e.rank != t.rank:
            problems.append(f"rank {e.rank} vs {t.rank}")
        if e.layout != t.layout:
            problems.append(f"layout {e.layout} vs {t.layout}")
        direct = e.direct_shape()
        if direct is not None and direct != t.shape:
            problems.append(f"shape {list(direct)} vs {list(t.shape)}")
        if direct is None and t.shape_id is not None and e.dims[0] != t.shape_id:
            problems.append(f"shape_id {e.dims[0]} vs {t.shape_id}")
        if e.dtype is not None and not problems:
            need = stb.element_count(t.shape) * stb.DTYPES[e.dtype].itemsize
            if need != e.size_bytes:
                problems.append(f"size_bytes {e.size_bytes:,} vs {need:,} for the shape")
        if problems:
            yield finding(
                stb.STB_SIDECAR_MISMATCH,
                f"{t.name!r} (tensor_id {tid}): file vs sidecar: {'; '.join(problems)}",
                offset=e.table_offset,
                field=f"{e.field}",
            )
    unnamed = sorted(set(by_id) - set(named))
    if unnamed:
        yield finding(
            stb.STB_SIDECAR_MISMATCH,
            f"{where}: tensor_id {unnamed[0]} (and {len(unnamed) - 1} more) has no sidecar entry",
            field="tensors",
        )


@rule(FMT, "padding bytes are zero", scan=True)
def check_padding(s: StbSubject) -> Iterator[Finding]:
    if s.broken():
        return
    yield from padding_findings(s.src.buf, s.stb)


def padding_findings(buf: Any, f: stb.StbFile) -> Iterator[Finding]:
    for start, end in stb.gaps(f):
        if end - start >= stb.ALIGNMENT and start >= f.header.data_offset:
            yield finding(
                stb.STB_GAP,
                f"bytes {start:,}..{end:,} ({end - start:,}) belong to no tensor",
                offset=start,
                field="padding",
            )
        at = first_nonzero(buf, start, end)
        if at is not None:
            yield finding(
                stb.STB_PADDING,
                f"padding byte at {at:,} is 0x{buf[at]:02x}, not 0x00",
                offset=at,
                field="padding",
            )


@rule(FMT, "CRC-32 recorded in the sidecar", scan=True)
def check_crc(s: StbSubject) -> Iterator[Finding]:
    if s.bin is None:
        return
    got = crc_range(s.src.buf, 0, s.src.size)
    if got != s.bin.crc32:
        yield finding(
            stb.STB_SIDECAR_FILE,
            f"the sidecar records CRC-32 0x{s.bin.crc32:08x}, the file's is 0x{got:08x}",
            field=f"bin_files[{s.bin.bin_file_id}].crc32",
        )
