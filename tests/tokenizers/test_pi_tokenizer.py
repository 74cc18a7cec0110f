"""π symbol map and tokenizer: checks, canonical hash, greedy matching, byte fallback, streaming."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl.codes import Severity
from matrixctl.errors import FormatError
from matrixctl.tokenizers import pi
from matrixctl.validate.engine import examine
from tests.helpers.cli import FIXTURES, ROOT

# A map typed by hand: ids 0 unk/pad, 1 eos, bytes at 10..265, symbols below 10 and above 265.
SMALL = {
    "version": 1,
    "vocab_size": 300,
    "unk_id": 0,
    "pad_id": 0,
    "eos_id": 1,
    "byte_fallback": True,
    "byte_base_id": 10,
    "normalization": "nfkc",
    "symbols": [
        {"id": 2, "text": "a"},
        {"id": 3, "text": "b"},
        {"id": 4, "text": "ab"},
        {"id": 5, "text": "abc"},
        {"id": 6, "text": " "},
        {"id": 7, "text": "c"},
        {"id": 270, "text": "the"},
        {"id": 271, "text": " the"},
        {"id": 272, "text": "fi"},
    ],
}


def raw(doc: dict) -> bytes:
    return json.dumps(doc).encode()


def small(**changes: object) -> pi.Tokenizer:
    doc = {**SMALL, **changes}
    smap, findings = pi.check_map(raw(doc))
    assert smap is not None, findings
    return pi.Tokenizer(smap)


def reference_encode(smap: pi.SymbolMap, text: str) -> list[int]:
    """Greedy leftmost-longest, one character at a time (the spec's rule, written plainly)."""
    text = pi.normalize(text, smap.normalization)
    table = {t: i for i, t in smap.symbols}
    longest = max((len(t) for t in table), default=1)
    out: list[int] = []
    pos = 0
    while pos < len(text):
        for n in range(min(longest, len(text) - pos), 0, -1):
            if text[pos : pos + n] in table:
                out.append(table[text[pos : pos + n]])
                pos += n
                break
        else:
            ch = text[pos]
            if smap.byte_fallback:
                assert smap.byte_base_id is not None
                out.extend(smap.byte_base_id + b for b in ch.encode("utf-8"))
            else:
                out.append(smap.unk_id)
            pos += 1
    return out


# Encoding by hand --------------------------------------------------------------------------


def test_hand_encoding_of_a_small_map() -> None:
    tok = small()
    # "abcab the" -> abc, ab, " the"; "é" is not a symbol -> bytes c3 a9 -> 10+0xc3, 10+0xa9.
    assert tok.encode("abcab the").tolist() == [5, 4, 271]
    assert tok.encode("é").tolist() == [10 + 0xC3, 10 + 0xA9]
    # NFKC turns the ligature "ﬁ" into "fi" before matching.
    assert tok.encode("ﬁ").tolist() == [272]


def test_longest_match_wins_over_first_match() -> None:
    """Decision: at each position the longest symbol wins (not the first one listed)."""
    tok = small()
    assert tok.encode("abc").tolist() == [5]
    assert tok.encode("abd").tolist() == [4, 10 + ord("d")]


def test_without_byte_fallback_one_unk_per_character() -> None:
    """Decision: without byte_fallback each uncovered character is one unk_id (not per byte)."""
    tok = small(byte_fallback=False)
    assert tok.encode("a€b").tolist() == [2, 0, 3]
    assert tok.decode([2, 0, 3]) == "a\ufffdb"


def test_normalization_is_case_insensitive() -> None:
    smap, findings = pi.check_map(raw({**SMALL, "normalization": "NFKC"}))
    assert smap is not None and smap.normalization == "nfkc" and not findings


@settings(max_examples=150, deadline=None)
@given(
    symbols=strategies.lists(
        strategies.text(alphabet="abcé ", min_size=1, max_size=4), max_size=12, unique=True
    ),
    text=strategies.text(alphabet="abcé d", max_size=40),
    fallback=strategies.booleans(),
)
def test_matches_the_plain_reference(symbols: list[str], text: str, fallback: bool) -> None:
    symbols = [s for s in symbols if unicodedata.normalize("NFKC", s) == s]
    doc = {
        **SMALL,
        "byte_fallback": fallback,
        "symbols": [{"id": 300 + n, "text": s} for n, s in enumerate(symbols)],
        "vocab_size": 400,
    }
    smap, findings = pi.check_map(raw(doc))
    assert smap is not None, findings
    assert pi.Tokenizer(smap).encode(text).tolist() == reference_encode(smap, text)


@settings(max_examples=200, deadline=None)
@given(text=strategies.text())
def test_decode_inverts_encode_for_every_string(text: str) -> None:
    """With byte fallback, decode(encode(x)) == normalize(x) for every string."""
    tok = _default()
    assert tok.decode(tok.encode(text)) == unicodedata.normalize("NFKC", text)


@settings(max_examples=100, deadline=None)
@given(text=strategies.text(), cuts=strategies.lists(strategies.integers(0, 200), max_size=6))
def test_streaming_equals_whole(text: str, cuts: list[int]) -> None:
    tok = _default()
    enc = tok.stream()
    parts = []
    prev = 0
    for cut in sorted(c % (len(text) + 1) for c in cuts):
        parts.append(enc.feed(text[prev:cut]))
        prev = cut
    parts.append(enc.feed(text[prev:]))
    parts.append(enc.finish())
    assert np.concatenate(parts).tolist() == tok.encode(text).tolist()


def test_streaming_across_a_long_symbol_boundary() -> None:
    tok = small()
    enc = tok.stream()
    text = "x" * 5000 + "abc" + "y" * 3000
    out = [enc.feed(text[:5001]), enc.feed(text[5001:]), enc.finish()]
    assert np.concatenate(out).tolist() == tok.encode(text).tolist()


@settings(max_examples=100, deadline=None)
@given(text=strategies.text(min_size=1))
def test_safe_cut_keeps_normalization(text: str) -> None:
    for form in ("nfkc", "nfc", "nfd", "nfkd"):
        cut = pi.safe_cut(text)
        assert pi.normalize(text[:cut], form) + pi.normalize(text[cut:], form) == pi.normalize(
            text, form
        )


# Decoding ----------------------------------------------------------------------------------


def test_invalid_utf8_names_the_token() -> None:
    tok = small()
    with pytest.raises(FormatError) as info:
        tok.decode([2, 10 + 0xC3, 2])  # a lead byte followed by "a"
    assert info.value.code == pi.PI_DECODE_UTF8
    assert info.value.field in {"token[1]", "token[2]"}
    assert tok.decode([2, 10 + 0xC3, 2], errors="replace") == "a\ufffda"


def test_unknown_id_is_an_error_or_replaced() -> None:
    tok = small()
    with pytest.raises(FormatError) as info:
        tok.decode([2, 299])
    assert info.value.code == pi.PI_DECODE_ID and info.value.field == "token[1]"
    assert tok.decode([2, 299], errors="replace") == "a\ufffd"


def test_eos_and_pad_decode_to_nothing_unk_to_replacement() -> None:
    """Decision: unk_id decodes to U+FFFD; pad_id and eos_id decode to nothing."""
    tok = small(pad_id=8)
    assert tok.decode([2, 1, 8, 3]) == "ab"
    assert tok.decode([0]) == "\ufffd"


def test_streaming_decode_across_pieces() -> None:
    tok = small()
    ids = tok.encode("é€🦀")
    dec = pi.StreamDecoder(tok)
    text = "".join(dec.feed(ids[i : i + 1]) for i in range(ids.size)) + dec.finish()
    assert text == "é€🦀"


# Map checks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"version": 2}, pi.PI_VERSION),
        ({"vocab_size": 0}, pi.PI_VOCAB_SIZE),
        ({"vocab_size": "300"}, pi.PI_FIELD),
        ({"normalization": "nfx"}, pi.PI_NORMALIZATION),
        ({"unk_id": 300}, pi.PI_SPECIAL_RANGE),
        ({"pad_id": -1}, pi.PI_SPECIAL_RANGE),
        ({"eos_id": 999}, pi.PI_SPECIAL_RANGE),
        ({"byte_base_id": 50}, pi.PI_BYTE_RANGE),
        ({"byte_base_id": 0}, pi.PI_BYTE_COLLISION),
        ({"byte_fallback": "yes"}, pi.PI_FIELD),
        ({"symbols": [{"id": 300, "text": "a"}]}, pi.PI_ID_RANGE),
        ({"symbols": [{"id": 2, "text": "a"}, {"id": 2, "text": "b"}]}, pi.PI_DUP_ID),
        ({"symbols": [{"id": 2, "text": "a"}, {"id": 3, "text": "a"}]}, pi.PI_DUP_TEXT),
        ({"symbols": [{"id": 2, "text": ""}]}, pi.PI_EMPTY_TEXT),
        ({"symbols": [{"id": 2, "text": "x" * 1025}]}, pi.PI_SYMBOL_LONG),
        ({"symbols": [{"id": True, "text": "a"}]}, pi.PI_FIELD),
        ({"symbols": [["a", 2]]}, pi.PI_FIELD),
    ],
)
def test_each_map_check_is_a_finding(change: dict, code: str) -> None:
    smap, findings = pi.check_map(raw({**SMALL, **change}))
    assert code in {f.code for f in findings}
    assert smap is None


