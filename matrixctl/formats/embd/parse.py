"""The lenient EMBD parser: every structure bounds-checked, each problem recorded under the
rule that reports it (`matrixctl.validate.embd` turns them into findings)."""

from __future__ import annotations

import struct
from typing import Any

from matrixctl import crc
from matrixctl.errors import FormatError
from matrixctl.formats.embd.layout import (
    ALIGNMENT,
    CRC_SPAN,
    DESCRIPTOR,
    DESCRIPTOR_SIZE,
    DTYPE_CODES,
    EMBD_ALIGN,
    EMBD_BOUNDS,
    EMBD_COMPRESSED,
    EMBD_DUPLICATE_NAME,
    EMBD_FILE_SIZE,
    EMBD_FLAGS,
    EMBD_FOOTER,
    EMBD_HEADER_CRC,
    EMBD_INDEX,
    EMBD_META,
    EMBD_NAME_HASH,
    EMBD_OVERLAP,
    EMBD_RESERVED,
    EMBD_SECTION,
    EMBD_SPECIAL,
    EMBD_TRUNCATED,
    EMBD_UTF8,
    EMBD_VERSION,
    EMBD_VERSION_NEWER,
    EMBD_VOCAB,
    EMBD_VOCAB_DUPLICATE,
    END_MAGIC,
    FLAG_CHECKSUM_ENABLED,
    FLAG_COMPRESSED,
    FLAG_TENSORS_ALIGNED,
    FLAG_VOCAB_EMBEDDED,
    FOOTER_SIZE,
    HEADER_SIZE,
    KNOWN_FLAGS,
    MAX_ENTRIES,
    MAX_RANK,
    MAX_TENSORS,
    MAX_TOKENS,
    NO_TOKEN,
    R_DATA,
    R_HEADER,
    R_INDEX,
    R_META,
    R_SECTIONS,
    R_VOCAB,
    SPECIAL_BLOCK,
    SPECIALS,
    VERSION_MAJOR,
    VERSION_MINOR,
    VOCAB_HEAD,
    EmbdFile,
    EmbdTensor,
    Footer,
    Header,
    fnv1a_32,
)
from matrixctl.tensors import crc_range


def parse(buf: Any, size: int) -> EmbdFile:
    """Every structure of the file, bounds-checked; problems are recorded, not raised, except
    when nothing at all can be read (shorter than a header, another major version)."""
    if size < HEADER_SIZE:
        raise FormatError(
            EMBD_TRUNCATED,
            f"file is {size} bytes, the header alone needs {HEADER_SIZE}",
            offset=size,
            field="header",
        )
    head = bytes(buf[:HEADER_SIZE])
    h = Header.parse(head)
    if h.version_major != VERSION_MAJOR:
        raise FormatError(
            EMBD_VERSION,
            f"version {h.version_major}.{h.version_minor}: this reader knows EMBD 1.x only",
            offset=4,
            field="version_major",
        )
    f = EmbdFile(size, h)
    _check_header(f, buf, head)
    body_end = _check_footer(f, buf)
    _check_sections(f, body_end)
    _parse_metadata(f, buf, body_end)
    _parse_vocab(f, buf, body_end)
    _parse_index(f, buf, body_end)
    _check_section_overlaps(f)
    _check_data(f, body_end)
    return f


