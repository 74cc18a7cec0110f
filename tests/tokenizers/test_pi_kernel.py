"""The π tokenizer's compiled kernel (matrixctl/_pi_kernel.c) and the per-user map cache
(matrixctl/tokenizers/pi_cache.py): checked against plain Python references."""

from __future__ import annotations

import os
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl import _pi_kernel
from matrixctl.tokenizers import pi, pi_cache
from tests.helpers.cli import run_cli


def longest_match(patterns: dict[bytes, int], data: bytes) -> list[int]:
    """Greedy leftmost-longest, the plain way: at each position try every length."""
    out, pos, top = [], 0, max(map(len, patterns))
    while pos < len(data):
        for n in range(min(top, len(data) - pos), 0, -1):
            if data[pos : pos + n] in patterns:
                value = patterns[data[pos : pos + n]]
                if value >= 0:
                    out.append(value)
                pos += n
                break
    return out


BYTES = {bytes([b]): 1000 + b for b in range(256)}


@settings(max_examples=150, deadline=None)
@given(
    words=strategies.lists(strategies.binary(min_size=2, max_size=6), max_size=30, unique=True),
    data=strategies.binary(max_size=200),
    drop=strategies.integers(0, 255),
)
def test_trie_matches_the_plain_reference(words: list[bytes], data: bytes, drop: int) -> None:
    patterns = dict(BYTES)
    patterns[bytes([drop])] = -1  # a pattern that gives no token
    patterns.update({w: i for i, w in enumerate(words)})
    trie = _pi_kernel.Trie(list(patterns), list(patterns.values()))
    want = longest_match(patterns, data)
    for itemsize, dtype in ((8, np.int64), (4, np.uint32), (2, np.uint16)):
        raw, used = trie.match(data, len(data), itemsize)
        assert used == len(data)
        assert np.frombuffer(raw, dtype=dtype).tolist() == want
    again = _pi_kernel.Trie.from_bytes(trie.to_bytes())
    assert again.match(data, len(data), 8) == trie.match(data, len(data), 8)
    assert again.lookahead == trie.lookahead == max(map(len, patterns))


@settings(max_examples=100, deadline=None)
@given(
    words=strategies.lists(strategies.binary(min_size=2, max_size=5), max_size=20),
    data=strategies.binary(max_size=120),
)
def test_spans_tile_the_input_like_the_reference(words: list[bytes], data: bytes) -> None:
    patterns = dict(BYTES)
    patterns[b"\x00"] = -1
    patterns.update({w: i for i, w in enumerate(words)})
    trie = _pi_kernel.Trie(list(patterns), list(patterns.values()))
    triples = np.frombuffer(trie.spans(data), dtype=np.int64).reshape(-1, 3).tolist()
    pos = 0
    for value, start, end in triples:
        assert start == pos < end and patterns[data[start:end]] == value
        pos = end
    assert pos == len(data)
    assert [v for v, _, _ in triples if v >= 0] == longest_match(patterns, data)


def test_trie_stops_after_the_limit() -> None:
    trie = _pi_kernel.Trie([*BYTES, b"abc"], [*BYTES.values(), 7])
    raw, used = trie.match(b"xxabcab", 2, 8)  # tokens starting at 0, 1 and 2
    assert np.frombuffer(raw, dtype=np.int64).tolist() == [1000 + ord("x")] * 2 + [7]
    assert used == 5
    assert trie.match(b"abc", -1, 8) == (b"", 0)


def test_trie_refuses_bad_patterns_and_damaged_bytes() -> None:
    with pytest.raises(ValueError, match="byte 0x00 is not a pattern"):
        _pi_kernel.Trie([b"ab"], [1])
    with pytest.raises(ValueError, match="listed twice"):
        _pi_kernel.Trie([*BYTES, b"a"], [*BYTES.values(), 1])
    with pytest.raises(TypeError):
        _pi_kernel.Trie([*BYTES, b""], [*BYTES.values(), 1])
    good = _pi_kernel.Trie([*BYTES, b"abc"], [*BYTES.values(), 7]).to_bytes()
    header = 8 + 4 * 8
    for bad in (
        good[:-1],  # truncated
        b"X" + good[1:],  # magic
        good[:header] + b"\0\0\0\0" + good[header + 4 :],  # root base 0: children on the root
        good[:header] + b"\xff\xff\xff\x7f" + good[header + 4 :],  # root base out of range
        good[:8] + (1 << 40).to_bytes(8, "little") + good[16:],  # slot count
    ):
        with pytest.raises(ValueError, match="not a valid compiled trie"):
            _pi_kernel.Trie.from_bytes(bad)


def test_kernel_objects_are_initialized_once() -> None:
    """Threads match and join without the GIL, so a second __init__ is refused."""
    trie = _pi_kernel.Trie(list(BYTES), list(BYTES.values()))
    with pytest.raises(TypeError, match="already initialized"):
        trie.__init__(list(BYTES), list(BYTES.values()))
    table = _pi_kernel.Table([b"x"])
    with pytest.raises(TypeError, match="already initialized"):
        table.__init__([b"y"])
    assert table.join(np.zeros(1, dtype=np.int64), 8, None) == (b"x", -1)


def test_decode_table_joins_short_long_and_missing_ids() -> None:
    long = "a text longer than fifteen bytes: π".encode()
    table = _pi_kernel.Table([b"", b"x", long, None, b"\xcf"])
    ids = np.array([1, 2, 0, 1, 4, 2], dtype=np.uint16)
    assert table.join(ids, 2, None) == (b"x" + long + b"x\xcf" + long, -1)
    assert table.join(ids.astype(np.int64), 8, None)[0] == b"x" + long + b"x\xcf" + long
    bad = np.array([1, 3, 2, 9, -5], dtype=np.int64)
    assert table.join(bad, 8, None) == (b"x", 1)
    assert table.join(bad, 8, b"?") == (b"x?" + long + b"??", 1)
    many = np.ones(5000, dtype=np.uint32) * 2  # the output grows past its first guess
    assert table.join(many, 4, None) == (long * 5000, -1)


