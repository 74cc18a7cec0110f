"""A per-user cache of the tables a byte-level BPE tokenizer builds from a GGUF vocabulary
(docs/tokenizers.md, "Speed"): the cold start of a large vocabulary (Llama 3's 128k tokens and
280k merges) is mostly spelling every token and merge in bytes and numbering the kernel's
symbols, which a cache entry replaces by one read.

- The key is the BLAKE3 digest of everything the tables are made of: the pre-tokenizer, the
  tokens, their attributes (types as llama.cpp reads them) and the merges, with this module's
  format version. Another vocabulary, or the same one changed in any token, is another key:
  never a stale hit.
- An entry records the key again and the CRC-32 of its payload, both checked on every load; its
  payload is then checked for shape (types, lengths), and the kernel checks every index of the
  tables it is given. An entry failing any check is ignored and replaced: the tables are built
  again, as without a cache.
- Writes are atomic (a temporary file in the cache folder, then a rename) and best-effort.
- The folder is the π cache's (`$MATRIXCTL_CACHE_DIR`, else the XDG cache folder), here under
  `bpe/`; `MATRIXCTL_NO_CACHE=1` turns it off. The payload is `marshal`
  data, so the entry name carries the Python version and the format version.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys
from array import array
from collections.abc import Sequence
from typing import Any

from matrixctl.crc import crc32
from matrixctl.tokenizers.cache_files import cache_dir, write_entry

FORMAT_VERSION = 1
MAGIC = b"MXBPECAC"
HEAD = struct.Struct("<8sII32sQ")  # magic, version, payload CRC-32, key, payload length
N_TABLES = 7  # sym_token, missing_off, missing_ids, merges, vocab_blob, vocab_off, vocab_ids


# (token bytes per id, bytes -> id of the tokens GPT-2's alphabet spells, the kernel's tables)
Entry = tuple[list[bytes], dict[bytes, int], tuple[bytes, ...]]


def key_of(
    pre: str | None, tokens: Sequence[str], attrs: Sequence[int], merges: Sequence[str]
) -> bytes:
    """The cache key of a GGUF vocabulary's tables."""
    import blake3

    digest = blake3.blake3(marshal.dumps((FORMAT_VERSION, pre, len(tokens), len(merges))))
    digest.update(array("q", attrs).tobytes())
    for texts in (tokens, merges):
        # each text's length, then the texts joined: one reading only
        digest.update(array("q", map(len, texts)).tobytes())
        digest.update("".join(texts).encode("utf-8", "surrogatepass"))
    return digest.digest()


def entry_path(folder: str, key: bytes) -> str:
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-v{FORMAT_VERSION}"
    return os.path.join(folder, "bpe", f"{key.hex()}.{tag}.bin")


def _checked(value: Any, n_tokens: int) -> Entry | None:
    """The entry of an unmarshalled payload, or None when its shape is not an entry's."""
    if not (isinstance(value, tuple) and len(value) == 3):
        return None
    token_bytes, vocab, tables = value
    if not (isinstance(token_bytes, list) and len(token_bytes) == n_tokens):
        return None
    if set(map(type, token_bytes)) - {bytes}:
        return None
    if not isinstance(vocab, dict) or set(map(type, vocab)) - {bytes}:
        return None
    ids = vocab.values()
    if set(map(type, ids)) - {int} or (ids and not 0 <= min(ids) <= max(ids) < n_tokens):
        return None
    if not (
        isinstance(tables, tuple)
        and len(tables) == N_TABLES
        and all(type(t) is bytes for t in tables)
    ):
        return None
    return token_bytes, vocab, tables


def load(key: bytes, n_tokens: int) -> Entry | None:
    """The entry of `key`, or None (no entry, the cache is off, or the entry fails a check)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        with open(entry_path(folder, key), "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    try:
        magic, version, crc, stored_key, length = HEAD.unpack_from(data)
        payload = memoryview(data)[HEAD.size :]
        if (
            magic != MAGIC
            or version != FORMAT_VERSION
            or stored_key != key
            or length != len(payload)
            or crc32(payload) != crc
        ):
            return None
        return _checked(marshal.loads(payload), n_tokens)
    except (ValueError, TypeError, EOFError, struct.error):
        return None


def store(key: bytes, entry: Entry) -> None:
    """Write the entry of `key` (atomic, best-effort)."""
    folder = cache_dir()
    if folder is None:
        return
    payload = marshal.dumps(entry)
    head = HEAD.pack(MAGIC, FORMAT_VERSION, crc32(payload), key, len(payload))
    write_entry(entry_path(folder, key), head, payload)