def _check_header(f: EmbdFile, buf: Any, head: bytes) -> None:
    h = f.header
    if h.version_minor > VERSION_MINOR:
        f.add(
            R_HEADER,
            EMBD_VERSION_NEWER,
            f"version 1.{h.version_minor} is newer than 1.0: read as 1.0",
            6,
            "version_minor",
        )
    if h.flags & FLAG_CHECKSUM_ENABLED:
        want = crc.crc32(head[:CRC_SPAN])
        if want != h.header_checksum:
            f.add(
                R_HEADER,
                EMBD_HEADER_CRC,
                f"header_checksum is 0x{h.header_checksum:08x}, the CRC-32 of bytes 0..55 is "
                f"0x{want:08x}",
                56,
                "header_checksum",
            )
    if h.flags & ~KNOWN_FLAGS:
        f.add(
            R_HEADER,
            EMBD_FLAGS,
            f"flags 0x{h.flags:08x} set bits 4-31, which the spec reserves (must be 0)",
            8,
            "flags",
        )
    if h.flags & FLAG_COMPRESSED:
        f.add(
            R_HEADER,
            EMBD_COMPRESSED,
            "COMPRESSED is set, but the spec defines no compression: the data cannot be read",
            8,
            "flags",
        )
    if h.reserved:
        f.add(R_HEADER, EMBD_RESERVED, f"reserved is 0x{h.reserved:08x}", 60, "reserved")
    if h.total_file_size != f.size:
        f.add(
            R_HEADER,
            EMBD_FILE_SIZE,
            f"total_file_size is {h.total_file_size:,}, the file has {f.size:,} bytes"
            + (" (truncated?)" if f.size < h.total_file_size else ""),
            48,
            "total_file_size",
        )


def _check_footer(f: EmbdFile, buf: Any) -> int:
    """Read the footer at EOF - 16; return where the file's body ends (the footer's offset)."""
    h = f.header
    if f.size < HEADER_SIZE + FOOTER_SIZE:
        f.add(
            R_HEADER,
            EMBD_TRUNCATED,
            f"file is {f.size} bytes: no room for the 16-byte footer after the header",
            f.size,
            "footer",
        )
        return f.size
    at = f.size - FOOTER_SIZE
    f.footer = Footer.parse(bytes(buf[at : f.size]))
    if f.footer.magic != END_MAGIC:
        f.add(
            R_HEADER,
            EMBD_FOOTER,
            f"the last 16 bytes end with {f.footer.magic!r}, not b'DBME': truncated or not "
            "finished",
            at + 8,
            "magic_end",
        )
    if f.footer.reserved:
        f.add(
            R_HEADER,
            EMBD_RESERVED,
            f"footer reserved is 0x{f.footer.reserved:08x}",
            at + 12,
            "footer.reserved",
        )
    if h.footer_offset != at:
        f.add(
            R_HEADER,
            EMBD_FOOTER,
            f"tensor_data_offset + tensor_data_size = {h.footer_offset:,}, but the footer is at "
            f"{at:,} (EOF - 16)",
            40,
            "tensor_data_size",
        )
    return at


def _in_body(f: EmbdFile, name: str, start: int, length: int, body_end: int, where: str) -> bool:
    end = start + length
    if start < HEADER_SIZE or end > body_end:
        f.add(
            R_SECTIONS,
            EMBD_SECTION,
            f"{name} section [{start:,}, {end:,}) lies outside the file body [{HEADER_SIZE}, "
            f"{body_end:,})" + (" (past EOF)" if end > f.size else ""),
            _field_offset(where),
            where,
        )
        return False
    return True


def _field_offset(name: str) -> int:
    return {
        "metadata_offset": 12,
        "vocab_offset": 20,
        "tensor_index_offset": 28,
        "tensor_data_offset": 36,
    }.get(name, 0)


def _check_sections(f: EmbdFile, body_end: int) -> None:
    h = f.header
    if _in_body(f, "metadata", h.metadata_offset, h.metadata_size, body_end, "metadata_offset"):
        f.sections.append(("metadata", h.metadata_offset, h.metadata_offset + h.metadata_size))
    vocab_flag = bool(h.flags & FLAG_VOCAB_EMBEDDED)
    if not vocab_flag and (h.vocab_offset or h.vocab_size):
        f.add(
            R_HEADER,
            EMBD_FLAGS,
            f"VOCAB_EMBEDDED is clear but vocab_offset/vocab_size are {h.vocab_offset}/"
            f"{h.vocab_size} (both must be 0 without a vocabulary)",
            8,
            "flags",
        )
    elif vocab_flag and _in_body(
        f, "vocabulary", h.vocab_offset, h.vocab_size, body_end, "vocab_offset"
    ):
        f.sections.append(("vocabulary", h.vocab_offset, h.vocab_offset + h.vocab_size))
    if _in_body(
        f, "tensor data", h.tensor_data_offset, h.tensor_data_size, body_end, "tensor_data_offset"
    ):
        f.sections.append(
            ("tensor data", h.tensor_data_offset, h.tensor_data_offset + h.tensor_data_size)
        )
    if h.flags & FLAG_TENSORS_ALIGNED and h.tensor_data_offset % ALIGNMENT:
        f.add(
            R_DATA,
            EMBD_ALIGN,
            f"tensor_data_offset {h.tensor_data_offset:,} is not a multiple of {ALIGNMENT}",
            36,
            "tensor_data_offset",
        )


