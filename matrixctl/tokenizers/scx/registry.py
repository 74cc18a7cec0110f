"""The SCX tokenizer registry file (SCX-TOK-REG-V1): entries, alignment law, signatures.

Byte layout (all integers little-endian; docs/formats/scx.md has the tables and the reasons):

    body (H_REG = blake3-256 of these bytes)
      0x00  8  magic          b"SCXTKREG"
      0x08  1  version        1
      0x09  1  lane_mode      1 SCXQ2, 2 SCXQ4, 3 CUSTOM
      0x0A  1  lane_width     W: 2 (SCXQ2), 4 (SCXQ4), 1..8 (CUSTOM)
      0x0B  1  pad_byte       PAD-BYTE
      0x0C  2  min_id         0
      0x0E  2  max_id         the largest id the registry assigns
      0x10  4  entry_count    fixed entries (266) + composites
      0x14  4  entries_bytes  size of the entry area
      0x18  4  revision       0 for a new registry, parent's revision + 1 after an append
      0x1C  4  reserved       0
      0x20 32  parent         H_REG of the previous revision (zero bytes for revision 0)
      0x40  .. entries, ascending token_id, each:
               token_id u16, kind u8, lane_width u8, flags u8, pattern_len u8,
               semantics_len u16, pattern, semantics (UTF-8)
    alignment law (H_ALIGN = blake3-256 of these 32 bytes)
      0x00  8  magic          b"SCXALIGN"
      0x08  1  law_version    1
      0x09  1  bundle_lanes   N (1..255)
      0x0A  2  reserved       0
      0x0C  4  chunk_bytes    K, a multiple of N * W
      0x10  8  shard_bundles  S >= 1
      0x18  8  reserved       0
    signatures
      0x00  8  magic          b"SCXPISIG"
      0x08  4  count          <= 256
      0x0C  4  reserved       0
      0x10  .. count records of 104 bytes, ascending public_key, no duplicates:
               algorithm u8 (1 = Ed25519), reserved 7 bytes, public_key 32, signature 64
               (the signature is Ed25519 over the 32 bytes of H_TOK)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.errors import FormatError
from matrixctl.tokenizers.scx import tokens as scx_tokens

FORMAT = "scx-registry"
MAGIC = b"SCXTKREG"
VERSION = 1
HEADER = struct.Struct("<8sBBBBHHIIII32s")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 64
ENTRY = struct.Struct("<HBBBBH")
ALIGN_MAGIC = b"SCXALIGN"
ALIGN = struct.Struct("<8sBBHIQ8s")
ALIGN_SIZE = ALIGN.size
assert ALIGN_SIZE == 32
LAW_VERSION = 1
SIG_MAGIC = b"SCXPISIG"
SIG_HEAD = struct.Struct("<8sII")
SIG_RECORD = struct.Struct("<B7s32s64s")
SIG_RECORD_SIZE = SIG_RECORD.size
assert SIG_RECORD_SIZE == 104
ALG_ED25519 = 1

MAX_SEMANTICS = 1024
MAX_SIGNATURES = 256
MAX_ENTRIES_BYTES = 64 << 20
MAX_CHUNK_BYTES = 1 << 30
DEFAULT_BUNDLE_LANES = 8
DEFAULT_CHUNK_BYTES = 4096
DEFAULT_SHARD_BYTES = 64 << 20

# Field name -> (offset, size) in the body header, for findings that point at a field.
FIELDS: dict[str, tuple[int, int]] = {
    "magic": (0x00, 8),
    "version": (0x08, 1),
    "lane_mode": (0x09, 1),
    "lane_width": (0x0A, 1),
    "pad_byte": (0x0B, 1),
    "min_id": (0x0C, 2),
    "max_id": (0x0E, 2),
    "entry_count": (0x10, 4),
    "entries_bytes": (0x14, 4),
    "revision": (0x18, 4),
    "reserved": (0x1C, 4),
    "parent": (0x20, 32),
}

G = FORMAT
SCX_REG_TRUNCATED = codes.define(
    "SCX_REG_TRUNCATED", "The SCX registry file ends before a section it declares.", group=G
)
SCX_REG_TRAILING = codes.define(
    "SCX_REG_TRAILING", "Bytes follow the SCX registry's signature section.", group=G
)
SCX_REG_HEADER = codes.define(
    "SCX_REG_HEADER",
    "An SCX registry header field is out of range or inconsistent (lane mode and width, "
    "reserved bytes, id range, revision and parent).",
    group=G,
)
SCX_REG_ENTRY = codes.define(
    "SCX_REG_ENTRY",
    "An SCX registry entry is malformed (order, kind, flags, lane width, pattern, UTF-8 "
    "semantics, duplicate pattern, composite ids not dense from 0x0400).",
    group=G,
)
SCX_REG_FIXED = codes.define(
    "SCX_REG_FIXED",
    "An SCX registry's raw-byte or control-token entry differs from the SCX-TOK-V1 table.",
    group=G,
)
SCX_ALIGN_LAW = codes.define(
    "SCX_ALIGN_LAW",
    "The SCX registry's alignment section (the alignment law) is invalid (magic, bundle lanes, "
    "chunk size not a multiple of the bundle size, shard size, reserved bytes).",
    group=G,
)
SCX_SIG_SECTION = codes.define(
    "SCX_SIG_SECTION",
    "The SCX signature section is malformed (magic, count, algorithm, order, duplicates).",
    group=G,
)
SCX_SIG_INVALID = codes.define(
    "SCX_SIG_INVALID", "An SCX registry signature does not verify against its public key.", group=G
)
SCX_TRUST_UNCHECKED = codes.define(
    "SCX_TRUST_UNCHECKED",
    "No trusted signing keys were configured (MATRIXCTL_SCX_TRUST), so authority was not checked.",
    group=G,
    severity=Severity.WARNING,
)
SCX_REG_SOURCE = codes.define(
    "SCX_REG_SOURCE", "An SCX registry source (JSON) is invalid.", group=G
)
SCX_REG_NOT_APPEND_ONLY = codes.define(
    "SCX_REG_NOT_APPEND_ONLY",
    "An SCX registry revision is not an append-only successor of its parent.",
    group=G,
)

LANE_MODE_NAMES = {m.value: m.name for m in scx_tokens.LaneMode}


@dataclass(frozen=True)
class Entry:
    token_id: int
    kind: int
    lane_width: int
    flags: int
    pattern: bytes
    semantics: str

    def to_bytes(self) -> bytes:
        sem = self.semantics.encode("utf-8")
        head = ENTRY.pack(
            self.token_id, self.kind, self.lane_width, self.flags, len(self.pattern), len(sem)
        )
        return head + self.pattern + sem


@dataclass(frozen=True)
class Composite:
    token_id: int
    pattern: bytes
    semantics: str
    deprecated: bool = False

    def entry(self, lane_width: int) -> Entry:
        flags = scx_tokens.Flag.IS_REVERSIBLE | (
            scx_tokens.Flag.IS_DEPRECATED if self.deprecated else 0
        )
        return Entry(
            self.token_id,
            scx_tokens.Kind.COMPOSITE,
            lane_width,
            int(flags),
            self.pattern,
            self.semantics,
        )


_FIXED_ENTRIES: list[Entry] = []


def fixed_entries() -> list[Entry]:
    """The 273 entries every registry starts with (the SCX-TOK-V1 table), built once."""
    if not _FIXED_ENTRIES:
        _FIXED_ENTRIES.extend(_build_fixed())
    return list(_FIXED_ENTRIES)


def _build_fixed() -> list[Entry]:
    return [
        Entry(
            f.token_id,
            int(f.kind),
            0,
            int(f.flags),
            bytes([f.token_id]) if f.kind == scx_tokens.Kind.RAW_BYTE else b"",
            f.name,
        )
        for f in scx_tokens.FIXED
    ]


@dataclass(frozen=True)
class Alignment:
    """The binary substrate alignment law's parameters (H_ALIGN covers their 32 bytes)."""

    bundle_lanes: int = DEFAULT_BUNDLE_LANES
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    shard_bundles: int = 1
    law_version: int = LAW_VERSION

    def to_bytes(self) -> bytes:
        return ALIGN.pack(
            ALIGN_MAGIC,
            self.law_version,
            self.bundle_lanes,
            0,
            self.chunk_bytes,
            self.shard_bundles,
            bytes(8),
        )

    @property
    def h_align(self) -> bytes:
        return scx_tokens.blake3_256(self.to_bytes())

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle_lanes": self.bundle_lanes,
            "chunk_bytes": self.chunk_bytes,
            "shard_bundles": self.shard_bundles,
        }


