"""The binary substrate alignment law on files: SCX shard files and `pack shards`.

An input file F is cut into bundles of B = N * W bytes; the last bundle is padded with PAD-BYTE
to B bytes (the aligned substrate F' is F plus that padding, so every byte keeps its offset).
Shards are runs of S bundles (the last one may be shorter); each is written as a shard file:

    0x00  8  magic          b"SCXSHARD"
    0x08  1  version        1
    0x09  1  lane_width     W
    0x0A  1  bundle_lanes   N
    0x0B  1  pad_byte       PAD-BYTE
    0x0C  4  reserved       0
    0x10  8  shard_index    position of the shard in F (0, 1, ...)
    0x18  8  bundle_count   bundles in the payload (>= 1)
    0x20  8  raw_bytes      bytes of F in the shard, in ((bundle_count - 1) * B, bundle_count * B]
    0x28  8  raw_offset     offset of the shard's first byte in F
    0x30 32  config_hash    H_TOK of the config that aligned it
    0x50 32  hash_raw       H_SHARD_RAW: blake3-256 of the raw bytes (payload[:raw_bytes])
    0x70 32  hash_aligned   H_SHARD_ALIGNED: blake3-256 of the whole payload
    0x90 32  header_hash    blake3-256 of bytes 0x00..0x8F
    0xB0 16  reserved       0
    0xC0  .. payload        bundle_count * B bytes of F' (raw bytes, then PAD-BYTEs)

The shard folder `pack shards` writes holds `manifest.json` (AGL-TOK-MANIFEST-V1), the registry
snapshot `registry.scxr` and `shard-NNNNNN.scxs` files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError, OutputError, UsageError, from_os_error
from matrixctl.io import (
    STDIO,
    aside_name,
    discard_aside,
    display_name,
    make_temp_dir,
    open_input_stream,
    restore_aside,
)
from matrixctl.tokenizers.scx import tokens as scx_tokens

FORMAT = "scx-shard"
MAGIC = b"SCXSHARD"
VERSION = 1
HEADER = struct.Struct("<8sBBBBIQQQQ32s32s32s32s16s")
HEADER_SIZE = HEADER.size
assert HEADER_SIZE == 0xC0
HASHED_HEADER = 0x90
READ_BLOCK = 1 << 20

MANIFEST_NAME = "manifest.json"
REGISTRY_NAME = "registry.scxr"

FIELDS: dict[str, tuple[int, int]] = {
    "magic": (0x00, 8),
    "version": (0x08, 1),
    "lane_width": (0x09, 1),
    "bundle_lanes": (0x0A, 1),
    "pad_byte": (0x0B, 1),
    "reserved0": (0x0C, 4),
    "shard_index": (0x10, 8),
    "bundle_count": (0x18, 8),
    "raw_bytes": (0x20, 8),
    "raw_offset": (0x28, 8),
    "config_hash": (0x30, 32),
    "hash_raw": (0x50, 32),
    "hash_aligned": (0x70, 32),
    "header_hash": (0x90, 32),
    "reserved1": (0xB0, 16),
}

G = FORMAT
SCX_SHARD_TRUNCATED = codes.define(
    "SCX_SHARD_TRUNCATED",
    "The SCX shard file is shorter than its header or than bundle_count bundles.",
    group=G,
)
SCX_SHARD_TRAILING = codes.define(
    "SCX_SHARD_TRAILING", "Bytes follow the SCX shard's last bundle.", group=G
)
SCX_SHARD_HEADER = codes.define(
    "SCX_SHARD_HEADER",
    "An SCX shard header field is invalid (lane width, bundle lanes, bundle_count, reserved).",
    group=G,
)
SCX_SHARD_HEADER_HASH = codes.define(
    "SCX_SHARD_HEADER_HASH", "The SCX shard's header_hash does not match its header.", group=G
)
SCX_SHARD_HASH = codes.define(
    "SCX_SHARD_HASH",
    "An SCX shard's bytes do not match the hash of its raw bytes (H_SHARD_RAW) or of its "
    "padded bytes (H_SHARD_ALIGNED).",
    group=G,
)


@dataclass(frozen=True)
class ShardHeader:
    lane_width: int
    bundle_lanes: int
    pad_byte: int
    shard_index: int
    bundle_count: int
    raw_bytes: int
    raw_offset: int
    config_hash: bytes
    hash_raw: bytes
    hash_aligned: bytes
    header_hash: bytes = bytes(32)
    version: int = VERSION
    reserved0: int = 0
    reserved1: bytes = bytes(16)

    @property
    def bundle_bytes(self) -> int:
        return self.lane_width * self.bundle_lanes

    @property
    def payload_bytes(self) -> int:
        return self.bundle_count * self.bundle_bytes

    def to_bytes(self) -> bytes:
        return HEADER.pack(
            MAGIC,
            self.version,
            self.lane_width,
            self.bundle_lanes,
            self.pad_byte,
            self.reserved0,
            self.shard_index,
            self.bundle_count,
            self.raw_bytes,
            self.raw_offset,
            self.config_hash,
            self.hash_raw,
            self.hash_aligned,
            self.header_hash,
            self.reserved1,
        )

    def sealed(self) -> ShardHeader:
        from dataclasses import replace

        return replace(self, header_hash=scx_tokens.blake3_256(self.to_bytes()[:HASHED_HEADER]))

    @classmethod
    def parse(cls, raw: bytes) -> ShardHeader:
        if len(raw) < HEADER_SIZE:
            raise FormatError(
                SCX_SHARD_TRUNCATED,
                f"file has {len(raw)} bytes, the shard header alone needs {HEADER_SIZE}",
                offset=len(raw),
                field="header",
            )
        (magic, version, w, n, pad, res0, idx, count, raw_bytes, raw_off, h_tok, h_raw, h_al,
         h_head, res1) = HEADER.unpack_from(raw, 0)  # fmt: skip
        if magic != MAGIC:
            raise FormatError(codes.UNKNOWN_FORMAT, f"not an SCX shard: {magic!r}", offset=0)
        return cls(
            w, n, pad, idx, count, raw_bytes, raw_off, h_tok, h_raw, h_al, h_head, version, res0,
            res1,
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "lane_width": self.lane_width,
            "bundle_lanes": self.bundle_lanes,
            "pad_byte": self.pad_byte,
            "shard_index": self.shard_index,
            "bundle_count": self.bundle_count,
            "raw_bytes": self.raw_bytes,
            "raw_offset": self.raw_offset,
            "config_hash": self.config_hash.hex(),
            "hash_raw": self.hash_raw.hex(),
            "hash_aligned": self.hash_aligned.hex(),
            "header_hash": self.header_hash.hex(),
        }


def header_problems(h: ShardHeader, raw: bytes) -> list[FormatError]:
    """Every structural problem of a parsed shard header, in field order."""

    def err(code: str, message: str, name: str) -> FormatError:
        return FormatError(code, message, offset=FIELDS[name][0], field=name)

    out: list[FormatError] = []
    if h.version != VERSION:
        out.append(
            err(
                scx_tokens.UNSUPPORTED_VERSION,
                f"shard version {h.version} is not supported",
                "version",
            )
        )
    if not 1 <= h.lane_width <= scx_tokens.MAX_LANE_WIDTH:
        out.append(err(SCX_SHARD_HEADER, f"lane_width is {h.lane_width}", "lane_width"))
    if h.bundle_lanes == 0:
        out.append(err(SCX_SHARD_HEADER, "bundle_lanes is 0", "bundle_lanes"))
    if h.reserved0 or any(h.reserved1):
        name = "reserved0" if h.reserved0 else "reserved1"
        out.append(err(SCX_SHARD_HEADER, "reserved bytes are not zero", name))
    if h.bundle_count == 0:
        out.append(
            err(SCX_SHARD_HEADER, "bundle_count is 0: shards hold whole bundles", "bundle_count")
        )
    bb = h.bundle_bytes
    if bb and h.bundle_count and not (h.bundle_count - 1) * bb < h.raw_bytes <= h.bundle_count * bb:
        out.append(
            err(
                scx_tokens.MISALIGNED_SHARD,
                f"raw_bytes {h.raw_bytes} does not fit {h.bundle_count} bundles of {bb} bytes "
                "(only the last bundle may be padded)",
                "raw_bytes",
            )
        )
    want = scx_tokens.blake3_256(raw[:HASHED_HEADER])
    if h.header_hash != want:
        out.append(
            err(
                SCX_SHARD_HEADER_HASH,
                f"header_hash is {h.header_hash.hex()[:16]}..., the header's is "
                f"{want.hex()[:16]}...",
                "header_hash",
            )
        )
    return out


def payload_problems(buf: Any, size: int, h: ShardHeader) -> list[FormatError]:
    """Size, padding and both hashes of a shard's payload (reads it in blocks)."""
    from blake3 import blake3

    out: list[FormatError] = []
    bb = h.bundle_bytes
    if (
        bb == 0
        or h.bundle_count == 0
        or not (h.bundle_count - 1) * bb < h.raw_bytes <= h.payload_bytes
    ):
        return out  # header_problems names it; nothing here can be measured against it
    need = HEADER_SIZE + h.payload_bytes
    if size < need:
        return [
            FormatError(
                SCX_SHARD_TRUNCATED,
                f"file is {size} bytes; {h.bundle_count} bundles of {h.bundle_bytes} need {need}",
                offset=size,
                field="bundle_count",
            )
        ]
    if size > need:
        out.append(
            FormatError(
                SCX_SHARD_TRAILING,
                f"{size - need} bytes follow the last bundle",
                offset=need,
                field="payload",
            )
        )
    view = memoryview(buf)
    hasher = blake3()
    raw_end = HEADER_SIZE + h.raw_bytes
    for pos in range(HEADER_SIZE, raw_end, READ_BLOCK):
        hasher.update(view[pos : min(pos + READ_BLOCK, raw_end)])
    h_raw = hasher.digest()
    pad = bytes(view[raw_end:need])
    hasher.update(pad)
    h_aligned = hasher.digest()
    if pad.strip(bytes([h.pad_byte])):
        first = next(i for i, b in enumerate(pad) if b != h.pad_byte)
        out.append(
            FormatError(
                scx_tokens.INVERTIBILITY_VIOLATION,
                f"padding byte is 0x{pad[first]:02x}, the registry's pad byte is "
                f"0x{h.pad_byte:02x}: decoding drops padding, so it must carry nothing",
                offset=raw_end + first,
                field="payload.padding",
            )
        )
    if h_raw != h.hash_raw:
        out.append(
            FormatError(
                SCX_SHARD_HASH,
                f"H_SHARD_RAW of the payload is {h_raw.hex()[:16]}..., the header says "
                f"{h.hash_raw.hex()[:16]}...",
                offset=FIELDS["hash_raw"][0],
                field="hash_raw",
            )
        )
    if h_aligned != h.hash_aligned:
        out.append(
            FormatError(
                SCX_SHARD_HASH,
                f"H_SHARD_ALIGNED of the payload is {h_aligned.hex()[:16]}..., the header says "
                f"{h.hash_aligned.hex()[:16]}...",
                offset=FIELDS["hash_aligned"][0],
                field="hash_aligned",
            )
        )
    return out


