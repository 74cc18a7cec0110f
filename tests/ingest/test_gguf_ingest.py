"""`ingest gguf`: the symbol map (golden, every real fixture), the space-marking extension of
the π tokenizer (whole words, exact round trips, streaming, backward compatibility), the
embeddings apart (every container, dequantized, cast or raw blocks), the manifest and `verify`
of the folder, atomic output and every exit code."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl.tokenizers import pi
from tests.helpers import ggufcraft
from tests.helpers.cli import FIXTURES, run_cli

GGUF_DIR = FIXTURES / "gguf"
VOCABS = {p.stem.removeprefix("ggml-vocab-"): p for p in sorted(GGUF_DIR.glob("*.gguf"))}


@pytest.fixture(scope="module")
def maps(tmp_path_factory) -> dict[str, Path]:
    """Every real fixture ingested once."""
    out = {}
    base = tmp_path_factory.mktemp("maps")
    for name, path in VOCABS.items():
        dest = base / name
        run = run_cli("ingest", "gguf", str(path), "-o", str(dest))
        assert run.code == 0, run.stderr
        out[name] = dest
    return out


_TOKENIZERS: dict[str, pi.Tokenizer] = {}


def tokenizer(maps: dict[str, Path], name: str) -> pi.Tokenizer:
    if name not in _TOKENIZERS:
        smap, _ = pi.load_symbol_map(str(maps[name] / "pi_symbol_map.json"))
        _TOKENIZERS[name] = pi.Tokenizer(smap)
    return _TOKENIZERS[name]


# The golden map -------------------------------------------------------------------------------


def tiny_vocab_gguf(**kw) -> bytes:
    tokens = [b"<unk>", b"<s>", b"</s>", *[f"<0x{b:02X}>".encode() for b in range(256)]]
    tokens += ["▁the".encode(), "▁quick".encode(), b"s", "▁".encode()]
    types = [2, 3, 3, *[6] * 256, 1, 1, 1, 1]
    kvs = [
        ggufcraft.kv_str("general.architecture", "llama"),
        ggufcraft.kv_str("tokenizer.ggml.model", "llama"),
        ggufcraft.kv(
            "tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(kw.get("tokens", tokens))
        ),
        ggufcraft.kv(
            "tokenizer.ggml.token_type",
            ggufcraft.ARR,
            ggufcraft.arr_num(ggufcraft.I32, "i", kw.get("types", types)),
        ),
        ggufcraft.kv_u32("tokenizer.ggml.bos_token_id", 1),
        ggufcraft.kv_u32("tokenizer.ggml.eos_token_id", 2),
        ggufcraft.kv_u32("tokenizer.ggml.unknown_token_id", 0),
    ]
    return ggufcraft.gguf(kvs, pad=False)


# Typed by hand from docs/formats/gguf.md ("The symbol map") and pi-symbol-map.md.
GOLDEN_MAP = """{
  "version": 1,
  "vocab_size": 263,
  "unk_id": 0,
  "pad_id": 0,
  "eos_id": 2,
  "byte_fallback": true,
  "byte_base_id": 3,
  "normalization": "none",
  "space_marking": {"scheme": "sentencepiece", "marker": "\u2581", "prefix_space": true},
  "symbols": [
    {"id": 0, "text": "<unk>", "special": true},
    {"id": 1, "text": "<s>", "special": true},
    {"id": 2, "text": "</s>", "special": true},
    {"id": 259, "text": "\u2581the"},
    {"id": 260, "text": "\u2581quick"},
    {"id": 261, "text": "s"},
    {"id": 262, "text": "\u2581"}
  ]
}
"""


def test_golden_symbol_map(tmp_path: Path) -> None:
    """Decision: symbol i is GGUF token i; the full <0x00>..<0xFF> run is the byte fallback
    (its ids are not symbols); control and unknown tokens are special symbols; unk, pad and eos
    come from the GGUF (pad defaults to unk); normalization none; SentencePiece marking with a
    prefix space unless tokenizer.ggml.add_space_prefix is false."""
    model = tmp_path / "v.gguf"
    model.write_bytes(tiny_vocab_gguf())
    out = tmp_path / "out"
    run = run_cli("ingest", "gguf", str(model), "-o", str(out), "--json")
    assert run.code == 0, run.stderr
    assert (out / "pi_symbol_map.json").read_text("utf-8") == GOLDEN_MAP
    assert sorted(os.listdir(out)) == [
        "gguf_manifest.json",
        "gguf_tokenizer.json",
        "pi_symbol_map.json",
    ]
    assert "no token_embd.weight" in run.stderr
    smap, _ = pi.load_symbol_map(str(out / "pi_symbol_map.json"))
    tok = pi.Tokenizer(smap)
    assert tok.encode("the quicks").tolist() == [259, 260, 261]
    # x has no symbol: the prefix space is the "▁" symbol, x its byte; a literal ▁ is bytes.
    assert tok.encode("x").tolist() == [262, 3 + 0x78]
    assert tok.encode("▁").tolist() == [262, 3 + 0xE2, 3 + 0x96, 3 + 0x81]
    assert tok.decode(tok.encode("▁ x▁")) == "▁ x▁"
    assert tok.encode("<s>").tolist()[:2] == [262, 3 + ord("<")]  # specials are never matched
    assert tok.decode([1, 259]) == "<s> the"  # a special decodes to its text
    assert tok.decode([0, 2, 259]) == "\ufffdthe"  # eos ends a document: the next one's prefix goes
    assert tok.encode("").tolist() == []


def test_gguf_tokenizer_sidecar_keeps_the_rest(tmp_path: Path) -> None:
    """Decision: scores, token types, merges, flags and every other tokenizer.* key go to
    gguf_tokenizer.json, float32 values as the doubles they equal exactly."""
    model = tmp_path / "m.gguf"
    ggufcraft.write_model(model, extra=False)
    out = tmp_path / "out"
    assert run_cli("ingest", "gguf", str(model), "-o", str(out)).code == 0
    side = json.loads((out / "gguf_tokenizer.json").read_text("utf-8"))
    meta = side["metadata"]
    assert side["tokens"] == 266 and side["model"] == "llama"
    assert meta["tokenizer.ggml.scores"][:3] == [0.0, -1.0, -2.0]
    assert len(meta["tokenizer.ggml.token_type"]) == 266
    assert meta["tokenizer.ggml.add_space_prefix"] is True
    assert side["special_ids"] == {"bos": 1, "eos": 2, "unk": 0}
    assert side["special_symbols"] == {"control": 3}
    assert "tokenizer.ggml.tokens" not in meta


# Whole words on every real fixture ------------------------------------------------------------

SENTENCE = "The quick brown dog is in the house."


@pytest.mark.parametrize("name", list(VOCABS))
def test_english_gives_whole_word_tokens(maps, name: str) -> None:
    tok = tokenizer(maps, name)
    ids = tok.encode(SENTENCE)
    pieces = [tok.decode_bytes([i]).decode("utf-8").strip() for i in ids]
    words = SENTENCE.replace(".", " .").split()
    if name == "bert-bge":  # uncased WordPiece: lower-cased
        words = [w.lower() for w in words]
    assert pieces == words, pieces
    smap = tok.map
    if smap.byte_fallback:
        base = smap.byte_base_id
        assert all(not base <= i < base + 256 for i in ids.tolist())
    if name != "bert-bge":  # WordPiece drops white space: not invertible
        assert tok.decode(ids) == SENTENCE


def test_marking_recorded_for_each_fixture(maps) -> None:
    """Decision: the scheme comes from tokenizer.ggml.model (llama: SentencePiece, gpt2:
    byte-level, bert: WordPiece with llama.cpp's ▁ word-start marker, lower-cased and
    accent-stripped when the vocabulary has no cased letter)."""
    got = {}
    for name, path in maps.items():
        m = json.loads((path / "gguf_manifest.json").read_text("utf-8"))["tokenizer"]
        got[name] = (m["space_marking"], m["byte_fallback"], m["token_dtype"], m["eos_id"])
    assert got == {
        "bert-bge": (
            {"scheme": "wordpiece", "marker": "▁", "lowercase": True, "strip_accents": True},
            False,
            "uint16",
            None,
        ),
        "gpt-2": ({"scheme": "byte_level"}, False, "uint16", 50256),
        "llama-spm": (
            {"scheme": "sentencepiece", "marker": "▁", "prefix_space": True},
            True,
            "uint16",
            2,
        ),
        "qwen2": ({"scheme": "byte_level"}, False, "uint32", 151643),
    }


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2"])
@settings(max_examples=60, deadline=None)
@given(text=strategies.text(strategies.characters(blacklist_categories=["Cs"]), max_size=40))
def test_decode_inverts_encode(maps, name: str, text: str) -> None:
    """With byte fallback (SentencePiece) or the byte alphabet (byte-level), decoding gives the
    text back exactly, literal ▁ and Ġ included."""
    tok = tokenizer(maps, name)
    for sample in (text, "▁" + text + " Ġ"):
        assert tok.decode(tok.encode(sample)) == sample


@settings(max_examples=40, deadline=None)
@given(
    text=strategies.text(strategies.sampled_from("ab ▁é\n日x"), max_size=60),
    cuts=strategies.lists(strategies.integers(0, 60), max_size=4),
)
def test_streaming_with_a_prefix_space_equals_whole(maps, text: str, cuts: list[int]) -> None:
    """Decision: the prefix space is added once per document, whatever the pieces."""
    tok = tokenizer(maps, "llama-spm")
    enc = tok.stream()
    parts, last = [], 0
    for c in sorted(cuts):
        parts.append(enc.feed(text[last:c]))
        last = max(last, c)
    parts.append(enc.feed(text[last:]))
    parts.append(enc.finish())
    assert np.concatenate(parts).tolist() == tok.encode(text).tolist()


def test_decoding_drops_each_documents_prefix(maps) -> None:
    """Decision: the prefix space is per document; decoding drops it at the start of the
    stream and after each eos_id."""
    tok = tokenizer(maps, "llama-spm")
    eos = tok.map.eos_id
    ids = [*tok.encode("Hello"), eos, *tok.encode(" two"), eos, eos, *tok.encode("x")]
    assert tok.decode(np.array(ids)) == "Hello twox"
    dec = pi.StreamDecoder(tok)
    text = "".join(dec.feed(np.array([i])) for i in ids) + dec.finish()
    assert text == "Hello twox"


def test_wordpiece_lowercases_strips_accents_and_splits_punctuation(maps) -> None:
    """Decision: WordPiece lower-cases one character at a time (no Final_Sigma context, as
    llama.cpp), strips accents after NFD, isolates punctuation and CJK characters."""
    tok = tokenizer(maps, "bert-bge")
    ids = tok.encode("The Café, déjà-vu! 東京 tokenization")
    pieces = [tok.decode_bytes([i]).decode("utf-8") for i in ids]
    assert pieces == [
        " the",
        " cafe",
        " ,",
        " de",
        "ja",
        " -",
        " vu",
        " !",
        " 東",
        " 京",
        " token",
        "ization",
    ]
    assert tok.decode(ids) == "the cafe , deja - vu ! 東 京 tokenization"
    assert 100 not in ids.tolist()  # no [UNK]


def test_vocabulary_above_65536_gives_uint32_tokens(maps, tmp_path: Path) -> None:
    symbols = str(maps["qwen2"] / "pi_symbol_map.json")
    text = "你好世界, 日本語のテキスト".encode()
    enc = run_cli(
        "tokenize", "pi", "encode", "-s", symbols, "-o", str(tmp_path / "t.mxt"), stdin=text
    )
    assert enc.code == 0, enc.stderr
    stream = (tmp_path / "t.mxt").read_bytes()
    assert stream[8:10] == b"\x01\x00" and stream[10] == 2  # version 1, dtype_id 2 = uint32
    assert struct.unpack("<I", stream[12:16])[0] == 151_936
    ids = tokenizer(maps, "qwen2").encode(text.decode()).tolist()
    assert max(ids) > 65_535
    dec = run_cli("tokenize", "pi", "decode", "-s", symbols, str(tmp_path / "t.mxt"))
    assert dec.code == 0 and dec.stdout == text
    info = run_cli("inspect", "--json", symbols).json()["files"][0]["map"]
    assert info["dtype"] == "uint32" and info["unused_ids"] == 0
    assert info["space_marking"] == "byte_level" and info["special_symbols"] == 3
    packed = run_cli(
        "pack", "atoms", str(tmp_path / "t.mxt"), "-o", str(tmp_path / "a.bin"), "-n", "4", "--json"
    )
    assert packed.code == 0 and packed.json()["dtype"] == "uint32"


def test_a_gguf_map_drives_ingest_docs(maps, tmp_path: Path) -> None:
    corpus = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
    pack = tmp_path / "pack"
    symbols = str(maps["llama-spm"] / "pi_symbol_map.json")
    run = run_cli("ingest", "docs", str(corpus), "-o", str(pack), "-s", symbols, "--json")
    assert run.code == 0, run.stderr
    assert run.json()["vocab_size"] == 32_000
    assert run_cli("verify", str(pack)).code == 0


# Special symbols ------------------------------------------------------------------------------


def test_tokens_that_cannot_be_matched_become_special(tmp_path: Path) -> None:
    """Decision: a token that is not UTF-8 (kept as hex in the sidecar), empty, or matching the
    same bytes as a lower id under the marking is listed as a special symbol (its id and text
    kept, never matched); without token types, the GGUF's special ids are the control tokens;
    an incomplete <0xNN> run is no byte fallback."""
    tokens = [b"<s>", b"</s>", "▁a".encode(), b" a", b"", b"\xff\xfe", b"b", b"<0x00>"]
    kvs = [
        ggufcraft.kv_str("tokenizer.ggml.model", "llama"),
        ggufcraft.kv("tokenizer.ggml.tokens", ggufcraft.ARR, ggufcraft.arr_str(tokens)),
        ggufcraft.kv_u32("tokenizer.ggml.bos_token_id", 0),
        ggufcraft.kv_u32("tokenizer.ggml.eos_token_id", 1),
    ]
    model = tmp_path / "m.gguf"
    model.write_bytes(ggufcraft.gguf(kvs, pad=False))
    out = tmp_path / "out"
    run = run_cli("ingest", "gguf", str(model), "-o", str(out))
    assert run.code == 0, run.stderr
    doc = json.loads((out / "pi_symbol_map.json").read_text("utf-8"))
    special = {s["id"] for s in doc["symbols"] if s.get("special")}
    assert special == {0, 1, 3, 4, 5}
    assert doc["byte_fallback"] is False and doc["unk_id"] == 1  # no unk: eos, then bos
    assert [s["text"] for s in doc["symbols"]][5] == "\\xff\\xfe"
    side = json.loads((out / "gguf_tokenizer.json").read_text("utf-8"))
    assert side["not_utf8_tokens"] == {"5": "fffe"}
    assert side["special_symbols"] == {
        "control": 2,
        "empty": 1,
        "matches the same bytes as a lower id": 1,
        "not UTF-8": 1,
    }
    assert run_cli("verify", str(out)).code == 0


def test_a_gguf_without_tokens_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(ggufcraft.gguf([ggufcraft.kv_str("general.architecture", "llama")]))
    run = run_cli("ingest", "gguf", str(model), "-o", str(tmp_path / "out"))
    assert run.code == 1 and "INGEST_GGUF_VOCAB" in run.stderr
    assert os.listdir(tmp_path) == ["m.gguf"]


# The π symbol map extension -------------------------------------------------------------------


def map_bytes(**fields) -> bytes:
    doc = {
        "version": 1,
        "vocab_size": 300,
        "unk_id": 0,
        "normalization": "none",
        "symbols": [{"id": 1, "text": "▁ab"}, {"id": 2, "text": "c"}],
    }
    doc.update(fields)
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("marking", "code"),
    [
        ("spaces", "PI_SPACE_MARKING"),
        ({"scheme": "bpe"}, "PI_SPACE_MARKING"),
        ({"scheme": "sentencepiece", "marker": "▁▁"}, "PI_SPACE_MARKING"),
        ({"scheme": "sentencepiece", "prefix_space": 1}, "PI_SPACE_MARKING"),
        ({"scheme": "byte_level", "marker": "Ġ"}, "PI_SPACE_MARKING"),
        ({"scheme": "wordpiece"}, "PI_SPACE_MARKING"),
        ({"scheme": "wordpiece", "marker": "▁", "continuation": "##"}, "PI_SPACE_MARKING"),
        ({"scheme": "wordpiece", "continuation": "# #"}, "PI_SPACE_MARKING"),
    ],
)
def test_bad_space_marking_is_an_error(marking, code: str) -> None:
    smap, findings = pi.check_map(map_bytes(space_marking=marking))
    assert smap is None and code in {f.code for f in findings}


def test_special_symbols_skip_the_matching_rules_only() -> None:
    """Decision: special symbols are listed, never matched; the matching rules (non-empty,
    unique) do not apply to them, the id rules do."""
    symbols = [
        {"id": 1, "text": "", "special": True},
        {"id": 2, "text": "c", "special": True},
        {"id": 3, "text": "c"},
    ]
    smap, findings = pi.check_map(map_bytes(symbols=symbols))
    assert smap is not None and findings == [] and smap.specials == {1, 2}
    bad = pi.check_map(map_bytes(symbols=[{"id": 1, "text": "a", "special": "yes"}]))
    assert bad[0] is None and bad[1][0].code == "PI_FIELD"
    dup_id = pi.check_map(
        map_bytes(symbols=[{"id": 1, "text": "a", "special": True}, {"id": 1, "text": "b"}])
    )
    assert dup_id[0] is None and "PI_DUP_ID" in {f.code for f in dup_id[1]}


def test_symbols_that_match_the_same_bytes_collide() -> None:
    """Decision: space marking changes the matched bytes, not the texts: under SentencePiece
    marking ▁a and ' a' both match ' a', a collision."""
    symbols = [{"id": 1, "text": "▁a"}, {"id": 2, "text": " a"}]
    marking = {"scheme": "sentencepiece", "marker": "▁", "prefix_space": False}
    smap, findings = pi.check_map(map_bytes(symbols=symbols, space_marking=marking))
    assert smap is None and [f.code for f in findings] == ["PI_DUP_TEXT"]
    assert "matches the same bytes" in findings[0].message
    assert pi.check_map(map_bytes(symbols=symbols))[0] is not None  # no marking: distinct


def test_maps_without_the_extension_are_unchanged() -> None:
    """Decision: the extension is opt-in and hashed only when used: the bundled map's file and
    canonical hash are what they were before it."""
    raw = Path(pi.default_map_path()).read_bytes()
    smap, _ = pi.check_map(raw)
    assert smap is not None and smap.space_marking is None and not smap.specials
    assert smap.to_json_bytes() == raw
    assert "space_marking" not in smap.canonical()
    assert smap.canonical_hash() == (
        "sha256:429b1051c9a53123de6d32a7044f2c3bf41e582cc5590e2a6697edfb0f6d76b3"
    )
    assert hashlib.sha256(raw).hexdigest() != smap.canonical_hash()


@settings(max_examples=60, deadline=None)
@given(
    # Letters only: no two texts may match the same bytes under a marking (▁ / Ġ vs space).
    texts=strategies.lists(
        strategies.text('ab"\\é日\n\u0001', min_size=1, max_size=5),
        min_size=1,
        max_size=20,
        unique=True,
    ),
    special=strategies.sets(strategies.integers(0, 19)),
    marking=strategies.sampled_from([None, "sentencepiece", "byte_level"]),
)
def test_canonical_bytes_fast_path_equals_json_dumps(texts, special, marking) -> None:
    symbols = tuple((i + 5, t) for i, t in enumerate(texts))
    smap = pi.SymbolMap(
        vocab_size=100,
        unk_id=0,
        pad_id=0,
        byte_fallback=False,
        byte_base_id=None,
        normalization="none",
        symbols=symbols,
        space_marking=pi.SpaceMarking(marking, marker="▁" if marking == "sentencepiece" else None)
        if marking
        else None,
        specials=frozenset(i + 5 for i in special if i < len(texts)),
    )
    want = json.dumps(
        smap.canonical(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8")
    assert smap.canonical_bytes() == want
    assert smap.canonical_hash() == "sha256:" + hashlib.sha256(want).hexdigest()
    again, _ = pi.check_map(smap.to_json_bytes())
    assert again is not None and again.canonical_hash() == smap.canonical_hash()


def test_byte_level_keys_follow_gpt2_alphabet() -> None:
    m = pi.SpaceMarking("byte_level")
    table = pi.gpt2_bytes_to_unicode()
    assert len(set(table.values())) == 256 and table[0x20] == "Ġ" and table[0x0A] == "Ċ"
    assert m.key("Ġthe") == b" the"
    assert m.key("âĢĶ") == "—".encode()  # the three bytes of an em dash
    assert m.key("<|endoftext|>") == b"<|endoftext|>"
    assert m.key("日本") == "日本".encode()  # outside the alphabet: its own UTF-8


# Embeddings -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    return path, ggufcraft.write_model(path, extra=False, embd_type="Q4_K")


def read_embeddings(out: Path, name: str):
    from matrixctl.converters.tensors import open_source

    with open_source(str(out / name)) as src:
        (info,) = src.tensors()
        return info, np.array(src.array(info)).reshape(info.shape)


@pytest.mark.parametrize(
    ("args", "file", "dtype"),
    [
        ([], "token_embd.zt", "f32"),
        (["--dtype", "f16"], "token_embd.zt", "f16"),
        (["--embeddings", "safetensors"], "token_embd.safetensors", "f32"),
        (["--embeddings", "npy", "--dtype", "f16"], "token_embd.npy", "f16"),
    ],
)
def test_embeddings_are_persisted_apart(model, tmp_path: Path, args, file: str, dtype: str) -> None:
    path, expected = model
    out = tmp_path / "out"
    run = run_cli("ingest", "gguf", str(path), "-o", str(out), *args)
    assert run.code == 0, run.stderr
    info, values = read_embeddings(out, file)
    assert info.shape == (266, 256) and info.dtype == dtype
    want = expected["token_embd.weight"]
    assert np.array_equal(values, want.astype(np.float16) if dtype == "f16" else want)
    manifest = json.loads((out / "gguf_manifest.json").read_text("utf-8"))
    assert manifest["embeddings"]["source_type"] == "Q4_K"
    assert manifest["embeddings"]["stored"] == "dequantized"
    assert run_cli("verify", str(out)).code == 0


def test_keep_quantized_embeddings(model, tmp_path: Path) -> None:
    from gguf import GGUFReader

    path, _ = model
    out = tmp_path / "out"
    assert run_cli("ingest", "gguf", str(path), "-o", str(out), "--keep-quantized").code == 0
    from matrixctl.formats import ztensor

    data = (out / "token_embd.zt").read_bytes()
    obj = ztensor.parse(data, len(data)).objects["token_embd.weight"]
    packed = obj.components["packed_weight"]
    raw = GGUFReader(str(path)).tensors[0].data.tobytes()
    assert data[packed.offset : packed.end] == raw
    assert obj.attributes["ggml_type"] == "Q4_K" and obj.shape == (266, 256)
    manifest = json.loads((out / "gguf_manifest.json").read_text("utf-8"))
    assert manifest["embeddings"]["stored"] == "quantized"
    assert manifest["embeddings"]["layout"] == "quantized_group"
    assert run_cli("verify", str(out)).code == 0


def test_manifest_records_every_hash(model, tmp_path: Path) -> None:
    path, _ = model
    out = tmp_path / "out"
    assert run_cli("ingest", "gguf", str(path), "-o", str(out)).code == 0
    manifest = json.loads((out / "gguf_manifest.json").read_text("utf-8"))
    assert manifest["source"]["sha256"] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["source"]["bytes"] == path.stat().st_size
    assert sorted(manifest["files"]) == [
        "gguf_tokenizer.json",
        "pi_symbol_map.json",
        "token_embd.zt",
    ]
    for name, rec in manifest["files"].items():
        data = (out / name).read_bytes()
        assert rec == {"sha256": "sha256:" + hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    smap, _ = pi.load_symbol_map(str(out / "pi_symbol_map.json"))
    assert manifest["tokenizer"]["canonical_hash"] == smap.canonical_hash()
    assert manifest["created"] is None and manifest["kind"] == "gguf"
    inspect = run_cli("inspect", "--json", str(out))
    assert inspect.code == 0 and inspect.json()["files"][0]["format"] == "gguf-ingest"


def test_verify_catches_damage_in_the_folder(model, tmp_path: Path) -> None:
    path, _ = model
    out = tmp_path / "out"
    assert run_cli("ingest", "gguf", str(path), "-o", str(out)).code == 0
    embd = out / "token_embd.zt"
    good = embd.read_bytes()
    embd.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    run = run_cli("verify", "--json", str(out))
    codes = {f["code"] for f in run.json()["files"][0]["findings"]}
    assert run.code == 1 and {"PACK_HASH", "PACK_ARTIFACT"} <= codes
    embd.write_bytes(good)
    smap_path = out / "pi_symbol_map.json"
    smap_path.write_text(smap_path.read_text("utf-8").replace('"pad_id": 0', '"pad_id": 1'))
    codes = {
        f["code"] for f in run_cli("verify", "--json", str(out)).json()["files"][0]["findings"]
    }
    assert {"PACK_HASH", "PACK_SIZE", "PACK_MISMATCH"} & codes and "PACK_MISMATCH" in codes
    manifest = out / "gguf_manifest.json"
    doc = json.loads(manifest.read_text("utf-8"))
    doc["files"]["../escape"] = {"sha256": "x", "bytes": 1}
    manifest.write_text(json.dumps(doc))
    codes = {
        f["code"] for f in run_cli("verify", "--json", str(out)).json()["files"][0]["findings"]
    }
    assert "PACK_PATH_ESCAPE" in codes
    (out / "token_embd.zt").unlink()
    codes = {
        f["code"] for f in run_cli("verify", "--json", str(out)).json()["files"][0]["findings"]
    }
    assert "PACK_MISSING" in codes


def test_same_input_same_bytes(model, tmp_path: Path) -> None:
    path, _ = model
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli("ingest", "gguf", str(path), "-o", str(a)).code == 0
    assert (
        run_cli("ingest", "gguf", str(path), "-o", str(b), env={"MATRIXCTL_NO_FSYNC": "1"}).code
        == 0
    )
    for name in os.listdir(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    c = tmp_path / "c"
    assert (
        run_cli("ingest", "gguf", str(path), "-o", str(c), env={"SOURCE_DATE_EPOCH": "0"}).code == 0
    )
    assert json.loads((c / "gguf_manifest.json").read_text())["created"] == "1970-01-01T00:00:00Z"


def test_failures_leave_no_folder_and_never_replace_foreign_ones(tmp_path: Path) -> None:
    """A value f16 cannot hold stops the ingest (CONVERT_CAST): no folder, no temporary folder;
    an existing folder that `ingest gguf` did not write is never replaced; one it wrote is."""
    from gguf import GGUFWriter

    model = tmp_path / "m.gguf"
    w = GGUFWriter(str(model), "llama")
    w.add_token_list([b"a", b"b"])
    w.add_tensor("token_embd.weight", np.array([[1.0, 2.0], [3.0, 1e6]], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = tmp_path / "out"
    run = run_cli("ingest", "gguf", str(model), "-o", str(out), "--dtype", "f16")
    assert run.code == 1 and "CONVERT_CAST" in run.stderr
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]
    ok = run_cli("ingest", "gguf", str(model), "-o", str(out), "--json")
    assert ok.code == 0 and ok.json()["embeddings"]["stored"] == "as stored"
    first = (out / "gguf_manifest.json").read_bytes()
    again = run_cli("ingest", "gguf", str(model), "-o", str(out), "--embeddings", "npy")
    assert again.code == 0 and (out / "token_embd.npy").exists()
    assert (
        not (out / "token_embd.zt").exists() and first != (out / "gguf_manifest.json").read_bytes()
    )
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    run = run_cli("ingest", "gguf", str(model), "-o", str(foreign))
    assert run.code == 2 and "GGUF_OUTPUT" in run.stderr
    assert os.listdir(foreign) == ["keep.txt"]
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert run_cli("ingest", "gguf", str(model), "-o", str(afile)).code == 2
    leftovers = [p for p in os.listdir(tmp_path) if p.endswith(".tmp") or p.endswith(".old")]
    assert leftovers == []


def test_embeddings_with_other_rows_are_written_with_a_warning(tmp_path: Path) -> None:
    """Decision: a token_embd.weight with more (padded) or fewer rows than tokens is written as
    it is, with a warning (verify of the GGUF warns too: GGUF_VOCAB_EMBD)."""
    model = tmp_path / "m.gguf"
    ggufcraft.write_model(model, extra=False, rows=300, embd_type="F16")
    run = run_cli("ingest", "gguf", str(model), "-o", str(tmp_path / "out"))
    assert run.code == 0 and "not one row per token" in run.stderr
    info, _ = read_embeddings(tmp_path / "out", "token_embd.zt")
    assert info.shape == (300, 256) and info.dtype == "f32"
    verify = run_cli("verify", "--json", str(tmp_path / "out"))
    assert verify.code == 0
    assert "PACK_MISMATCH" in {f["code"] for f in verify.json()["files"][0]["findings"]}


def test_an_interrupted_ingest_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C while the embeddings are being written on their helper thread: the writer is
    stopped and joined, the temporary folder removed, no DIR appears."""
    import threading

    from matrixctl.ingest import gguf as ingest_gguf

    model = tmp_path / "m.gguf"
    ggufcraft.write_model(model, extra=False, rows=4096, cols=512, embd_type="Q8_0")
    started = threading.Event()
    inner = ingest_gguf.EmbeddingSource.stream

    def slow_stream(self, info, role="data"):
        for piece in inner(self, info, role):
            started.set()
            yield piece

    def interrupted(gf, buf):
        started.wait(10)
        raise KeyboardInterrupt

    monkeypatch.setattr(ingest_gguf.EmbeddingSource, "stream", slow_stream)
    monkeypatch.setattr(ingest_gguf, "build_vocab", interrupted)
    run = run_cli("ingest", "gguf", str(model), "-o", str(tmp_path / "out"))
    assert run.code == 130 and "interrupted" in run.stderr
    assert started.is_set()
    assert sorted(os.listdir(tmp_path)) == ["m.gguf"]
    assert not [t for t in threading.enumerate() if t.name == "matrixctl-embeddings"]


