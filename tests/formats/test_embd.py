"""EMBD `.weights`: golden bytes, every decision, every finding, hostile files, round trips."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies
from safetensors.numpy import load_file, save_file

from matrixctl.codes import Severity
from matrixctl.converters.tensors import open_source
from matrixctl.errors import FormatError
from matrixctl.formats import embd
from matrixctl.tensors import DTYPES
from matrixctl.validate.engine import examine
from tests.helpers import golden_embd
from tests.helpers.cli import run_cli, run_sub

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TINY_META = {
    "model_name": "tiny",
    "model_version": "1.0.0",
    "embedding_dim": "2",
    "vocab_size": "7",
    "num_layers": "1",
    "num_attention_heads": "1",
    "hidden_size": "2",
    "intermediate_size": "4",
    "max_position_emb": "8",
    "created_at": "2025-01-16T12:00:00Z",
}
TINY_TOKENS = [t.decode() for t in golden_embd.TOKENS]
META_ARGS = [arg for k, v in TINY_META.items() for arg in ("--meta", f"{k}={v}")]


def report_of(tmp_path: Path, data: bytes, name: str = "f.weights", scan: bool = True):
    path = tmp_path / name
    path.write_bytes(data)
    return examine(str(path), scan=scan)[0]


def codes_of(report) -> set[str]:
    return {f.code for f in report.findings}


def errors_of(report) -> set[str]:
    return {f.code for f in report.findings if f.severity is Severity.ERROR}


def refresh(data: bytes | bytearray) -> bytes:
    """Recompute the header CRC and the footer CRCs after a deliberate edit, so only the edit
    itself is wrong (the CRC formulas are the spec's, computed with zlib)."""
    out = bytearray(data)
    struct.pack_into("<I", out, 56, zlib.crc32(bytes(out[:56])))
    tdo = struct.unpack_from("<I", out, 36)[0]
    tds = struct.unpack_from("<Q", out, 40)[0]
    foot = len(out) - 16
    struct.pack_into("<I", out, foot, zlib.crc32(bytes(out[tdo : tdo + tds])))
    struct.pack_into("<I", out, foot + 4, zlib.crc32(bytes(out[:foot])))
    return bytes(out)


def patched(fmt: str, offset: int, value: int, *, fix: bool = True) -> bytes:
    data = bytearray(golden_embd.EMBD)
    struct.pack_into(fmt, data, offset, value)
    return refresh(data) if fix else bytes(data)


def tiny_source(tmp_path: Path, metadata: dict | None = None, **arrays) -> Path:
    path = tmp_path / "src.safetensors"
    tensors = arrays or {
        "a": np.array([1, 2], np.float32),
        "foobar": np.array([[1, -2, 3]], np.int8),
    }
    meta = dict(TINY_META) if metadata is None else metadata
    save_file(tensors, str(path), metadata=meta)
    return path


# FNV-1a and golden bytes ----------------------------------------------------------------------


def test_fnv1a_matches_the_published_test_vectors() -> None:
    """Decision: name_hash is FNV-1a 32-bit (offset basis 2166136261, prime 16777619) over the
    name's UTF-8 bytes; values from the FNV reference code's test suite."""
    assert embd.fnv1a_32(b"") == 0x811C9DC5
    assert embd.fnv1a_32(b"a") == 0xE40C292C
    assert embd.fnv1a_32(b"foobar") == 0xBF9CF968


def test_golden_file_on_disk_is_the_hand_typed_bytes() -> None:
    assert (GOLDEN / "embd_v1_tiny.weights").read_bytes() == golden_embd.EMBD


def test_writer_reproduces_the_golden_file(tmp_path: Path) -> None:
    """The writer, fed the same tensors, metadata and vocabulary, gives the hand-typed bytes."""
    meta = dict(TINY_META, **{embd.TOKENS_KEY: json.dumps(TINY_TOKENS)})
    src = tiny_source(tmp_path, meta)
    out = tmp_path / "out.weights"
    result = run_cli("convert", str(src), str(out), "--meta", "created_at=2025-01-16T12:00:00Z")
    assert result.code == 0, result.stderr
    assert out.read_bytes() == golden_embd.EMBD


def test_golden_file_reads_back(tmp_path: Path) -> None:
    report = examine(str(GOLDEN / "embd_v1_tiny.weights"), scan=True)[0]
    assert report.format == "embd" and report.findings == []
    with open_source(str(GOLDEN / "embd_v1_tiny.weights")) as src:
        infos = src.tensors()
        assert [(i.name, i.dtype, i.shape) for i in infos] == [
            ("a", "f32", (2,)),
            ("foobar", "i8", (1, 3)),
        ]
        assert src.array(infos[0]).tolist() == [1.0, 2.0]
        assert src.array(infos[1]).tolist() == [1, -2, 3]
        meta = src.metadata()
        assert {k: meta[k] for k in TINY_META} == TINY_META
        assert meta[embd.TOKENS_KEY] == TINY_TOKENS
        assert meta["tokenizer.ggml.cls_token_id"] == 2
        assert src.special == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def test_inspect_shows_sections_vocabulary_and_tensors() -> None:
    doc = run_cli("inspect", "--json", str(GOLDEN / "embd_v1_tiny.weights")).json()["files"][0]
    assert doc["format"] == "embd" and doc["token_count"] == 7
    assert doc["special_tokens"]["cls"] == {"id": 2, "token": "[CLS]"}
    assert [s["section"] for s in doc["sections"]] == [
        "header",
        "metadata",
        "vocabulary",
        "tensor index",
        "tensor data",
        "footer",
    ]
    assert doc["tensors"][1]["extra"]["name_hash"] == "0xbf9cf968"
    human = run_cli("inspect", str(GOLDEN / "embd_v1_tiny.weights"))
    assert human.code == 0 and human.stdout == b"" and "foobar" in human.stderr


# Decisions ----------------------------------------------------------------------------------


def test_offsets_are_absolute_and_data_offsets_relative() -> None:
    """Decision: every header offset and special_tokens are absolute from the file start (spec
    assumption 4); only a descriptor's data_offset is relative to tensor_data_offset (as the
    spec's table says)."""
    f = embd.parse(golden_embd.EMBD, len(golden_embd.EMBD))
    assert (f.header.metadata_offset, f.header.vocab_offset) == (64, 280)
    assert f.special_offset == 292
    assert [t.data_offset for t in f.tensors] == [0, 64]
    assert [t.offset for t in f.tensors] == [448, 512]


def test_section_sizes_count_what_the_docs_say() -> None:
    """Decision: metadata total_size counts the entries only (metadata_size = 8 + total_size);
    vocabulary total_size counts the token entries only (vocab_size = 12 + 20 + total_size);
    the special ids sit right after the vocabulary header."""
    f = embd.parse(golden_embd.EMBD, len(golden_embd.EMBD))
    assert f.header.metadata_size == 8 + 205 and f.header.vocab_size == 12 + 20 + 45
    assert f.problems == []


def test_special_ids_may_follow_the_tokens() -> None:
    """Decision: a reader also accepts the five ids right after the tokens (the other place a
    writer could put them); anything else is EMBD_SPECIAL, and a value that looks relative to
    the vocabulary section says so."""
    data = bytearray(golden_embd.EMBD)
    vocab = bytearray(golden_embd.VOCAB)
    ids, tokens = vocab[12:32], vocab[32:]
    vocab[12:] = tokens + ids
    struct.pack_into("<I", vocab, 8, 280 + 12 + 45)
    data[280:357] = vocab
    f = embd.parse(refresh(data), len(data))
    assert f.problems == [] and f.tokens == TINY_TOKENS and f.special["sep"] == 3
    rel = patched("<I", 288, 12)
    f = embd.parse(rel, len(rel))
    assert [p.code for p in f.problems] == [embd.EMBD_SPECIAL]
    assert "looks relative" in f.problems[0].message


def test_tensor_data_size_and_checksums() -> None:
    """Decision: tensor_data_size runs from tensor_data_offset to the last tensor's last byte
    (padding between tensors included, none after); the footer follows at EOF - 16;
    data_checksum covers the tensor data section with its padding; file_checksum covers bytes
    0 to footer - 1 (the header with its checksum included)."""
    f = embd.parse(golden_embd.EMBD, len(golden_embd.EMBD))
    assert f.header.footer_offset == len(golden_embd.EMBD) - 16 == 448 + 67
    assert embd.checksums(golden_embd.EMBD, f) == (
        zlib.crc32(golden_embd.EMBD[448:515]),
        zlib.crc32(golden_embd.EMBD[:515]),
    )


def test_sections_are_8_aligned_and_tensors_64_aligned(tmp_path: Path) -> None:
    """Decision: the writer starts every section at a multiple of 8 (so u32/u64 fields can be
    read in place from a mapping), the tensor data and every tensor at a multiple of 64
    (absolute, TENSORS_ALIGNED), with zero padding; the reader accepts any zero gaps."""
    src = tiny_source(
        tmp_path,
        a=np.ones(3, np.float32),
        b=np.ones(5, np.int8),
        c=np.ones(1, np.uint16),
    )
    out = tmp_path / "o.weights"
    assert run_cli("convert", str(src), str(out), *META_ARGS, "--meta", "vocab_size=7").code == 0
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    h = f.header
    assert h.metadata_offset % 8 == 0 and h.tensor_index_offset % 8 == 0
    assert all(t.offset % 64 == 0 for t in f.tensors) and f.problems == []


def test_flags_the_reader_does_not_know_are_errors() -> None:
    """Decision: flag bits 4-31 are an error (EMBD_FLAGS): a reader cannot know what they
    change, and a file that loads but is misread is the failure this format must avoid.
    COMPRESSED (bit 3) is an error too: the spec defines no compression."""
    assert embd.EMBD_FLAGS in errors_of_data(patched("<I", 8, 0b10111))
    assert embd.EMBD_COMPRESSED in errors_of_data(patched("<I", 8, 0b1111))


def errors_of_data(data: bytes) -> set[str]:
    f = embd.parse(data, len(data))
    return {p.code for p in f.problems}


def test_without_checksum_enabled_nothing_is_checked(tmp_path: Path) -> None:
    """Decision: with CHECKSUM_ENABLED clear, neither the header CRC nor the footer CRCs are
    checked (one info finding says so)."""
    data = bytearray(patched("<I", 8, 0b0011))
    data[520] ^= 0xFF  # file_checksum
    data[56] ^= 0xFF  # header_checksum
    report = report_of(tmp_path, bytes(data))
    assert report.ok(strict=True) and codes_of(report) == {embd.EMBD_NO_CHECKSUM}


def test_vocabulary_flag_and_section_must_agree() -> None:
    """Decision: VOCAB_EMBEDDED clear means vocab_offset and vocab_size are both 0."""
    assert embd.EMBD_FLAGS in errors_of_data(patched("<I", 8, 0b0110))


def test_versions() -> None:
    """Decision: version_major must be 1 (nothing else is read); a newer minor is a warning."""
    data = patched("<H", 4, 2)
    with pytest.raises(FormatError) as err:
        embd.parse(data, len(data))
    assert err.value.code == embd.EMBD_VERSION
    f = embd.parse(patched("<H", 6, 3), len(golden_embd.EMBD))
    assert [p.code for p in f.problems] == [embd.EMBD_VERSION_NEWER]


def test_reserved_fields_are_warnings(tmp_path: Path) -> None:
    """Decision: non-zero reserved fields (header 60, footer 12) are warnings: not invalid, but
    `verify --strict` fails."""
    report = report_of(tmp_path, patched("<I", 60, 1))
    assert codes_of(report) == {embd.EMBD_RESERVED} and report.ok() and not report.ok(True)
    data = bytearray(golden_embd.EMBD)
    data[-1] = 1
    report = report_of(tmp_path, bytes(data))
    assert codes_of(report) == {embd.EMBD_RESERVED}


def test_metadata_values_are_text_and_checked(tmp_path: Path) -> None:
    """Decision: every metadata value is UTF-8 text; the integer keys must be decimal integers
    and created_at an ISO 8601 date-time (EMBD_META_VALUE); a missing required key is
    EMBD_META_MISSING; extra keys are kept."""
    src = tiny_source(tmp_path, dict(TINY_META, num_layers="six", extra="kept"))
    result = run_cli("convert", str(src), str(tmp_path / "x.weights"))
    assert result.code == 1 and "EMBD_META_VALUE" in result.stderr
    src = tiny_source(tmp_path, {k: v for k, v in TINY_META.items() if k != "hidden_size"})
    result = run_cli("convert", str(src), str(tmp_path / "x.weights"))
    assert result.code == 1 and "EMBD_META_MISSING" in result.stderr
    assert "hint: --meta hidden_size=VALUE" in result.stderr
    assert not (tmp_path / "x.weights").exists()
    bad = run_cli("convert", str(src), str(tmp_path / "x.weights"), "--meta", "hidden_size=big")
    assert bad.code == 2 and "EMBD_META_VALUE" in bad.stderr
    ok = run_cli(
        "convert", str(src), str(tmp_path / "x.weights"), "--meta", "hidden_size=2", "--meta", "x=y"
    )
    assert ok.code == 0, ok.stderr
    out = tmp_path / "x.weights"
    meta = embd.parse(out.read_bytes(), out.stat().st_size).meta
    assert meta["x"] == "y" and meta["hidden_size"] == "2"


def test_created_at_from_source_date_epoch(tmp_path: Path) -> None:
    """Decision: created_at comes from --meta created_at=..., else SOURCE_DATE_EPOCH (as
    YYYY-MM-DDTHH:MM:SSZ, UTC), else the source's own, else 1970-01-01T00:00:00Z; never the
    clock, so the same input gives the same bytes."""
    meta = {k: v for k, v in TINY_META.items() if k != "created_at"}
    src = tiny_source(tmp_path, meta)
    outs = []
    for i, env in enumerate([{}, {}, {"SOURCE_DATE_EPOCH": "1700000000"}]):
        out = tmp_path / f"{i}.weights"
        result = run_cli("convert", str(src), str(out), env=env)
        assert result.code == 0, result.stderr
        outs.append(embd.parse(out.read_bytes(), out.stat().st_size).meta["created_at"])
        outs.append(out.read_bytes())
    assert outs[0] == "1970-01-01T00:00:00Z" and outs[1] == outs[3]
    assert outs[4] == "2023-11-14T22:13:20Z"
    bad = run_cli("convert", str(src), str(tmp_path / "z.weights"), env={"SOURCE_DATE_EPOCH": "x"})
    assert bad.code == 2


def test_vocab_size_and_token_count(tmp_path: Path) -> None:
    """Decision: metadata vocab_size is the model's (the word embedding rows); the vocabulary
    may have fewer tokens (padded embedding tables) but not more (EMBD_MODEL)."""
    f = embd.parse(patched("<I", 280, 7), len(golden_embd.EMBD))
    assert f.problems == []
    meta = dict(TINY_META, vocab_size="6", **{embd.TOKENS_KEY: json.dumps(TINY_TOKENS)})
    result = run_cli("convert", str(tiny_source(tmp_path, meta)), str(tmp_path / "v.weights"))
    assert result.code == 1 and "EMBD_MODEL" in result.stderr
    meta["vocab_size"] = "9"
    result = run_cli("convert", str(tiny_source(tmp_path, meta)), str(tmp_path / "v.weights"))
    assert result.code == 0, result.stderr


def test_names_hash_collisions_and_duplicates(tmp_path: Path) -> None:
    """Decision: two different names with the same FNV-1a hash are valid (resolved by comparing
    names, spec assumption 5); the same name twice is EMBD_DUPLICATE_NAME; a hash that is not
    the name's is EMBD_NAME_HASH."""
    pair = ("ojeG8SO9", "MWUnIR53")  # found by a random search: both hash to 0xa3a9fdf5
    h = 0x811C9DC5  # the same hash, written out from the spec's definition
    for b in pair[1].encode():
        h = ((h ^ b) * 16777619) % 2**32
    assert embd.fnv1a_32(pair[0].encode()) == h == 0xA3A9FDF5
    src = tiny_source(
        tmp_path, {}, **{pair[0]: np.ones(2, np.float32), pair[1]: np.zeros(2, np.float32)}
    )
    out = tmp_path / "c.weights"
    assert run_cli("convert", str(src), str(out), *META_ARGS).code == 0
    report = examine(str(out), scan=True)[0]
    assert report.ok(strict=True), report.findings
    with open_source(str(out)) as s:
        got = {i.name: s.array(i).tolist() for i in s.tensors()}
    assert got == {pair[0]: [1.0, 1.0], pair[1]: [0.0, 0.0]}
    data = bytearray(golden_embd.EMBD)
    data[430] = ord("a")  # "foobar" -> "foobaa": its hash no longer matches
    assert errors_of_data(refresh(data)) == {embd.EMBD_NAME_HASH}
    dup = bytearray(golden_embd.EMBD)
    struct.pack_into("<IBBH", dup, 392, 0xE40C292C, 5, 2, 1)  # second name: 1 byte, "f"
    dup[425] = ord("a")
    assert embd.EMBD_DUPLICATE_NAME in errors_of_data(refresh(dup))


def test_special_token_absent_is_all_ones(tmp_path: Path) -> None:
    """Decision: a special token the vocabulary lacks is stored as 0xFFFFFFFF ("none"), with a
    note; any other id must be a token id."""
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "x", "y", "z"]
    meta = dict(TINY_META, **{embd.TOKENS_KEY: json.dumps(tokens)})
    out = tmp_path / "s.weights"
    result = run_cli("convert", str(tiny_source(tmp_path, meta)), str(out))
    assert result.code == 0 and "mask" in result.stderr
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    assert f.special == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 0xFFFFFFFF}
    assert f.problems == []
    assert errors_of_data(patched("<I", 300, 7)) == {embd.EMBD_SPECIAL}