@dataclass(frozen=True)
class Signature:
    public_key: bytes
    signature: bytes
    algorithm: int = ALG_ED25519

    @property
    def key_id(self) -> str:
        from matrixctl.tokenizers.scx.signing import key_id

        return key_id(self.public_key)

    def to_bytes(self) -> bytes:
        return SIG_RECORD.pack(self.algorithm, bytes(7), self.public_key, self.signature)

    def to_json(self) -> dict[str, Any]:
        return {
            "algorithm": "ed25519",
            "key_id": self.key_id,
            "public_key": self.public_key.hex(),
            "signature": self.signature.hex(),
        }


@dataclass(frozen=True)
class Registry:
    """The registry body: lane mode and width, PAD-BYTE, lineage and the composites."""

    lane_mode: int
    lane_width: int
    pad_byte: int = 0
    revision: int = 0
    parent: bytes = bytes(32)
    composites: tuple[Composite, ...] = ()

    def entries(self) -> list[Entry]:
        return fixed_entries() + [c.entry(self.lane_width) for c in self.composites]

    @property
    def max_id(self) -> int:
        return self.composites[-1].token_id if self.composites else scx_tokens.LAST_FIXED_ID

    def body(self) -> bytes:
        area = b"".join(e.to_bytes() for e in self.entries())
        head = HEADER.pack(
            MAGIC,
            VERSION,
            self.lane_mode,
            self.lane_width,
            self.pad_byte,
            0,
            self.max_id,
            len(scx_tokens.FIXED) + len(self.composites),
            len(area),
            self.revision,
            0,
            self.parent,
        )
        return head + area

    @property
    def lane_mode_name(self) -> str:
        return LANE_MODE_NAMES.get(self.lane_mode, f"unknown({self.lane_mode})")


