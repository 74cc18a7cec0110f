"""Load, describe and validate a MosaicML MDS folder (`index.json` + shards;
docs/formats/mds.md).

Structure (inspect and verify): index.json (at most 64 MiB, version 2, every shard entry's
fields and types, basenames that are plain names inside the folder); every shard file present
with the size its entry records (the root cause when one is cut); for uncompressed shards, the
header: the sample count, the offsets (in order, the first just after the embedded config, the
last at the end of the file) and the embedded config equal to the entry's. Scan (verify): the
shard hashes index.json records (hashlib's and xxhash's algorithms; another name is reported
as not checked), and every sample's column sizes and ndarray headers against its bytes.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterator
from typing import Any

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding
from matrixctl.formats import mds
from matrixctl.validate.engine import rule, sample, shown
from matrixctl.validate.manifest_folder import inside, read_manifest, regular

FMT = mds.FORMAT
PREVIEW = 8
MAX_SHARD_SAMPLES = 1 << 28  # offsets read at most per shard (1 GiB of u32)
MDS_HASH_UNCHECKED = codes.define(
    "MDS_HASH_UNCHECKED",
    "An MDS shard hash of an algorithm matrixctl does not compute (it is not checked).",
    group=mds.FORMAT,
    severity=Severity.WARNING,
)
ENTRY_FIELDS: dict[str, type | tuple[type, ...]] = {
    "column_encodings": list,
    "column_names": list,
    "column_sizes": list,
    "format": str,
    "raw_data": dict,
    "samples": int,
    "version": int,
}


class MdsSubject:
    def __init__(self, path: str) -> None:
        self.path = path
        self.index: dict[str, Any] | None = None
        self.shards: list[dict[str, Any]] = []
        self.problems: list[Finding] = []

    def file_of(self, entry: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """The file a shard entry names (the compressed one when there is one), and its record."""
        data = entry.get("zip_data") or entry["raw_data"]
        return inside(self.path, data.get("basename", "")), data


def load_dir(path: str) -> MdsSubject:
    s = MdsSubject(path)
    doc = read_manifest(path, mds.INDEX, mds.MAX_INDEX, mds.MDS_INDEX)
    s.index = doc
    if doc.get("version") != mds.VERSION:
        s.problems.append(
            finding(mds.MDS_INDEX, f"index version {doc.get('version')!r}", field="version")
        )
    shards = doc.get("shards")
    if not isinstance(shards, list):
        s.problems.append(finding(mds.MDS_INDEX, "shards is not a list", field="shards"))
        return s
    for n, entry in enumerate(shards):
        where = f"shards[{n}]"
        if not isinstance(entry, dict):
            s.problems.append(finding(mds.MDS_INDEX, f"{where} is not an object", field=where))
            continue
        bad = [
            k
            for k, kind in ENTRY_FIELDS.items()
            if not isinstance(entry.get(k), kind) or isinstance(entry.get(k), bool)
        ]
        if bad:
            s.problems.append(
                finding(mds.MDS_INDEX, f"{where} lacks or mistypes {', '.join(bad)}", field=where)
            )
            continue
        for key in ("raw_data", "zip_data"):
            data = entry.get(key)
            if data is None and key == "zip_data":
                continue
            name = data.get("basename") if isinstance(data, dict) else None
            size = data.get("bytes") if isinstance(data, dict) else None
            if not isinstance(name, str) or not isinstance(size, int) or size < 0:
                s.problems.append(
                    finding(mds.MDS_INDEX, f"{where}.{key} needs basename and bytes", field=where)
                )
                break
            if inside(path, name) is None:
                s.problems.append(
                    finding(
                        mds.MDS_INDEX,
                        f"{where}.{key}.basename {name!r} is not a plain name inside the folder",
                        field=f"{where}.{key}.basename",
                    )
                )
                break
        else:
            if entry["samples"] < 0 or entry["format"] != mds.FORMAT:
                s.problems.append(
                    finding(mds.MDS_INDEX, f"{where}: format or samples is wrong", field=where)
                )
                continue
            s.shards.append(entry)
    return s


def describe(s: MdsSubject) -> dict[str, Any]:
    first = s.shards[0] if s.shards else {}
    items = [
        {
            "shard": (e.get("raw_data") or {}).get("basename"),
            "samples": e.get("samples"),
            "bytes": (e.get("zip_data") or e.get("raw_data") or {}).get("bytes"),
            "compression": e.get("compression"),
        }
        for e in s.shards[: shown(PREVIEW)]
    ]
    return {
        "samples": sum(int(e["samples"]) for e in s.shards),
        "columns": dict(
            zip(first.get("column_names", []), first.get("column_encodings", []), strict=False)
        ),
        "shards": sample(items, len(s.shards)),
    }


@rule(FMT, "index.json")
def check_index(s: MdsSubject) -> Iterator[Finding]:
    yield from s.problems


@rule(FMT, "shard files and sizes", cause=True)
def check_files(s: MdsSubject) -> Iterator[Finding]:
    for n, entry in enumerate(s.shards):
        path, data = s.file_of(entry)
        if not regular(path):
            yield finding(
                mds.MDS_SHARD, f"shard {data['basename']} is missing", field=f"shards[{n}]"
            )
            continue
        assert path is not None
        size = os.lstat(path).st_size
        if size != data["bytes"]:
            yield finding(
                mds.MDS_SHARD,
                f"shard {data['basename']} is {size:,} bytes; index.json says {data['bytes']:,}"
                + (f" (cut at byte {size:,})" if size < data["bytes"] else ""),
                offset=min(size, data["bytes"]),
                field=f"shards[{n}].bytes",
            )


def shard_offsets(path: str, entry: dict[str, Any]) -> Any:
    """A raw shard's sample count and offsets, read within its size (FormatError otherwise)."""
    import numpy as np

    size = os.path.getsize(path)
    with open(path, "rb") as fp:
        head = fp.read(4)
        if len(head) < 4:
            raise FormatError(mds.MDS_SHARD, f"{size} bytes hold no sample count", offset=0)
        count = int.from_bytes(head, "little")
        if count != entry["samples"]:
            raise FormatError(
                mds.MDS_SHARD,
                f"holds {count} samples; index.json says {entry['samples']}",
                offset=0,
                field="samples",
            )
        if count > MAX_SHARD_SAMPLES or 4 + 4 * (count + 1) > size:
            raise FormatError(
                mds.MDS_SHARD,
                f"{count} samples need {4 + 4 * (count + 1)} bytes of offsets; the shard is {size}",
                offset=4,
                field="offsets",
            )
        raw = fp.read(4 * (count + 1))
    offsets = np.frombuffer(raw, dtype="<u4").astype(np.int64)
    config = {k: entry.get(k) for k in entry if k not in ("raw_data", "samples", "zip_data")}
    config_raw = mds.config_bytes(config)
    first = 4 + 4 * (count + 1)
    if int(offsets[0]) < first or np.any(np.diff(offsets) < 0) or int(offsets[-1]) != size:
        raise FormatError(
            mds.MDS_SHARD,
            f"offsets run from {int(offsets[0])} to {int(offsets[-1])} (not in order, or not "
            f"from {first} to the shard's {size} bytes)",
            offset=4,
            field="offsets",
        )
    with open(path, "rb") as fp:
        fp.seek(first)
        got = fp.read(int(offsets[0]) - first)
    try:
        embedded = json.loads(got.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        embedded = None
    if embedded != json.loads(config_raw):
        raise FormatError(
            mds.MDS_SHARD,
            "the config embedded after the offsets differs from the index.json entry",
            offset=first,
            field="config",
        )
    return offsets


@rule(FMT, "shard headers: samples, offsets, embedded config")
def check_headers(s: MdsSubject) -> Iterator[Finding]:
    for n, entry in enumerate(s.shards):
        path, data = s.file_of(entry)
        if path is None or entry.get("zip_data") or not regular(path):
            continue
        if os.path.getsize(path) != data["bytes"]:
            continue
        try:
            shard_offsets(path, entry)
        except FormatError as err:
            yield finding(
                err.code,
                f"shard {data['basename']}: {err.message}",
                offset=err.offset,
                field=f"shards[{n}].{err.field}" if err.field else f"shards[{n}]",
            )


def _hasher(algo: str) -> Any:
    import hashlib

    if algo.startswith("xx"):
        import xxhash

        return getattr(xxhash, algo, None)
    try:
        return hashlib.new(algo)
    except ValueError:
        return None


@rule(FMT, "shard hashes", scan=True)
def check_hashes(s: MdsSubject) -> Iterator[Finding]:
    for n, entry in enumerate(s.shards):
        path, data = s.file_of(entry)
        recorded = data.get("hashes")
        if not isinstance(recorded, dict) or not regular(path):
            continue
        assert path is not None
        for algo, want in sorted(recorded.items()):
            maker = _hasher(str(algo))
            h = maker() if callable(maker) else maker
            if h is None:
                yield finding(
                    MDS_HASH_UNCHECKED,
                    f"shard {data['basename']}: {algo} hashes are not checked",
                    field=f"shards[{n}].hashes.{algo}",
                )
                continue
            with open(path, "rb") as fp:
                while block := fp.read(1 << 22):
                    h.update(block)
            got = h.hexdigest() if not isinstance(want, int) else h.intdigest()
            if got != want:
                yield finding(
                    mds.MDS_HASH,
                    f"shard {data['basename']}: {algo} is {got}, index.json says {want}",
                    field=f"shards[{n}].hashes.{algo}",
                )


@rule(FMT, "samples: column sizes, ndarray headers", scan=True)
def check_samples(s: MdsSubject) -> Iterator[Finding]:
    import numpy as np

    for n, entry in enumerate(s.shards):
        path, data = s.file_of(entry)
        if path is None or entry.get("zip_data") or not regular(path):
            continue
        if os.path.getsize(path) != data["bytes"]:
            continue
        try:
            offsets = shard_offsets(path, entry)
        except FormatError:
            continue  # reported by the header rule
        sizes = entry["column_sizes"]
        encodings = entry["column_encodings"]
        variable = [i for i, size in enumerate(sizes) if size is None]
        with open(path, "rb") as fp:
            buf = mmap.mmap(fp.fileno(), 0, access=mmap.ACCESS_READ)  # never read whole
        for k in range(len(offsets) - 1):
            lo, hi = int(offsets[k]), int(offsets[k + 1])
            problem = _sample_problem(buf, lo, hi, sizes, encodings, variable, np)
            if problem:
                yield finding(
                    mds.MDS_SAMPLE,
                    f"shard {data['basename']} sample {k}: {problem}",
                    offset=lo,
                    field=f"shards[{n}].sample[{k}]",
                )
                break


def _sample_problem(
    buf: Any,
    lo: int,
    hi: int,
    sizes: list[Any],
    encodings: list[Any],
    variable: list[int],
    np: Any,
) -> str | None:
    head = 4 * len(variable)
    if hi - lo < head:
        return f"{hi - lo} bytes hold no column sizes"
    var = np.frombuffer(buf, dtype="<u4", count=len(variable), offset=lo).tolist()
    widths = [var[variable.index(i)] if size is None else int(size) for i, size in enumerate(sizes)]
    if head + sum(widths) != hi - lo:
        return f"columns of {sum(widths)} bytes and {head} of sizes in {hi - lo} bytes"
    pos = lo + head
    for enc, width in zip(encodings, widths, strict=False):
        if isinstance(enc, str) and enc.startswith("ndarray:") and enc.count(":") == 1:
            dtype = enc.split(":")[1]
            if dtype not in mds.VALUE_DTYPES.values():
                return f"ndarray dtype {dtype!r} is not one of MDS's"
            if width < 1:
                return "an empty ndarray column"
            byte = buf[pos]
            ndim, code = byte >> 2, byte & 3
            shape_item = 1 << code
            if 1 + ndim * shape_item > width:
                return f"an ndarray of {ndim} dimensions does not fit {width} bytes"
            shape = np.frombuffer(buf, dtype=mds.SHAPE_DTYPES[code], count=ndim, offset=pos + 1)
            values = int(np.prod(shape.astype(object))) * np.dtype(dtype).itemsize if ndim else 0
            if 1 + ndim * shape_item + values != width:
                return f"ndarray shape {shape.tolist()} of {dtype} needs {values} bytes"
        pos += width
    return None