def test_tensors_outside_the_dtypes_are_left_out_with_a_note(tmp_path: Path) -> None:
    """Decision: a tensor of a dtype EMBD lacks (the int64 embeddings.position_ids buffer) is
    left out with a warning naming it, never cast silently; --dtype NAME=i32 keeps it; --exclude
    drops others (the pooler) on request."""
    src = tiny_source(
        tmp_path,
        {},
        w=np.ones(2, np.float32),
        **{"embeddings.position_ids": np.arange(4, dtype=np.int64)[None]},
        **{"pooler.dense.bias": np.zeros(2, np.float32)},
    )
    out = tmp_path / "p.weights"
    result = run_cli("convert", str(src), str(out), *META_ARGS, "--json")
    assert result.code == 0
    assert "left out 'embeddings.position_ids'" in result.stderr
    assert result.json()["left_out"] == ["embeddings.position_ids"]
    names = [t.name for t in embd.parse(out.read_bytes(), out.stat().st_size).tensors]
    assert names == ["pooler.dense.bias", "w"]
    kept = run_cli(
        "convert",
        str(src),
        str(out),
        *META_ARGS,
        "--dtype",
        "*position_ids=i32",
        "--exclude",
        "pooler.*",
    )
    assert kept.code == 0, kept.stderr
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    assert {t.name: t.dtype for t in f.tensors} == {"embeddings.position_ids": "i32", "w": "f32"}