@dataclass
class RegistryFile:
    """A whole registry file: body, alignment law and signatures, plus the hashes."""

    registry: Registry
    alignment: Alignment
    signatures: tuple[Signature, ...] = ()
    body: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if not self.body:
            self.body = self.registry.body()
        self.signatures = tuple(sorted(self.signatures, key=lambda s: s.public_key))

    @property
    def h_reg(self) -> bytes:
        return scx_tokens.blake3_256(self.body)

    @property
    def h_align(self) -> bytes:
        return self.alignment.h_align

    @property
    def h_tok(self) -> bytes:
        return scx_tokens.h_tok(
            self.registry.lane_mode, self.h_reg, self.h_align, scx_tokens.h_api()
        )

    @property
    def bundle_bytes(self) -> int:
        return self.alignment.bundle_lanes * self.registry.lane_width

    def to_bytes(self) -> bytes:
        sigs = b"".join(s.to_bytes() for s in self.signatures)
        head = SIG_HEAD.pack(SIG_MAGIC, len(self.signatures), 0)
        return self.body + self.alignment.to_bytes() + head + sigs

    def with_signature(self, sig: Signature) -> RegistryFile:
        """A copy with `sig` added (replacing an earlier signature by the same key)."""
        kept = [s for s in self.signatures if s.public_key != sig.public_key]
        return replace(self, signatures=(*kept, sig))


def check_alignment(alignment: Alignment, lane_width: int, *, offset: int | None = None) -> None:
    """Raise SCX_ALIGN_LAW unless the law's parameters fit together."""

    def bad(message: str, fld: str, rel: int) -> FormatError:
        return FormatError(
            SCX_ALIGN_LAW, message, offset=None if offset is None else offset + rel, field=fld
        )

    if alignment.law_version != LAW_VERSION:
        raise FormatError(
            scx_tokens.UNSUPPORTED_VERSION,
            f"alignment law_version {alignment.law_version} is not supported (v{LAW_VERSION})",
            offset=None if offset is None else offset + 8,
            field="alignment.law_version",
        )
    if not 1 <= alignment.bundle_lanes <= 255:
        raise bad(f"bundle_lanes is {alignment.bundle_lanes}, must be 1..255", "bundle_lanes", 9)
    bundle = alignment.bundle_lanes * lane_width
    k = alignment.chunk_bytes
    if not bundle <= k <= MAX_CHUNK_BYTES or k % bundle:
        raise bad(
            f"chunk_bytes {k} must be a multiple of the bundle size {bundle} "
            f"(bundle_lanes {alignment.bundle_lanes} x lane_width {lane_width}), "
            f"at most {MAX_CHUNK_BYTES}",
            "chunk_bytes",
            12,
        )
    if not 1 <= alignment.shard_bundles < 1 << 48:
        raise bad(
            f"shard_bundles is {alignment.shard_bundles}, must be 1..2**48-1", "shard_bundles", 16
        )