def test_usage_errors_exit_2(model, tmp_path: Path) -> None:
    path, _ = model
    out = str(tmp_path / "out")
    cases = [
        ["--keep-quantized", "--embeddings", "safetensors"],
        ["--keep-quantized", "--dtype", "f16"],
        ["--embeddings", "tar"],
        ["--dtype", "bf16"],
    ]
    for extra in cases:
        run = run_cli("ingest", "gguf", str(path), "-o", out, *extra)
        assert run.code == 2, (extra, run.stderr)
        assert "Traceback" not in run.stderr
    missing = run_cli("ingest", "gguf", str(tmp_path / "nope.gguf"), "-o", out)
    assert missing.code == 2 and "IO_NOT_FOUND" in missing.stderr
    assert not Path(out).exists()


def test_stb_embeddings_are_written_with_their_sidecar(model, tmp_path: Path) -> None:
    """--embeddings stb writes token_embd.stb and its sidecar, both hashed in the manifest, with
    the same values as the zTensor output; damaging the sidecar fails verify."""
    path, _ = model
    out, ref = tmp_path / "out", tmp_path / "ref"
    run = run_cli("ingest", "gguf", str(path), "-o", str(out), "--embeddings", "stb")
    assert run.code == 0, run.stderr
    assert run_cli("ingest", "gguf", str(path), "-o", str(ref)).code == 0
    manifest = json.loads((out / "gguf_manifest.json").read_text())
    assert manifest["embeddings"]["file"] == "token_embd.stb"
    assert {"token_embd.stb", "token_embd.stb.json"} <= set(manifest["files"])
    info, got = read_embeddings(out, "token_embd.stb.json")
    _, want = read_embeddings(ref, "token_embd.zt")
    assert info.name == "token_embd.weight" and got.dtype == np.float32
    assert np.array_equal(got, want)
    assert run_cli("verify", str(out)).code == 0
    with open(out / "token_embd.stb.json", "a") as fh:
        fh.write(" ")
    bad = run_cli("verify", str(out))
    assert bad.code == 1 and "PACK_HASH" in bad.stderr


