"""The decoder's checking path: tokens that start outside any bundle, checked and decoded.

`check_segment` runs when the kernel and the decoder's fast path refuse a window. Each check
below looks at the whole segment with numpy and reports the first problem it sees; a problem
cuts the segment there (`limit`), so later checks look only in front of it, and the first
problem of all is raised. A segment with no problem is decoded, then checked for canonical
form (a violation of which is an error or, with strict_invertibility off, a warning).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from matrixctl.tokenizers.scx import lanes as scx_lanes
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.tokenizers.scx.issues import ScxFailure, fail

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.tokenizers.scx.decoder import Decoder

# Which token classes may stand inside a bundle, and which between bundles.
INSIDE = [c in scx_lanes.INSIDE_OK for c in range(16)]
OUTSIDE = [c in scx_lanes.OUTSIDE_OK for c in range(16)]
PADDED_AFTER = "a bundle follows a padded bundle; only the last bundle of a stream is padded"


def check_segment(
    dec: Decoder,
    t: np.ndarray,
    out: list[np.ndarray],
    *,
    complete: bool,
    stop_token: int | None = None,
) -> None:
    """Check and decode tokens that start outside any bundle, updating `dec`'s state.

    `complete`: the segment must end outside a bundle (a stop token or the end follows).
    """
    if t.size == 0:
        return
    seg = Segment(dec, t)
    seg.check_nesting()
    seg.check_open_bundle(complete, stop_token)
    seg.index_bundles()
    seg.check_bundle_pads()
    seg.check_bundle_sizes()
    seg.check_pad_lanes()
    seg.check_composite_starts()
    seg.check_lane_marks()
    first_bundle, chunk_marks = seg.walk_shards()
    if seg.errors:
        raise min(seg.errors, key=lambda e: e[0])[1]
    seg.decode(out, first_bundle, chunk_marks)


class Segment:
    """One segment's token classes and bundle layout, and the first problems found in it."""

    def __init__(self, dec: Decoder, t: np.ndarray) -> None:
        import numpy as np

        self.dec = dec
        self.t = t
        self.base = dec.cursor
        self.n = t.size
        self.cls = dec.codec.cls.take(t)
        self.is_s = self.cls == scx_lanes.C_BSTART
        self.is_e = self.cls == scx_lanes.C_BEND
        step = self.is_s.astype(np.int8) - self.is_e.astype(np.int8)
        self.depth = np.cumsum(step, dtype=np.int32)
        self.errors: list[tuple[int, ScxFailure]] = []
        self.limit = self.n  # tokens from the first problem found on are not looked at

    def found(self, i: int, err: ScxFailure) -> None:
        if i < self.limit:
            self.limit = i
            self.errors.append((i, err))

    def boundary(self, i: int, message: str) -> None:
        self.found(i, fail(scx_tokens.INVALID_BUNDLE_BOUNDARY, message, token_index=self.base + i))

    def misaligned(self, i: int, message: str) -> None:
        self.found(i, fail(scx_tokens.MISALIGNED_SHARD, message, token_index=self.base + i))

    # Structure ----------------------------------------------------------------------------

    def check_nesting(self) -> None:
        """BUNDLE_START / BUNDLE_END pair up, and every token stands where its class may."""
        import numpy as np

        cls, is_s, is_e, depth = self.cls, self.is_s, self.is_e, self.depth
        bad = np.flatnonzero((depth < 0) | (depth > 1))
        if bad.size:
            i = int(bad[0])
            what = "BUNDLE_END without BUNDLE_START" if is_e[i] else "BUNDLE_START inside a bundle"
            self.boundary(i, what)
        before = depth - is_s + is_e
        inside = (before == 1) & ~is_e
        outside = (before == 0) & ~is_s
        inside_ok = np.array(INSIDE, dtype=bool)[cls]
        outside_ok = np.array(OUTSIDE, dtype=bool)[cls]
        misplaced = (inside & ~inside_ok) | (outside & ~outside_ok)
        bad = np.flatnonzero(misplaced[: self.limit])
        if not bad.size:
            return
        i = int(bad[0])
        name = self.dec.token_name(int(self.t[i]))
        if inside[i]:
            code = (
                scx_tokens.MISALIGNED_SHARD
                if int(cls[i]) in scx_lanes.OUTSIDE_OK
                else scx_tokens.INVALID_BUNDLE_BOUNDARY
            )
            self.found(i, fail(code, f"{name} inside a bundle", token_index=self.base + i))
        else:
            self.boundary(
                i, f"{name} outside any bundle (lanes live between BUNDLE_START and BUNDLE_END)"
            )

    def check_open_bundle(self, complete: bool, stop_token: int | None) -> None:
        """A complete segment ends outside a bundle; an open one is not longer than a bundle."""
        import numpy as np

        n, dec = self.n, self.dec
        if self.limit != n or self.depth[-1] == 0:
            return
        opened = int(np.flatnonzero(self.is_s)[-1])
        if complete:
            what = (
                "the stream ends" if stop_token is None else f"{dec.token_name(stop_token)} comes"
            )
            self.boundary(opened, f"the bundle opened here is not closed before {what}")
        elif n > dec.carry_limit and n - opened > dec.max_bundle_tokens:
            self.boundary(
                opened, f"no BUNDLE_END within {dec.max_bundle_tokens} tokens of this BUNDLE_START"
            )

    def index_bundles(self) -> None:
        """Byte counts before every token, and the bundles in front of the first problem."""
        import numpy as np

        self.length = self.dec.codec.length.take(self.t)
        self.cum = np.cumsum(self.length, dtype=np.int32)  # windows are small: no overflow
        self.cum_before = self.cum - self.length
        self.starts = np.flatnonzero(self.is_s[: self.limit])
        self.ends = np.flatnonzero(self.is_e[: self.limit])
        self.nb = min(self.starts.size, self.ends.size)
        self.starts_c, self.ends_c = self.starts[: self.nb], self.ends[: self.nb]
        self.padded_pos = self.n if not self.dec.padded else -1

    # Bundle sizes and padding -------------------------------------------------------------

    def check_bundle_pads(self) -> None:
        import numpy as np

        pads = np.flatnonzero(self.cls[: self.limit] == scx_lanes.C_BUNDLE_PAD)
        if not pads.size:
            return
        nxt = pads + 1
        ok = nxt < self.n
        ok[ok] = self.is_e[nxt[ok]]
        if not ok.all():
            self.boundary(int(pads[np.argmin(ok)]), "BUNDLE_PAD must come right before BUNDLE_END")

    def check_bundle_sizes(self) -> None:
        """Every bundle holds N*W bytes, a padded one 1..N*W-1 and is the stream's last."""
        import numpy as np

        if not self.nb:
            return
        tok = self.dec.tok
        w, bb = tok.width, tok.bundle_bytes
        starts_c, ends_c = self.starts_c, self.ends_c
        nbytes = self.cum[ends_c] - self.cum[starts_c]
        padded = self.cls[ends_c - 1] == scx_lanes.C_BUNDLE_PAD
        wrong = np.where(padded, (nbytes < 1) | (nbytes >= bb), nbytes != bb)
        if wrong.any():
            k = int(np.argmax(wrong))
            if padded[k]:
                msg = (
                    f"a padded bundle holds {int(nbytes[k])} bytes; BUNDLE_PAD marks a "
                    f"bundle of 1..{bb - 1} bytes"
                )
            else:
                msg = (
                    f"the bundle holds {int(nbytes[k])} bytes; a bundle is {tok.lanes} "
                    f"lanes of {w} bytes ({bb})"
                )
            self.boundary(int(ends_c[k]), msg)
        pk = np.flatnonzero(padded)
        if self.dec.padded and self.starts.size:
            self.misaligned(int(self.starts[0]), PADDED_AFTER)
        if not pk.size:
            return
        k = int(pk[0])
        self.padded_pos = int(ends_c[k])
        if k + 1 < self.starts.size:
            self.misaligned(int(self.starts[k + 1]), PADDED_AFTER)
        nbk = int(nbytes[k])
        lanes_here = np.flatnonzero(self.cls[starts_c[k] : ends_c[k]] == scx_lanes.C_PAD_LANE)
        if (nbk % w != 0) != bool(lanes_here.size):
            self.boundary(
                int(ends_c[k]),
                f"a padded bundle of {nbk} bytes "
                + ("needs" if nbk % w else "has no partial lane for")
                + " a PAD_LANE",
            )

    def check_pad_lanes(self) -> None:
        """PAD_LANE: at a lane boundary, then 1..W-1 byte tokens, then BUNDLE_PAD."""
        import numpy as np

        cls, n, w = self.cls, self.n, self.dec.tok.width
        for p in np.flatnonzero(cls[: self.limit] == scx_lanes.C_PAD_LANE)[:2].tolist():
            q = p + 1
            while q < n and cls[q] == scx_lanes.C_RAW and q - p < w:
                q += 1
            d = q - p - 1
            if (
                self.cum_before[p] % w
                or not 1 <= d < w
                or q >= n
                or cls[q] != scx_lanes.C_BUNDLE_PAD
            ):
                self.boundary(
                    p,
                    f"PAD_LANE must start a lane and be followed by 1..{w - 1} byte tokens "
                    "and BUNDLE_PAD",
                )
                break

    # Lanes --------------------------------------------------------------------------------

    def check_composite_starts(self) -> None:
        """Composites start at lane boundaries."""
        import numpy as np

        cls, limit, w = self.cls, self.limit, self.dec.tok.width
        self.comp = np.flatnonzero(
            (cls[:limit] == scx_lanes.C_COMP) | (cls[:limit] == scx_lanes.C_COMP_DEP)
        )
        if w == 1 or not self.comp.size:
            return
        off = self.cum_before[self.comp] % w
        if off.any():
            i = int(self.comp[np.argmax(off != 0)])
            self.boundary(
                i,
                f"composite {self.dec.token_name(int(self.t[i]))} starts at byte "
                f"{int(self.cum_before[i] % w)} of a lane: a lane is one composite or {w} "
                "byte tokens",
            )

    def check_lane_marks(self) -> None:
        """A LANE_MARK comes right before a lane."""
        import numpy as np

        cls, n, w = self.cls, self.n, self.dec.tok.width
        marks = np.flatnonzero(cls[: self.limit] == scx_lanes.C_LANE_MARK)
        if not marks.size:
            return
        nxt = marks + 1
        good = nxt < n
        nc = np.full(marks.size, scx_lanes.C_BEND, dtype=np.uint8)
        nc[good] = cls[nxt[good]]
        lane_next = (
            (nc == scx_lanes.C_RAW) | (nc == scx_lanes.C_COMP) | (nc == scx_lanes.C_COMP_DEP)
        )
        ok = ((self.cum_before[marks] % w) == 0) & (lane_next | (nc == scx_lanes.C_PAD_LANE))
        if not ok.all():
            self.boundary(int(marks[np.argmin(ok)]), "LANE_MARK must come right before a lane")

    # Shards and chunk marks ---------------------------------------------------------------

    def walk_shards(self) -> tuple[int, int]:
        """A small state machine over the few tokens between bundles, which updates the
        decoder's shard state; returns the stream index of the segment's first bundle and the
        number of CHUNK_MARKs seen."""
        import numpy as np

        cls, limit = self.cls, self.limit
        events = np.flatnonzero(self.outside_tokens()[:limit] & (cls[:limit] != scx_lanes.C_BEND))
        before_ev = np.searchsorted(self.starts, events) if events.size else events
        self.counted = 0  # bundles of this segment accounted for
        chunk_marks = 0
        for p, nbefore in zip(events.tolist(), before_ev.tolist(), strict=True):
            if p >= self.limit:
                break
            self.account(min(nbefore, self.nb))
            if p >= self.limit:
                break
            c = int(cls[p])
            if c == scx_lanes.C_SHARD_START:
                if not self.shard_start(p):
                    break
            elif c == scx_lanes.C_SHARD_END:
                if not self.shard_end(p):
                    break
            else:  # CHUNK_MARK
                if not self.chunk_mark(p):
                    break
                chunk_marks += 1
        first_bundle = self.dec.bundles - self.counted  # stream index of this segment's bundle 0
        self.account(self.nb)
        return first_bundle, chunk_marks

    def outside_tokens(self) -> np.ndarray:
        return (self.depth - self.is_s + self.is_e == 0) & ~self.is_s

    def account(self, upto: int) -> None:
        """The segment's bundles up to `upto` join the current shard."""
        dec = self.dec
        count = upto - self.counted
        if count <= 0:
            return
        s = dec.tok.shard_bundles
        if not dec.in_shard:
            self.misaligned(
                int(self.starts[self.counted]),
                "a bundle outside any shard (SHARD_START ... SHARD_END)",
            )
        elif dec.shard_count + count > s:
            over = self.counted + s - dec.shard_count
            self.misaligned(
                int(self.starts[over]),
                f"shard {dec.shards - 1} holds more than {s} bundles (shard_bundles of the "
                "alignment law)",
            )
        dec.shard_count += count
        dec.bundles += count
        self.counted = upto

    def shard_start(self, p: int) -> bool:
        dec = self.dec
        if dec.in_shard or dec.closed_short or p > self.padded_pos:
            if dec.in_shard:
                why = "inside a shard"
            elif p > self.padded_pos:
                why = "after the padded bundle, which ends the stream"
            else:
                why = (
                    "after a short shard (every shard but the last holds "
                    f"{dec.tok.shard_bundles} bundles)"
                )
            self.misaligned(p, f"SHARD_START {why}")
            return False
        dec.in_shard = True
        dec.shard_count = 0
        dec.shards += 1
        return True

    def shard_end(self, p: int) -> bool:
        dec = self.dec
        if not dec.in_shard or dec.shard_count == 0:
            why = "outside any shard" if not dec.in_shard else "closes an empty shard"
            self.misaligned(p, f"SHARD_END {why}")
            return False
        if dec.shard_count < dec.tok.shard_bundles:
            dec.closed_short = True
        dec.in_shard = False
        return True

    def chunk_mark(self, p: int) -> bool:
        dec = self.dec
        j = dec.bundles
        nxt_ok = p + 1 < self.n and self.is_s[p + 1]
        if not dec.in_shard or not nxt_ok or j % dec.tok.chunk_bundles:
            self.misaligned(
                p,
                f"CHUNK_MARK must come right before bundle j with j a multiple of "
                f"{dec.tok.chunk_bundles} (chunk_bytes / bundle bytes), inside a "
                f"shard; the next bundle is {j}",
            )
            return False
        return True

    # Decoding and canonical form ----------------------------------------------------------

    def decode(self, out: list[np.ndarray], first_bundle: int, chunk_marks: int) -> None:
        """Every check passed for the whole segment: decode it, then check canonical form."""
        import numpy as np

        dec = self.dec
        if self.padded_pos < self.n:
            dec.padded = True
        data_pos = np.flatnonzero(self.length)
        data = dec.codec.expand_tokens(self.t.take(data_pos), self.comp.size)
        if data.size:
            out.append(data)
        self.check_composites(data, data_pos)
        self.check_debug_markers(first_bundle, chunk_marks)
        dec.bytes_out += int(data.size)
        dec.cursor = self.base + self.n

    def check_composites(self, data: np.ndarray, data_pos: np.ndarray) -> None:
        """The encoder uses exactly the active composites, on every matching lane."""
        import numpy as np

        dec, t, comp, cum_before = self.dec, self.t, self.comp, self.cum_before
        w = dec.tok.width
        whole = data.size // w * w
        if not whole:
            return
        want = dec.codec.canonical_ids(data[:whole])
        have = np.zeros(whole // w, dtype=np.uint16)
        if comp.size:
            have[cum_before[comp] // w] = t[comp]
        diff = np.flatnonzero(want != have)
        if not diff.size:
            return
        lane = int(diff[0])
        idx = int(data_pos[np.searchsorted(cum_before[data_pos], lane * w)])
        got, use = dec.token_name(int(have[lane])), dec.token_name(int(want[lane]))
        if have[lane] and want[lane]:
            msg = f"lane spelled {got}; encode uses {use}"
        elif have[lane]:
            msg = f"composite {got} is deprecated; encode spells the lane raw"
        else:
            msg = (
                f"lane bytes {data[lane * w : lane * w + w].tobytes().hex()} are spelled "
                f"raw; encode uses {use}"
            )
        dec.violation("composite", msg, self.base + idx, int(diff.size))

    def check_debug_markers(self, first_bundle: int, chunk_marks: int) -> None:
        """Debug markers: all or nothing, decided by the stream's first bundle."""
        import numpy as np

        dec, cls = self.dec, self.cls
        starts, ends = self.starts_c, self.ends_c
        if not starts.size:
            return
        w, lanes, chunk = dec.tok.width, dec.tok.lanes, dec.tok.chunk_bundles
        lm = np.cumsum(cls == scx_lanes.C_LANE_MARK, dtype=np.int32)
        marks = lm[ends] - lm[starts]
        if dec.debug is None:
            dec.debug = bool(marks[0]) or (
                starts[0] > 0 and int(cls[starts[0] - 1]) == scx_lanes.C_CHUNK_MARK
            )
        with_or_without = "with" if dec.debug else "without"
        nbytes_lanes = np.full(starts.size, lanes, dtype=np.int64)
        if cls[ends[-1] - 1] == scx_lanes.C_BUNDLE_PAD:
            total_before = int(self.cum_before[ends[-1]] - self.cum_before[starts[-1]])
            nbytes_lanes[-1] = -(-total_before // w)
        expected = nbytes_lanes if dec.debug else np.zeros_like(nbytes_lanes)
        wrong = np.flatnonzero(marks != expected)
        if wrong.size:
            k = int(wrong[0])
            dec.violation(
                "lane_marks",
                f"the bundle has {int(marks[k])} LANE_MARKs; encode {with_or_without} debug "
                f"markers puts {int(expected[k])}",
                self.base + int(starts[k]),
            )
        j = np.arange(first_bundle, first_bundle + starts.size)
        want_chunks = int(np.count_nonzero(j % chunk == 0)) if dec.debug else 0
        if want_chunks != chunk_marks:
            dec.violation(
                "chunk_marks",
                f"{chunk_marks} CHUNK_MARKs where encode {with_or_without} debug markers puts "
                f"{want_chunks}",
                self.base + int(starts[0]),
            )