def test_missing_byte_base_and_missing_field() -> None:
    doc = dict(SMALL)
    del doc["byte_base_id"]
    assert pi.PI_FIELD in {f.code for f in pi.check_map(raw(doc))[1]}
    doc = dict(SMALL)
    del doc["symbols"]
    assert pi.check_map(raw(doc))[0] is None


@pytest.mark.parametrize(
    "data", [b"", b"\xff\xfe", b"[1, 2]", b"{", b"[" * 100000, b'{"version": 1}']
)
def test_hostile_or_broken_map_files_are_findings(data: bytes) -> None:
    smap, findings = pi.check_map(data)
    assert smap is None and findings
    assert all(f.severity is Severity.ERROR for f in findings)


def test_warnings_do_not_reject_the_map() -> None:
    """Decision: symbols changed by normalization and colliding specials are warnings."""
    doc = {**SMALL, "symbols": [*SMALL["symbols"], {"id": 280, "text": "ﬀ"}], "extra": 1}
    smap, findings = pi.check_map(raw(doc))
    assert smap is not None
    assert {f.code for f in findings} == {pi.PI_NOT_NORMALIZED, pi.PI_UNKNOWN_KEY}
    doc = {**SMALL, "eos_id": 2}
    smap, findings = pi.check_map(raw(doc))
    assert smap is not None and [f.code for f in findings] == [pi.PI_SPECIAL_COLLISION]


