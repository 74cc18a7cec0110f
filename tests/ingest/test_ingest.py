"""ingest docs / merge / verify PACKDIR, extraction, the document index, tokenize pi CLI."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from matrixctl.formats import doc_index, matrix_atom
from matrixctl.ingest import kinds
from matrixctl.ingest.kinds import base as kinds_base
from matrixctl.ingest.kinds import html as kinds_html
from matrixctl.ingest.kinds import jsonl as kinds_jsonl
from matrixctl.ingest.kinds import markdown as kinds_markdown
from matrixctl.tokenizers import pi
from matrixctl.validate import ingest_pack as pack_checks
from matrixctl.validate import manifest_folder
from matrixctl.validate.engine import examine
from tests.helpers.cli import ROOT, run_cli, run_sub

CORPUS = ROOT / "fixtures" / "corpus"


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def ingest(tmp_path: Path, *args: str, name: str = "pack", src: Path = CORPUS) -> Path:
    out = tmp_path / name
    run = run_cli("ingest", "docs", str(src), "-o", str(out), *args)
    assert run.code == 0, run.stderr
    return out


def tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# Extraction ----------------------------------------------------------------------------------


def test_html_visible_text_only() -> None:
    html = (
        "<html><head><title>T &amp; t</title><style>p{}</style><script>bad()</script></head>"
        "<body><!-- hidden --><p>One <b>bold</b>\n   word</p><div>Two<br>lines</div>"
        "<pre>  keep\n  this</pre><noscript>no</noscript><ul><li>a</li><li>b</li></ul></body>"
    )
    assert kinds_html.html_text(html) == "T & t\nOne bold word\nTwo\nlines\n  keep\n  this\na\nb"


def test_markdown_syntax_is_stripped() -> None:
    md = (
        "# Title #\n\nSome **bold** and *em* with [a link](http://x) and `code`.\n\n"
        "```\nx = 1\n```\n---\n"
    )
    out = "".join(kinds_markdown.markdown_lines(kinds_markdown.split_lines(iter([md]))))
    assert out == "Title\n\nSome bold and em with a link and code.\n\nx = 1\n"


@pytest.mark.parametrize(
    ("head", "name", "kind"),
    [
        (b"<!DOCTYPE html><html>", "a.txt", "text"),
        (b"<!DOCTYPE html><html>", "a", "html"),
        (b"  <p>hello</p>", "x", "html"),
        (b"plain words", "page.HTM", "html"),
        (b'{"text": "a"}\n{"text": "b"}\n', "a", "jsonl"),
        (b'{"text": "a"}\n{"text": "b"}\n', "a.json", "json"),
        (b'{\n  "text": "a"\n}\n', "a", "json"),
        (b'{\n  "text": "a"\n}\n', "a.jsonl", "jsonl"),
        (b'{"text": "a"}\n', "a.ndjson", "jsonl"),
        (b"PAR1\x15\x04\x00", "x.bin", "parquet"),
        (b"ARROW1\x00\x00", "data.txt", "arrow"),
        (b'[{"text": "a"}]', "a", "json"),
        (b"[![Build status](https://ci/x.svg)](https://ci)\n# Tool\n", "README.md", "markdown"),
        (b"[ This is just a pointer ]\n", "notes.txt", "text"),
        (b'{"text": "a"}\n', "guide.rst", "text"),
        (b"# Title\n", "a.md", "markdown"),
        (b"# Title\n", "a.txt", "text"),
        (b"# Title\n", "dir.md/x", "text"),
        (b"abc\0def", "a.html", "binary"),
        (b"<not html at all", "a", "text"),
    ],
)
def test_kind_is_sniffed_from_bytes(head: bytes, name: str, kind: str) -> None:
    """Decision: the name decides for .md/.markdown/.txt/.rst/.html (and their variants), the
    bytes only where the name says nothing; a NUL byte means binary whatever the name, except
    for the Parquet/Arrow magics; .json/.jsonl/.ndjson are hints the bytes must agree with."""
    assert kinds.sniff_kind(head, name) == kind


# The pack ------------------------------------------------------------------------------------


def test_pack_has_every_artifact_and_verifies(tmp_path: Path) -> None:
    pack = ingest(tmp_path, "--svgt", "16x16")
    assert sorted(p.name for p in pack.iterdir()) == [
        "atoms.svgt",
        "doc_index.bin",
        "ingest_manifest.json",
        "matrix_atoms.bin",
        "pi_symbol_map.json",
    ]
    run = run_cli("verify", "--json", str(pack))
    assert run.code == 0, run.stdout
    doc = run.json()
    assert doc["files"][0]["format"] == "ingest-pack" and doc["files"][0]["findings"] == []
    m = json.loads((pack / "ingest_manifest.json").read_text())
    for key in ("version", "source", "tokenizer", "atom_file", "atom_size", "dtype", "hash"):
        assert key in m
    assert m["atom_size"] == 256 and m["dtype"] == "uint16" and m["created"] is None
    assert m["documents"] == 10 and m["tool"]["name"] == "matrixctl"
    jsonl = next(s for s in m["sources"] if s["kind"] == "jsonl")
    assert jsonl["documents"] == 7 and jsonl["skipped_records"] == 1
    assert (
        m["symbol_map"]["canonical_hash"]
        == pi.load_symbol_map(pi.default_map_path())[0].canonical_hash()
    )
    header = matrix_atom.AtomHeader.parse((pack / "matrix_atoms.bin").read_bytes())
    assert header.flags == matrix_atom.FLAG_INDEX | matrix_atom.FLAG_SVG_TENSOR


def test_documents_end_with_eos_and_decode_back(tmp_path: Path) -> None:
    """Decision: a JSON document without a string text field is skipped and counted."""
    pack = ingest(tmp_path)
    data = (pack / "matrix_atoms.bin").read_bytes()
    atoms = matrix_atom.token_view(data, matrix_atom.AtomHeader.parse(data))
    idx = (pack / "doc_index.bin").read_bytes()
    recs = doc_index.records_view(idx, doc_index.IndexHeader.parse(idx))
    tok = pi.Tokenizer(pi.load_symbol_map(str(pack / "pi_symbol_map.json"))[0])
    texts = []
    for r in recs:
        ids = atoms[int(r["token_offset"]) : int(r["token_offset"] + r["token_length"])]
        assert ids[-1] == 1  # eos_id of the bundled map
        texts.append(tok.decode(ids))
    assert "これは日本語の文です。" in texts
    assert "The quick brown fox jumps over the lazy dog." in texts
    items = [int(r["item"]) for r in recs]
    assert items[-7:] == [1, 2, 4, 5, 6, 7, 8]  # JSON Lines line numbers; line 3 skipped


def test_same_bytes_whatever_jobs_and_listing_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decision: inputs in SRC order, folders sorted by relative path bytes, any --jobs."""
    one = tree_bytes(ingest(tmp_path, "--jobs", "1", "--svgt", "16x16", name="a"))
    two = tree_bytes(ingest(tmp_path, "--jobs", "2", "--svgt", "16x16", name="b"))
    real = os.scandir

    class Reversed(list):  # the file system lists entries in another order
        def __enter__(self):
            return iter(self)

        def __exit__(self, *exc):
            return None

    def reversed_scandir(path="."):
        with real(path) as it:
            return Reversed(sorted(it, key=lambda e: e.name, reverse=True))

    monkeypatch.setattr(os, "scandir", reversed_scandir)
    three = tree_bytes(ingest(tmp_path, "--jobs", "2", "--svgt", "16x16", name="c"))
    assert one == two == three


