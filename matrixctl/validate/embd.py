"""Load, describe and validate EMBD `.weights` files (rules for `inspect` and `verify`).

Structural rules read the header, footer, metadata, vocabulary and tensor index (and the header
CRC, 56 bytes); the scan rules read the whole file once: data and file CRC-32s, then every
padding byte. The model rule checks the metadata against the vocabulary and the tensors (a BERT
encoder's tensors and shapes, when the file has one).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.findings import Finding, finding, findings_of, has_error
from matrixctl.formats import embd
from matrixctl.io import Source
from matrixctl.tensors import human_bytes, tensor_row
from matrixctl.validate.engine import cut_short, first_nonzero, problem_rule, rule

FMT = embd.FORMAT


class EmbdSubject:
    def __init__(self, src: Source, parsed: embd.EmbdFile) -> None:
        self.src = src
        self.embd = parsed

    def broken(self, *rules: str) -> bool:
        return has_error(self.embd.problems, *rules)


def load(src: Source) -> EmbdSubject:
    return EmbdSubject(src, embd.parse(src.buf, src.size))


def describe(s: EmbdSubject) -> dict[str, Any]:
    f = s.embd
    h = f.header
    out: dict[str, Any] = {
        "size": f.size,
        "version": f"{h.version_major}.{h.version_minor}",
        "flags": ", ".join(h.flag_names()) or "none",
        "tensor_count": h.tensor_index_count,
        "tensor_data": human_bytes(h.tensor_data_size),
    }
    if f.tokens is not None:
        out["token_count"] = len(f.tokens)
    out["checksums"] = {
        "header": f"0x{h.header_checksum:08x}",
        "data": f"0x{f.footer.data_checksum:08x}" if f.footer else None,
        "file": f"0x{f.footer.file_checksum:08x}" if f.footer else None,
    }
    if f.metadata:
        out["metadata"] = dict(f.metadata)
    if f.special is not None and f.tokens is not None:
        tokens = f.tokens
        out["special_tokens"] = {
            name: (
                {"id": value, "token": tokens[value]}
                if value < len(tokens)
                else {"id": value, "token": None}
            )
            for name, value in f.special.items()
        }
    out["sections"] = [
        {"section": "header", "offset": 0, "bytes": embd.HEADER_SIZE},
        *(
            {"section": name, "offset": start, "bytes": end - start}
            for name, start, end in sorted(f.sections, key=lambda x: x[1])
        ),
        {"section": "footer", "offset": f.size - embd.FOOTER_SIZE, "bytes": embd.FOOTER_SIZE},
    ]
    out["tensors"] = [
        tensor_row(
            t.name,
            t.dtype,
            t.shape,
            t.offset,
            t.nbytes,
            {"name_hash": f"0x{t.name_hash:08x}"}
            | ({} if t.dtype else {"dtype_code": t.dtype_code}),
        )
        for t in f.tensors
    ]
    return out


# Structural rules ---------------------------------------------------------------------------


@rule(FMT, "file length against total_file_size", cause=True)
def check_length(s: EmbdSubject) -> Iterator[Finding]:
    """Root cause of a cut file (the header rule repeats EMBD_FILE_SIZE: not counted)."""
    yield from cut_short(
        embd.EMBD_FILE_SIZE, s.embd.size, s.embd.header.total_file_size, "total_file_size"
    )


problem_rule(FMT, embd.R_HEADER, lambda s: s.embd.problems)
problem_rule(FMT, embd.R_SECTIONS, lambda s: s.embd.problems)


@rule(FMT, embd.R_META)
def check_metadata(s: EmbdSubject) -> Iterator[Finding]:
    yield from findings_of(s.embd.problems, embd.R_META)
    f = s.embd
    if not any(name == "metadata" for name, _, _ in f.sections) or s.broken(embd.R_META):
        return
    where = f.header.metadata_offset
    for code, key, message in embd.check_metadata(f.meta):
        yield finding(code, message, offset=where, field=f"metadata/{key}")


for _name in (embd.R_VOCAB, embd.R_INDEX, embd.R_DATA):
    problem_rule(FMT, _name, lambda s: s.embd.problems)


@rule(FMT, "metadata agrees with the vocabulary and the tensors")
def check_model(s: EmbdSubject) -> Iterator[Finding]:
    f = s.embd
    if s.broken(embd.R_META, embd.R_INDEX, embd.R_SECTIONS):
        return
    if embd.check_metadata(f.meta):
        return
    shapes = {t.name: t.shape for t in f.tensors}
    count = len(f.tokens) if f.tokens is not None else None
    for where, message in embd.model_problems(f.meta, count, shapes):
        yield finding(embd.EMBD_MODEL, message, offset=f.header.metadata_offset, field=where)


# Scans --------------------------------------------------------------------------------------


@rule(FMT, "data and file checksums", scan=True)
def check_checksums(s: EmbdSubject) -> Iterator[Finding]:
    f = s.embd
    if not f.header.flags & embd.FLAG_CHECKSUM_ENABLED:
        yield finding(
            embd.EMBD_NO_CHECKSUM,
            "CHECKSUM_ENABLED is clear: the checksums are not checked",
            offset=8,
            field="flags",
        )
        return
    if f.footer is None:
        return
    sums = embd.checksums(s.src.buf, f)
    if sums is None:
        return
    data, whole = sums
    at = f.size - embd.FOOTER_SIZE
    if data != f.footer.data_checksum:
        yield finding(
            embd.EMBD_DATA_CRC,
            f"data_checksum is 0x{f.footer.data_checksum:08x}, the CRC-32 of the tensor data "
            f"[{f.header.tensor_data_offset:,}, {at:,}) is 0x{data:08x}",
            offset=at,
            field="data_checksum",
        )
    if whole != f.footer.file_checksum:
        yield finding(
            embd.EMBD_FILE_CRC,
            f"file_checksum is 0x{f.footer.file_checksum:08x}, the CRC-32 of bytes 0..{at - 1:,} "
            f"is 0x{whole:08x}",
            offset=at + 4,
            field="file_checksum",
        )


@rule(FMT, "padding bytes are zero", scan=True)
def check_padding(s: EmbdSubject) -> Iterator[Finding]:
    f = s.embd
    if s.broken(embd.R_SECTIONS, embd.R_INDEX, embd.R_DATA, embd.R_HEADER):
        return
    buf = s.src.buf
    for start, end in embd.gaps(f):
        if end - start >= embd.ALIGNMENT:
            yield finding(
                embd.EMBD_GAP,
                f"bytes {start:,}..{end:,} ({end - start:,}) belong to no section or tensor",
                offset=start,
                field="padding",
            )
        at = first_nonzero(buf, start, end)
        if at is not None:
            yield finding(
                embd.EMBD_PADDING,
                f"padding byte at {at:,} is 0x{buf[at]:02x}, not 0x00",
                offset=at,
                field="padding",
            )