def test_refusals_rank_and_layout(tmp_path: Path) -> None:
    """Decision: EMBD holds ranks 1-4 (ndim 1-4): a scalar or a rank-5 tensor is refused, not
    reshaped."""
    src = tiny_source(tmp_path, {}, s=np.array(1.0, np.float32))
    result = run_cli("convert", str(src), str(tmp_path / "r.weights"), *META_ARGS)
    assert result.code == 1 and "CONVERT_REFUSED" in result.stderr and "rank 0" in result.stderr
    src = tiny_source(tmp_path, {}, s=np.ones((1, 1, 1, 1, 1), np.float32))
    assert run_cli("convert", str(src), str(tmp_path / "r.weights"), *META_ARGS).code == 1


def test_gguf_keys_and_shapes_fill_the_metadata(tmp_path: Path) -> None:
    """Decision: required metadata comes from --meta, else the source's metadata, else GGUF
    architecture keys (general.name, {arch}.block_count, ...), else a BERT encoder's tensor
    shapes; model_version defaults to 0.0.0; a note lists what was filled in."""
    gguf = {
        "general.architecture": "bert",
        "general.name": "bert-bge",
        "bert.block_count": "1",
        "bert.embedding_length": "4",
        "bert.feed_forward_length": "8",
        "bert.attention.head_count": "2",
        "bert.context_length": "8",
    }
    h, inter = 4, 8
    arrays = {
        "embeddings.word_embeddings.weight": np.ones((7, h), np.float32),
        "embeddings.position_embeddings.weight": np.ones((8, h), np.float32),
        "embeddings.token_type_embeddings.weight": np.ones((2, h), np.float32),
        "embeddings.LayerNorm.weight": np.ones(h, np.float32),
        "embeddings.LayerNorm.bias": np.ones(h, np.float32),
    }
    for part, shape in bert_layer(h, inter).items():
        arrays[f"encoder.layer.0.{part}"] = np.ones(shape, np.float32)
    out = tmp_path / "g.weights"
    result = run_cli("convert", str(tiny_source(tmp_path, gguf, **arrays)), str(out))
    assert result.code == 0, result.stderr
    meta = embd.parse(out.read_bytes(), out.stat().st_size).meta
    assert meta["model_name"] == "bert-bge" and meta["num_attention_heads"] == "2"
    assert meta["vocab_size"] == "7" and meta["model_version"] == "0.0.0"
    assert "metadata taken from" in result.stderr
    assert examine(str(out), scan=True)[0].ok(strict=True)
    no_heads = run_cli("convert", str(tiny_source(tmp_path, {}, **arrays)), str(out))
    assert no_heads.code == 1 and "no model_name, num_attention_heads" in no_heads.stderr