# pack shards ---------------------------------------------------------------------------------

Tick = Callable[[int], None]


@dataclass
class _Open:
    index: int
    fp: Any
    path: str
    raw_offset: int
    raw: int
    hasher: Any


def shard_name(index: int) -> str:
    return f"shard-{index:06d}"


def _read_full(fp: Any, n: int) -> bytes:
    parts = []
    got = 0
    while got < n:
        chunk = fp.read(n - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def write_shards(
    input_path: str,
    outdir: str,
    tok: Any,
    registry_bytes: bytes,
    *,
    created_at: str | None = None,
    strict_alignment: bool = False,
    force: bool = False,
    tick: Tick | None = None,
) -> dict[str, Any]:
    """Align `input_path` into shard files, write the registry snapshot and the manifest.

    The folder is built beside `outdir` and renamed into place when complete, so a failure
    leaves nothing behind (and an existing pack, with `force`, intact until the last step).
    """
    from blake3 import blake3

    from matrixctl.tokenizers.scx import manifest as scx_manifest

    if outdir == STDIO:
        raise UsageError("pack shards writes a folder; - (stdout) cannot be one")
    restore_aside(outdir)  # a run killed between its two renames
    _check_target(outdir, force)
    work = make_temp_dir(outdir, [])  # removes temporary folders of dead runs first
    try:
        bb = tok.bundle_bytes
        shard_bytes = tok.shard_bundles * bb
        entries: list[dict[str, Any]] = []
        total = 0
        cur: _Open | None = None

        def open_shard(index: int) -> _Open:
            path = os.path.join(work, shard_name(index) + ".scxs")
            fp = open(path, "w+b")  # noqa: SIM115 - closed in close_shard
            fp.write(bytes(HEADER_SIZE))
            return _Open(index, fp, path, total, 0, blake3())

        def close_shard(sh: _Open) -> None:
            h_raw = sh.hasher.digest()
            padded = -sh.raw % bb
            pad = bytes([tok.pad_byte]) * padded
            sh.hasher.update(pad)
            sh.fp.write(pad)
            h_aligned = sh.hasher.digest()
            count = (sh.raw + padded) // bb
            header = ShardHeader(
                tok.width,
                tok.lanes,
                tok.pad_byte,
                sh.index,
                count,
                sh.raw,
                sh.raw_offset,
                tok.h_tok,
                h_raw,
                h_aligned,
            ).sealed()
            sh.fp.seek(0)
            sh.fp.write(header.to_bytes())
            sh.fp.flush()
            os.fsync(sh.fp.fileno())
            sh.fp.close()
            entries.append(
                {
                    "shard_id": shard_name(sh.index),
                    "path_or_uri": os.path.basename(sh.path),
                    "hash_raw": h_raw.hex(),
                    "hash_aligned": h_aligned.hex(),
                    "bundle_count": count,
                    "raw_bytes": sh.raw,
                    "notes": f"raw bytes {sh.raw_offset}..{sh.raw_offset + sh.raw}"
                    + (f", {padded} pad bytes" if padded else ""),
                }
            )

        with open_input_stream(input_path) as src:
            while True:
                room = shard_bytes - (cur.raw if cur else 0)
                block = _read_full(src, min(READ_BLOCK, room))
                if not block:
                    break
                if cur is None:
                    cur = open_shard(len(entries))
                cur.fp.write(block)
                cur.hasher.update(block)
                cur.raw += len(block)
                total += len(block)
                if tick:
                    tick(len(block))
                if cur.raw == shard_bytes:
                    close_shard(cur)
                    cur = None
        warnings: list[str] = []
        if cur is not None:
            # Padding the last bundle is no warning (lossless; the summary's `padding` says how
            # much), as in `tokenize scx encode` (docs/formats/scx.md).
            if cur.raw % bb and strict_alignment:
                raise FormatError(
                    scx_tokens.MISALIGNED_SHARD,
                    f"input is {total} bytes, not a multiple of the bundle size {bb}; "
                    "--strict-alignment refuses to pad",
                    path=display_name(input_path),
                    offset=total - cur.raw % bb,
                    field="input",
                )
            close_shard(cur)
        with open(os.path.join(work, REGISTRY_NAME), "wb") as fp:
            fp.write(registry_bytes)
        man = scx_manifest.Manifest.new(tok, entries, total, created_at=created_at)
        text = man.to_bytes()
        with open(os.path.join(work, MANIFEST_NAME), "wb") as fp:
            fp.write(text)
        for name in os.listdir(work):
            os.chmod(os.path.join(work, name), 0o644 & ~_umask())
        os.chmod(work, 0o777 & ~_umask())
        _install(work, outdir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return {
        "input": input_path,
        "output": outdir,
        "bytes": total,
        "bundle_bytes": bb,
        "shard_bundles": tok.shard_bundles,
        "shards": len(entries),
        "padding": -total % bb,
        "config_hash": tok.h_tok.hex(),
        "manifest_hash": man.h_manifest.hex(),
        "pi_key_id": man.pi_key_id,
        "warnings": warnings,
    }


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_shard_folder(path: str) -> bool:
    try:
        with open(os.path.join(path, MANIFEST_NAME), "rb") as fp:
            from matrixctl.tokenizers.scx.manifest import sniff

            return sniff(fp.read(64), 0)
    except OSError:
        return False


def _check_target(outdir: str, force: bool) -> None:
    if not os.path.lexists(outdir):
        return
    if not os.path.isdir(outdir):
        raise OutputError(codes.USAGE, "exists and is not a folder", path=outdir)
    if force and (not os.listdir(outdir) or _is_shard_folder(outdir)):
        return
    raise OutputError(
        codes.OUT_EXISTS_DIR,
        "exists"
        + ("" if force else "; refusing to replace it")
        + (" and is not an SCX shard folder" if force else ""),
        path=outdir,
        hint=None if force else "pass --force to replace an existing shard folder",
    )


def _install(work: str, outdir: str) -> None:
    """Rename the finished folder into place (moving an old pack aside first)."""
    old = None
    try:
        if os.path.lexists(outdir):
            old = aside_name(outdir)
            os.rename(outdir, old)
        os.rename(work, outdir)
    except OSError as exc:
        if old and not os.path.lexists(outdir):
            with contextlib.suppress(OSError):
                os.rename(old, outdir)
        raise from_os_error(exc, outdir, writing=True) from None
    if old:
        discard_aside(old, outdir)
