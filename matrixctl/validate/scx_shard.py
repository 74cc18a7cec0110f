"""Load, describe and validate SCX shard files (the aligned substrate, one shard per file).

A shard alone proves its own integrity (header hash, payload hashes, padding); whether it
belongs to a manifest and a config is checked by verifying the manifest.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from matrixctl.findings import Finding, from_error
from matrixctl.io import Source
from matrixctl.tokenizers.scx import shards as scx_shards
from matrixctl.validate.engine import rule

FMT = scx_shards.FORMAT


class ShardSubject:
    def __init__(self, src: Source, header: scx_shards.ShardHeader) -> None:
        self.src = src
        self.header = header
        self.raw = src.head(scx_shards.HEADER_SIZE)

    @property
    def size_ok(self) -> bool:
        return self.src.size == scx_shards.HEADER_SIZE + self.header.payload_bytes


def load(src: Source) -> ShardSubject:
    return ShardSubject(src, scx_shards.ShardHeader.parse(src.head(scx_shards.HEADER_SIZE)))


def describe(s: ShardSubject) -> dict[str, Any]:
    h = s.header
    return {
        "size": s.src.size,
        "header": h.to_json(),
        "payload": {
            "offset": scx_shards.HEADER_SIZE,
            "bundle_bytes": h.bundle_bytes,
            "bytes": h.payload_bytes,
            "padding": max(0, h.payload_bytes - h.raw_bytes),
        },
        "fields": [
            {"field": name, "offset": off, "size": size}
            for name, (off, size) in scx_shards.FIELDS.items()
        ],
    }


@rule(FMT, "header fields and header_hash", header=True)
def check_header(s: ShardSubject) -> Iterator[Finding]:
    for err in scx_shards.header_problems(s.header, s.raw):
        yield from_error(err)


@rule(FMT, "file size", cause=True)
def check_size(s: ShardSubject) -> Iterator[Finding]:
    h = s.header
    if h.bundle_bytes == 0:
        return
    need = scx_shards.HEADER_SIZE + h.payload_bytes
    if s.src.size < need:
        yield from_error(
            scx_shards.FormatError(
                scx_shards.SCX_SHARD_TRUNCATED,
                f"file is {s.src.size} bytes; {h.bundle_count} bundles of {h.bundle_bytes} "
                f"need {need}",
                offset=s.src.size,
                field="bundle_count",
            )
        )
    elif s.src.size > need:
        yield from_error(
            scx_shards.FormatError(
                scx_shards.SCX_SHARD_TRAILING,
                f"{s.src.size - need} bytes follow the last bundle",
                offset=need,
                field="payload",
            )
        )


@rule(FMT, "H_SHARD_RAW, H_SHARD_ALIGNED and padding", scan=True)
def check_payload(s: ShardSubject) -> Iterator[Finding]:
    h = s.header
    if h.bundle_bytes == 0 or s.src.size < scx_shards.HEADER_SIZE + h.payload_bytes:
        return
    if not (h.bundle_count - 1) * h.bundle_bytes < h.raw_bytes <= h.payload_bytes:
        return
    for err in scx_shards.payload_problems(s.src.buf, s.src.size, h):
        if err.code != scx_shards.SCX_SHARD_TRAILING:
            yield from_error(err)