def bert_layer(h: int, inter: int) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    for p in ("query", "key", "value"):
        out[f"attention.self.{p}.weight"] = (h, h)
        out[f"attention.self.{p}.bias"] = (h,)
    out.update(
        {
            "attention.output.dense.weight": (h, h),
            "attention.output.dense.bias": (h,),
            "attention.output.LayerNorm.weight": (h,),
            "attention.output.LayerNorm.bias": (h,),
            "intermediate.dense.weight": (inter, h),
            "intermediate.dense.bias": (inter,),
            "output.dense.weight": (h, inter),
            "output.dense.bias": (h,),
            "output.LayerNorm.weight": (h,),
            "output.LayerNorm.bias": (h,),
        }
    )
    return out


def test_bert_shapes_are_checked_against_the_metadata(tmp_path: Path) -> None:
    """Decision: when the file holds a BERT encoder (embeddings.word_embeddings.weight), the
    spec's tensor list and shapes are checked against the metadata: a transposed FFN matrix, a
    missing tensor or a layer past num_layers is EMBD_MODEL (error); the writer refuses to write
    it. Other tensor sets are not judged."""
    h, inter = 4, 8
    arrays = {
        "embeddings.word_embeddings.weight": np.ones((7, h), np.float32),
        "embeddings.position_embeddings.weight": np.ones((8, h), np.float32),
        "embeddings.token_type_embeddings.weight": np.ones((2, h), np.float32),
        "embeddings.LayerNorm.weight": np.ones(h, np.float32),
        "embeddings.LayerNorm.bias": np.ones(h, np.float32),
    }
    for part, shape in bert_layer(h, inter).items():
        arrays[f"encoder.layer.0.{part}"] = np.ones(shape, np.float32)
    arrays["encoder.layer.0.intermediate.dense.weight"] = np.ones((h, inter), np.float32)
    meta = dict(
        TINY_META,
        hidden_size="4",
        embedding_dim="4",
        intermediate_size="8",
        num_attention_heads="2",
    )
    result = run_cli(
        "convert", str(tiny_source(tmp_path, meta, **arrays)), str(tmp_path / "b.weights")
    )
    assert result.code == 1 and "EMBD_MODEL" in result.stderr
    assert "intermediate.dense.weight" in result.stderr
    shapes = {k: v.shape for k, v in arrays.items()}
    shapes["encoder.layer.0.intermediate.dense.weight"] = (inter, h)
    assert embd.model_problems(meta, 7, shapes) == []
    shapes["encoder.layer.1.output.dense.bias"] = (h,)
    assert [w for w, _ in embd.model_problems(meta, 7, shapes)] == ["num_layers"]
    del shapes["embeddings.LayerNorm.bias"]
    assert "embeddings.LayerNorm.bias" in [w for w, _ in embd.model_problems(meta, 7, shapes)]


