"""SCX encode / decode: round trips in every lane mode, replay, every error code, fuzzing."""

from __future__ import annotations

import errno
import io
import os
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies

from matrixctl.tokenizers.scx import api
from matrixctl.tokenizers.scx import encoder as scx_encoder
from matrixctl.tokenizers.scx import registry as scx_registry
from matrixctl.tokenizers.scx import tokens as scx_tokens
from tests.helpers import scx_golden

SOURCES = {
    "SCXQ2": {
        "lane_mode": "SCXQ2",
        "alignment": {"shard_bundles": 3, "chunk_bytes": 32},
        "composites": [{"text": "th"}, {"text": "e "}, {"pattern": "0000", "deprecated": True}],
    },
    "SCXQ4": {
        "lane_mode": "SCXQ4",
        "alignment": {"bundle_lanes": 2, "chunk_bytes": 16, "shard_bundles": 2},
        "composites": [{"text": "the "}, {"text": "abcd"}, {"pattern": "00000000"}],
    },
    "CUSTOM3": {
        "lane_mode": "CUSTOM",
        "lane_width": 3,
        "pad_byte": 7,
        "alignment": {"bundle_lanes": 3, "chunk_bytes": 18, "shard_bundles": 2},
        "composites": [{"text": "the"}, {"text": "abc"}, {"pattern": "000000"}],
    },
    "CUSTOM1": {
        "lane_mode": "CUSTOM",
        "lane_width": 1,
        "alignment": {"bundle_lanes": 5, "chunk_bytes": 10, "shard_bundles": 4},
        "composites": [{"text": "e"}],
    },
    "CUSTOM8": {
        "lane_mode": "CUSTOM",
        "lane_width": 8,
        "alignment": {"bundle_lanes": 1, "chunk_bytes": 16, "shard_bundles": 3},
        "composites": [{"text": "the cat "}, {"pattern": "00" * 8}],
    },
}
TOKENIZERS = {
    name: api.Tokenizer.unchecked(scx_registry.from_source(src)) for name, src in SOURCES.items()
}
ALPHABET = b"the abcd\x00\x07"
data_strategy = strategies.one_of(
    strategies.binary(max_size=200),
    strategies.lists(strategies.sampled_from(list(ALPHABET)), max_size=200).map(bytes),
)


def decode_ok(tok: api.Tokenizer, tokens: np.ndarray, strict: bool = True) -> bytes:
    resp = api.decode(tok, api.DecodeRequest(tokens, tok.h_tok, strict_invertibility=strict))
    assert resp.errors == [], resp.errors
    return resp.bytes


def decode_error(
    tok: api.Tokenizer, tokens: list[int] | np.ndarray, strict: bool = True
) -> api.Issue:
    resp = api.decode(
        tok,
        api.DecodeRequest(np.array(tokens, dtype=np.int64), tok.h_tok, strict_invertibility=strict),
    )
    assert resp.bytes == b"" and len(resp.errors) == 1
    return resp.errors[0]