def test_source_date_epoch_is_the_only_time(tmp_path: Path) -> None:
    pack = tmp_path / "p"
    run = run_cli(
        "ingest", "docs", str(CORPUS), "-o", str(pack), env={"SOURCE_DATE_EPOCH": "86400"}
    )
    assert run.code == 0
    assert json.loads((pack / "ingest_manifest.json").read_text())["created"] == (
        "1970-01-02T00:00:00Z"
    )


def test_shards_merge_into_the_unsharded_pack(tmp_path: Path) -> None:
    """Decision: shards by a hash of the recorded path; merge restores the global order."""
    whole = tree_bytes(ingest(tmp_path, "--svgt", "16x16", name="whole"))
    shards = [
        str(ingest(tmp_path, "--svgt", "16x16", "--shard", f"{i}/3", name=f"s{i}"))
        for i in range(3)
    ]
    run = run_cli("ingest", "merge", shards[2], shards[0], shards[1], "-o", str(tmp_path / "m"))
    assert run.code == 0, run.stderr
    assert tree_bytes(tmp_path / "m") == whole
    missing = run_cli("ingest", "merge", shards[0], shards[1], "-o", str(tmp_path / "x"))
    assert missing.code == 1 and "INGEST_MERGE" in missing.stderr
    assert not (tmp_path / "x").exists()
    nothing = run_cli("ingest", "merge", str(tmp_path / "nope"), "-o", str(tmp_path / "x"))
    assert nothing.code == 2 and "IO_NOT_FOUND" in nothing.stderr
    decode_missing = run_cli("tokenize", "pi", "decode", str(tmp_path / "nope.mxt"))
    assert decode_missing.code == 2 and "IO_NOT_FOUND" in decode_missing.stderr


