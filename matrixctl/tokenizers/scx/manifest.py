"""The AGL tokenizer manifest (AGL-TOK-MANIFEST-V1): write, read, verify.

A UTF-8 JSON document in one canonical text: the keys in the order below, two-space indents,
`": "` and `","` separators, non-ASCII characters as themselves, one final newline. Readers
re-serialize what they parsed and require the same bytes (SCX_MAN_CANONICAL), so H_MANIFEST,
blake3-256 of the file, is well defined. Hashes and keys are lowercase hex.

    {
      "format": "AGL-TOK-MANIFEST-V1",
      "tok_spec_version": "SCX-TOK-V1",
      "config_hash": H_TOK,
      "pi_signature": {"algorithm": "ed25519", "public_key": hex, "signature": hex},
      "pi_key_id": "pi:<16 hex>",
      "key_history": [{"pi_key_id", "pi_signature"}, ...],   earlier keys, oldest first
      "registry_hash": H_REG,
      "alignment_hash": H_ALIGN,
      "api_schema_hash": H_API,
      "lane_mode": "SCXQ2" | "SCXQ4" | "CUSTOM",
      "registry_path": "registry.scxr",                      the registry snapshot
      "created_at": null | "YYYY-MM-DDTHH:MM:SSZ",
      "raw_bytes": total bytes of the input,
      "shards": [{"shard_id", "path_or_uri", "hash_raw", "hash_aligned", "bundle_count",
                  "raw_bytes", "notes"}, ...],
      "manifest_hash": H_MANIFEST
    }

H_MANIFEST is blake3-256 of the canonical text of the document without its manifest_hash
key (and without the comma that would precede it): every byte of the manifest is covered.
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError, UsageError
from matrixctl.tokenizers.scx import signing
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.tokenizers.scx.registry import LANE_MODE_NAMES, Signature

FORMAT = "scx-manifest"
NAME = "AGL-TOK-MANIFEST-V1"
SNIFF = b'{\n  "format": "AGL-TOK-MANIFEST-V1",'
MAX_MANIFEST_BYTES = 64 << 20
MAX_SHARDS = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_HEX128 = re.compile(r"[0-9a-f]{128}\Z")
_KEY_ID = re.compile(r"pi:[0-9a-f]{16}\Z")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z\Z")

G = FORMAT
SCX_MAN_JSON = codes.define(
    "SCX_MAN_JSON",
    "The SCX tokenizer manifest is not UTF-8 JSON with the fields of AGL-TOK-MANIFEST-V1 and "
    "their types.",
    group=G,
)
SCX_MAN_CANONICAL = codes.define(
    "SCX_MAN_CANONICAL",
    "The SCX tokenizer manifest is not in its canonical text, so its hash (H_MANIFEST) would "
    "not be reproducible.",
    group=G,
)
SCX_MAN_HASH = codes.define(
    "SCX_MAN_HASH",
    "An SCX tokenizer manifest hash disagrees: manifest_hash with the hash of its text, "
    "config_hash with the config hash (H_TOK) of its fields, api_schema_hash with this "
    "implementation, registry or alignment hash with the registry snapshot.",
    group=G,
)
SCX_MAN_SHARD = codes.define(
    "SCX_MAN_SHARD",
    "An SCX tokenizer manifest shard entry disagrees with its shard file (missing file, index, "
    "counts, config hash), or its path leaves the manifest's folder.",
    group=G,
)

KEYS = (
    "format",
    "tok_spec_version",
    "config_hash",
    "pi_signature",
    "pi_key_id",
    "key_history",
    "registry_hash",
    "alignment_hash",
    "api_schema_hash",
    "lane_mode",
    "registry_path",
    "created_at",
    "raw_bytes",
    "shards",
    "manifest_hash",
)
SHARD_KEYS = (
    "shard_id",
    "path_or_uri",
    "hash_raw",
    "hash_aligned",
    "bundle_count",
    "raw_bytes",
    "notes",
)
SIG_KEYS = ("algorithm", "public_key", "signature")


def sniff(head: bytes, size: int) -> bool:
    return head.startswith(SNIFF)


def created_at_from(option: str | None) -> str | None:
    """The created_at value: an explicit option, else SOURCE_DATE_EPOCH, else null."""
    if option is not None:
        if not _TIME.match(option):
            raise UsageError(f"--created-at must look like 2024-01-31T12:00:00Z, got {option!r}")
        try:
            datetime.datetime.strptime(option, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            raise UsageError(f"--created-at {option!r} is not a valid UTC time") from None
        return option
    from matrixctl.epoch import source_date_text

    return source_date_text()


def sig_json(sig: Signature) -> dict[str, str]:
    return {
        "algorithm": "ed25519",
        "public_key": sig.public_key.hex(),
        "signature": sig.signature.hex(),
    }


@dataclass
class Manifest:
    config_hash: bytes
    pi_signature: Signature
    registry_hash: bytes
    alignment_hash: bytes
    api_schema_hash: bytes
    lane_mode: str
    shards: list[dict[str, Any]]
    raw_bytes: int
    registry_path: str = "registry.scxr"
    created_at: str | None = None
    key_history: list[Signature] = field(default_factory=list)
    tok_spec_version: str = scx_tokens.SPEC_NAME
    format: str = NAME
    stored_hash: bytes | None = None  # manifest_hash as read from a file

    @property
    def pi_key_id(self) -> str:
        return signing.key_id(self.pi_signature.public_key)

    @classmethod
    def new(
        cls, tok: Any, shards: list[dict[str, Any]], raw_bytes: int, *, created_at: str | None
    ) -> Manifest:
        if tok.authority is None:
            raise UsageError("a manifest needs a config whose signature was checked")
        rf = tok.rf
        return cls(
            config_hash=tok.h_tok,
            pi_signature=tok.authority,
            registry_hash=rf.h_reg,
            alignment_hash=rf.h_align,
            api_schema_hash=scx_tokens.h_api(),
            lane_mode=rf.registry.lane_mode_name,
            shards=shards,
            raw_bytes=raw_bytes,
            created_at=created_at,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "tok_spec_version": self.tok_spec_version,
            "config_hash": self.config_hash.hex(),
            "pi_signature": sig_json(self.pi_signature),
            "pi_key_id": self.pi_key_id,
            "key_history": [
                {"pi_key_id": signing.key_id(s.public_key), "pi_signature": sig_json(s)}
                for s in self.key_history
            ],
            "registry_hash": self.registry_hash.hex(),
            "alignment_hash": self.alignment_hash.hex(),
            "api_schema_hash": self.api_schema_hash.hex(),
            "lane_mode": self.lane_mode,
            "registry_path": self.registry_path,
            "created_at": self.created_at,
            "raw_bytes": self.raw_bytes,
            "shards": [{k: s[k] for k in SHARD_KEYS} for s in self.shards],
        }

    def body_bytes(self) -> bytes:
        """The canonical text without manifest_hash: what H_MANIFEST hashes."""
        text = json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"
        return text.encode("utf-8")

    @property
    def h_manifest(self) -> bytes:
        return scx_tokens.blake3_256(self.body_bytes())

    def to_bytes(self, manifest_hash: bytes | None = None) -> bytes:
        doc = self.to_json()
        doc["manifest_hash"] = (manifest_hash or self.h_manifest).hex()
        text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        return text.encode("utf-8")

    def rotated(self, sig: Signature) -> Manifest:
        """Key rotation: `sig` (same H_TOK, new key) becomes current, the old one history."""
        if sig.public_key == self.pi_signature.public_key:
            return self
        history = [s for s in self.key_history if s.public_key != sig.public_key]
        return replace(self, pi_signature=sig, key_history=[*history, self.pi_signature])


# Reading -------------------------------------------------------------------------------------


def _bad(message: str, fld: str) -> FormatError:
    return FormatError(SCX_MAN_JSON, message, field=fld)


def _hex(doc: dict[str, Any], key: str, where: str, pattern: re.Pattern[str] = _HEX64) -> bytes:
    value = doc.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        raise _bad(
            f"{key} must be lowercase hex ({pattern.pattern[1:].split(']')[0]})", where + key
        )
    return bytes.fromhex(value)


def _sig(doc: Any, where: str) -> Signature:
    if not isinstance(doc, dict) or tuple(doc) != SIG_KEYS:
        raise _bad(f"a signature is an object with keys {list(SIG_KEYS)} in that order", where)
    if doc["algorithm"] != "ed25519":
        raise _bad("algorithm must be ed25519", where + ".algorithm")
    return Signature(
        _hex(doc, "public_key", where + "."), _hex(doc, "signature", where + ".", _HEX128)
    )


def _uint(doc: dict[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise _bad(f"{key} must be an integer in 0..2**64-1", where + key)
    return value


def parse(data: bytes) -> Manifest:
    """Parse and check a manifest's text; raise FormatError at the first problem."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise _bad(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes", "$")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(SCX_MAN_JSON, f"not UTF-8: {exc.reason}", offset=exc.start) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        at = len(text[: exc.pos].encode("utf-8"))
        raise FormatError(SCX_MAN_JSON, f"not JSON: {exc.msg}", offset=at) from None
    except RecursionError:
        raise _bad("JSON nested too deeply", "$") from None
    if not isinstance(doc, dict):
        raise _bad("a manifest is a JSON object", "$")
    if tuple(doc) != KEYS:
        missing = [k for k in KEYS if k not in doc]
        extra = [k for k in doc if k not in KEYS]
        raise _bad(
            f"keys must be {list(KEYS)} in that order"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {extra}" if extra else ""),
            "$",
        )
    if doc["format"] != NAME or doc["tok_spec_version"] != scx_tokens.SPEC_NAME:
        raise FormatError(
            scx_tokens.UNSUPPORTED_VERSION,
            f"format {doc['format']!r} / tok_spec_version {doc['tok_spec_version']!r}: this "
            f"implementation reads {NAME} / {scx_tokens.SPEC_NAME}",
            field="tok_spec_version",
        )
    if doc["lane_mode"] not in LANE_MODE_NAMES.values():
        raise _bad("lane_mode must be SCXQ2, SCXQ4 or CUSTOM", "lane_mode")
    if not isinstance(doc["registry_path"], str) or not doc["registry_path"]:
        raise _bad("registry_path must be a non-empty string", "registry_path")
    created = doc["created_at"]
    if created is not None and (not isinstance(created, str) or not _TIME.match(created)):
        raise _bad("created_at must be null or YYYY-MM-DDTHH:MM:SSZ", "created_at")
    pi_sig = _sig(doc["pi_signature"], "pi_signature")
    if doc["pi_key_id"] != signing.key_id(pi_sig.public_key):
        raise FormatError(
            scx_tokens.UNSIGNED_REGISTRY,
            f"pi_key_id {doc['pi_key_id']!r} is not the id of pi_signature's key "
            f"({signing.key_id(pi_sig.public_key)})",
            field="pi_key_id",
        )
    history_doc = doc["key_history"]
    if not isinstance(history_doc, list) or len(history_doc) > 1024:
        raise _bad("key_history must be a list (at most 1024 entries)", "key_history")
    history = []
    for i, item in enumerate(history_doc):
        where = f"key_history[{i}]"
        if not isinstance(item, dict) or tuple(item) != ("pi_key_id", "pi_signature"):
            raise _bad("an entry is {pi_key_id, pi_signature}", where)
        sig = _sig(item["pi_signature"], where + ".pi_signature")
        if item["pi_key_id"] != signing.key_id(sig.public_key):
            raise FormatError(
                scx_tokens.UNSIGNED_REGISTRY,
                "pi_key_id is not the id of the entry's key",
                field=where,
            )
        history.append(sig)
    shards_doc = doc["shards"]
    if not isinstance(shards_doc, list) or len(shards_doc) > MAX_SHARDS:
        raise _bad(f"shards must be a list of at most {MAX_SHARDS}", "shards")
    shards = []
    for i, item in enumerate(shards_doc):
        where = f"shards[{i}]"
        if not isinstance(item, dict) or tuple(item) != SHARD_KEYS:
            raise _bad(f"a shard entry has keys {list(SHARD_KEYS)} in that order", where)
        for key in ("shard_id", "path_or_uri", "notes"):
            if not isinstance(item[key], str):
                raise _bad(f"{key} must be a string", f"{where}.{key}")
        _hex(item, "hash_raw", where + ".")
        _hex(item, "hash_aligned", where + ".")
        _uint(item, "bundle_count", where + ".")
        _uint(item, "raw_bytes", where + ".")
        shards.append(dict(item))
    man = Manifest(
        config_hash=_hex(doc, "config_hash", ""),
        pi_signature=pi_sig,
        registry_hash=_hex(doc, "registry_hash", ""),
        alignment_hash=_hex(doc, "alignment_hash", ""),
        api_schema_hash=_hex(doc, "api_schema_hash", ""),
        lane_mode=doc["lane_mode"],
        shards=shards,
        raw_bytes=_uint(doc, "raw_bytes", ""),
        registry_path=doc["registry_path"],
        created_at=created,
        key_history=history,
    )
    stored = _hex(doc, "manifest_hash", "")
    man.stored_hash = stored
    canon = man.to_bytes(stored)
    if canon != bytes(data):
        at = next(
            (i for i, (a, b) in enumerate(zip(canon, bytes(data), strict=False)) if a != b),
            min(len(canon), len(data)),
        )
        raise FormatError(
            SCX_MAN_CANONICAL,
            "the manifest's bytes differ from its canonical text (key order, spacing, escapes, "
            "final newline), so H_MANIFEST would not be reproducible",
            offset=at,
            field="$",
        )
    return man


def expected_h_tok(man: Manifest) -> bytes:
    mode = {v: k for k, v in LANE_MODE_NAMES.items()}[man.lane_mode]
    return scx_tokens.h_tok(mode, man.registry_hash, man.alignment_hash, man.api_schema_hash)


def safe_member(folder: str, rel: str) -> str | None:
    """`folder/rel` when `rel` is a plain relative path that stays inside `folder`, else None."""
    if not rel or "://" in rel or os.path.isabs(rel) or "\\" in rel or "\0" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return os.path.join(folder, *parts)