def _section(f: EmbdFile, name: str) -> tuple[int, int] | None:
    for n, start, end in f.sections:
        if n == name:
            return start, end
    return None


def _text(f: EmbdFile, rule: str, raw: bytes, offset: int, where: str, what: str) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        f.add(rule, EMBD_UTF8, f"{what} is not UTF-8 ({exc.reason})", offset + exc.start, where)
        return None


def _parse_metadata(f: EmbdFile, buf: Any, body_end: int) -> None:
    sec = _section(f, "metadata")
    if sec is None:
        return
    start, end = sec
    if end - start < 8:
        f.add(
            R_META,
            EMBD_META,
            f"metadata_size {end - start} is smaller than the 8-byte metadata header",
            16,
            "metadata_size",
        )
        return
    raw = bytes(buf[start:end])
    count, total = struct.unpack_from("<II", raw, 0)
    if 8 + total != len(raw):
        f.add(
            R_META,
            EMBD_META,
            f"total_size {total:,} + 8 differs from metadata_size {len(raw):,}",
            start + 4,
            "metadata.total_size",
        )
    room = len(raw) - 8
    if count > MAX_ENTRIES or count * 4 > room:
        f.add(
            R_META,
            EMBD_META,
            f"entry_count {count:,} needs at least {count * 4:,} bytes, the section has "
            f"{room:,} after its header",
            start,
            "metadata.entry_count",
        )
        return
    pos = 8
    seen: set[str] = set()
    ok = True
    for i in range(count):
        where = f"metadata[{i}]"
        if pos + 4 > len(raw):
            f.add(R_META, EMBD_META, f"entry {i} runs past the section", start + pos, where)
            return
        klen, vlen = struct.unpack_from("<HH", raw, pos)
        if pos + 4 + klen + vlen > len(raw):
            f.add(
                R_META,
                EMBD_META,
                f"entry {i} ({klen}-byte key, {vlen}-byte value) runs past the section",
                start + pos,
                where,
            )
            return
        key = _text(f, R_META, raw[pos + 4 : pos + 4 + klen], start + pos + 4, where, "key")
        value = _text(
            f,
            R_META,
            raw[pos + 4 + klen : pos + 4 + klen + vlen],
            start + pos + 4 + klen,
            where,
            f"value of {key!r}",
        )
        if key is None or value is None:
            ok = False
        elif not key:
            f.add(R_META, EMBD_META, f"entry {i} has an empty key", start + pos, where)
            ok = False
        elif key in seen:
            f.add(R_META, EMBD_META, f"key {key!r} appears twice", start + pos, where)
            ok = False
        else:
            seen.add(key)
            f.metadata.append((key, value))
        pos += 4 + klen + vlen
    if pos != len(raw) and 8 + total == len(raw):
        f.add(
            R_META,
            EMBD_META,
            f"the {count} entries take {pos - 8:,} bytes, total_size says {total:,}",
            start + 4,
            "metadata.total_size",
        )
        ok = False
    f.metadata_ok = ok


