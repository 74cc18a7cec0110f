"""Load, describe and validate zTensor v1.1 files (rules for `inspect` and `verify`).

Structural rules read the manifest only (plus zstd frame headers); the scan rules read every
blob: digests, zstd decoding under the shape's cap, padding bytes, bool bytes, sparse indices.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding, from_error
from matrixctl.formats import ztensor
from matrixctl.integrity import unknown_severity
from matrixctl.io import Source
from matrixctl.tensors import DTYPES, human_bytes, tensor_row
from matrixctl.validate.engine import rule

FMT = ztensor.FORMAT
SCAN_CHUNK = 8 << 20


class ZtSubject:
    def __init__(self, src: Source, parsed: ztensor.ZtFile) -> None:
        self.src = src
        self.zt = parsed
        self.buf = src.buf
        # Components whose bytes can be read as declared: inside the data region, aligned.
        self.readable: set[tuple[str, str]] = set()
        # Those of them that hold bytes, by (offset, end), for the overlap and gap rules.
        self.spans: list[ztensor.ZtComponent] = []
        data_end = parsed.manifest_offset
        for c in parsed.parts:
            offset = c.offset
            if offset % ztensor.ALIGNMENT:
                continue
            if c.length:
                if offset >= ztensor.HEADER_SIZE and offset + c.length <= data_end:
                    self.readable.add((c.obj, c.role))
                    self.spans.append(c)
            elif ztensor.HEADER_SIZE <= offset <= data_end:
                self.readable.add((c.obj, c.role))
        self.spans.sort(key=_by_span)  # stable: components in file order on a tie
        self.quantized = [o for o in parsed.objects.values() if o.layout == "quantized_group"]

    def _in_bounds(self, c: ztensor.ZtComponent) -> bool:
        if c.length == 0:
            return ztensor.HEADER_SIZE <= c.offset <= self.zt.manifest_offset
        return c.offset >= ztensor.HEADER_SIZE and c.end <= self.zt.manifest_offset

    def sound(self, c: ztensor.ZtComponent) -> bool:
        """Readable and, for raw data, a whole number of elements."""
        if (c.obj, c.role) not in self.readable:
            return False
        return c.encoding != "raw" or c.length % c.itemsize == 0

    def object_ok(self, o: ztensor.ZtObject) -> bool:
        required = ztensor.LAYOUTS.get(o.layout)
        if required is None or any(r not in o.components for r in required):
            return False
        return all(self.sound(c) for c in o.components.values())


_by_span = operator.attrgetter("offset", "length")


def load(src: Source) -> ZtSubject:
    return ZtSubject(src, ztensor.parse(src.buf, src.size))


def _short_digest(digest: str | None) -> str | None:
    if digest is None:
        return None
    algo, _, value = digest.partition(":")
    return f"{algo}:{value[:12]}..." if len(value) > 14 else digest


def describe(s: ZtSubject) -> dict[str, Any]:
    f = s.zt
    rows = []
    parts = []
    stored_total = 0
    for o in f.objects.values():
        comps = list(o.components.values())
        stored = sum(c.length for c in comps)
        stored_total += stored
        main = o.components.get("data") or o.components.get("values")
        main = main or o.components.get("packed_weight") or (comps[0] if comps else None)
        dtype = main.dtype if main else None
        logical = o.count * DTYPES[dtype].itemsize if dtype else None
        encodings = sorted({c.encoding for c in comps})
        digests = [c.digest for c in comps]
        if len(comps) == 1:
            digest_text = _short_digest(digests[0])
        else:
            have = sum(d is not None for d in digests)
            digest_text = f"{have} of {len(comps)} components" if have else None
        rows.append(
            tensor_row(
                o.name,
                dtype,
                o.shape,
                comps[0].offset if len(comps) == 1 else None,
                stored,
                {
                    "layout": o.layout,
                    "logical_bytes": logical,
                    "encoding": "+".join(encodings),
                    "digest": digest_text,
                },
            )
        )
        if o.layout != "dense":
            for c in comps:
                parts.append(
                    {
                        "tensor": o.name,
                        "role": c.role,
                        "dtype": c.dtype,
                        "offset": c.offset,
                        "length": c.length,
                        "encoding": c.encoding,
                        "digest": c.digest,
                    }
                )
    out: dict[str, Any] = {
        "size": f.size,
        "version": f.version,
        "tensor_count": len(f.objects),
        "stored": human_bytes(stored_total),
        "manifest": {"offset": f.manifest_offset, "size": f.manifest_size},
    }
    if f.attributes:
        out["attributes"] = {str(k): v for k, v in f.attributes.items()}
    out["tensors"] = rows
    if parts:
        out["components"] = parts
    return out


# Structural rules ---------------------------------------------------------------------------


@rule(FMT, "manifest schema and version")
def check_schema(s: ZtSubject) -> Iterator[Finding]:
    f = s.zt
    at = f.manifest_offset
    for p in f.problems:
        severity = unknown_severity() if p.code == ztensor.ZT_DIGEST_UNKNOWN else None
        yield finding(p.code, p.message, offset=at, field=p.field, severity=severity)
    major, _, rest = f.version.partition(".")
    minor = rest.partition(".")[0]
    if not (major.isdigit() and minor.isdigit()) or int(major) != ztensor.SUPPORTED_MAJOR:
        yield finding(
            ztensor.ZT_VERSION,
            f"version {f.version!r} is not a zTensor 1.x version (this reader knows 1.1)",
            offset=at,
            field="version",
        )
    elif int(minor) > ztensor.KNOWN_MINOR:
        yield finding(
            ztensor.ZT_VERSION_NEWER,
            f"version {f.version} is newer than 1.1: fields it adds are ignored",
            offset=at,
            field="version",
        )
    bad_attrs = [
        str(k) for k, v in f.attributes.items() if not isinstance(k, str) or not isinstance(v, str)
    ]
    if bad_attrs:
        yield finding(
            ztensor.ZT_ATTRIBUTES,
            f"root attributes {', '.join(bad_attrs[:5])} are not text: ztensor 1.1.1 cannot open "
            "this file",
            offset=at,
            field="attributes",
        )
    # A NUL in any name is a NUL in their concatenation: one test for the whole map.
    for o in f.objects.values() if "" in f.objects or "\x00" in "".join(f.objects) else ():
        if o.name == "" or "\x00" in o.name:
            yield finding(
                ztensor.ZT_NAME,
                f"object name {o.name!r} is empty or has a NUL",
                offset=at,
                field=o.field,
            )
    foreign = sorted({c.dtype for c in f.components()} - ztensor.REFERENCE_DTYPES)
    if foreign:
        yield finding(
            ztensor.ZT_REFERENCE_DTYPE,
            f"dtype {', '.join(foreign)}: valid zTensor v1.1, but ztensor 1.1.1 cannot open files "
            "that use it",
            offset=at,
            field="dtype",
        )


@rule(FMT, "layouts and components")
def check_layouts(s: ZtSubject) -> Iterator[Finding]:
    at = s.zt.manifest_offset
    for o in s.zt.objects.values():
        if o.layout == "dense" and len(o.components) == 1 and "data" in o.components:
            continue  # the whole layout, nothing missing, extra or indexed
        required = ztensor.LAYOUTS.get(o.layout)
        if required is None:
            yield finding(
                ztensor.ZT_LAYOUT,
                f"{o.name}: format {o.layout!r} is not dense, sparse_csr, sparse_coo or "
                "quantized_group",
                offset=at,
                field=f"{o.field}/format",
            )
            continue
        missing = [r for r in required if r not in o.components]
        if missing:
            yield finding(
                ztensor.ZT_COMPONENTS,
                f"{o.name}: layout {o.layout} requires component(s) {', '.join(missing)}",
                offset=at,
                field=f"{o.field}/components",
            )
        for role in o.components:
            if role not in required:
                yield finding(
                    ztensor.ZT_EXTRA_COMPONENT,
                    f"{o.name}: component {role!r} is not part of layout {o.layout}",
                    offset=at,
                    field=f"{o.field}/components/{role}",
                )
        for role, c in o.components.items():  # in the manifest's order
            if role not in ztensor.INDEX_ROLES:
                continue
            if o.layout.startswith("sparse") and DTYPES[c.dtype].kind not in ("int", "uint"):
                yield finding(
                    ztensor.ZT_COMPONENT_DTYPE,
                    f"{o.name}/{role}: index dtype {c.dtype} is not an integer type",
                    offset=at,
                    field=f"{c.field}/dtype",
                )
        if o.layout == "sparse_csr" and len(o.shape) != 2:
            yield finding(
                ztensor.ZT_SPARSE,
                f"{o.name}: sparse_csr needs a 2-D shape, got {list(o.shape)}",
                offset=at,
                field=f"{o.field}/shape",
            )


@rule(FMT, "offsets: alignment and bounds")
def check_bounds(s: ZtSubject) -> Iterator[Finding]:
    f = s.zt
    for c in f.parts:
        if c.offset % ztensor.ALIGNMENT:
            yield finding(
                ztensor.ZT_ALIGN,
                f"{c.obj}/{c.role}: offset {c.offset} is not a multiple of {ztensor.ALIGNMENT}",
                offset=c.offset,
                field=f"{c.field}/offset",
            )
        elif (c.obj, c.role) in s.readable:
            continue  # aligned and inside the data region
        if c.end > f.size:
            yield finding(
                ztensor.ZT_BOUNDS,
                f"{c.obj}/{c.role}: bytes {c.offset:,}..{c.end:,} run past the end of the "
                f"{f.size:,}-byte file",
                offset=min(c.offset, f.size),
                field=f"{c.field}/length",
            )
        elif not s._in_bounds(c):
            where = "the magic" if c.offset < ztensor.HEADER_SIZE else "the manifest and footer"
            yield finding(
                ztensor.ZT_BOUNDS,
                f"{c.obj}/{c.role}: bytes {c.offset:,}..{c.end:,} overlap {where} (blobs lie in "
                f"{ztensor.HEADER_SIZE}..{f.manifest_offset:,})",
                offset=c.offset,
                field=f"{c.field}/offset",
            )


@rule(FMT, "no overlapping components, no unreferenced gaps")
def check_overlaps(s: ZtSubject) -> Iterator[Finding]:
    prev: ztensor.ZtComponent | None = None
    prev_end = 0
    for c in s.spans:
        end = c.offset + c.length
        if prev is not None and c.offset < prev_end:
            yield finding(
                ztensor.ZT_OVERLAP,
                f"{c.obj}/{c.role} (bytes {c.offset:,}..{end:,}) overlaps {prev.obj}/{prev.role} "
                f"(bytes {prev.offset:,}..{prev_end:,})",
                offset=c.offset,
                field=f"{c.field}/offset",
            )
        if prev is None or end > prev_end:
            prev, prev_end = c, end
    for start, end in gaps(s):
        if end - start >= ztensor.ALIGNMENT:
            yield finding(
                ztensor.ZT_GAP,
                f"bytes {start:,}..{end:,} ({end - start:,}) belong to no component",
                offset=start,
                field="padding",
            )


def gaps(s: ZtSubject) -> list[tuple[int, int]]:
    """Byte ranges of the data region covered by no readable component."""
    out = []
    pos = ztensor.HEADER_SIZE
    for c in s.spans:
        if c.offset > pos:
            out.append((pos, c.offset))
        end = c.offset + c.length
        pos = max(pos, end)
    if s.zt.manifest_offset > pos:
        out.append((pos, s.zt.manifest_offset))
    return out


@rule(FMT, "component lengths vs shape and dtype")
def check_lengths(s: ZtSubject) -> Iterator[Finding]:
    for o in s.zt.objects.values():
        for c in o.components.values():
            if c.encoding == "raw":
                if o.layout == "dense" and c.length == o.count * c.itemsize:
                    continue  # a whole number of elements, exactly the shape's (decoded_cap)
                yield from _raw_length(s, o, c)
            elif (c.obj, c.role) in s.readable:
                yield from _zstd_length(s, o, c)


def _raw_length(s: ZtSubject, o: ztensor.ZtObject, c: ztensor.ZtComponent) -> Iterator[Finding]:
    size = c.itemsize
    if c.length % size:
        yield finding(
            ztensor.ZT_LENGTH,
            f"{o.name}/{c.role}: length {c.length:,} is not a multiple of {c.dtype}'s {size} bytes",
            offset=c.offset,
            field=f"{c.field}/length",
        )
        return
    if o.layout not in ztensor.LAYOUTS:
        return
    cap, exact = ztensor.decoded_cap(o, c)
    if exact and c.length != cap:
        yield finding(
            ztensor.ZT_LENGTH,
            f"{o.name}/{c.role}: length {c.length:,}, but shape {list(o.shape)} of {c.dtype} "
            f"needs {cap:,} bytes",
            offset=c.offset,
            field=f"{c.field}/length",
        )
    elif not exact and c.length > cap:
        yield finding(
            ztensor.ZT_LENGTH,
            f"{o.name}/{c.role}: length {c.length:,} holds more elements than shape "
            f"{list(o.shape)} has",
            offset=c.offset,
            field=f"{c.field}/length",
        )


def _zstd_length(s: ZtSubject, o: ztensor.ZtObject, c: ztensor.ZtComponent) -> Iterator[Finding]:
    if o.layout not in ztensor.LAYOUTS:
        return
    cap, exact = ztensor.decoded_cap(o, c)
    if exact and cap > c.length * ztensor.ZSTD_MAX_RATIO:
        yield finding(
            ztensor.ZT_ZSTD_SIZE,
            f"{o.name}/{c.role}: {c.length:,} bytes of zstd cannot decode to the {cap:,} bytes "
            f"its shape needs (at most {ztensor.ZSTD_MAX_RATIO}x)",
            offset=c.offset,
            field=f"{c.field}/length",
        )
        return
    declared = ztensor.zstd_frame_size(memoryview(s.buf)[c.offset : c.end])
    if declared is not None and ((exact and declared != cap) or declared > cap):
        yield finding(
            ztensor.ZT_ZSTD_SIZE,
            f"{o.name}/{c.role}: the zstd frame declares {declared:,} decoded bytes, shape and "
            f"dtype give {cap:,}",
            offset=c.offset,
            field=f"{c.field}/length",
        )


@rule(FMT, "digest strings")
def check_digest_format(s: ZtSubject) -> Iterator[Finding]:
    missing = 0
    well_formed = ztensor.KNOWN_DIGEST.fullmatch
    for c in s.zt.parts:
        if c.digest is None:
            missing += 1
            continue
        if well_formed(c.digest):
            continue  # parse_digest would give (algorithm, value)
        try:
            known = ztensor.parse_digest(c.digest)
        except ValueError as exc:
            yield finding(
                ztensor.ZT_DIGEST_FORMAT,
                f"{c.obj}/{c.role}: digest {c.digest!r:.60} is malformed: {exc}",
                offset=s.zt.manifest_offset,
                field=f"{c.field}/digest",
            )
            continue
        if known is None:
            yield finding(
                ztensor.ZT_DIGEST_UNKNOWN,
                f"{c.obj}/{c.role}: digest algorithm {c.digest.partition(':')[0]!r:.30} is not "
                "crc32c or sha256; not verified",
                offset=s.zt.manifest_offset,
                field=f"{c.field}/digest",
                severity=unknown_severity(),
            )
    if missing:
        yield finding(
            ztensor.ZT_NO_DIGEST,
            f"{missing} of {len(s.zt.parts)} components carry no digest",
            offset=s.zt.manifest_offset,
            field="digest",
        )


@rule(FMT, "quantized_group sizes")
def check_quantized(s: ZtSubject) -> Iterator[Finding]:
    for o in s.quantized:
        if not s.object_ok(o):
            continue
        bits = o.attributes.get("bits")
        group = o.attributes.get("group_size")
        packed = o.components["packed_weight"]
        if (
            isinstance(bits, int)
            and not isinstance(bits, bool)
            and bits > 0
            and packed.encoding == "raw"
        ):
            need = -(-o.count * bits // 8)
            have = packed.length
            if have != -(-need // packed.itemsize) * packed.itemsize:
                yield finding(
                    ztensor.ZT_QUANT_SIZE,
                    f"{o.name}: packed_weight is {have:,} bytes; {o.count:,} elements of {bits} "
                    f"bits need {need:,}",
                    offset=packed.offset,
                    field=f"{packed.field}/length",
                )
        if isinstance(group, int) and not isinstance(group, bool) and group > 0:
            groups = -(-o.count // group)
            for role in ("scales", "zeros"):
                c = o.components[role]
                if c.encoding == "raw" and c.length // c.itemsize != groups:
                    yield finding(
                        ztensor.ZT_QUANT_SIZE,
                        f"{o.name}/{role}: {c.length // c.itemsize:,} elements; {o.count:,} "
                        f"elements in groups of {group} make {groups:,}",
                        offset=c.offset,
                        field=f"{c.field}/length",
                    )


ZT_QUANT_GGML = codes.define(
    "ZT_QUANT_GGML",
    "A quantized_group object marked `quantization: ggml` (raw GGUF blocks) names an unknown "
    "ggml type or a wrong block geometry, has rows that are not whole blocks, a packed_weight "
    "that is not u8 of exactly the blocks' size, or non-empty scales or zeros.",
    group=FMT,
)


@rule(FMT, "ggml quantized blocks")
def check_ggml_blocks(s: ZtSubject) -> Iterator[Finding]:
    """quantized_group objects holding raw ggml blocks (docs/formats/ztensor.md decision 20)."""
    for o in s.quantized:
        if o.attributes.get("quantization") != "ggml":
            continue
        if any(r not in o.components for r in ztensor.LAYOUTS[o.layout]):
            continue  # the layout rule reports it
        from matrixctl.formats.gguf import GGML_BY_NAME  # only for ggml blocks (start-up time)

        at = o.components["packed_weight"]
        name = o.attributes.get("ggml_type")
        gtype = GGML_BY_NAME.get(str(name))
        if gtype is None or not gtype.quantized:
            yield finding(
                ZT_QUANT_GGML,
                f"{o.name}: ggml_type {name!r:.40} is not a quantized ggml type",
                offset=s.zt.manifest_offset,
                field=f"{o.field}/attributes/ggml_type",
            )
            continue
        wrong = [
            f"{key} {o.attributes.get(key)!r:.20} (the type's is {want})"
            for key, want in (
                ("ggml_type_id", gtype.id),
                ("block_size", gtype.block_size),
                ("type_size", gtype.type_size),
            )
            if o.attributes.get(key, want) != want
        ]
        if wrong:
            yield finding(
                ZT_QUANT_GGML,
                f"{o.name}: {gtype.name} attributes disagree with the type: {', '.join(wrong)}",
                offset=s.zt.manifest_offset,
                field=f"{o.field}/attributes",
            )
            continue
        row = o.shape[-1] if o.shape else 1
        if row % gtype.block_size:
            yield finding(
                ZT_QUANT_GGML,
                f"{o.name}: rows of {row:,} elements are not whole {gtype.name} blocks of "
                f"{gtype.block_size}",
                offset=s.zt.manifest_offset,
                field=f"{o.field}/shape",
            )
            continue
        for role, comp in o.components.items():
            if role != "packed_weight" and comp.length:
                yield finding(
                    ZT_QUANT_GGML,
                    f"{o.name}/{role}: ggml blocks carry their scales inline, so {role} must be "
                    f"empty; it has {comp.length:,} bytes",
                    offset=comp.offset,
                    field=f"{comp.field}/length",
                )
        if at.dtype != "u8":
            yield finding(
                ZT_QUANT_GGML,
                f"{o.name}/packed_weight: ggml blocks are stored as u8, not {at.dtype}",
                offset=s.zt.manifest_offset,
                field=f"{at.field}/dtype",
            )


# Scan rules ---------------------------------------------------------------------------------


@rule(FMT, "padding bytes are zero", scan=True)
def check_padding(s: ZtSubject) -> Iterator[Finding]:
    import numpy as np

    for start, end in gaps(s):
        for pos in range(start, end, SCAN_CHUNK):
            stop = min(end, pos + SCAN_CHUNK)
            block = np.frombuffer(s.buf, dtype=np.uint8, count=stop - pos, offset=pos)
            nz = np.flatnonzero(block)
            if nz.size:
                first = pos + int(nz[0])
                yield finding(
                    ztensor.ZT_PADDING,
                    f"padding byte at {first:,} is 0x{int(block[nz[0]]):02x}; {nz.size} non-zero "
                    f"byte(s) in the gap {start:,}..{end:,}",
                    offset=first,
                    field="padding",
                )
                break


@rule(FMT, "digests match the stored bytes", scan=True)
def check_digests(s: ZtSubject) -> Iterator[Finding]:
    for c in s.zt.components():
        if c.digest is None or (c.obj, c.role) not in s.readable:
            continue
        try:
            known = ztensor.parse_digest(c.digest)
        except ValueError:
            continue
        if known is None:
            continue
        digester = ztensor.Digester(known[0])
        view = memoryview(s.buf)[c.offset : c.end]
        for pos in range(0, len(view), SCAN_CHUNK):
            digester.update(view[pos : pos + SCAN_CHUNK])
        got = digester.text()
        if not ztensor.same_digest(c.digest, got):
            yield finding(
                ztensor.ZT_DIGEST,
                f"{c.obj}/{c.role}: digest is {c.digest}, the stored bytes give {got}",
                offset=c.offset,
                field=f"{c.field}/digest",
            )


def _decoded_chunks(s: ZtSubject, o: ztensor.ZtObject, c: ztensor.ZtComponent) -> Iterator[Any]:
    return ztensor.stream_component(s.buf, o, c, verify_digest=False, chunk=SCAN_CHUNK)


@rule(FMT, "zstd components decode to their declared size", scan=True)
def check_zstd(s: ZtSubject) -> Iterator[Finding]:
    for o in s.zt.objects.values():
        if o.layout not in ztensor.LAYOUTS:
            continue
        for c in o.components.values():
            if c.encoding != "zstd" or (c.obj, c.role) not in s.readable:
                continue
            cap, exact = ztensor.decoded_cap(o, c)
            if exact and cap > c.length * ztensor.ZSTD_MAX_RATIO:
                continue  # reported by the structural rule; nothing to decode
            try:
                total = 0
                for piece in _decoded_chunks(s, o, c):
                    total += len(piece)
                partial = None if exact else ztensor.partial_element(o, c, total)
                if partial is not None:
                    yield from_error(partial)
            except FormatError as err:
                yield from_error(err)


@rule(FMT, "bool elements are 0 or 1", scan=True)
def check_bools(s: ZtSubject) -> Iterator[Finding]:
    import numpy as np

    for o in s.zt.objects.values():
        if not s.object_ok(o) or o.layout not in ztensor.LAYOUTS:
            continue
        for c in o.components.values():
            if c.dtype != "bool":
                continue
            pos = 0
            try:
                for piece in _decoded_chunks(s, o, c):
                    arr = np.frombuffer(piece, dtype=np.uint8)
                    bad = np.flatnonzero(arr > 1)
                    if bad.size:
                        index = pos + int(bad[0])
                        yield finding(
                            ztensor.ZT_BOOL,
                            f"{o.name}/{c.role}: element {index:,} is 0x{int(arr[bad[0]]):02x}; "
                            "bool is 0x00 or 0x01",
                            offset=c.offset + index if c.encoding == "raw" else c.offset,
                            field=f"{c.field}[{index}]",
                        )
                        break
                    pos += arr.size
            except FormatError:
                continue  # the zstd rule reports it


def _component_array(s: ZtSubject, o: ztensor.ZtObject, c: ztensor.ZtComponent) -> Any:
    import numpy as np

    dt = np.dtype(DTYPES[c.dtype].storage)
    if c.encoding == "raw":
        return np.frombuffer(s.buf, dtype=dt, count=c.length // c.itemsize, offset=c.offset)
    data = b"".join(bytes(p) for p in _decoded_chunks(s, o, c))
    return np.frombuffer(data, dtype=dt, count=len(data) // c.itemsize)


@rule(FMT, "sparse indices are consistent", scan=True)
def check_sparse(s: ZtSubject) -> Iterator[Finding]:
    for o in s.zt.objects.values():
        if o.layout not in ("sparse_csr", "sparse_coo") or not s.object_ok(o):
            continue
        if o.layout == "sparse_csr" and len(o.shape) != 2:
            continue
        try:
            problem = sparse_problem(s, o)
        except FormatError:
            continue  # decoding errors are the zstd rule's
        if problem is not None:
            role, message = problem
            c = o.components[role]
            yield finding(ztensor.ZT_SPARSE, f"{o.name}: {message}", offset=c.offset, field=c.field)


def sparse_problem(s: ZtSubject, o: ztensor.ZtObject) -> tuple[str, str] | None:
    """(role, what is wrong) for the first inconsistency of a sparse object, else None."""
    import numpy as np

    values = _component_array(s, o, o.components["values"])
    nnz = values.size
    if o.layout == "sparse_csr":
        rows, cols = o.shape
        indptr = _component_array(s, o, o.components["indptr"]).astype(np.int64, copy=False)
        indices = _component_array(s, o, o.components["indices"])
        if indptr.size != rows + 1:
            return "indptr", f"indptr has {indptr.size:,} entries, {rows:,} rows need {rows + 1:,}"
        if indices.size != nnz:
            return "indices", f"{indices.size:,} indices for {nnz:,} values"
        if int(indptr[0]) != 0 or int(indptr[-1]) != nnz:
            return "indptr", f"indptr runs {int(indptr[0])}..{int(indptr[-1])}, must be 0..{nnz}"
        if indptr.size > 1 and bool((np.diff(indptr) < 0).any()):
            first = int(np.flatnonzero(np.diff(indptr) < 0)[0])
            return "indptr", f"indptr decreases at row {first}"
        if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= cols):
            return "indices", f"a column index is outside 0..{cols - 1}"
        return None
    coords = _component_array(s, o, o.components["coords"])
    ndim = len(o.shape)
    if coords.size != ndim * nnz:
        return (
            "coords",
            f"coords has {coords.size:,} entries; {ndim} dims x {nnz:,} values need {ndim * nnz:,}",
        )
    if nnz:
        grid = coords.reshape(ndim, nnz)
        for axis, dim in enumerate(o.shape):
            row = grid[axis]
            if int(row.min()) < 0 or int(row.max()) >= dim:
                return "coords", f"a coordinate on axis {axis} is outside 0..{dim - 1}"
    return None