def default_alignment(lane_width: int, **given: int | None) -> Alignment:
    """The default law for a lane width, with any of the given parameters overriding it."""
    n = given.get("bundle_lanes") or DEFAULT_BUNDLE_LANES
    bundle = n * lane_width
    k = given.get("chunk_bytes") or max(bundle, DEFAULT_CHUNK_BYTES // bundle * bundle)
    s = given.get("shard_bundles") or max(1, DEFAULT_SHARD_BYTES // bundle)
    return Alignment(bundle_lanes=n, chunk_bytes=k, shard_bundles=s)


def check_registry(reg: Registry) -> None:
    """Raise on a registry body that breaks the rules (used for built and parsed registries)."""
    mode = reg.lane_mode
    if mode not in LANE_MODE_NAMES:
        raise FormatError(
            SCX_REG_HEADER, f"lane_mode {mode} is not 1, 2 or 3", offset=0x09, field="lane_mode"
        )
    want = scx_tokens.LANE_WIDTHS.get(scx_tokens.LaneMode(mode))
    if want is not None and reg.lane_width != want:
        raise FormatError(
            SCX_REG_HEADER,
            f"lane_width is {reg.lane_width}, {reg.lane_mode_name} lanes are {want} bytes",
            offset=0x0A,
            field="lane_width",
        )
    if not 1 <= reg.lane_width <= scx_tokens.MAX_LANE_WIDTH:
        raise FormatError(
            SCX_REG_HEADER,
            f"lane_width is {reg.lane_width}, must be 1..{scx_tokens.MAX_LANE_WIDTH}",
            offset=0x0A,
            field="lane_width",
        )
    if not 0 <= reg.pad_byte <= 255:
        raise FormatError(SCX_REG_HEADER, "pad_byte must be 0..255", offset=0x0B, field="pad_byte")
    if (reg.revision == 0) != (reg.parent == bytes(32)):
        raise FormatError(
            SCX_REG_HEADER,
            "revision 0 must have an all-zero parent and a later revision a parent H_REG",
            offset=0x18,
            field="revision",
        )
    if len(reg.composites) > scx_tokens.MAX_COMPOSITES:
        raise FormatError(
            SCX_REG_ENTRY, f"more than {scx_tokens.MAX_COMPOSITES} composites", field="entries"
        )
    seen: dict[bytes, int] = {}
    for i, c in enumerate(reg.composites):
        where = f"composites[{i}]"
        if c.token_id != scx_tokens.COMPOSITE_FIRST + i:
            raise FormatError(
                SCX_REG_ENTRY,
                f"composite {i} has id 0x{c.token_id:04X}; composite ids are dense from 0x0400, "
                f"so it must be 0x{scx_tokens.COMPOSITE_FIRST + i:04X}",
                field=where,
            )
        if len(c.pattern) != reg.lane_width:
            raise FormatError(
                SCX_REG_ENTRY,
                f"composite 0x{c.token_id:04X} pattern is {len(c.pattern)} bytes; a composite "
                f"is one lane of {reg.lane_width} bytes",
                field=where,
            )
        if c.pattern in seen:
            raise FormatError(
                SCX_REG_ENTRY,
                f"composite 0x{c.token_id:04X} repeats the pattern {c.pattern.hex()} of "
                f"0x{seen[c.pattern]:04X} (decoding would not be a function)",
                field=where,
            )
        seen[c.pattern] = c.token_id
        if len(c.semantics.encode("utf-8")) > MAX_SEMANTICS:
            raise FormatError(
                SCX_REG_ENTRY,
                f"composite 0x{c.token_id:04X} semantics exceeds {MAX_SEMANTICS} bytes",
                field=where,
            )


# Parsing -----------------------------------------------------------------------------------


def _need(buf: Any, size: int, start: int, n: int, what: str) -> None:
    if start + n > size:
        raise FormatError(
            SCX_REG_TRUNCATED,
            f"file ends at {size} bytes; {what} needs bytes {start}..{start + n}",
            offset=size,
            field=what,
        )


def parse(buf: Any, size: int | None = None) -> RegistryFile:
    """Parse and check a registry file; raise FormatError at the first problem."""
    view = memoryview(buf)
    size = len(view) if size is None else size
    _need(view, size, 0, HEADER_SIZE, "header")
    (
        magic,
        version,
        lane_mode,
        lane_width,
        pad_byte,
        min_id,
        max_id,
        entry_count,
        entries_bytes,
        revision,
        reserved,
        parent,
    ) = HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise FormatError(codes.UNKNOWN_FORMAT, f"not an SCX registry: {magic!r}", offset=0)
    if version != VERSION:
        raise FormatError(
            scx_tokens.UNSUPPORTED_VERSION,
            f"registry version {version} is not supported (v{VERSION})",
            offset=0x08,
            field="version",
        )
    if reserved:
        raise FormatError(
            SCX_REG_HEADER, "reserved bytes are not zero", offset=0x1C, field="reserved"
        )
    if min_id != 0:
        raise FormatError(
            SCX_REG_HEADER, f"min_id is {min_id}, must be 0", offset=0x0C, field="min_id"
        )
    n_fixed = len(scx_tokens.FIXED)
    if not n_fixed <= entry_count <= n_fixed + scx_tokens.MAX_COMPOSITES:
        raise FormatError(
            SCX_REG_HEADER,
            f"entry_count {entry_count} is outside "
            f"{n_fixed}..{n_fixed + scx_tokens.MAX_COMPOSITES}",
            offset=0x10,
            field="entry_count",
        )
    if entries_bytes > MAX_ENTRIES_BYTES or entries_bytes < entry_count * ENTRY.size:
        raise FormatError(
            SCX_REG_HEADER,
            f"entries_bytes {entries_bytes} cannot hold {entry_count} entries "
            f"(at least {ENTRY.size} bytes each, at most {MAX_ENTRIES_BYTES} in all)",
            offset=0x14,
            field="entries_bytes",
        )
    body_end = HEADER_SIZE + entries_bytes
    _need(view, size, HEADER_SIZE, entries_bytes, "entries")
    fixed = fixed_entries()
    fixed_bytes = _fixed_bytes()
    if view[HEADER_SIZE : HEADER_SIZE + len(fixed_bytes)] == fixed_bytes:
        # The common case: the fixed table is byte-identical; parse only the composites.
        entries = list(zip(fixed, _fixed_offsets(), strict=True))
        entries += _parse_entries(
            view, entry_count - n_fixed, body_end, HEADER_SIZE + len(fixed_bytes), n_fixed,
            fixed[-1].token_id,
        )  # fmt: skip
    else:
        entries = _parse_entries(view, entry_count, body_end, HEADER_SIZE, 0, -1)
    for i, want in enumerate(fixed):
        got, off = entries[i]
        if got != want:
            raise FormatError(
                SCX_REG_FIXED,
                f"entry {i} is {got.semantics!r} (id 0x{got.token_id:04X}, kind {got.kind}, "
                f"flags 0x{got.flags:02x}); SCX-TOK-V1 fixes {want.semantics} "
                f"(id 0x{want.token_id:04X}, kind {want.kind}, flags 0x{want.flags:02x})",
                offset=off,
                field=f"entries[{i}]",
            )
    composites = []
    for i, (e, off) in enumerate(entries[n_fixed:]):
        where = f"entries[{n_fixed + i}]"
        if e.kind != scx_tokens.Kind.COMPOSITE:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry 0x{e.token_id:04X} has kind {e.kind}; only composites follow the fixed "
                "table",
                offset=off + 2,
                field=where,
            )
        if e.lane_width != lane_width:
            raise FormatError(
                SCX_REG_ENTRY,
                f"composite 0x{e.token_id:04X} lane_width is {e.lane_width}, the registry's is "
                f"{lane_width}",
                offset=off + 3,
                field=where,
            )
        if e.flags & ~(scx_tokens.Flag.IS_REVERSIBLE | scx_tokens.Flag.IS_DEPRECATED) or not (
            e.flags & scx_tokens.Flag.IS_REVERSIBLE
        ):
            raise FormatError(
                SCX_REG_ENTRY,
                f"composite 0x{e.token_id:04X} flags 0x{e.flags:02x}: a composite is "
                "IS_REVERSIBLE and may only add IS_DEPRECATED",
                offset=off + 4,
                field=where,
            )
        composites.append(
            Composite(
                e.token_id, e.pattern, e.semantics, bool(e.flags & scx_tokens.Flag.IS_DEPRECATED)
            )
        )
    reg = Registry(lane_mode, lane_width, pad_byte, revision, bytes(parent), tuple(composites))
    try:
        check_registry(reg)
    except FormatError as err:
        if err.field and err.field.startswith("composites["):
            idx = int(err.field[len("composites[") : -1])
            err.offset = entries[n_fixed + idx][1]
            err.field = f"entries[{n_fixed + idx}]"
        raise
    if max_id != reg.max_id:
        raise FormatError(
            SCX_REG_HEADER,
            f"max_id is 0x{max_id:04X}, the largest assigned id is 0x{reg.max_id:04X}",
            offset=0x0E,
            field="max_id",
        )
    body = bytes(view[:body_end])
    alignment = _parse_alignment(view, size, body_end, lane_width)
    sig_at = body_end + ALIGN_SIZE
    signatures = _parse_signatures(view, size, sig_at)
    return RegistryFile(reg, alignment, signatures, body)


_FIXED_BYTES: bytes | None = None
_FIXED_OFFSETS: list[int] = []


def _fixed_offsets() -> list[int]:
    if not _FIXED_OFFSETS:
        pos = HEADER_SIZE
        for e in fixed_entries():
            _FIXED_OFFSETS.append(pos)
            pos += len(e.to_bytes())
    return _FIXED_OFFSETS


def _fixed_bytes() -> bytes:
    global _FIXED_BYTES
    if _FIXED_BYTES is None:
        _FIXED_BYTES = b"".join(e.to_bytes() for e in fixed_entries())
    return _FIXED_BYTES


def _parse_entries(
    view: memoryview, count: int, end: int, pos: int, first: int, prev: int
) -> list[tuple[Entry, int]]:
    out: list[tuple[Entry, int]] = []
    for i in range(first, first + count):
        if pos + ENTRY.size > end:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry {i} header runs past the entry area (entries_bytes)",
                offset=pos,
                field=f"entries[{i}]",
            )
        token_id, kind, width, flags, plen, slen = ENTRY.unpack_from(view, pos)
        if pos + ENTRY.size + plen + slen > end:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry {i} (id 0x{token_id:04X}) runs past the entry area",
                offset=pos,
                field=f"entries[{i}]",
            )
        if token_id <= prev:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry {i} id 0x{token_id:04X} does not follow 0x{prev:04X} (ids ascend)",
                offset=pos,
                field=f"entries[{i}]",
            )
        if kind > max(scx_tokens.Kind) or flags & ~scx_tokens.KNOWN_FLAGS:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry 0x{token_id:04X}: unknown kind {kind} or flags 0x{flags:02x}",
                offset=pos + 2,
                field=f"entries[{i}]",
            )
        if slen > MAX_SEMANTICS:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry 0x{token_id:04X} semantics is {slen} bytes (at most {MAX_SEMANTICS})",
                offset=pos + 6,
                field=f"entries[{i}]",
            )
        p0 = pos + ENTRY.size
        pattern = bytes(view[p0 : p0 + plen])
        raw = bytes(view[p0 + plen : p0 + plen + slen])
        try:
            semantics = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FormatError(
                SCX_REG_ENTRY,
                f"entry 0x{token_id:04X} semantics is not UTF-8 ({exc.reason})",
                offset=p0 + plen + exc.start,
                field=f"entries[{i}]",
            ) from None
        out.append((Entry(token_id, kind, width, flags, pattern, semantics), pos))
        prev = token_id
        pos = p0 + plen + slen
    if pos != end:
        raise FormatError(
            SCX_REG_ENTRY,
            f"{end - pos} bytes of the entry area follow the last entry",
            offset=pos,
            field="entries_bytes",
        )
    return out