def _parse_vocab(f: EmbdFile, buf: Any, body_end: int) -> None:
    sec = _section(f, "vocabulary")
    if sec is None:
        return
    start, end = sec
    if end - start < VOCAB_HEAD + SPECIAL_BLOCK:
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"vocab_size {end - start} is smaller than the 12-byte vocabulary header plus the "
            "20 bytes of special-token ids",
            24,
            "vocab_size",
        )
        return
    raw = bytes(buf[start:end])
    count, total, special = struct.unpack_from("<III", raw, 0)
    if VOCAB_HEAD + SPECIAL_BLOCK + total != len(raw):
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"total_size {total:,} + 32 (header and special ids) differs from vocab_size "
            f"{len(raw):,}",
            start + 4,
            "vocab.total_size",
        )
        total = min(total, len(raw) - VOCAB_HEAD - SPECIAL_BLOCK)
    before, after = start + VOCAB_HEAD, start + VOCAB_HEAD + total
    if special == before:
        tokens_at = VOCAB_HEAD + SPECIAL_BLOCK
    elif special == after:
        tokens_at = VOCAB_HEAD
    else:
        hint = ""
        if special in (VOCAB_HEAD, VOCAB_HEAD + total):
            hint = (
                "; it looks relative to the vocabulary section, but offsets are absolute "
                f"(spec assumption 4): {start + special:,} was expected"
            )
        f.add(
            R_VOCAB,
            EMBD_SPECIAL,
            f"special_tokens is {special:,}; the ids must start right after the vocabulary "
            f"header ({before:,}) or right after the tokens ({after:,}){hint}",
            start + 8,
            "vocab.special_tokens",
        )
        return
    f.special_offset = special
    ids = struct.unpack_from("<5I", raw, special - start)
    if count > MAX_TOKENS or count * 2 > total:
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"token_count {count:,} needs at least {count * 2:,} bytes, the token data has "
            f"{total:,}",
            start,
            "vocab.token_count",
        )
        return
    # First the entry positions (a tight loop: each length gives the next position), then
    # the texts in one comprehension; a decoding error sends us to the slow path that names
    # the token.
    starts: list[int] = []
    pos = tokens_at
    stop = tokens_at + total
    for i in range(count):
        if pos + 2 > stop:
            f.add(
                R_VOCAB,
                EMBD_VOCAB,
                f"token {i} runs past the token data",
                start + pos,
                f"token[{i}]",
            )
            return
        end = pos + 2 + (raw[pos] | raw[pos + 1] << 8)
        if end > stop:
            f.add(
                R_VOCAB,
                EMBD_VOCAB,
                f"token {i} ({end - pos - 2} bytes) runs past the token data",
                start + pos,
                f"token[{i}]",
            )
            return
        starts.append(pos)
        pos = end
    ends = [*starts[1:], pos] if starts else []
    bad_utf8 = False
    try:
        tokens = [raw[a + 2 : b].decode("utf-8") for a, b in zip(starts, ends, strict=True)]
    except UnicodeDecodeError:
        bad_utf8 = True
        tokens = []
        for i, (a, b) in enumerate(zip(starts, ends, strict=True)):
            try:
                tokens.append(raw[a + 2 : b].decode("utf-8"))
            except UnicodeDecodeError as exc:
                if len(tokens) == i and not any(p.code == EMBD_UTF8 for p in f.problems):
                    f.add(
                        R_VOCAB,
                        EMBD_UTF8,
                        f"token {i} is not UTF-8 ({exc.reason})",
                        start + a + 2 + exc.start,
                        f"token[{i}]",
                    )
                tokens.append(raw[a + 2 : b].decode("utf-8", "replace"))
    offsets = [start + a for a in starts]
    if pos != stop:
        f.add(
            R_VOCAB,
            EMBD_VOCAB,
            f"the {count:,} tokens take {pos - tokens_at:,} bytes, total_size says {total:,}",
            start + 4,
            "vocab.total_size",
        )
    f.tokens = tokens
    f.token_offsets = offsets
    f.special = dict(zip(SPECIALS, ids, strict=True))
    for i, (name, value) in enumerate(f.special.items()):
        if value != NO_TOKEN and value >= count:
            f.add(
                R_VOCAB,
                EMBD_SPECIAL,
                f"{name}_id is {value:,}, not a token id (the vocabulary has {count:,})",
                special + 4 * i,
                f"{name}_id",
            )
    if bad_utf8 or len(set(tokens)) == len(tokens):
        return
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        first = seen.setdefault(tok, i)
        if first != i:
            f.add(
                R_VOCAB,
                EMBD_VOCAB_DUPLICATE,
                f"token {i} {tok!r} repeats token {first}",
                offsets[i],
                f"token[{i}]",
            )
            break


