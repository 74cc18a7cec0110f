"""A per-user cache of checked π symbol maps and their compiled matchers (docs/benchmarks.md,
"Cold start"; docs/formats/pi-symbol-map.md, "Cache").

Checking a 2.2 MB map (`check_map`) and compiling its trie cost far more than encoding one line,
so `tokenize pi encode|decode` keep, per map content, the checked map and the compiled trie:

- the key is the BLAKE3 digest of the map file's bytes: a changed map is a new key, never a
  stale hit;
- an entry records that digest again and the CRC-32 of its own payload, both checked on every
  load (a damaged entry is detected; the cache is the user's own folder, so corruption, not
  forgery, is what it guards against), and the kernel checks every index of the trie it loads;
  an entry that fails any check is ignored (and replaced), never trusted;
- only maps that passed `check_map` with no error are stored (warnings do not stop encoding);
- writes are atomic (a temporary file in the cache folder, then a rename) and best-effort: a
  read-only or full disk only costs the next call the full check;
- the folder follows the XDG rules: `$MATRIXCTL_CACHE_DIR`, else `$XDG_CACHE_HOME/matrixctl`,
  else `~/.cache/matrixctl`; `MATRIXCTL_NO_CACHE=1` turns the cache off.

The payload is `marshal` data (the map's fields; its symbols, read only when something needs them,
such as decoding) and the trie, so the entry name carries the Python version and the format
version: another interpreter never reads it.
"""

from __future__ import annotations

import gc
import marshal
import os
import struct
import sys
from typing import Any

from matrixctl.crc import crc32
from matrixctl.tokenizers import pi
from matrixctl.tokenizers.cache_files import cache_dir, write_entry

FORMAT_VERSION = 2
MAGIC = b"MXPICACH"
HEAD = struct.Struct("<8sII32sQQQ")  # magic, version, payload CRC-32, map BLAKE3, 3 lengths


def map_digest(raw: bytes) -> bytes:
    """The cache key of map bytes: BLAKE3 (5x SHA-256's speed here), 32 bytes."""
    import blake3

    return blake3.blake3(raw).digest()


def entry_path(folder: str, digest: bytes) -> str:
    tag = f"py{sys.version_info[0]}{sys.version_info[1]}-v{FORMAT_VERSION}"
    return os.path.join(folder, "pi", f"{digest.hex()}.{tag}.bin")


def _fields(smap: pi.SymbolMap) -> tuple[Any, ...]:
    marking = smap.space_marking
    return (
        smap.vocab_size,
        smap.unk_id,
        smap.pad_id,
        smap.byte_fallback,
        smap.byte_base_id,
        smap.normalization,
        smap.eos_id,
        smap.version,
        dict(smap.extra),
        None if marking is None else marking.to_json(),
        smap.specials,
        smap.canonical_hash(),
    )


def _unmarshal(data: Any) -> Any:
    gc.disable()  # 62k small tuples: collections during the load would double its time
    try:
        return marshal.loads(data)
    finally:
        gc.enable()


def _map_of(fields: tuple[Any, ...], symbols: Any) -> pi.SymbolMap:
    """The map of cached fields; its symbols (marshal data) are read on first use only."""
    (vocab, unk, pad, fallback, base, norm, eos, version, extra, marking, specials, h) = fields
    space = None
    if marking is not None:
        space, why = pi.parse_space_marking(marking)
        if why is not None:
            raise ValueError(why)
    smap = pi.SymbolMap.deferred(
        lambda: _unmarshal(symbols),
        vocab_size=vocab,
        unk_id=unk,
        pad_id=pad,
        byte_fallback=fallback,
        byte_base_id=base,
        normalization=norm,
        eos_id=eos,
        version=version,
        extra=extra,
        space_marking=space,
        specials=specials,
    )
    smap.remember_hash(h)
    return smap


def load(raw: bytes) -> tuple[pi.SymbolMap, Any] | None:
    """(checked map, compiled trie) of map bytes `raw` from the cache, or None (no entry, the
    cache is off, or the entry fails a check)."""
    folder = cache_dir()
    if folder is None:
        return None
    digest = map_digest(raw)
    try:
        with open(entry_path(folder, digest), "rb") as fp:
            data = fp.read()
    except OSError:
        return None
    try:
        magic, version, crc, map_key, n_fields, n_symbols, n_trie = HEAD.unpack_from(data)
        payload = memoryview(data)[HEAD.size :]
        if (
            magic != MAGIC
            or version != FORMAT_VERSION
            or map_key != digest
            or n_fields + n_symbols + n_trie != len(payload)
            or crc32(payload) != crc
        ):
            return None
        from matrixctl import _pi_kernel

        symbols = payload[n_fields : n_fields + n_symbols]
        smap = _map_of(marshal.loads(payload[:n_fields]), symbols)
        trie = _pi_kernel.Trie.from_bytes(payload[n_fields + n_symbols :])
    except (ValueError, TypeError, EOFError, struct.error):
        return None
    return smap, trie


def store(raw: bytes, smap: pi.SymbolMap, trie: Any) -> None:
    """Write the cache entry of map bytes `raw` (atomic, best-effort)."""
    folder = cache_dir()
    if folder is None:
        return
    digest = map_digest(raw)
    fields = marshal.dumps(_fields(smap))
    symbols = marshal.dumps(smap.symbols)
    compiled = trie.to_bytes()
    crc = crc32(compiled, crc32(symbols, crc32(fields)))
    head = HEAD.pack(MAGIC, FORMAT_VERSION, crc, digest, len(fields), len(symbols), len(compiled))
    write_entry(entry_path(folder, digest), head, fields, symbols, compiled)


def load_tokenizer(path: str) -> tuple[pi.SymbolMap, bytes, pi.Tokenizer]:
    """The map at `path`, its bytes and its tokenizer: from the cache when an entry for its
    exact bytes is there and sound, else checked in full (`check_map`) and then stored."""
    raw = pi.read_map_bytes(path)
    hit = load(raw)
    if hit is not None:
        smap, trie = hit
        return smap, raw, pi.Tokenizer(smap, trie)
    smap = pi.check_map_bytes(raw, path)
    tok = pi.Tokenizer(smap)
    store(raw, smap, tok.trie)
    return smap, raw, tok