def test_large_file_spills_and_streams(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decision: bounded memory: tokens and records spill to the temporary folder."""
    from matrixctl.ingest import step

    monkeypatch.setattr(step, "MEM_TOKENS", 1000)
    monkeypatch.setattr(step, "MEM_DOCS", 7)
    monkeypatch.setattr(kinds_base, "PIECE", 4096)
    monkeypatch.setattr(kinds_jsonl, "PIECE", 4096)
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.txt").write_text("word and more words, " * 5000, encoding="utf-8")
    (src / "many.jsonl").write_text(
        "".join(json.dumps({"text": f"line {i} é"}) + "\n" for i in range(50)), encoding="utf-8"
    )
    pack = ingest(tmp_path, src=src)
    report, _ = examine(str(pack), scan=True)
    assert report.ok(strict=True), report.findings
    monkeypatch.setattr(step, "MEM_TOKENS", 1 << 20)
    monkeypatch.setattr(step, "MEM_DOCS", 1 << 16)
    monkeypatch.setattr(kinds_base, "PIECE", 1 << 20)
    monkeypatch.setattr(kinds_jsonl, "PIECE", 1 << 20)
    again = ingest(tmp_path, src=src, name="again")
    assert tree_bytes(pack) == tree_bytes(again)


# Failures leave nothing ------------------------------------------------------------------------


def test_bad_utf8_names_file_and_offset_and_leaves_no_pack(tmp_path: Path) -> None:
    """Decision: invalid UTF-8 stops with the file and byte offset, unless a policy is given."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"fine\n")
    (src / "b.txt").write_bytes(b"abc\xffdef")
    run = run_cli("ingest", "docs", str(src), "-o", str(tmp_path / "pack"))
    assert run.code == 1
    assert "INGEST_UTF8" in run.stderr and "b.txt" in run.stderr and "offset 3" in run.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]  # no pack, no temporary folder
    ok = run_cli(
        "ingest",
        "docs",
        str(src),
        "-o",
        str(tmp_path / "p2"),
        "--encoding-errors",
        "skip-file",
        "--json",
    )
    assert ok.code == 0 and ok.json()["skipped"] == 1
    rep = run_cli(
        "ingest", "docs", str(src), "-o", str(tmp_path / "p3"), "--encoding-errors", "replace"
    )
    assert rep.code == 0