def _parse_alignment(view: memoryview, size: int, at: int, lane_width: int) -> Alignment:
    _need(view, size, at, ALIGN_SIZE, "alignment")
    magic, law, n, res0, k, s, res1 = ALIGN.unpack_from(view, at)
    if magic != ALIGN_MAGIC:
        raise FormatError(
            SCX_ALIGN_LAW, f"alignment magic is {magic!r}", offset=at, field="alignment.magic"
        )
    if res0 or any(res1):
        raise FormatError(
            SCX_ALIGN_LAW,
            "alignment reserved bytes are not zero",
            offset=at + (10 if res0 else 24),
            field="alignment.reserved",
        )
    law_obj = Alignment(bundle_lanes=n, chunk_bytes=k, shard_bundles=s, law_version=law)
    check_alignment(law_obj, lane_width, offset=at)
    return law_obj


def _parse_signatures(view: memoryview, size: int, at: int) -> tuple[Signature, ...]:
    _need(view, size, at, SIG_HEAD.size, "signatures")
    magic, count, reserved = SIG_HEAD.unpack_from(view, at)
    if magic != SIG_MAGIC:
        raise FormatError(
            SCX_SIG_SECTION, f"signature magic is {magic!r}", offset=at, field="signatures.magic"
        )
    if reserved:
        raise FormatError(
            SCX_SIG_SECTION, "reserved bytes are not zero", offset=at + 12, field="signatures"
        )
    if count > MAX_SIGNATURES:
        raise FormatError(
            SCX_SIG_SECTION,
            f"signature count {count} exceeds {MAX_SIGNATURES}",
            offset=at + 8,
            field="signatures.count",
        )
    first = at + SIG_HEAD.size
    _need(view, size, first, count * SIG_RECORD_SIZE, "signatures")
    sigs: list[Signature] = []
    for i in range(count):
        off = first + i * SIG_RECORD_SIZE
        alg, res, pk, sig = SIG_RECORD.unpack_from(view, off)
        if alg != ALG_ED25519 or any(res):
            raise FormatError(
                SCX_SIG_SECTION,
                f"signature {i}: algorithm {alg} (1 = Ed25519) or reserved bytes not zero",
                offset=off,
                field=f"signatures[{i}]",
            )
        if sigs and pk <= sigs[-1].public_key:
            raise FormatError(
                SCX_SIG_SECTION,
                f"signature {i}: public keys must ascend without duplicates",
                offset=off + 8,
                field=f"signatures[{i}]",
            )
        sigs.append(Signature(bytes(pk), bytes(sig), alg))
    end = first + count * SIG_RECORD_SIZE
    if size > end:
        raise FormatError(
            SCX_REG_TRAILING, f"{size - end} bytes follow the signatures", offset=end, field="end"
        )
    return tuple(sigs)


