"""MosaicML Streaming's MDS dataset (a folder: `index.json` + `shard.NNNNN.mds`, read by
`streaming.StreamingDataset(local=...)`; docs/formats/mds.md). Bytes only.

`index.json` is `{"shards": [...], "version": 2}` (keys sorted). Each shard entry:
`column_encodings`, `column_names`, `column_sizes` (null for a variable-size column),
`compression` (null: matrixctl writes and reads uncompressed shards only), `format` ("mds"),
`hashes` (algorithm names), `raw_data` (`{"basename", "bytes", "hashes": {algo: hex}}`),
`samples`, `size_limit`, `version` (2), `zip_data` (null).

A shard, all integers little-endian u32:

    num_samples  N
    offsets      N+1 file offsets: sample i is bytes offsets[i]..offsets[i+1]
    config       the shard's JSON config (the entry's keys less raw_data/samples/zip_data),
                 sorted keys, between the offsets and the first sample
    samples      each: one u32 size per variable-size column, then each column's bytes

An `ndarray:DTYPE` column (fixed dtype, any shape) is `[ndim << 2 | shape_code: u8]
[shape: ndim x uint8/16/32/64 by shape_code 0-3][values]`.
"""

from __future__ import annotations

import json
from typing import Any

from matrixctl import codes

FORMAT = "mds"
INDEX = "index.json"
VERSION = 2
MAX_INDEX = 64 << 20  # bytes of index.json read at most
SIZE_LIMIT = 1 << 26  # the shard size MosaicML's writer defaults to
HASH = "sha1"  # recorded for every shard (MDS's names are hashlib's and xxhash's)
# NDArray value dtypes and their codes (a dynamic-dtype column stores the code per sample).
VALUE_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}

G = FORMAT
MDS_INDEX = codes.define(
    "MDS_INDEX",
    "An MDS index.json that is not the version 2 JSON object with a list of shard entries, "
    "or an entry with missing or wrong-typed fields, a compressed shard, or a basename that is "
    "not a plain file name.",
    group=G,
)
MDS_SHARD = codes.define(
    "MDS_SHARD",
    "An MDS shard that is missing, of another size than index.json records, or whose sample "
    "count, offsets or embedded config disagree with its entry.",
    group=G,
)
MDS_SAMPLE = codes.define(
    "MDS_SAMPLE",
    "An MDS sample whose column sizes or ndarray header do not fit its bytes.",
    group=G,
)
MDS_HASH = codes.define(
    "MDS_HASH", "An MDS shard whose hash differs from the one index.json records.", group=G
)


def shape_code(length: int) -> int:
    """The shape dtype MDS picks for a 1-D array of `length` (> 0) elements."""
    if length < 1 << 8:
        return 0
    if length < 1 << 16:
        return 1
    if length < 1 << 32:
        return 2
    return 3


def shard_config(encoding: str, size_limit: int) -> dict[str, Any]:
    """The writer config every shard embeds and its index entry repeats (one input_ids column)."""
    return {
        "column_encodings": [encoding],
        "column_names": ["input_ids"],
        "column_sizes": [None],
        "compression": None,
        "format": FORMAT,
        "hashes": [HASH],
        "size_limit": size_limit,
        "version": VERSION,
    }


def config_bytes(config: dict[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True).encode("utf-8")


def shard_name(index: int) -> str:
    return f"shard.{index:05}.mds"


def index_bytes(shards: list[dict[str, Any]]) -> bytes:
    return json.dumps({"shards": shards, "version": VERSION}, sort_keys=True).encode("utf-8")


def is_mds_dir(path: str) -> bool:
    """A folder with an index.json that is a JSON object with a "shards" key in its first
    4 KiB (MosaicML writes the keys sorted: "shards" comes first)."""
    import os

    name = os.path.join(path, INDEX)
    try:
        with open(name, "rb") as fp:
            head = fp.read(4096)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"shards"' in head
