"""The per-user cache of byte-level BPE tables (matrixctl/tokenizers/model/bpe_cache.py): a hit
gives the ids a fresh build gives; an entry failing any check is ignored and replaced."""

from __future__ import annotations

import marshal
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from matrixctl.crc import crc32
from matrixctl.tokenizers import pi_cache
from matrixctl.tokenizers.model import bpe_cache
from matrixctl.tokenizers.model.bpe import ByteLevelBPE
from tests.helpers.gguf_kv import gguf_kv
from tests.helpers.llama_vocab import vectors, vocab_path

TEXTS = ["Hello world, it's 12345", "  r\u00e9sum\u00e9 \u4e2d\u6587\r\n\n x \ud800", "'LL 'll"]


@cache
def kv_of(name: str) -> dict[str, Any]:
    return gguf_kv(vocab_path(name))


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MATRIXCTL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("MATRIXCTL_NO_CACHE", raising=False)
    return tmp_path


def entries(folder: Path) -> list[Path]:
    return sorted((folder / "bpe").glob("*.bin")) if (folder / "bpe").is_dir() else []


def build(name: str = "gpt-2") -> ByteLevelBPE:
    tok = ByteLevelBPE.from_gguf_kv(kv_of(name))
    assert tok.kernel is not None  # builds (or loads) the tables, stores them on a miss
    return tok


def test_a_hit_gives_the_ids_of_a_fresh_build(folder: Path) -> None:
    fresh = build()
    assert fresh._kernel_tables is None and len(entries(folder)) == 1
    hit = build()
    assert hit._kernel_tables is not None
    assert hit._token_bytes == fresh._token_bytes and hit._vocab == fresh._vocab
    for text, ids in vectors("gpt-2"):
        assert hit.encode(text) == ids, text
    for text in TEXTS:
        assert hit.encode(text) == fresh.encode(text)
        # the Python path of a hit makes its ranks on first use
        assert hit.without_kernel().encode(text) == fresh.without_kernel().encode(text)
    assert hit.decode(hit.encode(TEXTS[0])) == TEXTS[0]


def test_llama_bpe_hit_keeps_ignore_merges(folder: Path) -> None:
    fresh = build("llama-bpe")
    hit = build("llama-bpe")
    assert hit._kernel_tables is not None
    for text, ids in vectors("llama-bpe"):
        assert hit.encode(text) == ids, text
    assert [hit.encode(t) for t in TEXTS] == [fresh.encode(t) for t in TEXTS]


def content(path: Path) -> Any:
    """An entry's payload (equal payloads need not be equal bytes: marshal writes references
    where objects are shared)."""
    data = path.read_bytes()
    assert data[:8] == bpe_cache.MAGIC
    return marshal.loads(data[bpe_cache.HEAD.size :])


def rewrite(path: Path, change: Any) -> None:
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d.__setitem__(-1, d[-1] ^ 1),  # the payload: its CRC fails
        lambda d: d.__setitem__(20, d[20] ^ 1),  # the key recorded in the entry
        lambda d: d.__setitem__(8, 99),  # the format version
        lambda d: d.__delitem__(slice(len(d) // 2, None)),  # truncated
        lambda d: d.__delitem__(slice(10, None)),  # not even a head
    ],
)
def test_a_damaged_entry_is_ignored_and_replaced(folder: Path, damage: Any) -> None:
    build()
    (path,) = entries(folder)
    good = content(path)
    rewrite(path, damage)
    tok = build()
    assert tok._kernel_tables is None  # built again
    assert content(path) == good  # and stored again
    assert [tok.encode(t) for t in TEXTS] == [build().encode(t) for t in TEXTS]


def forge(path: Path, change: Any) -> None:
    """Change the payload and give it a matching CRC (what the CRC cannot catch)."""
    data = path.read_bytes()
    head = bpe_cache.HEAD.unpack_from(data)
    value = list(marshal.loads(data[bpe_cache.HEAD.size :]))
    change(value)
    payload = marshal.dumps(tuple(value))
    magic, version, _, key, _ = head
    path.write_bytes(
        bpe_cache.HEAD.pack(magic, version, crc32(payload), key, len(payload)) + payload
    )


@pytest.mark.parametrize(
    "change",
    [
        # a merge naming a symbol the tables do not have: the kernel refuses the tables
        lambda v: v.__setitem__(2, (*v[2][:3], b"\xff" * 16 + v[2][3][16:], *v[2][4:])),
        lambda v: v.__setitem__(2, v[2][:3]),  # a table missing
        lambda v: v.__setitem__(0, v[0][:-1]),  # a token's bytes missing
        lambda v: v.__setitem__(1, {**v[1], b"x": 10**9}),  # an id outside the vocabulary
        lambda v: v.__setitem__(1, {**v[1], "x": 1}),  # a key that is not bytes
    ],
)
def test_an_entry_of_the_wrong_shape_is_not_used(folder: Path, change: Any) -> None:
    build()
    (path,) = entries(folder)
    good = content(path)
    forge(path, change)
    tok = build()
    assert tok._kernel_tables is None  # built again
    assert content(path) == good  # and stored again
    for text, ids in vectors("gpt-2")[:20]:
        assert tok.encode(text) == ids, text


def test_another_vocabulary_is_another_key(folder: Path) -> None:
    kv = dict(kv_of("gpt-2"))
    build()
    tokens = list(kv["tokenizer.ggml.tokens"])
    tokens[1000] = tokens[1000] + "x"
    kv["tokenizer.ggml.tokens"] = tokens
    changed = ByteLevelBPE.from_gguf_kv(kv)
    assert changed._kernel_tables is None
    assert changed.kernel is not None
    assert len(entries(folder)) == 2
    merges = list(kv["tokenizer.ggml.merges"])
    assert bpe_cache.key_of("gpt-2", tokens, [1] * 3, merges) != bpe_cache.key_of(
        "mpt", tokens, [1] * 3, merges
    )
    # the lengths are part of the key: moving a character between neighbours changes it
    assert bpe_cache.key_of(None, ["ab", "c"], [], []) != bpe_cache.key_of(
        None, ["a", "bc"], [], []
    )


def test_no_cache_writes_nothing(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MATRIXCTL_NO_CACHE", "1")
    tok = build()
    assert tok.encode(TEXTS[0]) and not entries(folder)
    assert bpe_cache.load(b"\0" * 32, 1) is None


def test_an_unwritable_folder_only_costs_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    monkeypatch.setenv("MATRIXCTL_CACHE_DIR", str(blocker))  # a file: no folder can be made
    tok = build()
    assert tok.encode("Hello") == [15496]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"MATRIXCTL_CACHE_DIR": "/somewhere"},
        {"XDG_CACHE_HOME": "/xdg"},
        {"XDG_CACHE_HOME": "relative"},
        {"MATRIXCTL_NO_CACHE": "1"},
        {"MATRIXCTL_NO_CACHE": "0", "MATRIXCTL_CACHE_DIR": "/x"},
    ],
)
def test_the_folder_follows_the_pi_cache_rules(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MATRIXCTL_CACHE_DIR", "XDG_CACHE_HOME", "MATRIXCTL_NO_CACHE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert bpe_cache.cache_dir() == pi_cache.cache_dir()
    if "MATRIXCTL_CACHE_DIR" in env and "MATRIXCTL_NO_CACHE" not in env:
        assert bpe_cache.cache_dir() == os.environ["MATRIXCTL_CACHE_DIR"]