def test_canonical_hash_is_typed_from_the_docs() -> None:
    """Decision: the hash is SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8,
    symbols sorted by id, normalization lower case, unknown keys left out)."""
    doc = {
        "symbols": [{"text": "b", "id": 3}, {"id": 2, "text": "é"}],
        "normalization": "NFC",
        "vocab_size": 4,
        "unk_id": 0,
        "version": 1,
        "comment": "ignored",
    }
    smap, _ = pi.check_map(json.dumps(doc, indent=3).encode())
    assert smap is not None
    canonical = (
        '{"byte_base_id":null,"byte_fallback":false,"eos_id":null,"normalization":"nfc",'
        '"pad_id":0,"symbols":[{"id":2,"text":"é"},{"id":3,"text":"b"}],"unk_id":0,'
        '"version":1,"vocab_size":4}'
    )
    assert smap.canonical_hash() == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    other, _ = pi.check_map(json.dumps({**doc, "symbols": doc["symbols"][::-1]}).encode())
    assert other is not None and other.canonical_hash() == smap.canonical_hash()


def test_verify_and_inspect_a_map_file(tmp_path: Path) -> None:
    good = tmp_path / "m.json"
    good.write_bytes(raw(SMALL))
    report, desc = examine(str(good), scan=True, describe=True)
    assert report.format == "pi-symbol-map" and report.ok(strict=True)
    assert desc is not None and desc["map"]["symbols"] == len(SMALL["symbols"])
    bad = tmp_path / "b.json"
    bad.write_bytes(raw({**SMALL, "unk_id": 400}))
    report, _ = examine(str(bad), scan=True)
    assert report.format == "pi-symbol-map" and not report.ok()


# The bundled default map -------------------------------------------------------------------

_DEFAULT: pi.Tokenizer | None = None


def _default() -> pi.Tokenizer:
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = pi.Tokenizer(pi.load_symbol_map(pi.default_map_path())[0])
    return _DEFAULT


def test_bundled_map_verifies_clean() -> None:
    report, _ = examine(pi.default_map_path(), scan=True)
    assert report.format == "pi-symbol-map"
    assert report.findings == [] and report.ok(strict=True)
    smap = _default().map
    assert smap.normalization == "nfkc" and smap.byte_fallback and smap.vocab_size <= 65536


def test_bundled_map_tokenizes_english_and_other_scripts_sensibly() -> None:
    tok = _default()
    english = "The quick brown fox jumps over the lazy dog, and the information is available."
    assert len(english) / tok.encode(english).size > 3.5  # whole words, not characters
    for text in ("日本語のテキスト", "中文文本", "한국어", "Ελληνικά", "Русский"):
        assert tok.encode(text).size <= len(text)  # one token per character at most
    crab = tok.encode("🦀")  # not a symbol: its four UTF-8 bytes
    assert crab.tolist() == [2 + b for b in "🦀".encode()]


def test_bundled_map_is_reproduced_by_its_recipe(tmp_path: Path) -> None:
    out = tmp_path / "map.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "build_default_symbols.py"),
            "--gguf",
            str(FIXTURES / "gguf" / "ggml-vocab-gpt-2.gguf"),
            "-o",
            str(out),
        ],
        capture_output=True,
        check=False,
    )
    if unicodedata.unidata_version != "14.0.0":
        assert proc.returncode == 2 and b"pins Unicode" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == Path(pi.default_map_path()).read_bytes()


@settings(max_examples=60, deadline=None)
@given(text=strategies.text(alphabet="abc é€🦀the", max_size=80))
def test_matching_with_a_look_ahead_limit_is_exact(text: str) -> None:
    """The kernel stops at a look-ahead limit and the rest is matched again; the ids do not
    change."""
    tok = small()
    whole = tok.encode(text).tolist()
    assert whole == reference_encode(tok.map, text)
    data = tok.prepare(text)
    head, used = tok.match(data, max(0, len(data) - tok.lookahead))
    assert head.tolist() + tok.match(data[used:])[0].tolist() == whole
    enc = tok.stream()
    parts = [enc.feed(text), enc.finish()]
    assert np.concatenate(parts).tolist() == whole
