"""SCX fast paths against simple references: the decoder's bundle kernel against a per-token
reference decoder written here from docs/formats/scx.md and against the decoder with the kernel
switched off (same bytes, same error code and token index, same warnings)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies

from matrixctl.tokenizers.scx import api
from matrixctl.tokenizers.scx import lanes as scx_lanes
from matrixctl.tokenizers.scx import registry as scx_registry
from matrixctl.tokenizers.scx import tokens as scx_tokens

# A reference decoder: one token at a time, straight from the grammar ---------------------------


class Reject(Exception):
    """The reference refuses the stream (it does not name the error: see `Outcome`)."""


def reference_decode(tok: api.Tokenizer, toks: list[int]) -> bytes:
    """strict_invertibility decode, per docs/formats/scx.md "Token stream":

    stream  := TOK_CONFIG byte{32}  shard*  STREAM_END byte{8}
    shard   := SHARD_START  ([CHUNK_MARK] bundle)+  SHARD_END
    bundle  := BUNDLE_START lane{N} BUNDLE_END
             | BUNDLE_START lane{m} [[LANE_MARK] PAD_LANE byte{d}] BUNDLE_PAD BUNDLE_END
    lane    := [LANE_MARK] (composite | byte{W})

    and canonical: a lane is its active composite when it has one, else its W bytes; debug
    markers (LANE_MARK before every lane and the partial lane, CHUNK_MARK before every bundle
    j with j a multiple of chunk_bytes / B) everywhere or nowhere, decided by the first bundle;
    every shard but the last holds S bundles; only the last bundle is short (1..B-1 bytes).
    """
    reg = tok.rf.registry
    w, n, s, chunk = reg.lane_width, tok.lanes, tok.shard_bundles, tok.chunk_bundles
    active = {c.pattern: c.token_id for c in reg.composites if not c.deprecated}
    pattern = {c.token_id: c.pattern for c in reg.composites if not c.deprecated}
    pos = 0

    def peek(k: int = 0) -> int:
        return toks[pos + k] if pos + k < len(toks) else -1

    def expect(token: int) -> None:
        nonlocal pos
        if peek() != token:
            raise Reject
        pos += 1

    def byte() -> int:
        nonlocal pos
        if not 0 <= peek() < 256:
            raise Reject
        pos += 1
        return toks[pos - 1]

    expect(scx_tokens.TOK_CONFIG)
    if bytes(byte() for _ in range(32)) != tok.h_tok:
        raise Reject
    out = bytearray()
    debug: bool | None = None
    j = 0  # bundles so far
    ended = False  # a short shard or the padded bundle was seen: only STREAM_END may follow
    while peek() != scx_tokens.STREAM_END:
        if ended:
            raise Reject
        expect(scx_tokens.SHARD_START)
        count = 0
        while True:
            if count and peek() == scx_tokens.SHARD_END:
                break
            if count == s or ended:
                raise Reject
            if debug is None:
                debug = peek() == scx_tokens.CHUNK_MARK
            if debug and j % chunk == 0:
                expect(scx_tokens.CHUNK_MARK)
            expect(scx_tokens.BUNDLE_START)
            data = bytearray()
            lanes = 0
            while lanes < n:
                if (
                    peek() == scx_tokens.BUNDLE_PAD
                    or (peek(1) if debug else peek()) == scx_tokens.PAD_LANE
                ):
                    break
                if debug:
                    expect(scx_tokens.LANE_MARK)
                t = peek()
                if t in pattern:
                    pos += 1
                    data += pattern[t]
                else:
                    lane = bytes(byte() for _ in range(w))
                    if lane in active:
                        raise Reject  # spelled raw, but it has a composite
                    data += lane
                lanes += 1
            if lanes < n:
                if (
                    debug and peek() == scx_tokens.LANE_MARK and peek(1) == scx_tokens.PAD_LANE
                ) or (not debug and peek() == scx_tokens.PAD_LANE):
                    pos += 2 if debug else 1
                    part = bytearray()
                    while peek() != scx_tokens.BUNDLE_PAD:
                        part.append(byte())
                    if not 1 <= len(part) < w:
                        raise Reject
                    data += part
                expect(scx_tokens.BUNDLE_PAD)
                if not data:
                    raise Reject
                ended = True
            expect(scx_tokens.BUNDLE_END)
            out += data
            j += 1
            count += 1
        expect(scx_tokens.SHARD_END)
        if count < s:
            ended = True
    expect(scx_tokens.STREAM_END)
    (declared,) = struct.unpack("<Q", bytes(byte() for _ in range(8)))
    if declared != len(out) or pos != len(toks):
        raise Reject
    return bytes(out)


# Random configs, inputs and damage -----------------------------------------------------------

ALPHABET = b"ab\x00"


@dataclass
class Case:
    tok: api.Tokenizer
    data: bytes
    debug: bool


@strategies.composite
def cases(draw: strategies.DrawFn) -> Case:
    width = draw(strategies.sampled_from([1, 2, 3, 4, 8]))
    lanes = draw(strategies.integers(1, 4))
    bundle = width * lanes
    mode = {2: "SCXQ2", 4: "SCXQ4"}.get(width, "CUSTOM")
    pats = draw(
        strategies.lists(
            strategies.lists(strategies.sampled_from(ALPHABET), min_size=width, max_size=width).map(
                bytes
            ),
            max_size=12,
            unique=True,
        )
    )
    deprecated = draw(
        strategies.lists(strategies.booleans(), min_size=len(pats), max_size=len(pats))
    )
    source = {
        "lane_mode": mode,
        "alignment": {
            "bundle_lanes": lanes,
            "chunk_bytes": bundle * draw(strategies.integers(1, 3)),
            "shard_bundles": draw(strategies.integers(1, 6)),
        },
        "composites": [
            {"pattern": p.hex(), "deprecated": d} for p, d in zip(pats, deprecated, strict=True)
        ],
    }
    if mode == "CUSTOM":
        source["lane_width"] = width
    tok = api.Tokenizer.unchecked(scx_registry.from_source(source))
    data = draw(strategies.lists(strategies.sampled_from(ALPHABET), max_size=160).map(bytes))
    return Case(tok, data, draw(strategies.booleans()))


def damage_values(tok: api.Tokenizer) -> list[int]:
    """Ids worth planting: bytes, every control token, the kernel's own filler id (SKIP), each
    composite (active and deprecated), the first unassigned id, and the top id."""
    reg = tok.rf.registry
    ids = [0x00, 0x61, 0x62, 0xFF, scx_tokens.SKIP, 0xFFFF, reg.max_id + 1]
    ids += [
        scx_tokens.BUNDLE_START,
        scx_tokens.BUNDLE_END,
        scx_tokens.PAD_LANE,
        scx_tokens.LANE_MARK,
    ]
    ids += [
        scx_tokens.SHARD_START,
        scx_tokens.SHARD_END,
        scx_tokens.BUNDLE_PAD,
        scx_tokens.CHUNK_MARK,
    ]
    ids += [scx_tokens.TOK_CONFIG, scx_tokens.STREAM_END, min(scx_tokens.ERROR_SENTINELS)]
    ids += [c.token_id for c in reg.composites]
    return [i for i in ids if 0 <= i < scx_tokens.TOKEN_LIMIT]


@strategies.composite
def damaged(draw: strategies.DrawFn, case: Case) -> list[int]:
    """The case's token stream with up to three edits (replace, insert, delete)."""
    toks = api.encode_bytes(case.tok, case.data, emit_debug_markers=case.debug).tolist()
    values = damage_values(case.tok)
    for _ in range(draw(strategies.integers(0, 3))):
        at = draw(strategies.integers(0, len(toks)))
        kind = draw(strategies.sampled_from(["replace", "insert", "delete"]))
        if kind == "insert" or at == len(toks):
            toks.insert(at, draw(strategies.sampled_from(values)))
        elif kind == "replace":
            toks[at] = draw(strategies.sampled_from(values))
        else:
            del toks[at]
    return toks