def test_failure_keeps_the_existing_pack(tmp_path: Path) -> None:
    """Decision: an existing pack is replaced only when the new one is complete."""
    pack = ingest(tmp_path)
    before = tree_bytes(pack)
    src = tmp_path / "bad"
    src.mkdir()
    (src / "x.jsonl").write_text('{"text": "a"}\n{broken\n')
    run = run_cli("ingest", "docs", str(src), "-o", str(pack))
    assert run.code == 1 and "INGEST_JSON" in run.stderr and "line 2" in run.stderr
    assert tree_bytes(pack) == before
    assert sorted(os.listdir(tmp_path)) == ["bad", "pack"]


def test_a_folder_that_is_not_a_pack_is_never_replaced(tmp_path: Path) -> None:
    """Decision: only a pack or an empty folder may be replaced (INGEST_OUTPUT otherwise)."""
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "thesis.txt").write_text("precious")
    run = run_cli("ingest", "docs", str(CORPUS), "-o", str(keep))
    assert run.code == 2 and "INGEST_OUTPUT" in run.stderr
    assert (keep / "thesis.txt").read_text() == "precious"


def test_interrupted_ingest_leaves_no_pack(tmp_path: Path) -> None:
    """SIGTERM in the middle: exit 130, no pack, no temporary folder."""
    import signal
    import subprocess
    import sys
    import time

    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}.txt").write_text("some words to tokenize " * 20000)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "matrixctl",
            "ingest",
            "docs",
            str(src),
            "-o",
            str(tmp_path / "pack"),
            "--jobs",
            "2",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60  # signal once the temporary pack folder exists
    while time.time() < deadline and os.listdir(tmp_path) == ["src"] and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if proc.returncode == 0:  # finished before the signal: nothing to check on this machine
        assert (tmp_path / "pack" / "ingest_manifest.json").exists()
        return
    assert proc.returncode == 130, err
    assert sorted(os.listdir(tmp_path)) == ["src"]


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--svgt", "3x3"], 2, "USAGE"),
        (["--shard", "3/3"], 2, "USAGE"),
        (["--eos-id", "99999999"], 2, "USAGE"),
        (["--dtype", "int8"], 2, "USAGE"),
        (["--symbols", "/nonexistent/map.json"], 2, "IO_NOT_FOUND"),
    ],
)
def test_bad_options_are_usage_errors(
    tmp_path: Path, args: list[str], code: int, text: str
) -> None:
    run = run_cli("ingest", "docs", str(CORPUS), "-o", str(tmp_path / "p"), *args)
    assert run.code == code and text in run.stderr
    assert not (tmp_path / "p").exists()


def test_missing_source_and_binary_named_file(tmp_path: Path) -> None:
    run = run_cli("ingest", "docs", str(tmp_path / "nope"), "-o", str(tmp_path / "p"))
    assert run.code == 2 and "IO_NOT_FOUND" in run.stderr
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\x00\x01\x02")
    run = run_cli("ingest", "docs", str(binary), "-o", str(tmp_path / "p"))
    assert run.code == 1 and "INGEST_BINARY" in run.stderr


def test_map_without_eos_needs_an_eos_option(tmp_path: Path) -> None:
    """Decision: without a map eos_id, --eos-id ID or --eos-id none must be given."""
    m = tmp_path / "m.json"
    m.write_text(
        json.dumps(
            {
                "version": 1,
                "vocab_size": 300,
                "unk_id": 0,
                "byte_fallback": True,
                "byte_base_id": 2,
                "normalization": "nfc",
                "symbols": [{"id": 258, "text": "the"}],
            }
        )
    )
    run = run_cli("ingest", "docs", str(CORPUS), "-o", str(tmp_path / "p"), "--symbols", str(m))
    assert run.code == 2 and "--eos-id" in run.stderr
    run = run_cli(
        "ingest",
        "docs",
        str(CORPUS),
        "-o",
        str(tmp_path / "p"),
        "--symbols",
        str(m),
        "--eos-id",
        "none",
    )
    assert run.code == 0
    assert examine(str(tmp_path / "p"), scan=True)[0].ok(strict=True)


# verify PACKDIR catches damage ---------------------------------------------------------------