def test_no_vocabulary_in_the_input(tmp_path: Path) -> None:
    """Decision: without a vocabulary in the input, the file is written without one
    (VOCAB_EMBEDDED clear, vocab_offset = vocab_size = 0) and a warning says so."""
    out = tmp_path / "n.weights"
    result = run_cli("convert", str(tiny_source(tmp_path)), str(out))
    assert result.code == 0 and "no vocabulary" in result.stderr
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    assert f.header.flags == 0b0110 and f.header.vocab_offset == f.header.vocab_size == 0
    assert f.tokens is None and examine(str(out), scan=True)[0].ok(strict=True)


# Hostile files ------------------------------------------------------------------------------


def test_truncation_at_every_length(tmp_path: Path) -> None:
    path = tmp_path / "t.weights"
    for n in range(len(golden_embd.EMBD)):
        path.write_bytes(golden_embd.EMBD[:n])
        report = examine(str(path), scan=True)[0]
        assert not report.ok(), n
        assert report.format == ("embd" if n >= 4 else None), n


def test_every_bit_flip_is_reported(tmp_path: Path) -> None:
    """Every single-bit flip gives a finding; all but those in the two reserved fields give an
    error (the CRCs cover every other byte)."""
    path = tmp_path / "b.weights"
    reserved = set(range(60, 64)) | set(range(527, 531))
    for i in range(len(golden_embd.EMBD)):
        data = bytearray(golden_embd.EMBD)
        data[i] ^= 1 << (i % 8)
        path.write_bytes(bytes(data))
        report = examine(str(path), scan=True)[0]
        if i < 4:
            assert report.format is None
            continue
        assert report.findings, i
        if i not in reserved:
            assert not report.ok(), i


