"""Load, describe and validate an STB sidecar and the set of .stb files it lists
(`verify NAME.stb.json` checks the whole set; `convert NAME.stb.json ...` reads it).

Structural rules: the sidecar's schema; every bin file exists, stays inside the sidecar's
folder, and passes the STB structural rules; every sidecar tensor matches its file's table and
every tensor of every file is named. Scans: each file's CRC-32 against the sidecar, and each
file's padding.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from matrixctl.codes import Severity
from matrixctl.errors import FormatError, MatrixError
from matrixctl.findings import Finding, finding, has_error
from matrixctl.formats import stb
from matrixctl.io import Source
from matrixctl.tensors import crc_range, human_bytes, tensor_row
from matrixctl.validate.engine import rule
from matrixctl.validate.stb import compare, padding_findings

FMT = stb.SIDECAR_FORMAT


@dataclass
class OpenedBin:
    entry: stb.BinFile
    path: str
    source: Source | None = None
    parsed: stb.StbFile | None = None
    error: MatrixError | None = None
    by_id: dict[int, stb.Entry] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        if self.parsed is None:
            return False
        return not has_error(self.parsed.problems)


class SidecarSubject:
    def __init__(self, src: Source, sidecar: stb.Sidecar) -> None:
        self.src = src
        self.sidecar = sidecar
        folder = os.path.dirname(os.path.abspath(src.path)) if src.path != "-" else os.getcwd()
        self.files: list[OpenedBin] = []
        for b in sidecar.bin_files:
            opened = OpenedBin(b, os.path.join(folder, b.path))
            try:
                opened.source = Source.open(opened.path)
                opened.parsed = stb.parse(opened.source.buf, opened.source.size)
                opened.by_id = {e.tensor_id: e for e in opened.parsed.readable()}
            except MatrixError as err:
                opened.error = err
            self.files.append(opened)

    def close(self) -> None:
        for f in self.files:
            if f.source is not None:
                f.source.close()


def load(src: Source) -> SidecarSubject:
    if src.size > stb.MAX_SIDECAR:
        raise FormatError(
            stb.STB_SIDECAR, f"sidecar is {src.size:,} bytes, above the {stb.MAX_SIDECAR:,} limit"
        )
    return SidecarSubject(src, stb.parse_sidecar(bytes(src.buf[: src.size])))


def describe(s: SidecarSubject) -> dict[str, Any]:
    side = s.sidecar
    out: dict[str, Any] = {
        "size": s.src.size,
        "tensor_count": len(side.tensors),
        "bin_file_count": len(side.bin_files),
        "data": human_bytes(sum(b.file_size for b in side.bin_files)),
    }
    meta = {k: v for k, v in side.metadata.items() if isinstance(v, str | int | float)}
    if meta:
        out["metadata"] = meta
    out["bin_files"] = [
        {
            "bin_file_id": b.bin_file_id,
            "path": b.path,
            "tensors": b.tensor_count,
            "bytes": b.file_size,
            "crc32": f"0x{b.crc32:08x}",
        }
        for b in side.bin_files
    ]
    by_file = {f.entry.bin_file_id: f for f in s.files}
    rows = []
    for t in side.tensors:
        # The byte range is in the .stb file that holds the tensor, when that file is readable.
        opened = by_file.get(t.bin_file_id)
        entry = opened.by_id.get(t.tensor_id) if opened is not None else None
        rows.append(
            tensor_row(
                t.name,
                t.dtype,
                t.shape,
                entry.offset if entry is not None else None,
                entry.size_bytes if entry is not None else None,
                {
                    "bin_file_id": t.bin_file_id,
                    "file": opened.entry.path if opened is not None else None,
                    "tensor_id": t.tensor_id,
                },
            )
        )
    out["tensors"] = rows
    return out


@rule(FMT, "bin files exist and are valid STB")
def check_files(s: SidecarSubject) -> Iterator[Finding]:
    for f in s.files:
        where = f"bin_files[{f.entry.bin_file_id}]"
        if f.error is not None:
            yield finding(
                stb.STB_SIDECAR_FILE,
                f"{f.entry.path}: {f.error.code}: {f.error.message}",
                field=where,
            )
            continue
        assert f.parsed is not None
        for p in f.parsed.problems:
            if p.severity is Severity.ERROR:
                yield finding(
                    stb.STB_SIDECAR_FILE,
                    f"{f.entry.path}: {p.code}: {p.message}",
                    offset=p.offset,
                    field=f"{where}/{p.field}",
                )


@rule(FMT, "sidecar tensors agree with the .stb tables")
def check_tensors(s: SidecarSubject) -> Iterator[Finding]:
    for f in s.files:
        if f.parsed is None:
            continue
        fid = f.entry.bin_file_id
        named = {t.tensor_id: t for t in s.sidecar.tensors if t.bin_file_id == fid}
        yield from compare(f.parsed, f.entry, named, f.entry.path)


@rule(FMT, "bin file CRC-32s", scan=True)
def check_crcs(s: SidecarSubject) -> Iterator[Finding]:
    for f in s.files:
        if f.source is None:
            continue
        got = crc_range(f.source.buf, 0, f.source.size)
        if got != f.entry.crc32:
            yield finding(
                stb.STB_SIDECAR_FILE,
                f"{f.entry.path}: the sidecar records CRC-32 0x{f.entry.crc32:08x}, the file's "
                f"is 0x{got:08x}",
                field=f"bin_files[{f.entry.bin_file_id}].crc32",
            )


@rule(FMT, "bin files' padding bytes are zero", scan=True)
def check_padding(s: SidecarSubject) -> Iterator[Finding]:
    for f in s.files:
        if f.source is None or f.parsed is None or not f.ok:
            continue
        for p in padding_findings(f.source.buf, f.parsed):
            yield finding(
                p.code,
                f"{f.entry.path}: {p.message}",
                offset=p.offset,
                field=f"bin_files[{f.entry.bin_file_id}]/{p.field}",
                severity=p.severity,
            )