@settings(max_examples=200, deadline=None)
@given(
    text=strategies.text(
        alphabet=strategies.sampled_from(
            list("ab .\u00e9\u0301\u0323e\u1100\u1161\uac00\u2163\ufb01")
        )
        | strategies.characters(),
        max_size=120,
    )
)
def test_segmented_normalization_equals_whole(text: str) -> None:
    for form in ("nfkc", "nfc", "nfkd", "nfd"):
        assert pi.normalize(text, form) == unicodedata.normalize(form.upper(), text)  # type: ignore[arg-type]


def test_segments_merge_close_runs() -> None:
    text = "ab\u00e9cd" + "x" * 100 + "\u00e9"
    assert _pi_kernel.segments(text, 64) == [1, 3, 104, 106]
    assert _pi_kernel.segments(text, 200) == [1, 106]
    assert _pi_kernel.segments("\u00e9a", 64) == [0, 1]
    assert _pi_kernel.segments("plain", 64) == []


# The cache -------------------------------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MATRIXCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MATRIXCTL_NO_CACHE", raising=False)
    return tmp_path / "cache"


def entries(folder: Path) -> list[Path]:
    return sorted((folder / "pi").glob("*.bin")) if (folder / "pi").exists() else []


def test_cache_hit_gives_the_same_map_and_tokens(cache: Path) -> None:
    path = pi.default_map_path()
    smap, _, tok = pi_cache.load_tokenizer(path)  # miss: checked in full, then stored
    assert len(entries(cache)) == 1
    hit = pi_cache.load(Path(path).read_bytes())
    assert hit is not None
    cached, trie = hit
    assert cached == smap and cached.canonical_hash() == smap.canonical_hash()
    text = "The quick brown fox, \u00e9t\u00e9 \u4e2d\u6587 \U0001f980."
    again = pi.Tokenizer(cached, trie)
    assert (
        again.encode(text).tolist()
        == tok.encode(text).tolist()
        == pi.Tokenizer(smap).encode(text).tolist()
    )
    assert again.decode(again.encode(text)) == pi.normalize(text, "nfkc")


def test_damaged_or_foreign_cache_entries_are_never_trusted(cache: Path) -> None:
    path = pi.default_map_path()
    raw = Path(path).read_bytes()
    pi_cache.load_tokenizer(path)
    [entry] = entries(cache)
    good = entry.read_bytes()
    for pos in (0, 20, pi_cache.HEAD.size + 5, len(good) - 3):  # magic, key, fields, trie
        entry.write_bytes(good[:pos] + bytes([good[pos] ^ 0x40]) + good[pos + 1 :])
        assert pi_cache.load(raw) is None
    entry.write_bytes(good[:-10])
    assert pi_cache.load(raw) is None
    # The next call checks the map in full again and replaces the entry.
    pi_cache.load_tokenizer(path)
    assert entry.read_bytes() == good
    # Another map's bytes never hit this entry (the key is the map's content).
    assert pi_cache.load(raw + b" ") is None


def test_changed_map_is_checked_again(cache: Path, tmp_path: Path) -> None:
    src = tmp_path / "map.json"
    doc = Path(pi.default_map_path()).read_text(encoding="utf-8")
    src.write_text(doc, encoding="utf-8")
    pi_cache.load_tokenizer(str(src))
    src.write_text(doc.replace('"vocab_size": 61883', '"vocab_size": 1'), encoding="utf-8")
    with pytest.raises(pi.FormatError) as err:
        pi_cache.load_tokenizer(str(src))
    assert err.value.code in (pi.PI_ID_RANGE, pi.PI_SPECIAL_RANGE, pi.PI_BYTE_RANGE)


def test_cache_can_be_turned_off_and_follows_xdg(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MATRIXCTL_NO_CACHE", "1")
    assert pi_cache.cache_dir() is None
    pi_cache.load_tokenizer(pi.default_map_path())
    assert entries(cache) == []
    monkeypatch.delenv("MATRIXCTL_NO_CACHE")
    monkeypatch.delenv("MATRIXCTL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pi_cache.cache_dir() == str(tmp_path / "xdg" / "matrixctl")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # invalid under XDG: ignored
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert pi_cache.cache_dir() == str(tmp_path / "home" / ".cache" / "matrixctl")


def test_unwritable_cache_costs_nothing_but_time(cache: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    os.environ["MATRIXCTL_CACHE_DIR"] = str(blocker)  # a file, not a folder: writes fail
    res = run_cli("tokenize", "pi", "encode", "-o", str(tmp_path / "t.mxt"), stdin=b"hello\n")
    assert res.code == 0, res.stderr
    assert (tmp_path / "t.mxt").exists()


def test_cached_and_uncached_commands_write_the_same_bytes(cache: Path, tmp_path: Path) -> None:
    text = "Encoding twice gives the same stream. \u00e9\u0301 \u4e2d\n".encode() * 50
    outs = []
    for n, env in enumerate(({"MATRIXCTL_NO_CACHE": "1"}, {}, {})):  # off, miss, hit
        out = tmp_path / f"t{n}.mxt"
        res = run_cli("tokenize", "pi", "encode", "-o", str(out), stdin=text, env=env)
        assert res.code == 0, res.stderr
        outs.append(out.read_bytes())
    assert len(entries(cache)) == 1
    assert outs[0] == outs[1] == outs[2]