@pytest.mark.parametrize(
    ("fmt", "offset", "value", "code"),
    [
        ("<I", 20, 10**6, embd.EMBD_SECTION),  # vocab_offset past EOF
        ("<I", 28, 10**6, embd.EMBD_SECTION),  # tensor_index_offset past EOF
        ("<I", 36, 10**6, embd.EMBD_SECTION),  # tensor_data_offset past EOF
        ("<I", 12, 8, embd.EMBD_SECTION),  # metadata inside the header
        ("<I", 12, 280, embd.EMBD_SECTION),  # metadata over the vocabulary
        ("<I", 32, 0xFFFFFFFF, embd.EMBD_INDEX),  # tensor_index_count huge
        ("<I", 32, 3, embd.EMBD_SECTION),  # one descriptor too many: runs into the data
        ("<Q", 48, 10**9, embd.EMBD_FILE_SIZE),
        ("<Q", 40, 66, embd.EMBD_FOOTER),  # tensor_data_size disagrees with the footer
        ("<I", 280, 0xFFFFFFFF, embd.EMBD_VOCAB),  # token_count larger than the file
        ("<I", 280, 30, embd.EMBD_VOCAB),  # token_count larger than the token data
        ("<I", 284, 44, embd.EMBD_VOCAB),  # total_size disagrees with vocab_size
        ("<I", 64, 0xFFFFFFFF, embd.EMBD_META),  # entry_count huge
        ("<I", 68, 204, embd.EMBD_META),
        ("<I", 72, 0xFFFF, embd.EMBD_META),  # key length past the section
        ("<B", 396, 9, embd.EMBD_INDEX),  # dtype outside the enum
        ("<B", 397, 5, embd.EMBD_INDEX),  # ndim 5
        ("<I", 408, 1, embd.EMBD_INDEX),  # shape[2] non-zero with ndim 2
        ("<Q", 416, 10**6, embd.EMBD_BOUNDS),  # data_offset past the data
        ("<Q", 416, 4, embd.EMBD_OVERLAP),  # foobar over a
        ("<Q", 416, 60, embd.EMBD_ALIGN),  # not 64-aligned
        ("<I", 404, 10**6, embd.EMBD_BOUNDS),  # a huge shape
        ("<H", 398, 60000, embd.EMBD_SECTION),  # name length past the body
    ],
)
def test_hostile_fields(tmp_path: Path, fmt: str, offset: int, value: int, code: str) -> None:
    report = report_of(tmp_path, patched(fmt, offset, value))
    assert code in errors_of(report), report.findings
    result = run_cli("convert", str(tmp_path / "f.weights"), str(tmp_path / "o.safetensors"))
    assert result.code == 1 and not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize(
    ("offset", "code"),
    [(56, embd.EMBD_HEADER_CRC), (515, embd.EMBD_DATA_CRC), (519, embd.EMBD_FILE_CRC)],
)
def test_wrong_checksums(tmp_path: Path, offset: int, code: str) -> None:
    data = bytearray(golden_embd.EMBD)
    data[offset] ^= 0x40
    report = report_of(tmp_path, bytes(data))
    # The header (its checksum included) is covered by file_checksum too.
    assert errors_of(report) == ({code, embd.EMBD_FILE_CRC} if offset == 56 else {code})
    result = run_cli("convert", str(tmp_path / "f.weights"), str(tmp_path / "o.npz"))
    assert result.code == 1 and code in result.stderr
    assert not (tmp_path / "o.npz").exists()