# JSON source -------------------------------------------------------------------------------

SOURCE_FORMAT = "SCX-TOK-REG-V1"
SOURCE_KEYS = {
    "format",
    "lane_mode",
    "lane_width",
    "pad_byte",
    "revision",
    "parent",
    "alignment",
    "composites",
}
COMPOSITE_KEYS = {"token_id", "pattern", "text", "semantics", "deprecated"}
ALIGN_KEYS = {"bundle_lanes", "chunk_bytes", "shard_bundles"}


def _src_error(message: str, where: str) -> FormatError:
    return FormatError(SCX_REG_SOURCE, message, field=where)


def _int(doc: dict[str, Any], key: str, default: int | None, lo: int, hi: int, where: str) -> int:
    value = doc.get(key, default)
    if (
        value is None
        or isinstance(value, bool)
        or not isinstance(value, int)
        or not lo <= value <= hi
    ):
        raise _src_error(f"{key} must be an integer in {lo}..{hi}, got {value!r}", f"{where}{key}")
    return value


def from_source(doc: Any) -> RegistryFile:
    """Build an unsigned registry from its JSON source (or from `inspect --json`'s view)."""
    if isinstance(doc, dict) and "schema_version" in doc and isinstance(doc.get("files"), list):
        # The whole `inspect --json` document (docs/json.md): its one file's description.
        if len(doc["files"]) != 1:
            raise _src_error("an inspect --json document of exactly one registry", "files")
        doc = doc["files"][0]
    if isinstance(doc, dict) and isinstance(doc.get("registry"), dict):
        # The JSON view `inspect --json` prints: the body's fields under "registry", the
        # composites beside them.
        doc = {**doc["registry"], "composites": doc.get("composites", [])}
    if not isinstance(doc, dict):
        raise _src_error("a registry source is a JSON object", "$")
    unknown = set(doc) - SOURCE_KEYS
    if unknown:
        raise _src_error(f"unknown keys {sorted(unknown)}", "$")
    if doc.get("format", SOURCE_FORMAT) != SOURCE_FORMAT:
        raise _src_error(f"format must be {SOURCE_FORMAT!r}", "format")
    mode_name = doc.get("lane_mode")
    if mode_name not in scx_tokens.LaneMode.__members__:
        raise _src_error("lane_mode must be SCXQ2, SCXQ4 or CUSTOM", "lane_mode")
    mode = scx_tokens.LaneMode[str(mode_name)]
    fixed_width = scx_tokens.LANE_WIDTHS.get(mode)
    width = _int(doc, "lane_width", fixed_width, 1, scx_tokens.MAX_LANE_WIDTH, "")
    if fixed_width is not None and width != fixed_width:
        raise _src_error(f"{mode_name} lanes are {fixed_width} bytes, not {width}", "lane_width")
    pad = _int(doc, "pad_byte", 0, 0, 255, "")
    revision = _int(doc, "revision", 0, 0, 2**32 - 1, "")
    parent_hex = doc.get("parent")
    parent = bytes(32)
    if parent_hex is not None:
        try:
            parent = bytes.fromhex(parent_hex)
        except (TypeError, ValueError):
            parent = b""
        if len(parent) != 32:
            raise _src_error("parent must be 64 hex digits (an H_REG)", "parent")
    align_doc = doc.get("alignment", {})
    if not isinstance(align_doc, dict) or set(align_doc) - ALIGN_KEYS:
        raise _src_error(f"alignment is an object with keys {sorted(ALIGN_KEYS)}", "alignment")
    given = {
        k: _int(align_doc, k, None, 1, 2**48 - 1, "alignment.") if k in align_doc else None
        for k in ALIGN_KEYS
    }
    alignment = default_alignment(width, **given)
    comps_doc = doc.get("composites", [])
    if not isinstance(comps_doc, list):
        raise _src_error("composites is a list", "composites")
    composites = []
    for i, c in enumerate(comps_doc):
        where = f"composites[{i}]"
        if not isinstance(c, dict) or set(c) - COMPOSITE_KEYS:
            raise _src_error(f"a composite is an object with keys {sorted(COMPOSITE_KEYS)}", where)
        if ("pattern" in c) == ("text" in c):
            raise _src_error("give exactly one of pattern (hex) and text (UTF-8)", where)
        try:
            pattern = (
                bytes.fromhex(c["pattern"]) if "pattern" in c else str(c["text"]).encode("utf-8")
            )
        except (TypeError, ValueError):
            raise _src_error("pattern must be hex digits", where) from None
        semantics = c.get("semantics", "")
        if not isinstance(semantics, str):
            raise _src_error("semantics must be a string", where)
        deprecated = c.get("deprecated", False)
        if not isinstance(deprecated, bool):
            raise _src_error("deprecated must be true or false", where)
        tid = scx_tokens.COMPOSITE_FIRST + i
        if "token_id" in c and c["token_id"] != tid:
            raise _src_error(
                f"token_id {c['token_id']!r}: composite ids are dense from 0x0400, so entry {i} "
                f"is {tid}",
                where,
            )
        composites.append(Composite(tid, pattern, semantics, deprecated))
    reg = Registry(int(mode), width, pad, revision, parent, tuple(composites))
    try:
        check_registry(reg)
        check_alignment(alignment, width)
    except FormatError as err:
        raise FormatError(SCX_REG_SOURCE, err.message, field=err.field) from None
    return RegistryFile(reg, alignment)


