"""The SCX compiled kernel (matrixctl/_scx_kernel.c) against plain-Python references written
here: lane lookup against a dict, bundle encoding against a per-lane loop, decoding of whole
bundles against the grammar, and its refusals (bad arguments, hostile token windows)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies

from matrixctl import _scx_kernel
from matrixctl.tokenizers.scx import tokens as scx_tokens

LIMIT = scx_tokens.TOKEN_LIMIT


def make(width: int, lanes: int, patterns: dict[int, bytes], deprecated: tuple[int, ...] = ()):
    """A Codec with composites id -> pattern (ids in `deprecated` are not active)."""
    expand = bytearray(LIMIT * width)
    for b in range(256):
        expand[b * width] = b
    active = bytearray(LIMIT)
    for tid, pat in patterns.items():
        expand[tid * width : tid * width + width] = pat
        active[tid] = tid not in deprecated
    return _scx_kernel.Codec(width, lanes, bytes(expand), bytes(active))


def ref_ids(
    width: int, patterns: dict[int, bytes], deprecated: tuple[int, ...]
) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for tid, pat in sorted(patterns.items()):
        if tid not in deprecated:
            out[pat] = tid
    return out


def ref_encode(
    width: int,
    lanes: int,
    ids: dict[bytes, int],
    data: bytes,
    first: int,
    debug: bool,
    chunk: int,
    shard: int = 0,
) -> list[int]:
    out: list[int] = []
    bb = width * lanes
    for b in range(len(data) // bb):
        j = first + b
        if shard and j % shard == 0:
            out.append(scx_tokens.SHARD_START)
        if debug and j % chunk == 0:
            out.append(scx_tokens.CHUNK_MARK)
        out.append(scx_tokens.BUNDLE_START)
        for lane in range(lanes):
            at = b * bb + lane * width
            if debug:
                out.append(scx_tokens.LANE_MARK)
            pat = data[at : at + width]
            out += [ids[pat]] if pat in ids else list(pat)
        out.append(scx_tokens.BUNDLE_END)
        if shard and (j + 1) % shard == 0:
            out.append(scx_tokens.SHARD_END)
    return out


def u16(values: list[int]) -> bytes:
    return np.array(values, dtype="<u2").tobytes()


composite_sets = strategies.integers(1, 8).flatmap(
    lambda w: strategies.tuples(
        strategies.just(w),
        strategies.lists(strategies.binary(min_size=w, max_size=w), max_size=40),
        strategies.lists(strategies.binary(min_size=w, max_size=w), max_size=40),
    )
)


@settings(max_examples=80, deadline=None)
@given(spec=composite_sets, dep=strategies.sets(strategies.integers(0, 39), max_size=5))
def test_lookup_answers_like_a_dict(
    spec: tuple[int, list[bytes], list[bytes]], dep: set[int]
) -> None:
    width, pats, probes = spec
    patterns = {0x400 + i: p for i, p in enumerate(pats)}
    deprecated = tuple(0x400 + i for i in dep)
    codec = make(width, 2, patterns, deprecated)
    ids = ref_ids(width, patterns, deprecated)
    asked = pats + probes + [bytes(width)]
    got = np.frombuffer(codec.lookup(b"".join(asked)), dtype="<u2").tolist()
    assert got == [ids.get(p, 0) for p in asked]


@settings(max_examples=80, deadline=None)
@given(
    spec=composite_sets,
    lanes=strategies.integers(1, 5),
    bundles=strategies.integers(0, 6),
    seed=strategies.integers(0, 2**32 - 1),
    first=strategies.integers(0, 10),
    debug=strategies.booleans(),
    chunk=strategies.integers(1, 4),
)
def test_encode_and_decode_match_the_references(
    spec: tuple[int, list[bytes], list[bytes]],
    lanes: int,
    bundles: int,
    seed: int,
    first: int,
    debug: bool,
    chunk: int,
) -> None:
    width, pats, _ = spec
    patterns = {0x400 + i: p for i, p in enumerate(pats)}
    codec = make(width, lanes, patterns)
    ids = ref_ids(width, patterns, ())
    rng = np.random.default_rng(seed)
    # Lanes drawn from the patterns and from a few random bytes, so both kinds occur.
    pool = pats + [bytes(rng.integers(0, 4, width, dtype=np.uint8)) for _ in range(3)]
    data = b"".join(pool[int(rng.integers(0, len(pool)))] for _ in range(lanes * bundles))
    want = ref_encode(width, lanes, ids, data, first, debug, chunk)
    got = np.frombuffer(codec.encode(data, first, debug, chunk), dtype="<u2").tolist()
    assert got == want
    found = codec.decode(u16(want))
    if debug or not bundles:
        assert found is None  # markers are not the kernel's case; nor is an empty window
    else:
        assert found == (data, bundles)


def test_decode_refuses_every_non_canonical_window() -> None:
    w, n = 2, 2
    codec = make(w, n, {0x400: b"th", 0x401: b"e ", 0x402: b"xx"}, deprecated=(0x402,))
    ok = [scx_tokens.BUNDLE_START, 0x400, ord("a"), ord("b"), scx_tokens.BUNDLE_END]
    assert codec.decode(u16(ok)) == (b"thab", 1)
    assert codec.decode(u16(ok * 3)) == (b"thab" * 3, 3)
    bad = {
        "composite spelled as bytes": [
            scx_tokens.BUNDLE_START,
            ord("t"),
            ord("h"),
            0x400,
            scx_tokens.BUNDLE_END,
        ],
        "deprecated composite": [scx_tokens.BUNDLE_START, 0x402, 0x400, scx_tokens.BUNDLE_END],
        "unassigned id": [scx_tokens.BUNDLE_START, 0x403, 0x400, scx_tokens.BUNDLE_END],
        "lane split by a composite": [
            scx_tokens.BUNDLE_START,
            ord("a"),
            0x400,
            ord("b"),
            scx_tokens.BUNDLE_END,
        ],
        "short bundle": [scx_tokens.BUNDLE_START, 0x400, scx_tokens.BUNDLE_END],
        "long bundle": [scx_tokens.BUNDLE_START, 0x400, 0x400, 0x401, scx_tokens.BUNDLE_END],
        "no BUNDLE_START": [0x400, 0x400, scx_tokens.BUNDLE_END],
        "control token in a lane": [
            scx_tokens.BUNDLE_START,
            scx_tokens.PAD_LANE,
            0x400,
            scx_tokens.BUNDLE_END,
        ],
        "debug marker": [
            scx_tokens.BUNDLE_START,
            scx_tokens.LANE_MARK,
            0x400,
            0x400,
            scx_tokens.BUNDLE_END,
        ],
        "shard marker": [scx_tokens.SHARD_START, *ok],
    }
    for name, toks in bad.items():
        assert codec.decode(u16(toks)) is None, name
        assert codec.decode(u16(ok + toks)) is None, name
    for cut in range(len(ok) * 2):
        # Every cut of two bundles that is not a bundle boundary is refused, without reading
        # past the window.
        got = codec.decode(u16((ok * 2)[:cut]))
        assert got == ((b"thab", 1) if cut == len(ok) else None)


@settings(max_examples=200, deadline=None)
@given(
    toks=strategies.lists(
        strategies.sampled_from([*range(0, 300, 37), 0x100, 0x101, 0x400, 0x401, 0xFFFF]),
        max_size=60,
    ),
    width=strategies.integers(1, 8),
    lanes=strategies.integers(1, 4),
)
def test_decode_of_hostile_windows_is_exact_or_none(
    toks: list[int], width: int, lanes: int
) -> None:
    pats = {0x400: bytes(range(1, width + 1)), 0x401: b"\xff" * width}
    codec = make(width, lanes, pats)
    found = codec.decode(u16(toks))
    if found is not None:
        data, nb = found
        # Whatever it accepts is exactly what encoding its bytes gives back.
        assert codec.encode(data, 0, False, 1) == u16(toks)
        assert nb == len(data) // (width * lanes) and nb > 0


@settings(max_examples=150, deadline=None)
@given(
    width=strategies.sampled_from([1, 2, 3, 4, 8]),
    lanes=strategies.integers(1, 4),
    bundles=strategies.integers(0, 30),
    first=strategies.integers(0, 1 << 40),
    debug=strategies.booleans(),
    chunk=strategies.integers(1, 7),
    shard=strategies.integers(1, 9),
    seed=strategies.integers(0, 2**16),
)
def test_encode_frames_shards_like_the_reference(
    width: int,
    lanes: int,
    bundles: int,
    first: int,
    debug: bool,
    chunk: int,
    shard: int,
    seed: int,
) -> None:
    """With shard_bundles, SHARD_START before every bundle j with j % S == 0 and SHARD_END after
    every bundle j with (j + 1) % S == 0, wherever the block starts in the stream."""
    patterns = {0x400: bytes(range(width)), 0x401: b"\x01" * width}
    codec = make(width, lanes, patterns)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 2, width * lanes * bundles, dtype=np.uint8).tobytes()
    ids = ref_ids(width, patterns, ())
    want = ref_encode(width, lanes, ids, data, first, debug, chunk, shard)
    got = np.frombuffer(codec.encode(data, first, debug, chunk, shard), dtype="<u2").tolist()
    assert got == want
    # shard_bundles 0 (the default) is the bare bundles
    assert codec.encode(data, first, debug, chunk, 0) == codec.encode(data, first, debug, chunk)
    assert codec.encode(data, first, debug, chunk) == u16(
        ref_encode(width, lanes, ids, data, first, debug, chunk)
    )


def test_bad_arguments_are_value_errors() -> None:
    with pytest.raises(ValueError):
        _scx_kernel.Codec(9, 1, bytes(LIMIT * 9), bytes(LIMIT))
    with pytest.raises(ValueError):
        _scx_kernel.Codec(2, 0, bytes(LIMIT * 2), bytes(LIMIT))
    with pytest.raises(ValueError):
        _scx_kernel.Codec(2, 1, bytes(LIMIT), bytes(LIMIT))
    codec = make(4, 2, {0x400: b"abcd"})
    with pytest.raises(TypeError):
        codec.__init__(4, 2, bytes(LIMIT * 4), bytes(LIMIT))  # tables never change once built
    with pytest.raises(ValueError):
        codec.lookup(b"abc")  # not whole lanes
    with pytest.raises(ValueError):
        codec.encode(b"abcd", 0, False, 1)  # not a whole bundle
    with pytest.raises(ValueError):
        codec.encode(b"abcdabcd", 0, False, 1, -1)  # a negative shard size
    with pytest.raises(ValueError):
        codec.decode(b"\x00\x01\x02")  # not u16 tokens
    with pytest.raises(ValueError):
        _scx_kernel.Codec.__new__(_scx_kernel.Codec).lookup(b"")


def test_threads_share_a_codec() -> None:
    """The kernel releases the GIL on shared, read-only tables: threads give the same tokens."""
    codec = make(4, 8, {0x400 + i: bytes([i, i, 0, 1]) for i in range(200)})
    rng = np.random.default_rng(5)
    data = rng.integers(0, 3, 32 * 4000, dtype=np.uint8).tobytes()
    want = codec.encode(data, 0, False, 4)
    got: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: got.append(codec.encode(data, 0, False, 4)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [want] * 4
    assert codec.decode(want) == (data, 4000)
    # Decoding threads: one takes the Codec's scratch buffer, the others their own.
    found: list[tuple[bytes, int] | None] = []
    threads = [threading.Thread(target=lambda: found.append(codec.decode(want))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == [(data, 4000)] * 4
    # A window larger than the scratch a Codec keeps (4 MiB of bytes) decodes the same.
    big = data * 40
    assert codec.decode(codec.encode(big, 0, False, 4)) == (big, 4000 * 40)


def test_encode_blocks_gives_encode_tokens_in_kept_memory() -> None:
    """Decision (tok18, docs/formats/scx.md): `encode_blocks` writes `encode`'s tokens into
    blocks of its Codec's pool, read-only through the buffer protocol; a block whose last view
    is gone serves the next call (the same memory: no fresh pages), a block still viewed is
    never reused, and a larger request gets a larger block."""
    codec = make(2, 4, {0x400: b"ab", 0x401: b"\x00\x00"})
    rng = np.random.default_rng(3)
    data = rng.integers(0, 3, 8 * 5000, dtype=np.uint8).tobytes()
    for first, debug, chunk, shard in ((0, False, 4, 0), (7, True, 3, 5)):
        (buf,) = codec.encode_blocks(data, first, debug, chunk, shard, 0)
        assert bytes(memoryview(buf)) == codec.encode(data, first, debug, chunk, shard)
        assert len(buf) == len(codec.encode(data, first, debug, chunk, shard))
        assert memoryview(buf).readonly
    kept = np.frombuffer(codec.encode_blocks(data, 0, False, 4, 0, 0)[0], dtype="<u2")
    want = kept.copy()
    address = kept.__array_interface__["data"][0]
    for _ in range(3):  # `kept` still views its block: the calls get others
        other = np.frombuffer(codec.encode_blocks(data[::-1], 0, False, 4, 0, 0)[0], dtype="<u2")
        assert other.__array_interface__["data"][0] != address
        del other
    assert np.array_equal(kept, want)
    del kept
    again = np.frombuffer(codec.encode_blocks(data[:800], 0, False, 4, 0, 0)[0], dtype="<u2")
    assert again.__array_interface__["data"][0] == address  # the freed block, reused
    assert bytes(again) == codec.encode(data[:800], 0, False, 4)
    (bigger,) = codec.encode_blocks(data * 3, 0, False, 4, 0, 0)
    assert bytes(memoryview(bigger)) == codec.encode(data * 3, 0, False, 4)
    with pytest.raises(ValueError):
        codec.encode_blocks(b"abc", 0, False, 1, 0, 0)  # not a whole bundle
    with pytest.raises(ValueError):
        codec.encode_blocks(data, 0, False, 1, 0, -1)
    assert [len(b) for b in codec.encode_blocks(b"", 0, False, 1, 0, 0)] == [0]
    assert codec.encode_blocks(b"", 0, False, 1, 0, 3) == []


@pytest.mark.parametrize("block", [1, 3, 7, 4999, 5000, 5001, 10**9])
@pytest.mark.parametrize(("first", "debug", "chunk", "shard"), [(0, False, 4, 0), (7, True, 3, 5)])
def test_encode_blocks_cut_where_asked_and_join_to_encode(
    block: int, first: int, debug: bool, chunk: int, shard: int
) -> None:
    """Decision (tok18jobs, docs/formats/scx.md): one `encode_blocks` call makes every block of
    a range (the GIL released once): a block per `block_bundles` bundles, the last one shorter,
    each the tokens `encode` gives for its bundles (shard and chunk markers counted from the
    range's first bundle), so the blocks joined are `encode`'s tokens for the whole range."""
    codec = make(2, 4, {0x400: b"ab", 0x401: b"\x00\x00"})
    rng = np.random.default_rng(4)
    data = rng.integers(0, 3, 8 * 5000, dtype=np.uint8).tobytes()
    blocks = codec.encode_blocks(data, first, debug, chunk, shard, block)
    step = min(block, 5000)
    assert len(blocks) == -(-5000 // step)
    for i, buf in enumerate(blocks):
        part = data[8 * step * i : 8 * step * (i + 1)]
        assert bytes(memoryview(buf)) == codec.encode(part, first + step * i, debug, chunk, shard)
    joined = b"".join(bytes(memoryview(buf)) for buf in blocks)
    assert joined == codec.encode(data, first, debug, chunk, shard)
