"""The one manifest-folder base (matrixctl/validate/manifest_folder.py) that the ingest pack and
the `ingest gguf` folder handlers share: manifest reading, member names, sizes and hashes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from matrixctl.errors import FormatError
from matrixctl.validate import gguf_ingest, ingest_pack, manifest_folder

DIGEST_OF_ABC = "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
FIELDS = {"version": int, "files": dict}


def _folder(tmp_path: Path, files: dict[str, object]) -> Path:
    folder = tmp_path / "pack"
    folder.mkdir()
    (folder / "m.json").write_text(json.dumps({"version": 1, "files": files}))
    return folder


def _load(folder: Path) -> manifest_folder.ManifestFolder:
    subject = manifest_folder.load_folder(str(folder), "m.json", 1 << 20, "PACK_MANIFEST", FIELDS)
    assert subject.manifest is not None
    for name in subject.manifest["files"]:
        manifest_folder.admit(subject, f"files.{name}", name, "folder")
    return subject


def test_handlers_share_the_base() -> None:
    """Decision: one manifest-folder base; both folder handlers load into its subject and
    report member problems with its codes (docs/architecture.md)."""
    assert gguf_ingest.load_dir.__annotations__["return"] == "ManifestFolder"
    assert ingest_pack.load_dir.__annotations__["return"] == "ManifestFolder"
    assert manifest_folder.PACK_HASH == "PACK_HASH"


def test_members_names_sizes_and_hashes(tmp_path: Path) -> None:
    folder = _folder(
        tmp_path,
        {
            "good": {"bytes": 3, "sha256": DIGEST_OF_ABC},
            "edited": {"bytes": 3, "sha256": DIGEST_OF_ABC},
            "cut": {"bytes": 9, "sha256": DIGEST_OF_ABC},
            "gone": {"bytes": 3},
            "bare": 3,
            "../escape": {"bytes": 3},
        },
    )
    (folder / "good").write_bytes(b"abc")
    (folder / "edited").write_bytes(b"abd")
    (folder / "cut").write_bytes(b"abc")
    (folder / "bare").write_bytes(b"abc")
    subject = _load(folder)
    assert [(f.code, f.field) for f in subject.findings] == [
        ("PACK_PATH_ESCAPE", "files.../escape")
    ]
    assert "not a file inside the folder; not opened" in subject.findings[0].message
    assert subject.file("../escape") is None and subject.file(["not", "a", "name"]) is None

    lenient = [
        (f.code, f.field, root) for f, root in manifest_folder.presence(subject, records=False)
    ]
    assert lenient == [
        ("PACK_SIZE", "files.cut.bytes", True),
        ("PACK_MISSING", "files.gone", True),
    ]
    strict = [(f.message, root) for f, root in manifest_folder.presence(subject, records=True)]
    assert strict == [
        ("cut is 3 bytes, the manifest says 9", True),
        ("gone is missing", True),
        ("bare is 3 bytes, the manifest says 3", False),
    ]
    cut = next(f for f, _ in manifest_folder.presence(subject, records=False))
    assert cut.message == "cut is 3 bytes, the manifest says 9 (cut at byte 3)"
    assert [f.field for f in manifest_folder.hashes(subject)] == ["files.edited.sha256"]


def test_a_link_leading_out_is_never_a_member(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"abc")
    folder = _folder(tmp_path, {"link": {"bytes": 3, "sha256": DIGEST_OF_ABC}})
    os.symlink(outside, folder / "link")
    subject = _load(folder)
    assert [f.code for f in subject.findings] == ["PACK_PATH_ESCAPE"]
    assert list(manifest_folder.hashes(subject)) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1]", "m.json is not a JSON object"),
        ("{", "m.json is not UTF-8 JSON"),
    ],
)
def test_manifest_refused_whole(tmp_path: Path, text: str, message: str) -> None:
    folder = tmp_path / "pack"
    folder.mkdir()
    (folder / "m.json").write_text(text)
    with pytest.raises(FormatError) as err:
        manifest_folder.load_folder(str(folder), "m.json", 1 << 20, "PACK_MANIFEST", FIELDS)
    assert err.value.code == "PACK_MANIFEST" and message in err.value.message


def test_wrong_fields_leave_no_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "pack"
    folder.mkdir()
    (folder / "m.json").write_text(json.dumps({"version": True, "files": {}}))
    subject = manifest_folder.load_folder(str(folder), "m.json", 1 << 20, "PACK_MANIFEST", FIELDS)
    assert subject.manifest is None
    assert [f.field for f in subject.findings] == ["version"]
    assert list(manifest_folder.presence(subject, records=True)) == []