def _parse_index(f: EmbdFile, buf: Any, body_end: int) -> None:
    h = f.header
    start, count = h.tensor_index_offset, h.tensor_index_count
    if count > MAX_TENSORS or not _in_body(
        f, "tensor index", start, count * DESCRIPTOR_SIZE, body_end, "tensor_index_offset"
    ):
        if count > MAX_TENSORS:
            f.add(
                R_SECTIONS,
                EMBD_INDEX,
                f"tensor_index_count {count:,} is above the {MAX_TENSORS:,} limit",
                32,
                "tensor_index_count",
            )
        return
    raw = bytes(buf[start : start + count * DESCRIPTOR_SIZE])
    descs = [DESCRIPTOR.unpack_from(raw, i * DESCRIPTOR_SIZE) for i in range(count)]
    names_at = start + count * DESCRIPTOR_SIZE
    names_len = sum(d[3] for d in descs)
    if names_at + names_len > body_end:
        f.add(
            R_SECTIONS,
            EMBD_SECTION,
            f"the {count} tensor names ({names_len:,} bytes from {names_at:,}) run past the "
            f"file body (ends at {body_end:,})",
            start,
            "tensor_index_offset",
        )
        return
    f.index_end = names_at + names_len
    f.sections.append(("tensor index", start, f.index_end))
    names = bytes(buf[names_at : names_at + names_len])
    pos = 0
    seen: dict[str, int] = {}
    for i, (name_hash, dtype, ndim, nlen, d0, d1, d2, d3, data_offset) in enumerate(descs):
        at = start + i * DESCRIPTOR_SIZE
        where = f"tensor[{i}]"
        raw_name = names[pos : pos + nlen]
        name_offset = names_at + pos
        pos += nlen
        name = _text(f, R_INDEX, raw_name, name_offset, f"{where}.name", f"tensor {i}'s name")
        ok = name is not None
        label = repr(name) if name is not None else f"tensor {i}"
        if nlen == 0:
            f.add(
                R_INDEX, EMBD_INDEX, f"tensor {i} has an empty name", at + 6, f"{where}.name_length"
            )
            ok = False
        if dtype not in DTYPE_CODES:
            f.add(
                R_INDEX,
                EMBD_INDEX,
                f"{label}: dtype {dtype} is not in the spec's enum (0-8)",
                at + 4,
                f"{where}.dtype",
            )
            ok = False
        dims = (d0, d1, d2, d3)
        if not 1 <= ndim <= MAX_RANK:
            f.add(
                R_INDEX,
                EMBD_INDEX,
                f"{label}: ndim {ndim} is outside 1-4",
                at + 5,
                f"{where}.ndim",
            )
            ok = False
        elif any(dims[ndim:]):
            f.add(
                R_INDEX,
                EMBD_INDEX,
                f"{label}: ndim is {ndim} but shape is {list(dims)} (dimensions past ndim must "
                "be 0)",
                at + 8 + 4 * ndim,
                f"{where}.shape",
            )
            ok = False
        if name is not None:
            want = fnv1a_32(raw_name)
            if want != name_hash:
                f.add(
                    R_INDEX,
                    EMBD_NAME_HASH,
                    f"{label}: name_hash is 0x{name_hash:08x}, FNV-1a of the name is 0x{want:08x}",
                    at,
                    f"{where}.name_hash",
                )
            first = seen.setdefault(name, i)
            if first != i:
                f.add(
                    R_INDEX,
                    EMBD_DUPLICATE_NAME,
                    f"{label} is the name of tensors {first} and {i}",
                    name_offset,
                    f"{where}.name",
                )
                ok = False
        t = EmbdTensor(
            i,
            name if name is not None else raw_name.decode("utf-8", "replace"),
            name_hash,
            dtype,
            min(ndim, MAX_RANK),
            dims,
            data_offset,
            at,
            name_offset,
            h.tensor_data_offset,
        )
        f.tensors.append(t)
        if ok:
            f.sound.add(i)