def tamper_manifest(pack: Path, **changes: object) -> None:
    path = pack / "ingest_manifest.json"
    m = json.loads(path.read_text())
    m.update(changes)
    path.write_text(json.dumps(m))


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        ("atoms_byte", manifest_folder.PACK_HASH),
        ("manifest_escape", manifest_folder.PACK_PATH_ESCAPE),
        ("manifest_vocab", pack_checks.PACK_MISMATCH),
        ("missing_index", manifest_folder.PACK_MISSING),
        ("svgt_byte", manifest_folder.PACK_HASH),
        ("bad_version", pack_checks.PACK_VERSION),
        ("not_json", pack_checks.PACK_MANIFEST),
    ],
)
def test_verify_reports_damage(tmp_path: Path, damage: str, code: str) -> None:
    pack = ingest(tmp_path, "--svgt", "16x16")
    if damage == "atoms_byte":
        data = bytearray((pack / "matrix_atoms.bin").read_bytes())
        data[100] ^= 1
        (pack / "matrix_atoms.bin").write_bytes(bytes(data))
    elif damage == "manifest_escape":
        tamper_manifest(pack, tokenizer="../../etc/passwd")
    elif damage == "manifest_vocab":
        tamper_manifest(pack, vocab_size=7)
    elif damage == "missing_index":
        (pack / "doc_index.bin").unlink()
    elif damage == "svgt_byte":
        data = bytearray((pack / "atoms.svgt").read_bytes())
        data[40] ^= 1
        (pack / "atoms.svgt").write_bytes(bytes(data))
    elif damage == "bad_version":
        tamper_manifest(pack, version=9)
    elif damage == "not_json":
        (pack / "ingest_manifest.json").write_text("{nope")
    run = run_cli("verify", "--json", str(pack))
    assert run.code == 1
    found = {f["code"] for f in run.json()["files"][0]["findings"]}
    assert code in found


def test_projection_and_index_are_checked_against_the_atoms(tmp_path: Path) -> None:
    """A projection or index that is self-consistent but disagrees with the atoms is caught,
    even with every hash in the manifest updated to match."""
    from matrixctl.io import sha256_file

    pack = ingest(tmp_path, "--svgt", "16x16")
    data = bytearray((pack / "atoms.svgt").read_bytes())
    data[32] ^= 1  # first projected id
    (pack / "atoms.svgt").write_bytes(bytes(data))
    m = json.loads((pack / "ingest_manifest.json").read_text())
    m["files"]["atoms.svgt"]["sha256"] = sha256_file(str(pack / "atoms.svgt"))
    (pack / "ingest_manifest.json").write_text(json.dumps(m))
    report, _ = examine(str(pack), scan=True)
    assert "SVGT_MISMATCH" in codes_of(report)
    # An index whose first document is one token shorter (resealed, hash updated).
    pack2 = ingest(tmp_path, name="p2")
    idx = bytearray((pack2 / "doc_index.bin").read_bytes())
    length = struct.unpack_from("<Q", idx, 48 + 8)[0]
    struct.pack_into("<Q", idx, 48 + 8, length - 1)
    struct.pack_into("<Q", idx, 48 + 32, length - 1)
    struct.pack_into("<I", idx, 0x24, zlib.crc32(bytes(idx[48:])))
    idx[0x28:0x2C] = bytes(4)
    struct.pack_into("<I", idx, 0x28, zlib.crc32(bytes(idx[:48])))
    (pack2 / "doc_index.bin").write_bytes(bytes(idx))
    m = json.loads((pack2 / "ingest_manifest.json").read_text())
    m["files"]["doc_index.bin"]["sha256"] = sha256_file(str(pack2 / "doc_index.bin"))
    (pack2 / "ingest_manifest.json").write_text(json.dumps(m))
    report, _ = examine(str(pack2), scan=True)
    assert "PACK_INDEX" in codes_of(report)


def test_symlink_artifact_leaving_the_pack_is_not_followed(tmp_path: Path) -> None:
    pack = ingest(tmp_path)
    outside = tmp_path / "outside.bin"
    shutil.move(str(pack / "doc_index.bin"), outside)
    os.symlink(outside, pack / "doc_index.bin")
    report, _ = examine(str(pack), scan=True)
    assert manifest_folder.PACK_PATH_ESCAPE in codes_of(report)