@dataclass
class Outcome:
    data: bytes | None
    error: tuple[str, int | None] | None
    warnings: list[tuple[str, int | None, str]]


def run_decoder(
    tok: api.Tokenizer, toks: list[int], cuts: list[int], *, strict: bool, kernel: bool
) -> Outcome:
    """Decode fed in pieces (so the first pieces settle the debug-marker question and later
    windows can take the bundle kernel)."""
    arr = np.array(toks, dtype="<u2")
    dec = api.Decoder(tok, strict_invertibility=strict)
    dec.use_bundle_kernel = kernel
    parts: list[np.ndarray] = []
    try:
        start = 0
        for cut in [*cuts, arr.size]:
            end = max(start, min(cut, arr.size))
            parts += dec.feed(arr[start:end])
            start = end
        parts += dec.finish()
    except api.ScxFailure as err:
        warns = [(w.code, w.token_index, w.message) for w in dec.warnings]
        return Outcome(None, (err.issue.code, err.issue.token_index), warns)
    data = b"".join(p.tobytes() for p in parts)
    return Outcome(data, None, [(w.code, w.token_index, w.message) for w in dec.warnings])


def cut_points(draw: strategies.DrawFn, size: int) -> list[int]:
    return sorted(draw(strategies.lists(strategies.integers(0, size + 1), max_size=6)))


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """Records every bundle-kernel call as accepted (True) or refused (False)."""
    calls: list[bool] = []
    real = scx_lanes.LaneCodec.decode_bundles

    def spy(self: scx_lanes.LaneCodec, t: np.ndarray) -> tuple[np.ndarray, int] | None:
        found = real(self, t)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(scx_lanes.LaneCodec, "decode_bundles", spy)
    yield calls