def _check_section_overlaps(f: EmbdFile) -> None:
    spans = sorted([("header", 0, HEADER_SIZE), *f.sections], key=lambda s: (s[1], s[2]))
    owner, reach = spans[0][0], spans[0][2]
    for name, start, end in spans[1:]:
        if start < reach and end > start:
            f.add(
                R_SECTIONS,
                EMBD_SECTION,
                f"the {name} section [{start:,}, {end:,}) overlaps the {owner} section (ends "
                f"at {reach:,})",
                start,
                name.replace(" ", "_"),
            )
        if end > reach:
            owner, reach = name, end


def _check_data(f: EmbdFile, body_end: int) -> None:
    h = f.header
    size = h.tensor_data_size
    aligned = bool(h.flags & FLAG_TENSORS_ALIGNED)
    data_ok = _section(f, "tensor data") is not None
    for t in f.tensors:
        if t.index not in f.sound:
            continue
        if t.data_offset + t.nbytes > size:
            f.add(
                R_DATA,
                EMBD_BOUNDS,
                f"{t.name!r}: data [{t.data_offset:,}, {t.data_offset + t.nbytes:,}) runs past "
                f"tensor_data_size {size:,}",
                t.desc_offset + 24,
                f"{t.field}.data_offset",
            )
            f.sound.discard(t.index)
            continue
        if not data_ok or t.end > body_end:
            f.sound.discard(t.index)
            continue
        if aligned and t.offset % ALIGNMENT:
            f.add(
                R_DATA,
                EMBD_ALIGN,
                f"{t.name!r} starts at {t.offset:,}, not a multiple of {ALIGNMENT} "
                "(TENSORS_ALIGNED is set)",
                t.desc_offset + 24,
                f"{t.field}.data_offset",
            )
    prev: EmbdTensor | None = None
    for t in f.readable():
        if t.nbytes == 0:
            continue
        if prev is not None and t.offset < prev.end:
            f.add(
                R_DATA,
                EMBD_OVERLAP,
                f"{t.name!r} [{t.offset:,}, {t.end:,}) overlaps {prev.name!r} (ends at "
                f"{prev.end:,})",
                t.desc_offset + 24,
                f"{t.field}.data_offset",
            )
        if prev is None or t.end > prev.end:
            prev = t


def gaps(f: EmbdFile) -> list[tuple[int, int]]:
    """Byte ranges of the file body that belong to no section and no tensor: padding."""
    used = [(0, HEADER_SIZE)]
    for name, start, end in f.sections:
        if name != "tensor data":
            used.append((start, end))
    data = _section(f, "tensor data")
    if data is not None:
        used.extend((t.offset, t.end) for t in f.readable())
    body_end = f.header.footer_offset if data is not None else f.size
    used.sort()
    out = []
    pos = 0
    for start, end in used:
        if start > pos:
            out.append((pos, start))
        pos = max(pos, end)
    if pos < body_end:
        out.append((pos, body_end))
    return out


def data_span(f: EmbdFile) -> tuple[int, int] | None:
    """The byte range `data_checksum` covers (the tensor data, up to the footer; the file
    checksum covers the bytes before it too), or None when it is out of bounds."""
    end = f.header.footer_offset
    if _section(f, "tensor data") is None or end != f.size - FOOTER_SIZE:
        return None
    return f.header.tensor_data_offset, end


def checksums(buf: Any, f: EmbdFile) -> tuple[int, int] | None:
    """(data CRC, file CRC) computed in one pass over the file, mapped pages dropped as they
    go; None when the sections needed are out of bounds."""
    span = data_span(f)
    if span is None:
        return None
    start, end = span
    prefix = crc_range(buf, 0, start)
    data = crc_range(buf, start, end)
    return data, crc.crc32_combine(prefix, data, end - start)