def test_damaged_data_is_caught_by_convert(tmp_path: Path) -> None:
    """Decision: convert from .weights checks the data and file CRC-32s first (one pass), so a
    damaged file is refused with the code verify reports even when its structure is fine."""
    data = bytearray(golden_embd.EMBD)
    data[450] ^= 1
    path = tmp_path / "d.weights"
    path.write_bytes(bytes(data))
    result = run_cli("convert", str(path), str(tmp_path / "o.safetensors"))
    assert result.code == 1 and "EMBD_DATA_CRC" in result.stderr
    assert "EMBD_DATA_CRC" in run_cli("verify", str(path)).stderr


def test_padding_must_be_zero(tmp_path: Path) -> None:
    data = bytearray(golden_embd.EMBD)
    data[500] = 7  # between "a" and "foobar"
    report = report_of(tmp_path, refresh(data))
    assert errors_of(report) == {embd.EMBD_PADDING}
    data = bytearray(golden_embd.EMBD)
    data[278] = 1  # between metadata and vocabulary
    assert errors_of(report_of(tmp_path, refresh(data))) == {embd.EMBD_PADDING}


def test_non_utf8_strings(tmp_path: Path) -> None:
    for at in (76, 318, 424):  # a key, a token, a name
        data = bytearray(golden_embd.EMBD)
        data[at] = 0xFF
        assert embd.EMBD_UTF8 in errors_of(report_of(tmp_path, refresh(data))), at


def test_duplicate_token_warning(tmp_path: Path) -> None:
    """Decision: a token string that appears twice is a warning (EMBD_VOCAB_DUPLICATE): the
    file is readable, but a tokenizer can never produce one of the two ids."""
    meta = dict(TINY_META, **{embd.TOKENS_KEY: json.dumps([*TINY_TOKENS[:6], "hi"])})
    out = tmp_path / "d.weights"
    assert run_cli("convert", str(tiny_source(tmp_path, meta)), str(out)).code == 0
    report = examine(str(out), scan=True)[0]
    assert codes_of(report) == {embd.EMBD_VOCAB_DUPLICATE} and report.ok()
    assert not report.ok(strict=True)


# Round trips and the CLI --------------------------------------------------------------------

EMBD_DTYPES = ["f32", "f16", "bf16", "i32", "i16", "i8", "u32", "u16", "u8"]