# The tests ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies.data())
def test_decoder_matches_the_reference_decoder(data: strategies.DataObject) -> None:
    """Valid or damaged streams, random configs, fed in random pieces: the decoder accepts
    exactly what the reference accepts, with the same bytes."""
    case = data.draw(cases())
    toks = data.draw(damaged(case))
    got = run_decoder(case.tok, toks, cut_points(data.draw, len(toks)), strict=True, kernel=True)
    try:
        want: bytes | None = reference_decode(case.tok, toks)
    except Reject:
        want = None
    assert got.data == want, (got.error, toks)
    if toks == api.encode_bytes(case.tok, case.data, emit_debug_markers=case.debug).tolist():
        assert want == case.data  # an undamaged stream


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies.data())
def test_bundle_kernel_changes_nothing_but_speed(data: strategies.DataObject) -> None:
    """With and without the bundle kernel: the same bytes, or the same error (code and token
    index), and the same warnings, strict and lenient, whatever the feeding."""
    case = data.draw(cases())
    toks = data.draw(damaged(case))
    cuts = cut_points(data.draw, len(toks))
    strict = data.draw(strategies.booleans())
    fast = run_decoder(case.tok, toks, cuts, strict=strict, kernel=True)
    slow = run_decoder(case.tok, toks, cuts, strict=strict, kernel=False)
    assert fast == slow


@pytest.mark.parametrize("width", [1, 2, 3, 4, 8])
def test_bundle_kernel_takes_the_long_windows(width: int, kernel_calls: list[bool]) -> None:
    """A long canonical stream without debug markers, composites and raw lanes mixed, is
    decoded by the kernel (every window after the first) and gives the input back."""
    w = width
    comps = [b"the cat "[:w], b"abcdabcd"[:w], bytes(w)]
    source = {
        "lane_mode": {2: "SCXQ2", 4: "SCXQ4"}.get(w, "CUSTOM"),
        "composites": [{"pattern": p.hex()} for p in comps],
    }
    if w not in (2, 4):
        source["lane_width"] = w
    tok = api.Tokenizer.unchecked(scx_registry.from_source(source))
    lanes = [*comps, b"xyzwvuts"[:w], b"qrstuvwx"[:w]]
    if w == 1:
        lanes = [*comps, b"x", b"q"]
    # At least one token per lane, so four windows or more; whole bundles (no padded one).
    whole = 4 * api.DECODE_WINDOW // tok.lanes * tok.lanes
    pick = np.random.default_rng(11).integers(0, len(lanes), whole)
    data = b"".join(lanes[i] for i in pick.tolist())
    toks = api.encode_bytes(tok, data)
    assert np.count_nonzero(toks >= scx_tokens.COMPOSITE_FIRST) > toks.size // 10
    out = run_decoder(tok, toks.tolist(), [1000], strict=True, kernel=True)
    assert out.data == data and out.error is None
    assert len(kernel_calls) >= 3 and all(kernel_calls)