@pytest.mark.parametrize("mode", list(SOURCES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=data_strategy, debug=strategies.booleans())
def test_round_trip_every_mode(mode: str, data: bytes, debug: bool) -> None:
    tok = TOKENIZERS[mode]
    tokens = api.encode_bytes(tok, data, emit_debug_markers=debug)
    assert decode_ok(tok, tokens) == data


@settings(max_examples=40, deadline=None)
@given(
    data=data_strategy,
    cuts=strategies.lists(strategies.integers(1, 40), max_size=10),
    jobs=strategies.integers(1, 3),
)
def test_replay_is_independent_of_chunking_and_jobs(
    data: bytes, cuts: list[int], jobs: int
) -> None:
    tok = TOKENIZERS["SCXQ2"]
    whole = api.encode_bytes(tok, data)
    pieces, pos = [], 0
    for cut in cuts:
        pieces.append(data[pos : pos + cut])
        pos += cut
    pieces.append(data[pos:])
    joined = np.concatenate(list(api.encode_chunks(tok, pieces, jobs=jobs)))
    assert np.array_equal(joined, whole)
    dec = api.Decoder(tok)
    out = []
    for i in range(0, whole.size, 7):
        out += dec.feed(whole[i : i + 7])
    out += dec.finish()
    assert b"".join(o.tobytes() for o in out) == data


@pytest.mark.parametrize("mode", list(SOURCES))
@pytest.mark.parametrize("debug", [False, True])
def test_jobs_give_the_same_tokens_with_blocks_shards_and_carries(mode: str, debug: bool) -> None:
    """Chunks of several encode blocks, cut inside bundles, as bytes, bytearray and memoryview:
    `--jobs 2` and `--jobs 3` give exactly the tokens of one encoder."""
    tok = TOKENIZERS[mode]
    rng = np.random.default_rng(7)
    data = bytes(rng.choice(np.frombuffer(ALPHABET, np.uint8), 3 * api.BLOCK_BYTES + 1001))
    whole = api.encode_bytes(tok, data, emit_debug_markers=debug)
    cuts = [0, 5, api.BLOCK_BYTES + 7, 2 * api.BLOCK_BYTES + 3, len(data)]
    kinds = [bytes, bytearray, memoryview, bytes]
    pieces = [kind(data[a:b]) for kind, a, b in zip(kinds, cuts[:-1], cuts[1:], strict=True)]
    for jobs in (2, 3):
        parts = api.encode_chunks(tok, pieces, jobs=jobs, emit_debug_markers=debug)
        assert np.array_equal(np.concatenate(list(parts)), whole)
    assert decode_ok(tok, whole) == data


@pytest.mark.parametrize("mode", ["SCXQ2", "CUSTOM3"])
@pytest.mark.parametrize("debug", [False, True])
def test_encode_file_gives_the_tokens_of_one_encoder(
    mode: str, debug: bool, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`encode_file` of a file read from an offset, several tasks of whole bundles and a short
    last bundle: the tokens, the padding and the progress ticks of one encoder, for 1, 2 and 3
    jobs, from the file and from a pipe-like stream (no fileno)."""
    monkeypatch.setattr(scx_encoder, "TASK_BYTES", 50_000)  # several tasks of ~50 KB
    tok = TOKENIZERS[mode]
    rng = np.random.default_rng(5)
    data = bytes(rng.choice(np.frombuffer(ALPHABET, np.uint8), 260_011))
    whole = api.encode_bytes(tok, data, emit_debug_markers=debug)
    path = tmp_path / "in.bin"
    path.write_bytes(b"HEAD" + data)
    for jobs in (1, 2, 3):
        for stream in (False, True):
            ticks: list[int] = []
            padding: list[int] = []
            with open(path, "rb") as fp:
                assert fp.read(4) == b"HEAD"
                src = io.BytesIO(fp.read()) if stream else fp
                arrays = list(
                    api.encode_file(
                        tok,
                        src,
                        jobs=jobs,
                        emit_debug_markers=debug,
                        padding=padding,
                        tick=ticks.append,
                    )
                )
            assert np.array_equal(np.concatenate(arrays), whole), (jobs, stream)
            assert sum(ticks) == len(data)
            assert padding == [-len(data) % tok.bundle_bytes]
    assert decode_ok(tok, whole) == data


def test_encode_file_names_a_file_that_shrank(tmp_path: Any) -> None:
    """A worker that finds the file shorter than its size when encoding started: EIO, and
    the byte where the file ended."""
    tok = TOKENIZERS["SCXQ4"]
    path = tmp_path / "in.bin"
    path.write_bytes(b"the " * 2_000_000)
    with open(path, "rb") as fp:
        parts = api.encode_file(tok, fp, jobs=2)
        next(parts)  # TOK_CONFIG: the size is taken
        os.truncate(path, 1_000_000)
        with pytest.raises(OSError, match="ended at byte 1000000") as info:
            list(parts)
    assert info.value.errno == errno.EIO and info.value.filename == str(path)


def test_encode_file_ranges_tile_the_file_and_end_in_smaller_tasks() -> None:
    """Decision (tok18jobs, encoder._ranges): the tasks of `encode_file` tile the whole bundles
    in order, TASK_BYTES each, and the last TAIL tasks' worth per thread are cut four times
    finer (whole bundles), so the threads end within a small task of each other."""
    bb, step, jobs = 48, 48 * 1000, 2
    for whole in (0, bb, 7 * bb, step, 10 * step + 5 * bb, 3 * step):
        ranges = list(scx_encoder._ranges(whole, step, bb, jobs))
        ends = np.cumsum([0] + [n for _, n in ranges]).tolist()
        assert [at for at, _ in ranges] == ends[:-1]
        assert sum(n for _, n in ranges) == whole and all(n % bb == 0 and n for _, n in ranges)
        tail = scx_encoder.TAIL * jobs * step
        assert all(n == step for at, n in ranges if whole - at > tail)
        assert all(n <= step // 4 for at, n in ranges if whole - at <= tail)


def test_encode_file_threads_stop_with_the_caller_and_raise_in_order(tmp_path: Any) -> None:
    """Decision (tok18jobs, encoder._Threads): a caller that stops early leaves no thread
    behind (tasks not yet started are dropped, running ones end); a task's exception is raised
    where its tokens were due, after the tokens of the tasks before it."""
    import threading

    tok = TOKENIZERS["SCXQ4"]
    path = tmp_path / "in.bin"
    path.write_bytes(b"the " * 3_000_000)
    before = threading.active_count()
    with open(path, "rb") as fp:
        parts = api.encode_file(tok, fp, jobs=2)
        next(parts)
        next(parts)
        parts.close()
    assert threading.active_count() == before
    calls: list[int] = []

    def work(i: int) -> int:
        calls.append(i)
        if i == 3:
            raise ValueError("task 3")
        return i

    with scx_encoder._Threads(2) as pool:
        done = [pool.submit(work, i) for i in range(6)]
        assert [d.result() for d in done[:3]] == [0, 1, 2]
        with pytest.raises(ValueError, match="task 3"):
            done[3].result()
        assert done[4].result() == 4
    assert threading.active_count() == before


def test_encode_file_imports_no_concurrent_futures(tmp_path: Any) -> None:
    """Decision (tok18jobs): `encode_file --jobs 2` runs on its own small pool; importing
    `concurrent.futures` (and `logging` with it) cost 5-10 ms on the thread nothing shares."""
    import subprocess
    import sys

    from tests.helpers.cli import ROOT

    path = tmp_path / "in.bin"
    path.write_bytes(b"the " * 100_000)
    code = (
        "import sys\n"
        "from matrixctl.tokenizers.scx import api, registry\n"
        f"tok = api.Tokenizer.unchecked(registry.from_source({SOURCES['SCXQ2']!r}))\n"
        f"with open({str(path)!r}, 'rb') as fp:\n"
        "    n = sum(a.size for a in api.encode_file(tok, fp, jobs=2))\n"
        "assert n > 100_000\n"
        "print(sorted(m for m in ('concurrent.futures', 'logging') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_feeds_longer_than_a_window_decode_like_one_feed() -> None:
    """The decoder joins what a feed leaves over with the next feed's first window only: feeds
    of a window and a bit give the same bytes, and the same error at the same token."""
    tok = TOKENIZERS["SCXQ4"]
    rng = np.random.default_rng(11)
    data = bytes(rng.choice(np.frombuffer(ALPHABET, np.uint8), 700_000))
    tokens = api.encode_bytes(tok, data)
    step = api.DECODE_WINDOW + 13
    assert tokens.size > 3 * step
    dec = api.Decoder(tok)
    out = []
    for i in range(0, tokens.size, step):
        out += dec.feed(tokens[i : i + step])
    out += dec.finish()
    assert b"".join(o.tobytes() for o in out) == data
    bad = tokens.copy()
    at = 2 * step + 5 + int(np.flatnonzero(tokens[2 * step + 5 :] == scx_tokens.BUNDLE_START)[0])
    bad[at] = scx_tokens.BUNDLE_END  # BUNDLE_END without BUNDLE_START, in the third feed
    want = decode_error(tok, bad)
    assert want.code == scx_tokens.INVALID_BUNDLE_BOUNDARY and want.token_index == at
    dec = api.Decoder(tok)
    with pytest.raises(api.ScxFailure) as err:
        for i in range(0, bad.size, step):
            dec.feed(bad[i : i + step])
        dec.finish()
    assert (err.value.issue.code, err.value.issue.token_index) == (want.code, at)


class _Trickle:
    """A pipe-like reader: `readinto` fills at most `most` bytes a call (or none: no method)."""

    def __init__(self, data: bytes, most: int, readinto: bool) -> None:
        self.data, self.pos, self.most = data, 0, most
        if not readinto:
            self.readinto = None  # type: ignore[assignment]

    def read(self, n: int = -1) -> bytes:
        n = len(self.data) - self.pos if n < 0 else min(n, self.most)
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    def readinto(self, b: memoryview) -> int:
        out = self.read(len(b))
        b[: len(out)] = out
        return len(out)


def test_token_stream_decode_reuses_its_frame_buffer_safely() -> None:
    """`decode_token_stream` reads frame bodies into one reused buffer: many frames, read
    whole or a few KiB at a time (a pipe) or without `readinto`, decode to the same bytes."""
    import io

    from matrixctl.formats.token_stream import TokenStreamWriter
    from matrixctl.tokenizing import decode_token_stream

    tok = TOKENIZERS["SCXQ4"]
    rng = np.random.default_rng(3)
    data = bytes(rng.choice(np.frombuffer(ALPHABET, np.uint8), 600_000))
    tokens = api.encode_bytes(tok, data)
    blob = io.BytesIO()
    writer = TokenStreamWriter(blob, dtype="uint16", vocab_size=1 << 16)
    for i in range(0, tokens.size, 70_001):  # frames of 140 KB: above the reuse size
        writer.write(tokens[i : i + 70_001])
    writer.end_document("")
    writer.close()
    readers = [
        io.BytesIO(blob.getvalue()),
        _Trickle(blob.getvalue(), 5_000, readinto=True),
        _Trickle(blob.getvalue(), 5_000, readinto=False),
    ]
    for reader in readers:
        out = io.BytesIO()
        result = decode_token_stream(tok, reader, out)
        assert out.getvalue() == data
        assert result["tokens"] == tokens.size


def test_large_input_uses_the_fast_path_and_many_windows() -> None:
    tok = TOKENIZERS["SCXQ4"]
    rng = np.random.default_rng(5)
    data = bytes(rng.choice(np.frombuffer(ALPHABET, np.uint8), 400_000))
    tokens = api.encode_bytes(tok, data)
    assert tokens.size > 2 * api.DECODE_WINDOW
    assert decode_ok(tok, tokens) == data
    assert api.encode_bytes(tok, data).tobytes() == tokens.tobytes()


# Errors: one per code, with its position -----------------------------------------------------

TOK = TOKENIZERS["SCXQ2"]  # W = 2, N = 8, S = 3, chunk = 2 bundles
PRE = [scx_tokens.TOK_CONFIG, *TOK.h_tok]


def bundle(*lanes: int) -> list[int]:
    return [scx_tokens.BUNDLE_START, *lanes, scx_tokens.BUNDLE_END]


FULL = bundle(*([0x61] * 16))


def stream(*body: int, n: int | None = None) -> list[int]:
    nbytes = n if n is not None else 16 * sum(1 for t in body if t == scx_tokens.BUNDLE_START)
    return [*PRE, *body, scx_tokens.STREAM_END, *struct.pack("<Q", nbytes)]


def test_valid_hand_stream() -> None:
    assert (
        decode_ok(TOK, np.array(stream(scx_tokens.SHARD_START, *FULL, scx_tokens.SHARD_END)))
        == b"a" * 16
    )


@pytest.mark.parametrize(
    ("tokens", "code", "index"),
    [
        (stream(scx_tokens.SHARD_START, *FULL[:5], 0x9000, *FULL[5:], scx_tokens.SHARD_END), scx_tokens.UNKNOWN_TOKEN, 39),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL[:5], 0x0150, *FULL[5:], scx_tokens.SHARD_END), scx_tokens.UNKNOWN_TOKEN, 39),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL[:-1], scx_tokens.SHARD_END), scx_tokens.MISALIGNED_SHARD, 51),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL[:-2], scx_tokens.BUNDLE_END, scx_tokens.SHARD_END), scx_tokens.INVALID_BUNDLE_BOUNDARY, 50),  # noqa: E501
        (stream(scx_tokens.SHARD_START, 0x61, *FULL, scx_tokens.SHARD_END), scx_tokens.INVALID_BUNDLE_BOUNDARY, 34),  # noqa: E501
        (stream(scx_tokens.SHARD_START, scx_tokens.BUNDLE_START, 0x61, 0x400, *[0x61] * 13, scx_tokens.BUNDLE_END, scx_tokens.SHARD_END), scx_tokens.INVALID_BUNDLE_BOUNDARY, 36),  # noqa: E501
        (stream(*FULL), scx_tokens.MISALIGNED_SHARD, 33),
        (stream(scx_tokens.SHARD_START, *FULL, *FULL, *FULL, *FULL, scx_tokens.SHARD_END), scx_tokens.MISALIGNED_SHARD, 88),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL, scx_tokens.SHARD_END, scx_tokens.SHARD_START, *FULL, scx_tokens.SHARD_END), scx_tokens.MISALIGNED_SHARD, 53),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL), scx_tokens.MISALIGNED_SHARD, 52),
        (stream(scx_tokens.SHARD_START, *FULL, scx_tokens.SHARD_END, n=15), scx_tokens.INVERTIBILITY_VIOLATION, 53),  # noqa: E501
        (stream(scx_tokens.SHARD_START, 0x0311, *FULL, scx_tokens.SHARD_END), scx_tokens.INVALID_BUNDLE_BOUNDARY, 34),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL[:3], 0x0315, scx_tokens.SHARD_END), scx_tokens.INVERTIBILITY_VIOLATION, 37),  # noqa: E501
        (stream(scx_tokens.SHARD_START, *FULL[:3], 0x0316, scx_tokens.SHARD_END), scx_tokens.INTERNAL_INVARIANT_BROKEN, 37),  # noqa: E501
        ([scx_tokens.BUNDLE_START], scx_tokens.UNSUPPORTED_VERSION, 0),
        ([scx_tokens.TOK_CONFIG, *bytes(32)], scx_tokens.UNSUPPORTED_VERSION, 1),
        (stream(scx_tokens.SHARD_START, *FULL, scx_tokens.SHARD_END)[:-3], scx_tokens.MISALIGNED_SHARD, 59),  # noqa: E501
        ([*stream(scx_tokens.SHARD_START, *FULL, scx_tokens.SHARD_END), 0x61], scx_tokens.MISALIGNED_SHARD, 62),  # noqa: E501
        (stream(scx_tokens.SHARD_START, scx_tokens.BUNDLE_START, *[0x61] * 14, scx_tokens.BUNDLE_PAD, scx_tokens.BUNDLE_END, *FULL, scx_tokens.SHARD_END, n=30), scx_tokens.MISALIGNED_SHARD, 51),  # noqa: E501
        (stream(scx_tokens.SHARD_START, scx_tokens.BUNDLE_START, *[0x61] * 3, scx_tokens.BUNDLE_PAD, scx_tokens.BUNDLE_END, scx_tokens.SHARD_END, n=3), scx_tokens.INVALID_BUNDLE_BOUNDARY, 39),  # noqa: E501
        (stream(scx_tokens.SHARD_START, scx_tokens.BUNDLE_START, 0x61, scx_tokens.PAD_LANE, 0x61, scx_tokens.BUNDLE_PAD, scx_tokens.BUNDLE_END, scx_tokens.SHARD_END, n=2), scx_tokens.INVALID_BUNDLE_BOUNDARY, 36),  # noqa: E501
        (stream(scx_tokens.SHARD_START, scx_tokens.CHUNK_MARK, *FULL, scx_tokens.CHUNK_MARK, *FULL, scx_tokens.SHARD_END), scx_tokens.MISALIGNED_SHARD, 53),  # noqa: E501
        (stream(scx_tokens.SHARD_START, scx_tokens.BUNDLE_START, scx_tokens.SHARD_END, *[0x61] * 16, scx_tokens.BUNDLE_END), scx_tokens.MISALIGNED_SHARD, 35),  # noqa: E501
    ],
)  # fmt: skip
def test_each_error_code_and_position(tokens: list[int], code: str, index: int) -> None:
    err = decode_error(TOK, tokens)
    assert (err.code, err.token_index) == (code, index), err


def test_stream_of_another_config_is_refused() -> None:
    other = TOKENIZERS["SCXQ4"]
    tokens = api.encode_bytes(other, b"the cat")
    err = decode_error(TOK, tokens)
    assert err.code == scx_tokens.UNSUPPORTED_VERSION and err.token_index == 1
    assert err.context["stream_h_tok"] == other.h_tok.hex()


def test_request_config_hash_must_match() -> None:
    resp = api.encode(TOK, api.EncodeRequest(b"abc", bytes(32)))
    assert resp.errors[0].code == scx_tokens.UNSUPPORTED_VERSION and resp.tokens.size == 0
    resp2 = api.decode(TOK, api.DecodeRequest(api.encode_bytes(TOK, b"abc"), bytes(32)))
    assert resp2.errors[0].code == scx_tokens.UNSUPPORTED_VERSION and resp2.bytes == b""


def test_strict_alignment_refuses_padding_with_the_byte_offset() -> None:
    """Decision: strict_alignment turns padding of the last bundle into MISALIGNED_SHARD.
    Decision: without it, padding the last bundle is no warning (it is lossless and the normal
    case for any length that is not a whole number of bundles); the response counts the
    PAD-BYTEs instead."""
    resp = api.encode(TOK, api.EncodeRequest(b"x" * 21, TOK.h_tok, strict_alignment=True))
    assert [(e.code, e.byte_offset) for e in resp.errors] == [(scx_tokens.MISALIGNED_SHARD, 16)]
    ok = api.encode(TOK, api.EncodeRequest(b"x" * 21, TOK.h_tok))
    assert ok.errors == [] and ok.warnings == [] and ok.pad_bytes == 11
    aligned = api.encode(TOK, api.EncodeRequest(b"x" * 32, TOK.h_tok, strict_alignment=True))
    assert aligned.errors == [] and aligned.warnings == [] and aligned.pad_bytes == 0


def test_non_canonical_streams_strict_and_lenient() -> None:
    """Decision: strict_invertibility means decode accepts only what encode would produce; with
    it off, raw lanes that have a composite, deprecated composites and missing debug markers
    decode with INVERTIBILITY_VIOLATION warnings."""
    raw_th = stream(
        scx_tokens.SHARD_START,
        scx_tokens.BUNDLE_START,
        ord("t"),
        ord("h"),
        *[0x61] * 14,
        scx_tokens.BUNDLE_END,
        scx_tokens.SHARD_END,
    )
    err = decode_error(TOK, raw_th)
    assert (err.code, err.token_index) == (scx_tokens.INVERTIBILITY_VIOLATION, 35)
    resp = api.decode(
        TOK, api.DecodeRequest(np.array(raw_th), TOK.h_tok, strict_invertibility=False)
    )
    assert resp.errors == [] and resp.bytes == b"th" + b"a" * 14
    assert [w.code for w in resp.warnings] == [scx_tokens.INVERTIBILITY_VIOLATION]
    deprecated = stream(
        scx_tokens.SHARD_START,
        scx_tokens.BUNDLE_START,
        0x0402,
        *[0x61] * 14,
        scx_tokens.BUNDLE_END,
        scx_tokens.SHARD_END,
    )
    assert decode_error(TOK, deprecated).code == scx_tokens.INVERTIBILITY_VIOLATION
    assert decode_ok(TOK, np.array(deprecated), strict=False) == bytes(2) + b"a" * 14
    half_debug = stream(scx_tokens.SHARD_START, scx_tokens.CHUNK_MARK, scx_tokens.BUNDLE_START, scx_tokens.LANE_MARK, *[0x61] * 16, scx_tokens.BUNDLE_END, scx_tokens.SHARD_END)  # fmt: skip  # noqa: E501
    assert decode_error(TOK, half_debug).code == scx_tokens.INVERTIBILITY_VIOLATION
    assert decode_ok(TOK, np.array(half_debug), strict=False) == b"a" * 16


def test_warnings_are_counted_not_repeated() -> None:
    body = []
    for _ in range(3):
        body += [scx_tokens.BUNDLE_START, ord("t"), ord("h"), *[0x61] * 14, scx_tokens.BUNDLE_END]
    resp = api.decode(
        TOK,
        api.DecodeRequest(
            np.array(stream(scx_tokens.SHARD_START, *body, scx_tokens.SHARD_END)),
            TOK.h_tok,
            strict_invertibility=False,
        ),
    )
    assert len(resp.warnings) == 1 and "3 times" in resp.warnings[0].message


def test_decoder_never_buffers_an_endless_bundle() -> None:
    dec = api.Decoder(TOK)
    dec.feed(np.array([*PRE, scx_tokens.SHARD_START, scx_tokens.BUNDLE_START], dtype="<u2"))
    with pytest.raises(api.ScxFailure) as info:
        for _ in range(100):
            dec.feed(np.full(1000, 0x61, dtype="<u2"))
    assert info.value.code == scx_tokens.INVALID_BUNDLE_BOUNDARY
    assert dec.buf.size < 2000


@settings(max_examples=300, deadline=None)
@given(strategies.lists(strategies.sampled_from([0, 0x61, 0x100, 0x101, 0x102, 0x103, 0x200, 0x201, 0x202, 0x203, 0x300, 0x301, 0x312, 0x400, 0x401, 0x402, 0x500]), max_size=120), strategies.booleans(), strategies.booleans())  # fmt: skip  # noqa: E501
def test_fuzzed_streams_give_typed_errors_only(
    body: list[int], with_preamble: bool, strict: bool
) -> None:
    tokens = (PRE if with_preamble else []) + body
    resp = api.decode(
        TOK,
        api.DecodeRequest(np.array(tokens, dtype=np.int64), TOK.h_tok, strict_invertibility=strict),
    )
    if resp.errors:
        assert resp.errors[0].code in scx_tokens.ERROR_CODES
        assert resp.errors[0].token_index is not None
    else:
        assert api.encode_bytes(TOK, resp.bytes).size > 0


@settings(max_examples=150, deadline=None)
@given(data=data_strategy, debug=strategies.booleans(), where=strategies.integers(0, 10**6), value=strategies.sampled_from([0, 0x61, 0x101, 0x103, 0x201, 0x202, 0x203, 0x400, 0x401, 0x402]))  # fmt: skip  # noqa: E501
def test_mutated_streams_are_refused_or_canonical(
    data: bytes, debug: bool, where: int, value: int
) -> None:
    """A single changed token never decodes silently to other bytes: either a typed error, or
    the mutated stream is exactly the canonical encoding of what it decodes to."""
    tok = TOKENIZERS["SCXQ2"]
    tokens = api.encode_bytes(tok, data, emit_debug_markers=debug)
    mutated = tokens.copy()
    mutated[where % tokens.size] = value
    resp = api.decode(tok, api.DecodeRequest(mutated, tok.h_tok))
    if resp.errors:
        assert resp.errors[0].code in scx_tokens.ERROR_CODES
        return
    again = api.encode_bytes(tok, resp.bytes, emit_debug_markers=debug)
    assert np.array_equal(again, mutated)


def test_random_ids_give_typed_errors() -> None:
    rng = np.random.default_rng(9)
    for _ in range(300):
        body = rng.integers(0, 1 << 16, int(rng.integers(0, 300)))
        err = decode_error(TOK, [*PRE, *body.tolist()])
        assert err.code in scx_tokens.ERROR_CODES


def test_zero_pattern_composite_is_found() -> None:
    tok = api.Tokenizer.unchecked(
        scx_registry.from_source({"lane_mode": "SCXQ4", "composites": [{"pattern": "00000000"}]})
    )
    toks = api.encode_bytes(tok, bytes(32)).tolist()
    assert toks[33:44] == [
        scx_tokens.SHARD_START,
        scx_tokens.BUNDLE_START,
        *[0x400] * 8,
        scx_tokens.BUNDLE_END,
    ]


def test_golden_registry_decodes_its_vectors_after_chunked_feeding() -> None:
    tok = api.Tokenizer.load(scx_golden.signed_registry(), [scx_golden.golden_public_key()])
    for _, data, debug, toks in scx_golden.VECTORS:
        stream_ = np.array(scx_golden.preamble() + toks, dtype="<u2")
        dec = api.Decoder(tok)
        out = []
        for t in stream_:
            out += dec.feed(np.array([t], dtype="<u2"))
        out += dec.finish()
        assert b"".join(o.tobytes() for o in out) == data
        assert dec.debug in (None, debug)