@settings(max_examples=30, deadline=None)
@given(
    tensors=strategies.dictionaries(
        strategies.text("abcxyz._/0123é", min_size=1, max_size=8),
        strategies.tuples(
            strategies.sampled_from(EMBD_DTYPES),
            strategies.lists(strategies.integers(0, 4), min_size=1, max_size=4),
            strategies.binary(max_size=48),
        ),
        min_size=1,
        max_size=5,
    ),
    tokens=strategies.none() | strategies.lists(strategies.text(max_size=6), max_size=6),
    via=strategies.sampled_from([".safetensors", ".zt"]),
)
def test_round_trip_is_byte_identical(tensors, tokens, via) -> None:
    """.weights -> safetensors or zTensor -> .weights gives the same bytes: tensors, metadata
    and vocabulary all survive (the vocabulary as file metadata under GGUF's keys)."""
    import tempfile

    arrays = {}
    for name, (dtype, shape, seed) in tensors.items():
        d = DTYPES[dtype]
        n = int(np.prod(shape)) * d.itemsize
        raw = (seed * (n // max(len(seed), 1) + 1))[:n] if seed else bytes(n)
        if dtype == "bf16":
            arr = np.frombuffer(raw, "<u2").view(ml_dtypes.bfloat16)
        else:
            arr = np.frombuffer(raw, d.storage)
        arrays[name] = arr.reshape(shape)
    meta = dict(TINY_META, vocab_size="64")
    if tokens is not None:
        meta[embd.TOKENS_KEY] = json.dumps(tokens)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        src = t / "in.safetensors"
        save_file(arrays, str(src), metadata=meta)
        first, mid, second = t / "a.weights", t / f"m{via}", t / "b.weights"
        for a, b in ((src, first), (first, mid), (mid, second)):
            result = run_cli("convert", str(a), str(b))
            assert result.code == 0, result.stderr
        assert examine(str(first), scan=True)[0].ok()
        if via == ".safetensors" or all(a.size for a in arrays.values()):
            assert first.read_bytes() == second.read_bytes()
        # (zTensor may list empty tensors that share an offset in another order.)
        with open_source(str(second)) as s:
            for info in s.tensors():
                assert s.array(info).tobytes() == arrays[info.name].tobytes()
            if tokens is not None:
                assert s.tokens == tokens


def test_cli_exit_codes(tmp_path: Path) -> None:
    good = GOLDEN / "embd_v1_tiny.weights"
    assert run_cli("verify", str(good)).code == 0
    verify = run_cli("verify", "--json", str(good))
    assert verify.code == 0 and verify.json()["files"][0]["format"] == "embd"
    bad = tmp_path / "bad.weights"
    bad.write_bytes(golden_embd.EMBD[:300])
    result = run_cli("verify", "--json", str(bad))
    assert result.code == 1 and result.json()["ok"] is False
    assert run_cli("inspect", str(bad)).code == 1
    assert run_cli("verify", str(tmp_path / "missing.weights")).code == 2
    out = tmp_path / "o.safetensors"
    assert run_cli("convert", str(good), str(out)).code == 0
    assert load_file(str(out))["foobar"].tolist() == [[1, -2, 3]]
    piped = run_cli("convert", "-", "-", "--to", "npz", stdin=good.read_bytes())
    assert piped.code == 0 and piped.stdout.startswith(b"PK")
    sub = run_sub("convert", str(bad), str(tmp_path / "x.npz"))
    assert sub.code == 1 and "Traceback" not in sub.stderr
    assert sub.stderr.startswith("matrixctl: error[EMBD_")


def test_empty_vocabulary(tmp_path: Path) -> None:
    meta = dict(TINY_META, **{embd.TOKENS_KEY: "[]"})
    out = tmp_path / "e.weights"
    assert run_cli("convert", str(tiny_source(tmp_path, meta)), str(out)).code == 0
    f = embd.parse(out.read_bytes(), out.stat().st_size)
    assert f.tokens == [] and f.special == dict.fromkeys(embd.SPECIALS, embd.NO_TOKEN)
    assert examine(str(out), scan=True)[0].ok(strict=True)


def test_descriptor_order_and_section_order() -> None:
    """Decision: the writer lists descriptors in data order (the source's order) and puts the
    sections in the spec's order; readers look names up by hash then compare names, so no
    order is required of the index; a reader accepts the metadata, vocabulary and index
    sections in any order as long as they do not overlap and the gaps are zero."""
    f = embd.parse(golden_embd.EMBD, len(golden_embd.EMBD))
    assert [t.offset for t in f.tensors] == sorted(t.offset for t in f.tensors)
    # Move the vocabulary before the metadata: vocab at 64, metadata at 144 (64 + 77 -> 8).
    body = bytearray(golden_embd.EMBD[:448])
    body[64:360] = bytes(296)
    vocab = bytearray(golden_embd.VOCAB)
    struct.pack_into("<I", vocab, 8, 64 + 12)
    body[64:141] = vocab
    body[144:357] = golden_embd.METADATA
    data = bytearray(body + golden_embd.EMBD[448:])
    struct.pack_into("<I", data, 12, 144)
    struct.pack_into("<I", data, 20, 64)
    data = bytearray(refresh(data))
    moved = embd.parse(bytes(data), len(data))
    assert moved.problems == [] and moved.tokens == TINY_TOKENS
    assert moved.meta == TINY_META


def test_convert_option_usage_errors(tmp_path: Path) -> None:
    """--meta needs KEY=VALUE; --exclude that leaves nothing is CONVERT_EMPTY; both exit 2
    before anything is written."""
    src = tiny_source(tmp_path)
    out = tmp_path / "u.weights"
    bad = run_cli("convert", str(src), str(out), "--meta", "model_name")
    assert bad.code == 2 and "KEY=VALUE" in bad.stderr
    none = run_cli("convert", str(src), str(out), "--exclude", "*")
    assert none.code == 2 and "CONVERT_EMPTY" in none.stderr
    assert not out.exists()
    meta_zt = tmp_path / "m.zt"
    assert run_cli("convert", str(src), str(meta_zt), "--meta", "origin=test").code == 0
    with open_source(str(meta_zt)) as s:
        assert s.metadata()["origin"] == "test"