HOSTILE = [
    # A composite moved one token later: the lane before it is W-1 bytes plus the composite.
    ("misalign", scx_tokens.INVALID_BUNDLE_BOUNDARY),
    ("raw_lane_with_composite", scx_tokens.INVERTIBILITY_VIOLATION),
    ("deprecated", scx_tokens.INVERTIBILITY_VIOLATION),
    ("unassigned", scx_tokens.UNKNOWN_TOKEN),
    ("skip_id", scx_tokens.UNKNOWN_TOKEN),
    ("bundle_end_early", scx_tokens.INVALID_BUNDLE_BOUNDARY),
    # The same number of slots, the markers in the wrong units: N + 1 lanes, then N - 1
    # lanes and two BUNDLE_ENDs; a lane before BUNDLE_START; BUNDLE_START twice.
    ("lane_moved_across_bundles", scx_tokens.INVALID_BUNDLE_BOUNDARY),
    ("bundle_start_after_a_lane", scx_tokens.INVALID_BUNDLE_BOUNDARY),
    ("bundle_start_doubled", scx_tokens.INVALID_BUNDLE_BOUNDARY),
    ("bundle_markers_replaced_by_lanes", scx_tokens.INVALID_BUNDLE_BOUNDARY),
]


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize(("edit", "code"), HOSTILE)
def test_hostile_windows_are_refused_by_the_kernel(
    width: int, edit: str, code: str, kernel_calls: list[bool]
) -> None:
    """Damage deep inside a long stream: the kernel refuses the window, and the error is the
    one the rule-by-rule checks name (code and token index as without the kernel)."""
    w = width
    source = {
        "lane_mode": {2: "SCXQ2", 4: "SCXQ4"}.get(w, "CUSTOM"),
        "composites": [{"text": "the "[:w]}, {"text": "abcd"[:w], "deprecated": True}],
    }
    if w == 3:
        source["lane_width"] = 3
    tok = api.Tokenizer.unchecked(scx_registry.from_source(source))
    n = tok.lanes
    bundles = 2 * api.DECODE_WINDOW // (n * w + 2)  # two windows of whole raw bundles
    data = b"xyzw"[:w] * (n * bundles + 1) + b"the "[:w] + b"qrst"[:w] * (n * 100)
    toks = api.encode_bytes(tok, data).tolist()
    at = toks.index(0x400)  # "the", lane 1 of its bundle
    end = toks.index(scx_tokens.BUNDLE_END, at)
    end2 = toks.index(scx_tokens.BUNDLE_END, end + 1)
    lane = toks[end + 2 : end + 2 + w]  # the first lane of the next bundle
    rest = toks[end + 2 + w : end2]  # its other lanes
    if edit == "misalign":
        toks[at - 1 : at + 1] = [0x400, toks[at - 1]]
    elif edit == "raw_lane_with_composite":
        toks[at : at + 1] = list(b"the "[:w])
    elif edit == "deprecated":
        toks[at - w : at + 1] = [0x401, 0x400]  # "xyz.." spelled by the deprecated "abc.."
    elif edit == "unassigned":
        toks[at] = 0x402
    elif edit == "skip_id":
        toks[at] = scx_tokens.SKIP
    elif edit == "bundle_end_early":
        toks[at - 1] = scx_tokens.BUNDLE_END
    elif edit == "lane_moved_across_bundles":
        toks[end : end2 + 1] = [
            *lane,
            scx_tokens.BUNDLE_START,
            *rest,
            scx_tokens.BUNDLE_END,
            scx_tokens.BUNDLE_END,
        ]
    elif edit == "bundle_start_after_a_lane":
        toks[end + 1 : end2 + 1] = [*lane, scx_tokens.BUNDLE_START, *rest, scx_tokens.BUNDLE_END]
    elif edit == "bundle_start_doubled":
        toks[end + 1 : end2 + 1] = [
            scx_tokens.BUNDLE_START,
            scx_tokens.BUNDLE_START,
            *rest,
            scx_tokens.BUNDLE_END,
        ]
    else:
        toks[end + 1 : end2 + 1] = [*lane, *lane, *rest, *lane]
    fast = run_decoder(tok, toks, [500], strict=True, kernel=True)
    slow = run_decoder(tok, toks, [500], strict=True, kernel=False)
    assert fast == slow
    assert fast.error is not None and fast.error[0] == code
    assert True in kernel_calls and False in kernel_calls  # windows before it were taken
