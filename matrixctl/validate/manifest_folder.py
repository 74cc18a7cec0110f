"""The base of every manifest folder's handler: an ingest pack (`ingest_pack.py`) and the folder
`ingest gguf` writes (`gguf_ingest.py`).

A manifest folder is a folder whose JSON manifest lists its member files under `files`, each
with its size (`bytes`) and SHA-256. What both handlers check the same way lives here: reading
the manifest (bounded, UTF-8 JSON, an object), its typed fields, member names that must stay
inside the folder (a name that leaves it is reported and never opened), each member present as
a regular file with its recorded size, its SHA-256, and its own format's checks. The handler
adds its manifest's fields, names and the consistency rules of its members.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from matrixctl import codes
from matrixctl.errors import FormatError
from matrixctl.findings import Finding, finding

# Member codes keep the group they were first defined under: both folders report them.
G = "ingest-pack"
PACK_PATH_ESCAPE = codes.define(
    "PACK_PATH_ESCAPE",
    "An artifact name in the manifest leaves the pack folder (never followed).",
    group=G,
)
PACK_MISSING = codes.define(
    "PACK_MISSING", "An artifact the manifest lists is missing or not a regular file.", group=G
)
PACK_SIZE = codes.define(
    "PACK_SIZE", "An artifact's size differs from the manifest's record.", group=G
)
PACK_HASH = codes.define("PACK_HASH", "An artifact's SHA-256 differs from the manifest.", group=G)
PACK_ARTIFACT = codes.define(
    "PACK_ARTIFACT", "An artifact of the pack fails its own format's checks.", group=G
)


@dataclass
class ManifestFolder:
    """A manifest folder as loaded: the manifest (None when its fields are wrong: the member
    rules then skip themselves), what loading found, and the members' paths by name."""

    path: str
    manifest: dict[str, Any] | None
    findings: list[Finding] = field(default_factory=list)
    safe: dict[str, str] = field(default_factory=dict)  # member name -> path inside the folder

    def file(self, name: Any) -> str | None:
        """The path of a member whose name stays inside the folder; None for any other name."""
        return self.safe.get(name) if isinstance(name, str) else None

    def members(self) -> Iterator[tuple[str, Any, str]]:
        """(name, record, path) of every member listed under `files` whose name is safe."""
        if self.manifest is None:
            return
        for name, record in self.manifest["files"].items():
            path = self.file(name)
            if path is not None:
                yield name, record, path


def describe_files(manifest: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The members for `describe`: name, size and the start of the SHA-256 (None when the
    manifest has no `files` object)."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        return None
    return [
        {"file": k, "bytes": v.get("bytes"), "sha256": str(v.get("sha256", ""))[:23] + "..."}
        for k, v in files.items()
        if isinstance(v, dict)
    ]


def inside(folder: str, name: str) -> str | None:
    """The path of `name` if it is a plain file name inside `folder` (no separators, no link
    leading out)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        return None
    full = os.path.join(folder, name)
    if os.path.dirname(os.path.realpath(full)) != os.path.realpath(folder):
        return None
    return full


def regular(path: str | None) -> bool:
    """Whether `path` is a regular file (a link is not followed)."""
    try:
        return path is not None and stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_manifest(folder: str, name: str, limit: int, code: str) -> dict[str, Any]:
    """The folder's manifest `name` as a JSON object of at most `limit` bytes; `FormatError`
    with `code` when it cannot be read, is not UTF-8 JSON or is not an object."""
    path = os.path.join(folder, name)
    try:
        st = os.stat(path)
        if st.st_size > limit:
            raise FormatError(code, f"manifest is {st.st_size} bytes, limit {limit}")
        with open(path, "rb") as fp:
            raw = fp.read(limit + 1)
    except OSError as exc:
        raise FormatError(code, f"cannot read {name}: {exc.strerror}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise FormatError(code, f"{name} is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise FormatError(code, f"{name} is not a JSON object")
    return doc


def load_folder(
    folder: str,
    manifest: str,
    limit: int,
    code: str,
    fields: Mapping[str, type | tuple[type, ...]],
) -> ManifestFolder:
    """The folder with its manifest read; `manifest` is None (and `findings` says why) when a
    field is missing or of another type (a bool is never an int)."""
    doc = read_manifest(folder, manifest, limit, code)
    subject = ManifestFolder(folder, doc)
    for key, typ in fields.items():
        value = doc.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            subject.findings.append(
                finding(code, f"field {key!r} is missing or not a {typ}", field=key)
            )
    if subject.findings:
        subject.manifest = None
    return subject


def admit(subject: ManifestFolder, where: str, name: str, noun: str) -> None:
    """Record the member `name` (named by the manifest's `where`) when it stays inside the
    folder; report it (PACK_PATH_ESCAPE) and never open it otherwise."""
    path = inside(subject.path, name)
    if path is None:
        subject.findings.append(
            finding(
                PACK_PATH_ESCAPE,
                f"{where} names {name!r}, which is not a file inside the {noun}; not opened",
                field=where,
            )
        )
    else:
        subject.safe[name] = path


def presence(subject: ManifestFolder, *, records: bool) -> Iterator[tuple[Finding, bool]]:
    """Each member that is missing, not a regular file or not of its recorded size, and whether
    that is a root cause (missing, or shorter than recorded: cut) rather than another size.
    With `records`, a `files` entry that is not a record is reported too."""
    for name, record, path in subject.members():
        try:
            st = os.lstat(path)
        except OSError:
            yield finding(PACK_MISSING, f"{name} is missing", field=f"files.{name}"), True
            continue
        if not stat.S_ISREG(st.st_mode):
            yield (
                finding(PACK_MISSING, f"{name} is not a regular file", field=f"files.{name}"),
                True,
            )
            continue
        is_record = isinstance(record, dict)
        if not is_record and not records:
            continue
        want = record.get("bytes") if is_record else record
        if is_record and want == st.st_size:
            continue
        cut = isinstance(want, int) and st.st_size < want
        if records:
            said = f"{want!r:.40}"
        else:
            said = f"{want}" + (f" (cut at byte {st.st_size})" if cut else "")
        yield (
            finding(
                PACK_SIZE,
                f"{name} is {st.st_size} bytes, the manifest says {said}",
                field=f"files.{name}.bytes",
            ),
            cut,
        )


def hashes(subject: ManifestFolder) -> Iterator[Finding]:
    """Every regular member whose SHA-256 differs from its record's."""
    from matrixctl.io import sha256_file

    for name, record, path in subject.members():
        if not regular(path) or not isinstance(record, dict):
            continue
        got = sha256_file(path)
        if got != record.get("sha256"):
            yield finding(
                PACK_HASH,
                f"{name}: SHA-256 is {got}, the manifest says {record.get('sha256')}",
                field=f"files.{name}.sha256",
            )


def member_findings(path: str, name: str) -> Iterator[Finding]:
    """The member's own format checks (verify), each under the member's name: errors as
    PACK_ARTIFACT, warnings under their own code, notes left out."""
    from matrixctl.validate.engine import examine

    report, _ = examine(path, scan=True)
    for f in report.findings:
        if f.severity is codes.Severity.INFO:
            continue
        yield finding(
            PACK_ARTIFACT if f.severity is codes.Severity.ERROR else f.code,
            f"{name}: [{f.code}] {f.message}",
            offset=f.offset,
            field=f"{name}:{f.field}" if f.field else name,
            severity=f.severity,
        )