def test_exit_1_for_a_broken_model_and_json_summary(model, tmp_path: Path) -> None:
    path, _ = model
    broken = tmp_path / "b.gguf"
    broken.write_bytes(path.read_bytes()[:-100])
    run = run_cli("ingest", "gguf", str(broken), "-o", str(tmp_path / "out"))
    assert run.code == 1 and "GGUF_TRUNCATED" in run.stderr  # a cut file: one root cause
    assert not (tmp_path / "out").exists()
    good = run_cli("ingest", "gguf", str(path), "-o", str(tmp_path / "out"), "--json")
    assert good.code == 0
    doc = good.json()
    assert doc["output"] == str(tmp_path / "out") and doc["tokenizer"]["vocab_size"] == 266
    # --json: stdout is the one document; stderr only the warning that π's segmentation
    # differs from the model's (SentencePiece here; tests/tokenizers/test_gguf_tokenizer.py).
    assert good.stderr.startswith("matrixctl: warning: tokenizer: SentencePiece; ")
    assert good.stderr.count("\n") == 1
    assert doc["tokenizer"]["agreement"]["share"] < 1
    stdin = run_cli("ingest", "gguf", "-", "-o", str(tmp_path / "o2"), stdin=path.read_bytes())
    assert stdin.code == 0 and "<stdin>" in (tmp_path / "o2" / "gguf_manifest.json").read_text()