def to_source(rf: RegistryFile) -> dict[str, Any]:
    """The JSON view of a registry body and law; `from_source` turns it back into the same bytes."""
    reg = rf.registry
    return {
        "format": SOURCE_FORMAT,
        "lane_mode": reg.lane_mode_name,
        "lane_width": reg.lane_width,
        "pad_byte": reg.pad_byte,
        "revision": reg.revision,
        "parent": reg.parent.hex() if reg.revision else None,
        "alignment": rf.alignment.to_json(),
        "composites": [composite_json(c) for c in reg.composites],
    }


def composite_json(c: Composite) -> dict[str, Any]:
    out: dict[str, Any] = {"token_id": c.token_id, "pattern": c.pattern.hex()}
    out["semantics"] = c.semantics
    if c.deprecated:
        out["deprecated"] = True
    return out


def check_append_only(parent: RegistryFile, child: RegistryFile) -> None:
    """Raise SCX_REG_NOT_APPEND_ONLY unless `child` is the next revision of `parent`.

    The child keeps every composite of the parent with the same id and pattern, may only add
    IS_DEPRECATED to one, appends new composites after them, keeps lane mode, width and
    PAD-BYTE, has revision parent + 1 and names the parent's H_REG.
    """
    p, c = parent.registry, child.registry

    def fail(message: str, fld: str) -> FormatError:
        return FormatError(SCX_REG_NOT_APPEND_ONLY, message, field=fld)

    if c.revision != p.revision + 1:
        raise fail(f"revision is {c.revision}, the parent's is {p.revision}", "revision")
    if c.parent != parent.h_reg:
        raise fail(
            f"parent is {c.parent.hex()}, the parent registry's H_REG is {parent.h_reg.hex()}",
            "parent",
        )
    for name in ("lane_mode", "lane_width", "pad_byte"):
        if getattr(c, name) != getattr(p, name):
            raise fail(f"{name} changed from {getattr(p, name)} to {getattr(c, name)}", name)
    if len(c.composites) < len(p.composites):
        raise fail(
            f"{len(p.composites) - len(c.composites)} composites of the parent were removed",
            "composites",
        )
    for old, new in zip(p.composites, c.composites, strict=False):
        if (old.token_id, old.pattern, old.semantics) != (new.token_id, new.pattern, new.semantics):
            raise fail(
                f"composite 0x{old.token_id:04X} was changed in place", f"0x{old.token_id:04X}"
            )
        if old.deprecated and not new.deprecated:
            raise fail(f"composite 0x{old.token_id:04X} was un-deprecated", f"0x{old.token_id:04X}")


def patterns(composites: Iterable[Composite]) -> dict[bytes, int]:
    return {c.pattern: c.token_id for c in composites}
