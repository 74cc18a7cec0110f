"""Load, describe and validate zTensor 2 files (rules for `inspect` and `verify`).

`load` runs the footer and manifest checks (spec 8 steps 1-5); the structural rules run the
validation summary of spec 3.6 over the manifest; the scan rules read every local part
(decoding, digests, data rules of bool, f4_e2m1 and the sparse profiles), the padding, and the
earlier generations an append left behind.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from matrixctl.errors import FormatError, MatrixError
from matrixctl.findings import Finding, finding, findings_of, from_error
from matrixctl.formats import ztensor2
from matrixctl.formats.ztensor2.layout import shown
from matrixctl.io import STDIO, Source
from matrixctl.tensors import DTYPES, human_bytes, mapped_chunks
from matrixctl.validate.engine import first_nonzero, rule

FMT = ztensor2.FORMAT


class Zt2Subject:
    def __init__(self, src: Source, parsed: ztensor2.Zt2File) -> None:
        self.src = src
        self.zt = parsed
        self.buf = src.buf
        # Every part, in object order, with what breaks its blob reference alone (spec 2.4;
        # None: nothing), worked out once for the rules that need it.
        self.parts = parsed.parts()
        self.placed = [(p, _placement(parsed, p)) for p in self.parts]
        # Local parts whose bytes can be read as declared: aligned, inside the data region.
        self.readable: set[tuple[str, str]] = {
            (p.obj, p.role) for p, bad in self.placed if bad is None and p.local
        }

        self._generations: list[tuple[ztensor2.Footer, ztensor2.Zt2File | FormatError]] | None = (
            None
        )

    def sound(self, p: ztensor2.Part) -> bool:
        return (p.obj, p.role) in self.readable

    def generations(self) -> list[tuple[ztensor2.Footer, ztensor2.Zt2File | FormatError]]:
        """Earlier generations (spec 2.5), newest first: footers an append left behind, each
        found by its magic and confirmed by a manifest whose XXH3-64 matches (a magic inside
        tensor data is not mistaken for one), parsed as a file ending at that footer."""
        if self._generations is None:
            self._generations = list(_find_generations(self))
        return self._generations


GAP_WINDOW = 1 << 20  # the longest zero padding searched before a blob (alignment <= 1 MiB)


def _find_generations(
    s: Zt2Subject,
) -> Iterator[tuple[ztensor2.Footer, ztensor2.Zt2File | FormatError]]:
    """An append (spec 2.5) writes its first blob, or its manifest, at the first aligned offset
    after the old EOF, so an earlier footer ends just before a blob start, followed only by
    zero padding. Each blob start of each generation found is such a candidate: the scan reads
    the padding before it (at most GAP_WINDOW bytes), never the whole file."""
    buf = s.buf
    seen: set[int] = set()
    todo = [s.zt]
    while todo:
        gen = todo.pop()
        starts = {p.offset for p in gen.parts() if p.local and p.length}
        if gen.footer.manifest_length:
            starts.add(gen.footer.manifest_offset)
        for start in sorted(starts, reverse=True):
            lo = max(ztensor2.MIN_SIZE, start - GAP_WINDOW)
            if start <= lo:
                continue
            window = bytes(buf[lo:start])
            end = lo + len(window.rstrip(b"\x00"))
            if (
                end in seen
                or end < ztensor2.MIN_SIZE
                or bytes(buf[end - 8 : end]) != ztensor2.MAGIC
            ):
                continue
            seen.add(end)
            try:
                f = ztensor2.read_footer(buf, s.src.size, end=end)
            except FormatError:
                continue
            if f.manifest_length == 0:
                continue
            try:
                old = ztensor2.parse(buf, s.src.size, end=end)
            except FormatError as err:
                if err.code != ztensor2.ZT2_MANIFEST_HASH:
                    yield f, err
                continue
            yield f, old
            todo.append(old)


def _placement(f: ztensor2.Zt2File, p: ztensor2.Part) -> tuple[str, str, str] | None:
    """(code, message, field) when a blob reference breaks spec 2.4 alone."""
    if p.offset % ztensor2.ALIGN or p.offset < ztensor2.ALIGN:
        return (
            ztensor2.ZT2_ALIGN,
            f"{p.obj}/{p.role}: blob offset {p.offset:,} is not a multiple of 4096 at or above "
            "4096",
            f"{p.field}/blob",
        )
    # `data_end` and `end` spelled out: this runs once per part of every file opened.
    if p.shard is None:
        limit, where = f.size - ztensor2.FOOTER_SIZE, "this file's data region"
    else:
        size = f.shards.get(p.shard, {}).get("size", 0)
        limit, where = size - ztensor2.FOOTER_SIZE, f"shard {p.shard}'s data region"
    if p.offset + p.length > limit:
        return (
            ztensor2.ZT2_BOUNDS,
            f"{p.obj}/{p.role}: blob {p.offset:,}..{p.end:,} runs past {where} (ends at "
            f"{max(limit, 0):,})",
            f"{p.field}/blob",
        )
    return None


def load(src: Source) -> Zt2Subject:
    return Zt2Subject(src, ztensor2.parse(src.buf, src.size))


def _row(o: ztensor2.Obj) -> dict[str, Any]:
    parts = list(o.parts.values())
    main = o.parts.get("data") or o.parts.get("values") or parts[0]
    dtype = ztensor2.MATRIX_DTYPE.get((main.dtype, main.type)) or main.type or main.dtype
    extra: dict[str, Any] = {"layout": o.layout}
    if len(parts) == 1:
        p = parts[0]
        offset: int | None = p.offset if p.local else None
        nbytes = p.length
        if main.type:
            extra["type"] = main.type
        extra["storage_dtype"] = main.dtype
        if p.encoding:
            extra["encoding"] = p.encoding
            extra["decoded_length"] = p.decoded_length
        if p.digest:
            extra["digest"] = p.digest
        if p.shard:
            extra["shard"] = p.shard
    else:
        offset = None
        nbytes = sum(p.length for p in parts)
        extra["parts"] = {
            p.role: {
                k: v
                for k, v in {
                    "dtype": p.dtype,
                    "type": p.type,
                    "offset": p.offset,
                    "nbytes": p.length,
                    "encoding": p.encoding,
                    "decoded_length": p.decoded_length,
                    "digest": p.digest,
                    "shard": p.shard,
                }.items()
                if v is not None
            }
            for p in parts
        }
    if o.attributes:
        extra["attributes"] = o.attributes
    return {
        "name": o.name,
        "dtype": dtype,
        "shape": list(o.shape),
        "offset": offset,
        "nbytes": nbytes,
        "extra": extra,
    }


def describe(s: Zt2Subject) -> dict[str, Any]:
    f = s.zt
    ft = f.footer
    out: dict[str, Any] = {
        "size": f.size,
        "version": ft.version,
        "manifest": {
            "offset": ft.manifest_offset,
            "length": ft.manifest_length,
            "xxh3": f"0x{ft.manifest_hash:016x}",
        },
    }
    if f.data_shard:
        out["data_shard"] = True
        out["tensors"] = []
        return out
    out["tensor_count"] = len(f.objects)
    out["stored"] = human_bytes(sum(p.length for p in f.parts() if p.local))
    if f.attributes:
        out["attributes"] = f.attributes
    if f.shards:
        out["shards"] = f.shards
    out["tensors"] = [_row(o) for o in f.objects.values()]
    return out


# Structural rules ---------------------------------------------------------------------------


@rule(FMT, "manifest schema, names and shapes")
def check_schema(s: Zt2Subject) -> Iterator[Finding]:
    yield from findings_of(s.zt.problems)


@rule(FMT, "blob alignment and bounds")
def check_blobs(s: Zt2Subject) -> Iterator[Finding]:
    for _, bad in s.placed:
        if bad:
            yield finding(bad[0], bad[1], offset=s.zt.footer.manifest_offset, field=bad[2])


@rule(FMT, "blob references identical or disjoint")
def check_overlap(s: Zt2Subject) -> Iterator[Finding]:
    f = s.zt
    # (offset, end, index): the index names the part (or the manifest, -1) only when a
    # finding needs its label.
    groups: dict[str | None, list[tuple[int, int, int]]] = {}
    parts = s.parts
    for i, (p, bad) in enumerate(s.placed):
        if p.length and not bad:
            groups.setdefault(p.shard, []).append((p.offset, p.offset + p.length, i))
    ft = f.footer
    if ft.manifest_length:
        groups.setdefault(None, []).append(
            (ft.manifest_offset, ft.manifest_offset + ft.manifest_length, -1)
        )

    def label(i: int) -> str:
        return "the manifest" if i < 0 else f"{parts[i].obj}/{parts[i].role}"

    for shard, spans in groups.items():
        spans.sort()  # identical spans (allowed) in the parts' order, the manifest first
        prev: tuple[int, int, int] | None = None
        for span in spans:
            if prev is not None and span[0] < prev[1] and span[:2] != prev[:2]:
                where = f" in shard {shard}" if shard else ""
                yield finding(
                    ztensor2.ZT2_OVERLAP,
                    f"{label(span[2])} (bytes {span[0]:,}..{span[1]:,}) partially overlaps "
                    f"{label(prev[2])} (bytes {prev[0]:,}..{prev[1]:,}){where}",
                    offset=span[0],
                    field=label(span[2]),
                )
            if prev is None or span[1] > prev[1]:
                prev = span


@rule(FMT, "layouts, logical types and encodings")
def check_layouts(s: Zt2Subject) -> Iterator[Finding]:
    at = s.zt.footer.manifest_offset
    external = 0
    for o in s.zt.objects.values():
        for p in o.parts.values():
            if p.type is not None and p.type not in ztensor2.LOGICAL:
                yield finding(
                    ztensor2.ZT2_TYPE_UNKNOWN,
                    f"{o.name}/{p.role}: logical type {shown(p.type, 40)} is not registered: not "
                    "decoded",
                    offset=at,
                    field=f"{p.field}/type",
                )
            if p.encoding is not None and p.encoding != ztensor2.ZSTD_SEEKABLE:
                yield finding(
                    ztensor2.ZT2_ENCODING_UNKNOWN,
                    f"{o.name}/{p.role}: encoding {shown(p.encoding, 40)} is unknown: not decoded",
                    offset=at,
                    field=f"{p.field}/encoding",
                )
            external += not p.local
        if not ztensor2.layout_known(o.layout):
            yield finding(
                ztensor2.ZT2_LAYOUT_UNKNOWN,
                f"{o.name}: layout {shown(o.layout, 60)} is unknown: exposed structurally only",
                offset=at,
                field=f"{o.field}/layout",
            )
            continue
        for problem in ztensor2.layout_problems(o):
            yield finding(problem.code, problem.message, offset=at, field=problem.field)
    if external:
        yield finding(
            ztensor2.ZT2_SHARD_EXTERNAL,
            f"{external} part(s) live in other shard files: only verify reads them, from "
            "<stem>-<shard>.zt beside this file when it is there",
            offset=at,
            field="shards",
        )


@rule(FMT, "digest strings")
def check_digests(s: Zt2Subject) -> Iterator[Finding]:
    at = s.zt.footer.manifest_offset
    parts = s.parts
    missing = 0
    for p in parts:
        if p.digest is None:
            missing += 1
            continue
        try:
            known = ztensor2.parse_digest(p.digest)
        except ValueError as exc:
            yield finding(
                ztensor2.ZT2_DIGEST_FORMAT,
                f"{p.obj}/{p.role}: digest {shown(p.digest, 60)} is malformed: {exc}",
                offset=at,
                field=f"{p.field}/digest",
            )
            continue
        if known is None:
            yield finding(
                ztensor2.ZT2_DIGEST_UNKNOWN,
                f"{p.obj}/{p.role}: digest algorithm "
                f"{shown(p.digest.partition(':')[0], 30)} is not registered (xxh3, sha256): "
                "not verified",
                offset=at,
                field=f"{p.field}/digest",
            )
    if missing:
        yield finding(
            ztensor2.ZT2_NO_DIGEST,
            f"{missing} of {len(parts)} parts carry no digest",
            offset=at,
            field="digest",
        )


# Scan rules ---------------------------------------------------------------------------------


def _decodable(s: Zt2Subject, o: ztensor2.Obj, p: ztensor2.Part) -> bool:
    return (
        s.sound(p)
        and p.encoding in (None, ztensor2.ZSTD_SEEKABLE)
        and (p.type is None or p.type in ztensor2.LOGICAL)
    )


@rule(FMT, "part data: decoding, digests, values", scan=True)
def check_data(s: Zt2Subject) -> Iterator[Finding]:
    for o in s.zt.objects.values():
        for p in o.parts.values():
            if not _decodable(s, o, p):
                continue
            last: Any = None
            try:
                for piece in ztensor2.stream_part(s.buf, p):
                    last = piece
            except FormatError as err:
                yield from_error(err)
                continue
            if p.type == "f4_e2m1" and last is not None:
                n = (
                    o.count
                    if o.layout in (ztensor2.DENSE, ztensor2.MX) and p.role == "data"
                    else None
                )
                why = ztensor2.check_values(p, memoryview(last)[-1:], n)
                if why:
                    yield finding(
                        ztensor2.ZT2_VALUES,
                        f"{o.name}/{p.role}: {why}",
                        offset=p.offset,
                        field=p.field,
                    )
        if (
            o.layout in (ztensor2.CSR, ztensor2.COO)
            and all(_decodable(s, o, p) for p in o.parts.values())
            and not any(True for _ in ztensor2.layout_problems(o))
        ):
            yield from _sparse(s, o)


def shard_path(root: str, name: str) -> str | None:
    """Where shard `name` of the file at `root` is looked for: the positional convention of
    spec Appendix B, `<stem>-<name>.zt` beside the root (shard names are a single path
    component by 7.1). None for a root read from stdin."""
    if root == STDIO:
        return None
    folder, base = os.path.split(root)
    stem = base[:-3] if base.endswith(".zt") else base
    return os.path.join(folder, f"{stem}-{name}.zt")


def shard_identity(sh: Source, name: str, entry: dict[str, Any]) -> FormatError | None:
    """The verification ladder of spec 7.3, cheapest first: footer magic and version, the exact
    size of the shard table, then the whole-file digest."""
    where = f"shards/{name}"
    try:
        ztensor2.read_footer(sh.buf, sh.size)
    except FormatError as err:
        return FormatError(
            err.code, f"shard {name} ({sh.name}): {err.message}", offset=err.offset, field=where
        )
    if sh.size != entry["size"]:
        return FormatError(
            ztensor2.ZT2_SHARD,
            f"shard {name} ({sh.name}) is {sh.size:,} bytes, the shard table says "
            f"{entry['size']:,}",
            offset=sh.size,
            field=f"{where}/size",
        )
    known = ztensor2.parse_digest(entry["digest"])  # checked by parse
    if known is None:
        return None  # an unregistered algorithm: the digest strings rule warns
    digester = ztensor2.Digester(known[0])
    for piece in mapped_chunks(sh.buf, 0, sh.size):  # pages dropped behind the pass
        digester.update(piece)
    got = digester.text()
    if got != entry["digest"]:
        return FormatError(
            ztensor2.ZT2_DIGEST,
            f"shard {name} ({sh.name}): the whole file gives {got}, the shard table says "
            f"{entry['digest']}",
            offset=0,
            field=f"{where}/digest",
        )
    return None


@rule(FMT, "shard files: identity and part data", scan=True)
def check_shards(s: Zt2Subject) -> Iterator[Finding]:
    used: dict[str, list[ztensor2.Part]] = {}
    for p in s.zt.parts():
        if p.shard is not None and p.shard in s.zt.shards:
            used.setdefault(p.shard, []).append(p)
    for name, parts in used.items():
        path = shard_path(s.src.path, name)
        if path is None or not os.path.isfile(path):
            yield finding(
                ztensor2.ZT2_SHARD_EXTERNAL,
                f"shard {name}: {os.path.basename(path) if path else 'no file'} not found beside "
                f"this file: its {len(parts)} part(s) are not read",
                offset=s.zt.footer.manifest_offset,
                field=f"shards/{name}",
            )
            continue
        try:
            sh = Source.open(path)
        except MatrixError as err:
            yield finding(
                ztensor2.ZT2_SHARD,
                f"shard {name}: {err.message}",
                offset=s.zt.footer.manifest_offset,
                field=f"shards/{name}",
            )
            continue
        with sh:
            problem = shard_identity(sh, name, s.zt.shards[name])
            if problem is not None:
                yield from_error(problem)
                continue
            for p in parts:
                if _placement(s.zt, p) or p.encoding not in (None, ztensor2.ZSTD_SEEKABLE):
                    continue  # reported by the structural rules
                if p.type is not None and p.type not in ztensor2.LOGICAL:
                    continue
                try:
                    for _ in ztensor2.stream_part(sh.buf, p):
                        pass
                except FormatError as err:
                    yield finding(
                        err.code,
                        f"{err.message} (in shard {name}, {sh.name})",
                        offset=err.offset,
                        field=err.field,
                    )


def _array(s: Zt2Subject, p: ztensor2.Part) -> Any:
    import numpy as np

    data = b"".join(bytes(x) for x in ztensor2.stream_part(s.buf, p, verify_digest=False))
    return np.frombuffer(data, dtype=np.dtype(DTYPES[p.dtype].storage))


def _sparse(s: Zt2Subject, o: ztensor2.Obj) -> Iterator[Finding]:
    import numpy as np

    def bad(msg: str, p: ztensor2.Part) -> Finding:
        return finding(ztensor2.ZT2_SPARSE, f"{o.name}: {msg}", offset=p.offset, field=p.field)

    try:
        if o.layout == ztensor2.CSR:
            cols = o.shape[1]
            ind, ptr = o.parts["indices"], o.parts["indptr"]
            indices, indptr = _array(s, ind), _array(s, ptr)
            nnz = indices.size
            if indptr[0] != 0 or int(indptr[-1]) != nnz:
                yield bad(
                    f"indptr runs {int(indptr[0])}..{int(indptr[-1])}, expected 0..{nnz}", ptr
                )
                return
            if np.any(
                np.diff(indptr.astype(np.int64) if indptr.dtype == np.uint32 else indptr) < 0
            ):
                yield bad("indptr decreases", ptr)
                return
            if nnz and int(indices.max()) >= cols:
                yield bad(f"column index {int(indices.max())} is not below {cols}", ind)
                return
            starts = np.zeros(nnz, dtype=bool)
            starts[indptr[:-1][indptr[:-1] < nnz].astype(np.int64)] = True
            if nnz > 1:
                steps = np.diff(indices.astype(np.int64))
                if np.any((steps <= 0) & ~starts[1:]):
                    yield bad("column indices are not strictly increasing within a row", ind)
        else:
            co = o.parts["coords"]
            coords = _array(s, co)
            ndim = len(o.shape)
            nnz = coords.size // ndim
            grid = coords.reshape(ndim, nnz)
            for d in range(ndim):
                if nnz and int(grid[d].max()) >= o.shape[d]:
                    yield bad(
                        f"coordinate {int(grid[d].max())} in dimension {d} is not below "
                        f"{o.shape[d]}",
                        co,
                    )
                    return
            if nnz > 1:
                flat = (
                    np.ravel_multi_index(tuple(grid.astype(np.int64)), o.shape)
                    if o.count < 1 << 62
                    else None
                )
                keys = flat if flat is not None else np.unique(grid.T, axis=0)
                if (flat is not None and np.unique(flat).size != nnz) or (
                    flat is None and len(keys) != nnz
                ):
                    yield bad("two elements name the same cell", co)
    except FormatError as err:
        yield from_error(err)


@rule(FMT, "padding between blobs is zero", scan=True)
def check_padding(s: Zt2Subject) -> Iterator[Finding]:
    f = s.zt
    if f.data_shard:
        return
    spans = sorted({(p.offset, p.end) for p in f.parts() if s.sound(p) and p.length})
    spans.append((f.footer.manifest_offset, f.footer.manifest_offset + f.footer.manifest_length))
    # An earlier generation's manifest, footer and blobs are unreferenced data, not padding.
    for g, old in s.generations():
        spans.append((g.manifest_offset, g.offset + ztensor2.FOOTER_SIZE))
        if not isinstance(old, FormatError):
            spans.extend((p.offset, p.end) for p in old.parts() if p.local and p.length)
    spans.sort()
    pos = len(ztensor2.MAGIC)
    buf = s.buf
    for start, end in [*spans, (f.data_end, f.data_end)]:
        first = first_nonzero(buf, pos, start, PADDING_CHUNK)
        if first is not None:
            yield finding(
                ztensor2.ZT2_PADDING,
                f"padding byte at {first:,} is 0x{buf[first]:02x}",
                offset=first,
                field="padding",
            )
            return
        pos = max(pos, end)


PADDING_CHUNK = 1 << 20


@rule(FMT, "earlier generations", scan=True)
def check_generations(s: Zt2Subject) -> Iterator[Finding]:
    for f, old in s.generations():
        gen_end = f.offset + ztensor2.FOOTER_SIZE
        if isinstance(old, FormatError):
            yield finding(
                ztensor2.ZT2_GENERATION,
                f"the generation ending at {gen_end:,}: {old.message}",
                offset=old.offset,
                field=old.field,
            )
            continue
        problems = [p.message for p in old.problems]
        for p in old.parts():
            bad = _placement(old, p)
            if bad:
                problems.append(bad[1])
        for o in old.objects.values():
            if ztensor2.layout_known(o.layout):
                problems.extend(problem.message for problem in ztensor2.layout_problems(o))
        if problems:
            yield finding(
                ztensor2.ZT2_GENERATION,
                f"the generation ending at {gen_end:,}: {problems[0]}",
                offset=f.manifest_offset,
                field="manifest",
            )