# The document index file ---------------------------------------------------------------------

# Two documents: tokens 0..4 from source 0 (item 0) and 5..6 from source 1 (JSON Lines line 3),
# eos_id 1. Typed from the table in docs/formats/doc-index.md.
RECORDS = (
    bytes.fromhex("0000000000000000")  # record 0 token_offset 0
    + bytes.fromhex("0500000000000000")  # token_length 5
    + bytes.fromhex("00000000")  # source 0
    + bytes.fromhex("00000000")  # reserved
    + bytes.fromhex("0000000000000000")  # item 0
    + bytes.fromhex("0500000000000000")  # record 1 token_offset 5
    + bytes.fromhex("0200000000000000")  # token_length 2
    + bytes.fromhex("01000000")  # source 1
    + bytes.fromhex("00000000")  # reserved
    + bytes.fromhex("0300000000000000")  # item 3
)


def index_header(header_crc: bytes) -> bytes:
    return (
        b"MXDOCIDX"  # 0x00 magic
        + bytes.fromhex("0100")  # 0x08 version
        + bytes.fromhex("3000")  # 0x0A header_bytes 48
        + bytes.fromhex("00000000")  # 0x0C flags
        + bytes.fromhex("0200000000000000")  # 0x10 doc_count 2
        + bytes.fromhex("0700000000000000")  # 0x18 token_count 7
        + bytes.fromhex("01000000")  # 0x20 eos_id 1
        + struct.pack("<I", zlib.crc32(RECORDS))  # 0x24 records_crc32
        + header_crc  # 0x28 header_crc32
        + bytes(4)  # 0x2C reserved
    )


GOLDEN_INDEX = index_header(struct.pack("<I", zlib.crc32(index_header(bytes(4))))) + RECORDS


def test_index_writer_produces_the_golden_bytes() -> None:
    import io

    out = io.BytesIO()
    writer = doc_index.IndexWriter(out, eos_id=1)
    writer.add(5, 0, 0)
    writer.add(2, 1, 3)
    writer.finish()
    assert out.getvalue() == GOLDEN_INDEX


def test_index_records_in_one_block_are_the_same_bytes_as_one_by_one() -> None:
    """`IndexWriter.add_many` (a piece's records in one write) gives the bytes and the CRC-32
    of `add` called for each record, after earlier records and with an item base."""
    import io

    rng = np.random.default_rng(7)
    pairs = np.stack(
        [rng.integers(1, 5000, 300, dtype=np.uint64), rng.integers(0, 10**9, 300, dtype=np.uint64)],
        axis=1,
    )
    one, block = io.BytesIO(), io.BytesIO()
    writers = doc_index.IndexWriter(one, eos_id=3), doc_index.IndexWriter(block, eos_id=3)
    for writer in writers:
        writer.add(7, 0, 0)
    for length, item in pairs.tolist():
        writers[0].add(length, 2, item + 40)
    writers[1].add_many(pairs, 2, 40)
    writers[1].add_many(pairs[:0], 2, 40)  # nothing: no bytes, no change
    heads = [w.finish() for w in writers]
    assert heads[0] == heads[1]
    assert one.getvalue() == block.getvalue()


