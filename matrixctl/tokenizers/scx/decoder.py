"""The streaming decoder: token arrays in, byte arrays out, window by window.

Whole canonical bundles go through the kernel (`_bundles`), a window that is exactly what the
encoder makes of its bytes through `_fast`; anything else through `segment.check_segment`,
which finds and names the first problem.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from matrixctl.tokenizers.scx import lanes as scx_lanes
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.tokenizers.scx.config import Tokenizer
from matrixctl.tokenizers.scx.issues import Issue, fail
from matrixctl.tokenizers.scx.segment import check_segment

if TYPE_CHECKING:
    import numpy as np

DECODE_WINDOW = 1 << 17  # decoder work unit, in tokens (measured: 64K and 256K are slower)
PREAMBLE_TOKENS = 1 + scx_tokens.HASH_BYTES
TRAILER_TOKENS = 1 + 8


@dataclass
class _Tally:
    """A warning kind seen `count` times; the first occurrence is kept."""

    first: Issue
    count: int = 1


class Decoder:
    """Token arrays in, byte arrays out, window by window; strict inverse of `Encoder`."""

    # The bundle kernel is an accelerator only: off, every window goes through `_fast` and
    # `check_segment` (the equivalence tests compare both ways).
    use_bundle_kernel = True

    def __init__(self, tok: Tokenizer, *, strict_invertibility: bool = True) -> None:
        import numpy as np

        self.tok = tok
        self.codec = tok.codec
        self.strict = strict_invertibility
        self.buf = np.zeros(0, dtype="<u2")
        self.base = 0  # stream index of buf[0]
        self.phase = "config"
        self.bytes_out = 0
        self.bundles = 0
        self.in_shard = False
        self.shard_count = 0
        self.shards = 0
        self.closed_short = False
        self.padded = False
        self.debug: bool | None = None
        self.cursor = 0  # stream index of the next token to consume
        self._tallies: dict[str, _Tally] = {}
        self.max_bundle_tokens = 2 + tok.lanes * (tok.width + 1) + 2
        self.full_bundle_tokens = 2 + tok.lanes * tok.width  # the most a raw bundle takes
        self.carry_limit = self.max_bundle_tokens + 8

    # Warnings (lenient mode) and errors ----------------------------------------------------

    @property
    def warnings(self) -> list[Issue]:
        out = []
        for t in self._tallies.values():
            msg = t.first.message
            if t.count > 1:
                msg += f" ({t.count} times; the first is shown)"
            out.append(
                Issue(t.first.code, msg, t.first.byte_offset, t.first.token_index, t.first.context)
            )
        return out

    def violation(self, kind: str, message: str, index: int, count: int = 1, **ctx: Any) -> None:
        """A decodable but non-canonical stream: an error when strict, else a warning."""
        if self.strict:
            raise fail(
                scx_tokens.INVERTIBILITY_VIOLATION,
                message + " (strict_invertibility)",
                token_index=index,
                context=ctx,
            )
        tally = self._tallies.get(kind)
        if tally is None:
            ctx_s = {k: str(v) for k, v in ctx.items()}
            self._tallies[kind] = _Tally(
                Issue(
                    scx_tokens.INVERTIBILITY_VIOLATION, message, token_index=index, context=ctx_s
                ),
                count,
            )
        else:
            tally.count += count

    def token_name(self, token: int) -> str:
        return scx_tokens.token_name(token, self.codec.names)

    # Feeding ----------------------------------------------------------------------------

    def feed(self, tokens: np.ndarray) -> list[np.ndarray]:
        """Bytes decoded from the whole units (bundles, markers) `tokens` completes."""
        import numpy as np

        tokens = np.asarray(tokens)
        if tokens.dtype != np.dtype("<u2"):
            tokens = tokens.astype("<u2")
        out: list[np.ndarray] = []
        carry = self.buf.size
        if carry and tokens.size > DECODE_WINDOW:
            # The carry (the unfinished end of the last feed) is joined with the first window
            # of `tokens` only: joining all of them would copy every token once more.
            head = np.concatenate([self.buf, tokens[:DECODE_WINDOW]])
            used = self._windows(head, out)
            if used >= carry:
                buf = tokens[used - carry :]
            else:  # the head did not use up the carry (a problem is coming): join the rest
                buf = np.concatenate([head[used:], tokens[DECODE_WINDOW:]])
        else:
            buf = np.concatenate([self.buf, tokens]) if carry else tokens
        pos = self._windows(buf, out)
        self.buf = buf[pos:].copy()
        return out

    def _windows(self, buf: np.ndarray, out: list[np.ndarray]) -> int:
        """Decode `buf` window by window until a window uses nothing; return how many tokens
        were used."""
        pos = 0
        while pos < buf.size:
            end = min(buf.size, pos + DECODE_WINDOW)
            used = self._step(buf[pos:end], out, final=False)
            pos += used
            if used == 0:
                break
        return pos

    def finish(self) -> list[np.ndarray]:
        """Decode what is left and check that the stream ended where it may."""
        out: list[np.ndarray] = []
        if self.buf.size:
            used = self._step(self.buf, out, final=True)
            self.buf = self.buf[used:]
        end = self.cursor + self.buf.size
        if self.phase == "config":
            raise fail(
                scx_tokens.UNSUPPORTED_VERSION,
                "the stream ends before its TOK_CONFIG preamble (33 tokens) is complete",
                token_index=end,
            )
        if self.phase == "body":
            raise fail(
                scx_tokens.MISALIGNED_SHARD,
                "the stream ends without STREAM_END (truncated?)",
                token_index=end,
                context={"bytes_decoded": self.bytes_out},
            )
        if self.phase == "trailer":
            raise fail(
                scx_tokens.MISALIGNED_SHARD,
                "the stream ends inside its STREAM_END trailer (8 byte tokens)",
                token_index=end,
            )
        return out

    def _step(self, t: np.ndarray, out: list[np.ndarray], *, final: bool) -> int:
        """Consume what can be consumed from the front of `t`; return how many tokens."""
        if self.phase == "config":
            if t.size < PREAMBLE_TOKENS and not final:
                return 0
            self._preamble(t)
            self.phase = "body"
            return PREAMBLE_TOKENS + self._step(t[PREAMBLE_TOKENS:], out, final=final)
        if self.phase == "body":
            return self._body(t, out, final=final)
        if self.phase == "trailer":
            if t.size < TRAILER_TOKENS - 1:
                return 0
            self._trailer(t)
            self.phase = "done"
            return TRAILER_TOKENS - 1 + self._step(t[TRAILER_TOKENS - 1 :], out, final=final)
        if t.size:
            raise fail(
                scx_tokens.MISALIGNED_SHARD,
                f"{self.token_name(int(t[0]))} follows STREAM_END; nothing may",
                token_index=self.cursor,
            )
        return 0

    def _preamble(self, t: np.ndarray) -> None:
        import numpy as np

        first = int(t[0]) if t.size else None
        if first != scx_tokens.TOK_CONFIG:
            what = "nothing" if first is None else self.token_name(first)
            raise fail(
                scx_tokens.UNSUPPORTED_VERSION,
                f"not an SCX-TOK-V1 token stream: it starts with {what}, not TOK_CONFIG",
                token_index=0,
            )
        body = t[1:PREAMBLE_TOKENS]
        high = np.flatnonzero(body > 0xFF)
        if body.size < scx_tokens.HASH_BYTES or high.size:
            raise fail(
                scx_tokens.UNSUPPORTED_VERSION,
                "TOK_CONFIG must be followed by the 32 bytes of H_TOK as byte tokens",
                token_index=1 + int(high[0]) if high.size else t.size,
            )
        h = body.astype(np.uint8).tobytes()
        if h != self.tok.h_tok:
            raise fail(
                scx_tokens.UNSUPPORTED_VERSION,
                "the stream was made by another tokenizer config (its config hash differs)",
                token_index=1,
                context={"stream_h_tok": h.hex(), "h_tok": self.tok.h_tok.hex()},
            )
        self.cursor = PREAMBLE_TOKENS

    def _trailer(self, t: np.ndarray) -> None:
        import numpy as np

        body = t[: TRAILER_TOKENS - 1]
        high = np.flatnonzero(body > 0xFF)
        if high.size:
            raise fail(
                scx_tokens.MISALIGNED_SHARD,
                "STREAM_END must be followed by 8 byte tokens (the byte count)",
                token_index=self.cursor + int(high[0]),
            )
        (count,) = struct.unpack("<Q", body.astype(np.uint8).tobytes())
        if count != self.bytes_out:
            raise fail(
                scx_tokens.INVERTIBILITY_VIOLATION,
                f"STREAM_END says {count} bytes; the stream decodes to {self.bytes_out}",
                token_index=self.cursor - 1,
                context={"declared": count, "decoded": self.bytes_out},
            )
        self.cursor += TRAILER_TOKENS - 1

    def _body(self, t: np.ndarray, out: list[np.ndarray], *, final: bool) -> int:
        import numpy as np

        if self._bundle_window_ok() and not final and t.size:
            # Whole canonical bundles up to the last BUNDLE_END (looked for near the end) are
            # what the code below would accept for this cut: the kernel refuses any window
            # with another kind of token, which then takes the way below.
            tail = max(0, t.size - 2 * self.max_bundle_tokens)
            last = np.flatnonzero(t[tail:] == scx_tokens.BUNDLE_END)
            cut = tail + int(last[-1]) + 1 if last.size else 0
            # A window that must reach past the shard's end (it holds at least
            # cut / (N*W + 2) bundles) is not tried: it holds shard markers.
            fits = self.shard_count + cut // self.full_bundle_tokens <= self.tok.shard_bundles
            if cut and fits and self._bundles(t[:cut], out):
                return cut
        cls = self.codec.cls.take(t)
        stops = np.flatnonzero(cls >= scx_lanes.C_CONFIG)
        if stops.size:
            stop = int(stops[0])
            code = int(cls[stop])
            token = int(t[stop])
            is_end = code == scx_lanes.C_STREAM_END
            check_segment(self, t[:stop], out, complete=is_end, stop_token=token)
            index = self.cursor
            if is_end:
                if self.in_shard:
                    raise fail(
                        scx_tokens.MISALIGNED_SHARD,
                        f"STREAM_END inside shard {self.shards - 1} (no SHARD_END)",
                        token_index=index,
                    )
                self.cursor += 1
                self.phase = "trailer"
                return stop + 1 + self._step(t[stop + 1 :], out, final=final)
            if code == scx_lanes.C_ERROR:
                raise fail(
                    scx_tokens.ERROR_SENTINELS[token],
                    f"the stream holds the error sentinel {self.token_name(token)}: its producer "
                    "reported this error here",
                    token_index=index,
                )
            if code == scx_lanes.C_CONFIG:
                raise fail(
                    scx_tokens.INVALID_BUNDLE_BOUNDARY,
                    "TOK_CONFIG may only start the stream",
                    token_index=index,
                )
            raise fail(
                scx_tokens.UNKNOWN_TOKEN,
                f"token id 0x{token:04X} is not assigned (the registry's ids end at "
                f"0x{self.tok.rf.registry.max_id:04X})",
                token_index=index,
                context={"token": f"0x{token:04X}"},
            )
        if final:
            check_segment(self, t, out, complete=True)
            return t.size
        ends = np.flatnonzero(cls == scx_lanes.C_BEND)
        if not ends.size:
            if t.size > self.carry_limit:
                # No bundle is this long: find the exact error (or name the first token).
                check_segment(self, t, out, complete=False)
                raise fail(
                    scx_tokens.INVALID_BUNDLE_BOUNDARY,
                    f"no BUNDLE_END within {t.size} tokens",
                    token_index=self.cursor,
                )
            return 0
        cut = int(ends[-1]) + 1
        if not self._fast(t[:cut], cls[:cut], out):
            check_segment(self, t[:cut], out, complete=False)
        return cut

    def _bundle_window_ok(self) -> bool:
        return (
            self.use_bundle_kernel
            and self.debug is False
            and self.in_shard
            and not self.closed_short
            and not self.padded
        )

    def _bundles(self, t: np.ndarray, out: list[np.ndarray]) -> bool:
        """Accept `t` when it is whole canonical bundles that continue the current shard, in a
        stream without debug markers (the common case, `LaneCodec.decode_bundles`); anything
        else (shard markers, debug markers, a problem) goes to `_fast` and `check_segment`."""
        found = self.codec.decode_bundles(t)
        if found is None:
            return False
        data, nb = found
        if self.shard_count + nb > self.tok.shard_bundles:
            return False
        self.bundles += nb
        self.shard_count += nb
        self.bytes_out += int(data.size)
        out.append(data)
        self.cursor += t.size
        return True

    def _fast(self, t: np.ndarray, cls: np.ndarray, out: list[np.ndarray]) -> bool:
        """Accept `t` when it is exactly what the encoder makes of the bytes it holds.

        Equality with a fresh encoding proves structure, alignment and canonical form at once;
        anything else goes to `check_segment`, which finds and names the problem.
        """
        import numpy as np

        tok, codec = self.tok, self.codec
        debug = self.debug
        j0 = self.bundles
        s = tok.shard_bundles
        if debug is None or self.closed_short or self.padded:
            return False
        if self.in_shard != (j0 > 0) or (j0 and self.shard_count != (j0 - 1) % s + 1):
            return False  # pragma: no cover - the state always follows the bundle count
        if int(cls.max()) > (scx_lanes.FAST_MAX_DEBUG if debug else scx_lanes.FAST_MAX):
            return False
        length = codec.length.take(t)
        data_tokens = np.compress(length != 0, t)
        n_comp = int(np.count_nonzero(length > 1)) if tok.width > 1 else 0
        data = codec.expand_tokens(data_tokens, n_comp)
        bb = tok.bundle_bytes
        nb = data.size // bb
        if nb == 0 or data.size % bb:
            return False
        pos = 0

        def match(expected: np.ndarray | list[int]) -> bool:
            nonlocal pos
            size = len(expected)
            ok = pos + size <= t.size and bool(np.array_equal(t[pos : pos + size], expected))
            pos += size
            return ok

        if j0 and j0 % s == 0 and not match([scx_tokens.SHARD_END]):
            return False
        done = 0
        while done < nb:
            j = j0 + done
            if j % s == 0 and not match([scx_tokens.SHARD_START]):
                return False
            take = min(nb - done, s - j % s)
            part = data[done * bb : (done + take) * bb]
            if not match(codec.bundle_tokens(part, j, debug, tok.chunk_bundles)):
                return False
            done += take
            if done < nb and (j0 + done) % s == 0 and not match([scx_tokens.SHARD_END]):
                return False
        if pos != t.size:
            return False
        end = j0 + nb
        self.bundles = end
        self.in_shard = True
        self.shards = (end - 1) // s + 1
        self.shard_count = (end - 1) % s + 1
        self.bytes_out += int(data.size)
        out.append(data)
        self.cursor += t.size
        return True