def test_index_truncation_and_bit_flips_are_reported(tmp_path: Path) -> None:
    """Decision: header and records both carry a CRC-32, so any flipped bit is seen."""
    path = tmp_path / "i.bin"
    path.write_bytes(GOLDEN_INDEX)
    report = examine(str(path), scan=True)[0]
    assert report.format == "doc-index" and report.ok(strict=True)
    for n in range(8, len(GOLDEN_INDEX)):
        path.write_bytes(GOLDEN_INDEX[:n])
        assert not examine(str(path), scan=True)[0].ok(), n
    for bit in range(64, len(GOLDEN_INDEX) * 8):
        data = bytearray(GOLDEN_INDEX)
        data[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(bytes(data))
        assert not examine(str(path), scan=True)[0].ok(), bit


def test_index_hostile_counts_do_not_allocate(tmp_path: Path) -> None:
    data = bytearray(GOLDEN_INDEX)
    struct.pack_into("<Q", data, 0x10, 2**62)
    path = tmp_path / "h.bin"
    path.write_bytes(bytes(data))
    report = examine(str(path), scan=True)[0]
    assert doc_index.DIDX_SIZE in codes_of(report)


# tokenize pi -----------------------------------------------------------------------------------


def test_encode_pack_decode_pipeline(tmp_path: Path) -> None:
    text = "Héllo wörld ﬁne 🦀 日本\n" * 50
    enc = run_cli("tokenize", "pi", "encode", "-", stdin=text.encode())
    assert enc.code == 0 and enc.stdout[:8] == b"MXTOKENS"
    (tmp_path / "t.mxt").write_bytes(enc.stdout)
    packed = run_cli(
        "pack",
        "atoms",
        str(tmp_path / "t.mxt"),
        "-o",
        str(tmp_path / "a.bin"),
        "-n",
        "64",
        "--json",
    )
    assert packed.code == 0 and packed.json()["documents"] == 1
    dec = run_cli("tokenize", "pi", "decode", str(tmp_path / "t.mxt"))
    assert dec.code == 0 and dec.out == pi.normalize(text, "nfkc")


def test_tokenize_exit_codes(tmp_path: Path) -> None:
    bad_text = run_cli("tokenize", "pi", "encode", "-", stdin=b"ok\xc3(")
    assert (
        bad_text.code == 1 and "PI_TEXT_UTF8" in bad_text.stderr and "offset 2" in bad_text.stderr
    )
    assert bad_text.stdout == b""
    missing = run_cli("tokenize", "pi", "encode", str(tmp_path / "none.txt"))
    assert missing.code == 2 and "IO_NOT_FOUND" in missing.stderr
    bad_map = tmp_path / "m.json"
    bad_map.write_text('{"version": 1, "vocab_size": 0}')
    run = run_cli("tokenize", "pi", "encode", "--symbols", str(bad_map), "-", stdin=b"x")
    assert run.code == 1 and "PI_" in run.stderr
    undecodable = run_cli("tokenize", "pi", "decode", "-", stdin=b"2 197 40 2")
    assert undecodable.code == 1 and "PI_DECODE_UTF8" in undecodable.stderr
    replaced = run_cli("tokenize", "pi", "decode", "--errors", "replace", "-", stdin=b"197 2")
    assert replaced.code == 0 and replaced.out.startswith("\ufffd")
    # --json with stdout as the output puts the ids in the document (tests/cli/test_ids.py).
    usage = run_cli("tokenize", "pi", "decode", "--errors", "ignore", "-", stdin=b"1")
    assert usage.code == 2 and "USAGE" in usage.stderr
    js = run_cli(
        "tokenize", "pi", "encode", "-o", str(tmp_path / "o.mxt"), "--json", "-", stdin=b"hello"
    )
    assert (
        js.code == 0
        and js.json()["tokens"]
        == pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0]).encode("hello").size
    )


def test_cli_in_a_subprocess_and_help_stays_cheap() -> None:
    run = run_sub("tokenize", "pi", "encode", "-", stdin=b"abc")
    assert run.code == 0 and run.stdout.startswith(b"MXTOKENS")
    import subprocess
    import sys

    code = (
        "import sys; from matrixctl.cli.app import main; "
        "main(['ingest', 'docs', '--help']); "
        "print('LOADED=' + ','.join(m for m in ('numpy', 'matrixctl._pi_kernel', 'selectolax') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert "Usage:" in out.stdout and out.stdout.strip().splitlines()[-1] == "LOADED="


def test_generated_docs_are_current() -> None:
    from matrixctl.cli import docgen

    assert docgen.main([]) == 0, "run `make docs`"
    np.zeros(1)  # keeps numpy imported for the module under test
