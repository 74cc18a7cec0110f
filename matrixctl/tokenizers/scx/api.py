"""The error-addressable SCX tokenizer API: a signed config, streaming encode and decode.

    tok = Tokenizer.load(registry_bytes, trusted_keys)     # UNSIGNED_REGISTRY unless signed
    resp = encode(tok, EncodeRequest(data, tok.h_tok))     # tokens, warnings, errors
    back = decode(tok, DecodeRequest(resp.tokens, tok.h_tok))

`Encoder` and `Decoder` do the same in bounded memory, block by block; they raise `ScxFailure`
(a FormatError carrying the spec's error object) at the first error and collect warnings.

The token stream grammar (docs/formats/scx.md, "Token stream"):

    stream  := TOK_CONFIG byte{32}  shard*  STREAM_END byte{8}
    shard   := SHARD_START  ([CHUNK_MARK] bundle)+  SHARD_END
    bundle  := BUNDLE_START lane{N} BUNDLE_END
             | BUNDLE_START lane{0..N-1} [[LANE_MARK] PAD_LANE byte{1..W-1}] BUNDLE_PAD BUNDLE_END
    lane    := [LANE_MARK] (composite | byte{W})

The 32 bytes after TOK_CONFIG are H_TOK; the 8 after STREAM_END the input's length (u64 LE).
Only the last bundle of a stream may be short (BUNDLE_PAD); every shard but the last holds
exactly S bundles. LANE_MARK and CHUNK_MARK appear only with emit_debug_markers.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl.errors import FormatError
from matrixctl.tokenizers.scx import lanes as ln
from matrixctl.tokenizers.scx import signing
from matrixctl.tokenizers.scx import tokens as tk
from matrixctl.tokenizers.scx.registry import RegistryFile, Signature, parse

if TYPE_CHECKING:
    import numpy as np

BLOCK_BYTES = 1 << 16  # encoder work unit: small enough for the kernels to stay in L2
DECODE_WINDOW = 1 << 17  # decoder work unit, in tokens (measured: 64K and 256K are slower)
PREAMBLE_TOKENS = 1 + tk.HASH_BYTES
TRAILER_TOKENS = 1 + 8


@dataclass(frozen=True)
class Issue:
    """The spec's Error object (and, with the same shape, a Warning)."""

    code: str
    message: str
    byte_offset: int | None = None
    token_index: int | None = None
    context: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        position: dict[str, int] = {}
        if self.byte_offset is not None:
            position["byte_offset"] = self.byte_offset
        if self.token_index is not None:
            position["token_index"] = self.token_index
        return {
            "code": self.code,
            "message": self.message,
            "position": position,
            "context": dict(self.context),
        }

    def where(self) -> str:
        if self.token_index is not None:
            return f"token[{self.token_index}]"
        if self.byte_offset is not None:
            return f"byte[{self.byte_offset}]"
        return ""


class ScxFailure(FormatError):
    """A FormatError that carries the spec's error object (exit code 1 on the command line)."""

    def __init__(self, issue: Issue, *, offset: int | None = None) -> None:
        where = issue.where() or None
        if offset is None and issue.byte_offset is not None:
            offset = issue.byte_offset
        super().__init__(issue.code, issue.message, offset=offset, field=where)
        self.issue = issue


def fail(code: str, message: str, **kw: Any) -> ScxFailure:
    ctx = {k: str(v) for k, v in kw.pop("context", {}).items()}
    return ScxFailure(Issue(code, message, context=ctx, **kw))


# The signed config ---------------------------------------------------------------------------


def authorize(rf: RegistryFile, trusted: Iterable[bytes]) -> Signature:
    """The signature that authorises `rf`: valid over H_TOK and by a trusted key.

    Raises UNSIGNED_REGISTRY (with what was found) when there is none.
    """
    trusted = list(trusted)
    h = rf.h_tok
    ctx = {"h_tok": h.hex(), "signatures": str(len(rf.signatures))}
    if not trusted:
        raise fail(
            tk.UNSIGNED_REGISTRY,
            "no trusted signing keys were given, so no signature can authorise this config",
            context=ctx,
        )
    if not rf.signatures:
        raise fail(tk.UNSIGNED_REGISTRY, "the registry carries no signature", context=ctx)
    broken = []
    for sig in rf.signatures:
        if sig.public_key not in trusted:
            continue
        if signing.valid(sig.public_key, sig.signature, h):
            return sig
        broken.append(sig.key_id)
    if broken:
        raise fail(
            tk.UNSIGNED_REGISTRY,
            f"the signature by trusted key {broken[0]} does not verify over the config hash "
            "(the registry or its alignment settings were changed after signing)",
            context={**ctx, "key_id": broken[0]},
        )
    ids = ", ".join(s.key_id for s in rf.signatures)
    raise fail(
        tk.UNSIGNED_REGISTRY,
        f"signed only by keys that are not trusted ({ids})",
        context={**ctx, "key_ids": ids},
    )


class Tokenizer:
    """A registry whose signature was checked, compiled for encoding and decoding."""

    def __init__(self, rf: RegistryFile, authority: Signature | None) -> None:
        self.rf = rf
        self.authority = authority
        self.h_tok = rf.h_tok
        self.codec = ln.LaneCodec(rf)
        law = rf.alignment
        self.width = rf.registry.lane_width
        self.lanes = law.bundle_lanes
        self.bundle_bytes = law.bundle_lanes * self.width
        self.chunk_bundles = law.chunk_bytes // self.bundle_bytes
        self.shard_bundles = law.shard_bundles
        self.pad_byte = rf.registry.pad_byte

    @classmethod
    def load(cls, data: Any, trusted: Iterable[bytes]) -> Tokenizer:
        rf = parse(data)
        return cls(rf, authorize(rf, trusted))

    @classmethod
    def unchecked(cls, rf: RegistryFile) -> Tokenizer:
        """A tokenizer without an authority check (tests, benchmarks, building registries)."""
        return cls(rf, None)

    def check_config_hash(self, config_hash: bytes, **position: int) -> None:
        if config_hash != self.h_tok:
            raise fail(
                tk.UNSUPPORTED_VERSION,
                "the request's config_hash is not this tokenizer's config hash (H_TOK)",
                context={"config_hash": config_hash.hex(), "h_tok": self.h_tok.hex()},
                **position,
            )


# Encoding ------------------------------------------------------------------------------------


class Encoder:
    """Bytes in, token arrays out, block by block (memory bounded by the block size)."""

    def __init__(
        self, tok: Tokenizer, *, strict_alignment: bool = False, emit_debug_markers: bool = False
    ) -> None:
        self.tok = tok
        self.strict = strict_alignment
        self.debug = emit_debug_markers
        self.carry = b""
        self.bytes_in = 0
        self.bundles = 0
        self.warnings: list[Issue] = []
        self.pad_bytes = 0  # PAD-BYTEs that complete the last bundle (0: none)
        self._started = False
        self._done = False
        self.block = max(1, BLOCK_BYTES // tok.bundle_bytes) * tok.bundle_bytes

    def _emit(self, arrays: list[np.ndarray], extra: list[int]) -> None:
        import numpy as np

        if extra:
            arrays.append(np.array(extra, dtype="<u2"))
            extra.clear()

    def feed(self, data: Any) -> list[np.ndarray]:
        """Tokens for the whole bundles completed by `data` (a bytes-like object)."""
        import numpy as np

        out: list[np.ndarray] = []
        pending: list[int] = []
        if not self._started:
            self._started = True
            pending += [tk.TOK_CONFIG, *self.tok.h_tok]
        view = memoryview(data).cast("B")
        self.bytes_in += len(view)
        bb = self.tok.bundle_bytes
        pos = 0
        if self.carry:
            need = bb - len(self.carry)
            if len(view) < need:
                self.carry += bytes(view)
                self._emit(out, pending)
                return out
            first = np.frombuffer(self.carry + bytes(view[:need]), dtype=np.uint8)
            self._bundles(first, out, pending)
            self.carry = b""
            pos = need
        whole = pos + (len(view) - pos) // bb * bb
        arr = np.frombuffer(view, dtype=np.uint8)
        for start in range(pos, whole, self.block):
            self._bundles(arr[start : min(start + self.block, whole)], out, pending)
        self.carry = bytes(view[whole:])
        self._emit(out, pending)
        return out

    def _bundles(self, data: np.ndarray, out: list[np.ndarray], pending: list[int]) -> None:
        self._emit(out, pending)
        out.extend(self.tokens_for(data, self.bundles))
        self.bundles += data.size // self.tok.bundle_bytes

    def tokens_for(self, data: np.ndarray, first_bundle: int) -> list[np.ndarray]:
        """Tokens of whole bundles starting at bundle `first_bundle` of the stream, with the
        SHARD_START / SHARD_END markers around them. A pure function of its arguments and the
        config, so blocks may be encoded in any order (or in parallel) and joined."""
        import numpy as np

        tok = self.tok
        bb = tok.bundle_bytes
        s = tok.shard_bundles
        nb = data.size // bb
        out: list[np.ndarray] = []
        done = 0
        while done < nb:
            j = first_bundle + done
            take = min(nb - done, s - j % s)
            if j % s == 0:
                out.append(np.array([tk.SHARD_START], dtype="<u2"))
            part = data[done * bb : (done + take) * bb]
            out.append(tok.codec.bundle_tokens(part, j, self.debug, tok.chunk_bundles))
            done += take
            if (first_bundle + done) % s == 0:
                out.append(np.array([tk.SHARD_END], dtype="<u2"))
        return out

    def finish(self) -> list[np.ndarray]:
        """The last (padded) bundle, the closing SHARD_END, STREAM_END and the byte count."""
        import numpy as np

        if self._done:
            return []
        self._done = True
        out = self.feed(b"") if not self._started else []
        pending: list[int] = []
        tok = self.tok
        if self.carry:
            at = self.bytes_in - len(self.carry)
            pad = tok.bundle_bytes - len(self.carry)
            if self.strict:
                raise fail(
                    tk.MISALIGNED_SHARD,
                    f"input is {self.bytes_in} bytes, not a multiple of the bundle size "
                    f"{tok.bundle_bytes}; strict_alignment refuses to pad the last "
                    f"{len(self.carry)} bytes",
                    byte_offset=at,
                    context={"bundle_bytes": tok.bundle_bytes, "input_bytes": self.bytes_in},
                )
            # Not a warning: padding is the alignment law's normal case and lossless
            # (STREAM_END has the byte count); strict_alignment refuses it (docs/formats/scx.md).
            self.pad_bytes = pad
            j = self.bundles
            if j % tok.shard_bundles == 0:
                pending.append(tk.SHARD_START)
            chunk_mark = self.debug and j % tok.chunk_bundles == 0
            pending += tok.codec.partial_bundle(self.carry, self.debug, chunk_mark)
            self.bundles += 1
            pending.append(tk.SHARD_END)
        elif self.bundles % tok.shard_bundles:
            pending.append(tk.SHARD_END)
        pending += [tk.STREAM_END, *struct.pack("<Q", self.bytes_in)]
        out.append(np.array(pending, dtype="<u2"))
        return out


# Decoding ------------------------------------------------------------------------------------

_INSIDE = [c in ln.INSIDE_OK for c in range(16)]
_OUTSIDE = [c in ln.OUTSIDE_OK for c in range(16)]


@dataclass
class _Tally:
    """A warning kind seen `count` times; the first occurrence is kept."""

    first: Issue
    count: int = 1


class Decoder:
    """Token arrays in, byte arrays out, window by window; strict inverse of `Encoder`."""

    # The bundle kernel is an accelerator only: off, every window goes through `_fast` and
    # `_segment` (the equivalence tests compare both ways).
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
        self._cursor = 0  # stream index of the next token to consume
        self._tallies: dict[str, _Tally] = {}
        self.inside = np.array(_INSIDE, dtype=bool)
        self.outside = np.array(_OUTSIDE, dtype=bool)
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

    def _violation(self, kind: str, message: str, index: int, count: int = 1, **ctx: Any) -> None:
        """A decodable but non-canonical stream: an error when strict, else a warning."""
        if self.strict:
            raise fail(
                tk.INVERTIBILITY_VIOLATION,
                message + " (strict_invertibility)",
                token_index=index,
                context=ctx,
            )
        tally = self._tallies.get(kind)
        if tally is None:
            ctx_s = {k: str(v) for k, v in ctx.items()}
            self._tallies[kind] = _Tally(
                Issue(tk.INVERTIBILITY_VIOLATION, message, token_index=index, context=ctx_s),
                count,
            )
        else:
            tally.count += count

    def _name(self, token: int) -> str:
        return tk.token_name(token, self.codec.names)

    # Feeding ----------------------------------------------------------------------------

    def feed(self, tokens: np.ndarray) -> list[np.ndarray]:
        """Bytes decoded from the whole units (bundles, markers) `tokens` completes."""
        import numpy as np

        tokens = np.asarray(tokens)
        if tokens.dtype != np.dtype("<u2"):
            tokens = tokens.astype("<u2")
        buf = np.concatenate([self.buf, tokens]) if self.buf.size else tokens
        out: list[np.ndarray] = []
        pos = 0
        while pos < buf.size:
            end = min(buf.size, pos + DECODE_WINDOW)
            used = self._step(buf[pos:end], out, final=False)
            pos += used
            if used == 0:
                break
        self.buf = buf[pos:].copy()
        return out

    def finish(self) -> list[np.ndarray]:
        """Decode what is left and check that the stream ended where it may."""
        out: list[np.ndarray] = []
        if self.buf.size:
            used = self._step(self.buf, out, final=True)
            self.buf = self.buf[used:]
        end = self._cursor + self.buf.size
        if self.phase == "config":
            raise fail(
                tk.UNSUPPORTED_VERSION,
                "the stream ends before its TOK_CONFIG preamble (33 tokens) is complete",
                token_index=end,
            )
        if self.phase == "body":
            raise fail(
                tk.MISALIGNED_SHARD,
                "the stream ends without STREAM_END (truncated?)",
                token_index=end,
                context={"bytes_decoded": self.bytes_out},
            )
        if self.phase == "trailer":
            raise fail(
                tk.MISALIGNED_SHARD,
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
                tk.MISALIGNED_SHARD,
                f"{self._name(int(t[0]))} follows STREAM_END; nothing may",
                token_index=self._cursor,
            )
        return 0

    def _preamble(self, t: np.ndarray) -> None:
        import numpy as np

        first = int(t[0]) if t.size else None
        if first != tk.TOK_CONFIG:
            what = "nothing" if first is None else self._name(first)
            raise fail(
                tk.UNSUPPORTED_VERSION,
                f"not an SCX-TOK-V1 token stream: it starts with {what}, not TOK_CONFIG",
                token_index=0,
            )
        body = t[1:PREAMBLE_TOKENS]
        high = np.flatnonzero(body > 0xFF)
        if body.size < tk.HASH_BYTES or high.size:
            raise fail(
                tk.UNSUPPORTED_VERSION,
                "TOK_CONFIG must be followed by the 32 bytes of H_TOK as byte tokens",
                token_index=1 + int(high[0]) if high.size else t.size,
            )
        h = body.astype(np.uint8).tobytes()
        if h != self.tok.h_tok:
            raise fail(
                tk.UNSUPPORTED_VERSION,
                "the stream was made by another tokenizer config (its config hash differs)",
                token_index=1,
                context={"stream_h_tok": h.hex(), "h_tok": self.tok.h_tok.hex()},
            )
        self._cursor = PREAMBLE_TOKENS

    def _trailer(self, t: np.ndarray) -> None:
        import numpy as np

        body = t[: TRAILER_TOKENS - 1]
        high = np.flatnonzero(body > 0xFF)
        if high.size:
            raise fail(
                tk.MISALIGNED_SHARD,
                "STREAM_END must be followed by 8 byte tokens (the byte count)",
                token_index=self._cursor + int(high[0]),
            )
        (count,) = struct.unpack("<Q", body.astype(np.uint8).tobytes())
        if count != self.bytes_out:
            raise fail(
                tk.INVERTIBILITY_VIOLATION,
                f"STREAM_END says {count} bytes; the stream decodes to {self.bytes_out}",
                token_index=self._cursor - 1,
                context={"declared": count, "decoded": self.bytes_out},
            )
        self._cursor += TRAILER_TOKENS - 1

    def _body(self, t: np.ndarray, out: list[np.ndarray], *, final: bool) -> int:
        import numpy as np

        if self._bundle_window_ok() and not final and t.size:
            # Whole canonical bundles up to the last BUNDLE_END (looked for near the end) are
            # what the code below would accept for this cut: the kernel refuses any window
            # with another kind of token, which then takes the way below.
            tail = max(0, t.size - 2 * self.max_bundle_tokens)
            last = np.flatnonzero(t[tail:] == tk.BUNDLE_END)
            cut = tail + int(last[-1]) + 1 if last.size else 0
            # A window that must reach past the shard's end (it holds at least
            # cut / (N*W + 2) bundles) is not tried: it holds shard markers.
            fits = self.shard_count + cut // self.full_bundle_tokens <= self.tok.shard_bundles
            if cut and fits and self._bundles(t[:cut], out):
                return cut
        cls = self.codec.cls.take(t)
        stops = np.flatnonzero(cls >= ln.C_CONFIG)
        if stops.size:
            stop = int(stops[0])
            code = int(cls[stop])
            token = int(t[stop])
            is_end = code == ln.C_STREAM_END
            self._segment(t[:stop], out, complete=is_end, stop_token=token)
            index = self._cursor
            if is_end:
                if self.in_shard:
                    raise fail(
                        tk.MISALIGNED_SHARD,
                        f"STREAM_END inside shard {self.shards - 1} (no SHARD_END)",
                        token_index=index,
                    )
                self._cursor += 1
                self.phase = "trailer"
                return stop + 1 + self._step(t[stop + 1 :], out, final=final)
            if code == ln.C_ERROR:
                raise fail(
                    tk.ERROR_SENTINELS[token],
                    f"the stream holds the error sentinel {self._name(token)}: its producer "
                    "reported this error here",
                    token_index=index,
                )
            if code == ln.C_CONFIG:
                raise fail(
                    tk.INVALID_BUNDLE_BOUNDARY,
                    "TOK_CONFIG may only start the stream",
                    token_index=index,
                )
            raise fail(
                tk.UNKNOWN_TOKEN,
                f"token id 0x{token:04X} is not assigned (the registry's ids end at "
                f"0x{self.tok.rf.registry.max_id:04X})",
                token_index=index,
                context={"token": f"0x{token:04X}"},
            )
        if final:
            self._segment(t, out, complete=True)
            return t.size
        ends = np.flatnonzero(cls == ln.C_BEND)
        if not ends.size:
            if t.size > self.carry_limit:
                # No bundle is this long: find the exact error (or name the first token).
                self._segment(t, out, complete=False)
                raise fail(
                    tk.INVALID_BUNDLE_BOUNDARY,
                    f"no BUNDLE_END within {t.size} tokens",
                    token_index=self._cursor,
                )
            return 0
        cut = int(ends[-1]) + 1
        if not self._fast(t[:cut], cls[:cut], out):
            self._segment(t[:cut], out, complete=False)
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
        else (shard markers, debug markers, a problem) goes to `_fast` and `_segment`."""
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
        self._cursor += t.size
        return True

    def _fast(self, t: np.ndarray, cls: np.ndarray, out: list[np.ndarray]) -> bool:
        """Accept `t` when it is exactly what the encoder makes of the bytes it holds.

        Equality with a fresh encoding proves structure, alignment and canonical form at once;
        anything else goes to `_segment`, which finds and names the problem.
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
        if int(cls.max()) > (ln.FAST_MAX_DEBUG if debug else ln.FAST_MAX):
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

        if j0 and j0 % s == 0 and not match([tk.SHARD_END]):
            return False
        done = 0
        while done < nb:
            j = j0 + done
            if j % s == 0 and not match([tk.SHARD_START]):
                return False
            take = min(nb - done, s - j % s)
            part = data[done * bb : (done + take) * bb]
            if not match(codec.bundle_tokens(part, j, debug, tok.chunk_bundles)):
                return False
            done += take
            if done < nb and (j0 + done) % s == 0 and not match([tk.SHARD_END]):
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
        self._cursor += t.size
        return True

    def _segment(
        self,
        t: np.ndarray,
        out: list[np.ndarray],
        *,
        complete: bool,
        stop_token: int | None = None,
    ) -> None:
        """Check and decode tokens that start outside any bundle.

        `complete`: the segment must end outside a bundle (a stop token or the end follows).
        """
        import numpy as np

        codec = self.codec
        base = self._cursor
        n = t.size
        if n == 0:
            return
        cls = codec.cls.take(t)
        is_s = cls == ln.C_BSTART
        is_e = cls == ln.C_BEND
        depth = np.cumsum(is_s.astype(np.int8) - is_e.astype(np.int8), dtype=np.int32)
        errors: list[tuple[int, ScxFailure]] = []
        limit = n

        def found(i: int, err: ScxFailure) -> None:
            nonlocal limit
            if i < limit:
                limit = i
                errors.append((i, err))

        bad = np.flatnonzero((depth < 0) | (depth > 1))
        if bad.size:
            i = int(bad[0])
            what = "BUNDLE_END without BUNDLE_START" if is_e[i] else "BUNDLE_START inside a bundle"
            found(i, fail(tk.INVALID_BUNDLE_BOUNDARY, what, token_index=base + i))
        before = depth - is_s + is_e
        inside = (before == 1) & ~is_e
        outside = (before == 0) & ~is_s
        misplaced = (inside & ~self.inside[cls]) | (outside & ~self.outside[cls])
        bad = np.flatnonzero(misplaced[:limit])
        if bad.size:
            i = int(bad[0])
            c = int(cls[i])
            name = self._name(int(t[i]))
            if inside[i]:
                code = tk.MISALIGNED_SHARD if c in ln.OUTSIDE_OK else tk.INVALID_BUNDLE_BOUNDARY
                found(i, fail(code, f"{name} inside a bundle", token_index=base + i))
            else:
                found(
                    i,
                    fail(
                        tk.INVALID_BUNDLE_BOUNDARY,
                        f"{name} outside any bundle (lanes live between BUNDLE_START and "
                        "BUNDLE_END)",
                        token_index=base + i,
                    ),
                )
        if complete and limit == n and depth[-1] != 0:
            opened = int(np.flatnonzero(is_s)[-1])
            what = "the stream ends" if stop_token is None else f"{self._name(stop_token)} comes"
            found(
                opened,
                fail(
                    tk.INVALID_BUNDLE_BOUNDARY,
                    f"the bundle opened here is not closed before {what}",
                    token_index=base + opened,
                ),
            )
        if not complete and limit == n and n > self.carry_limit and depth[-1] != 0:
            opened = int(np.flatnonzero(is_s)[-1])
            if n - opened > self.max_bundle_tokens:
                found(
                    opened,
                    fail(
                        tk.INVALID_BUNDLE_BOUNDARY,
                        f"no BUNDLE_END within {self.max_bundle_tokens} tokens of this "
                        "BUNDLE_START",
                        token_index=base + opened,
                    ),
                )
        length = codec.length.take(t)
        cum = np.cumsum(length, dtype=np.int32)  # windows are small: no overflow
        cum_before = cum - length
        starts = np.flatnonzero(is_s[:limit])
        ends = np.flatnonzero(is_e[:limit])
        nb = min(starts.size, ends.size)
        starts_c, ends_c = starts[:nb], ends[:nb]
        w, bb = self.tok.width, self.tok.bundle_bytes
        # Bundle sizes and padding.
        padded_pos = n if not self.padded else -1
        pads = np.flatnonzero(cls[:limit] == ln.C_BUNDLE_PAD)
        if pads.size:
            nxt = pads + 1
            ok = nxt < n
            ok[ok] = is_e[nxt[ok]]
            if not ok.all():
                i = int(pads[np.argmin(ok)])
                found(
                    i,
                    fail(
                        tk.INVALID_BUNDLE_BOUNDARY,
                        "BUNDLE_PAD must come right before BUNDLE_END",
                        token_index=base + i,
                    ),
                )
        if nb:
            nbytes = cum[ends_c] - cum[starts_c]
            padded = cls[ends_c - 1] == ln.C_BUNDLE_PAD
            wrong = np.where(padded, (nbytes < 1) | (nbytes >= bb), nbytes != bb)
            if wrong.any():
                k = int(np.argmax(wrong))
                i = int(ends_c[k])
                if padded[k]:
                    msg = (
                        f"a padded bundle holds {int(nbytes[k])} bytes; BUNDLE_PAD marks a "
                        f"bundle of 1..{bb - 1} bytes"
                    )
                else:
                    msg = (
                        f"the bundle holds {int(nbytes[k])} bytes; a bundle is {self.tok.lanes} "
                        f"lanes of {w} bytes ({bb})"
                    )
                found(i, fail(tk.INVALID_BUNDLE_BOUNDARY, msg, token_index=base + i))
            pk = np.flatnonzero(padded)
            if self.padded and starts.size:
                i = int(starts[0])
                found(
                    i,
                    fail(
                        tk.MISALIGNED_SHARD,
                        "a bundle follows a padded bundle; only the last bundle of a stream "
                        "is padded",
                        token_index=base + i,
                    ),
                )
            if pk.size:
                k = int(pk[0])
                padded_pos = int(ends_c[k])
                if k + 1 < starts.size:
                    i = int(starts[k + 1])
                    found(
                        i,
                        fail(
                            tk.MISALIGNED_SHARD,
                            "a bundle follows a padded bundle; only the last bundle of a stream "
                            "is padded",
                            token_index=base + i,
                        ),
                    )
                nbk = int(nbytes[k])
                lanes_here = np.flatnonzero(cls[starts_c[k] : ends_c[k]] == ln.C_PAD_LANE)
                if (nbk % w != 0) != bool(lanes_here.size):
                    found(
                        int(ends_c[k]),
                        fail(
                            tk.INVALID_BUNDLE_BOUNDARY,
                            f"a padded bundle of {nbk} bytes "
                            + ("needs" if nbk % w else "has no partial lane for")
                            + " a PAD_LANE",
                            token_index=base + int(ends_c[k]),
                        ),
                    )
        # PAD_LANE: at a lane boundary, then 1..W-1 byte tokens, then BUNDLE_PAD.
        for p in np.flatnonzero(cls[:limit] == ln.C_PAD_LANE)[:2].tolist():
            q = p + 1
            while q < n and cls[q] == ln.C_RAW and q - p < w:
                q += 1
            d = q - p - 1
            if cum_before[p] % w or not 1 <= d < w or q >= n or cls[q] != ln.C_BUNDLE_PAD:
                found(
                    p,
                    fail(
                        tk.INVALID_BUNDLE_BOUNDARY,
                        f"PAD_LANE must start a lane and be followed by 1..{w - 1} byte tokens "
                        "and BUNDLE_PAD",
                        token_index=base + p,
                    ),
                )
                break
        # Lanes: composites and LANE_MARKs start at lane boundaries.
        comp = np.flatnonzero((cls[:limit] == ln.C_COMP) | (cls[:limit] == ln.C_COMP_DEP))
        if w > 1 and comp.size:
            off = cum_before[comp] % w
            if off.any():
                i = int(comp[np.argmax(off != 0)])
                found(
                    i,
                    fail(
                        tk.INVALID_BUNDLE_BOUNDARY,
                        f"composite {self._name(int(t[i]))} starts at byte "
                        f"{int(cum_before[i] % w)} of a lane: a lane is one composite or {w} "
                        "byte tokens",
                        token_index=base + i,
                    ),
                )
        marks = np.flatnonzero(cls[:limit] == ln.C_LANE_MARK)
        if marks.size:
            nxt = marks + 1
            good = nxt < n
            nc = np.full(marks.size, ln.C_BEND, dtype=np.uint8)
            nc[good] = cls[nxt[good]]
            ok = ((cum_before[marks] % w) == 0) & (
                (nc == ln.C_RAW) | (nc == ln.C_COMP) | (nc == ln.C_COMP_DEP) | (nc == ln.C_PAD_LANE)
            )
            if not ok.all():
                i = int(marks[np.argmin(ok)])
                found(
                    i,
                    fail(
                        tk.INVALID_BUNDLE_BOUNDARY,
                        "LANE_MARK must come right before a lane",
                        token_index=base + i,
                    ),
                )
        # Shards and chunk marks: a small state machine over the few tokens between bundles.
        events = np.flatnonzero(outside[:limit] & (cls[:limit] != ln.C_BEND))
        before_ev = np.searchsorted(starts, events) if events.size else events
        state_bundles = 0  # bundles of this segment accounted for
        chunk_marks = 0

        def account(upto: int) -> None:
            nonlocal state_bundles
            count = upto - state_bundles
            if count <= 0:
                return
            first = int(starts[state_bundles])
            if not self.in_shard:
                found(
                    first,
                    fail(
                        tk.MISALIGNED_SHARD,
                        "a bundle outside any shard (SHARD_START ... SHARD_END)",
                        token_index=base + first,
                    ),
                )
            elif self.shard_count + count > self.tok.shard_bundles:
                over = state_bundles + self.tok.shard_bundles - self.shard_count
                i = int(starts[over])
                found(
                    i,
                    fail(
                        tk.MISALIGNED_SHARD,
                        f"shard {self.shards - 1} holds more than {self.tok.shard_bundles} "
                        "bundles (shard_bundles of the alignment law)",
                        token_index=base + i,
                    ),
                )
            self.shard_count += count
            self.bundles += count
            state_bundles = upto

        for p, nbefore in zip(events.tolist(), before_ev.tolist(), strict=True):
            if p >= limit:
                break
            account(min(nbefore, nb))
            if p >= limit:
                break
            c = int(cls[p])
            if c == ln.C_SHARD_START:
                if self.in_shard or self.closed_short or p > padded_pos:
                    if self.in_shard:
                        why = "inside a shard"
                    elif p > padded_pos:
                        why = "after the padded bundle, which ends the stream"
                    else:
                        why = (
                            "after a short shard (every shard but the last holds "
                            f"{self.tok.shard_bundles} bundles)"
                        )
                    found(p, fail(tk.MISALIGNED_SHARD, f"SHARD_START {why}", token_index=base + p))
                    break
                self.in_shard = True
                self.shard_count = 0
                self.shards += 1
            elif c == ln.C_SHARD_END:
                if not self.in_shard or self.shard_count == 0:
                    why = "outside any shard" if not self.in_shard else "closes an empty shard"
                    found(p, fail(tk.MISALIGNED_SHARD, f"SHARD_END {why}", token_index=base + p))
                    break
                if self.shard_count < self.tok.shard_bundles:
                    self.closed_short = True
                self.in_shard = False
            else:  # CHUNK_MARK
                j = self.bundles
                nxt_ok = p + 1 < n and is_s[p + 1]
                if not self.in_shard or not nxt_ok or j % self.tok.chunk_bundles:
                    found(
                        p,
                        fail(
                            tk.MISALIGNED_SHARD,
                            f"CHUNK_MARK must come right before bundle j with j a multiple of "
                            f"{self.tok.chunk_bundles} (chunk_bytes / bundle bytes), inside a "
                            f"shard; the next bundle is {j}",
                            token_index=base + p,
                        ),
                    )
                    break
                chunk_marks += 1
        first_bundle = self.bundles - state_bundles  # global index of this segment's bundle 0
        account(nb)
        if errors:
            raise min(errors, key=lambda e: e[0])[1]
        # Every check passed for [0, n): decode, then the canonical-form checks.
        if padded_pos < n:
            self.padded = True
        data_pos = np.flatnonzero(length)
        data_tokens = t.take(data_pos)
        data = codec.expand_tokens(data_tokens, comp.size)
        if data.size:
            out.append(data)
        self._canonical(
            t,
            cls,
            starts_c,
            ends_c,
            comp,
            data,
            data_pos,
            cum_before,
            first_bundle,
            chunk_marks,
            base,
        )
        self.bytes_out += int(data.size)
        self._cursor = base + n

    def _canonical(
        self,
        t: np.ndarray,
        cls: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        comp: np.ndarray,
        data: np.ndarray,
        data_pos: np.ndarray,
        cum_before: np.ndarray,
        first_bundle: int,
        chunk_marks: int,
        base: int,
    ) -> None:
        """Would `encode(decode(stream))` give these tokens back? Violations per strictness."""
        import numpy as np

        codec = self.codec
        w = self.tok.width
        # Composites: the encoder uses exactly the active composites, on every matching lane.
        whole = data.size // w * w
        if whole:
            want = codec.canonical_ids(data[:whole])
            have = np.zeros(whole // w, dtype=np.uint16)
            if comp.size:
                have[cum_before[comp] // w] = t[comp]
            diff = np.flatnonzero(want != have)
            if diff.size:
                lane = int(diff[0])
                idx = int(data_pos[np.searchsorted(cum_before[data_pos], lane * w)])
                got, use = self._name(int(have[lane])), self._name(int(want[lane]))
                if have[lane] and want[lane]:
                    msg = f"lane spelled {got}; encode uses {use}"
                elif have[lane]:
                    msg = f"composite {got} is deprecated; encode spells the lane raw"
                else:
                    msg = (
                        f"lane bytes {data[lane * w : lane * w + w].tobytes().hex()} are spelled "
                        f"raw; encode uses {self._name(int(want[lane]))}"
                    )
                self._violation("composite", msg, base + idx, int(diff.size))
        # Debug markers: all or nothing, decided by the stream's first bundle.
        if starts.size:
            lm = np.cumsum(cls == ln.C_LANE_MARK, dtype=np.int32)
            marks = lm[ends] - lm[starts]
            if self.debug is None:
                self.debug = bool(marks[0]) or (
                    starts[0] > 0 and int(cls[starts[0] - 1]) == ln.C_CHUNK_MARK
                )
            nbytes_lanes = np.full(starts.size, self.tok.lanes, dtype=np.int64)
            last_padded = cls[ends[-1] - 1] == ln.C_BUNDLE_PAD
            if last_padded:
                total_before = int(cum_before[ends[-1]] - cum_before[starts[-1]])
                nbytes_lanes[-1] = -(-total_before // w)
            expected = nbytes_lanes if self.debug else np.zeros_like(nbytes_lanes)
            wrong = np.flatnonzero(marks != expected)
            if wrong.size:
                k = int(wrong[0])
                self._violation(
                    "lane_marks",
                    f"the bundle has {int(marks[k])} LANE_MARKs; encode "
                    + ("with" if self.debug else "without")
                    + f" debug markers puts {int(expected[k])}",
                    base + int(starts[k]),
                )
            j = np.arange(first_bundle, first_bundle + starts.size)
            want_chunks = (
                int(np.count_nonzero(j % self.tok.chunk_bundles == 0)) if self.debug else 0
            )
            if want_chunks != chunk_marks:
                self._violation(
                    "chunk_marks",
                    f"{chunk_marks} CHUNK_MARKs where encode "
                    + ("with" if self.debug else "without")
                    + f" debug markers puts {want_chunks}",
                    base + int(starts[0]),
                )


# The API of the spec -------------------------------------------------------------------------


@dataclass(frozen=True)
class EncodeRequest:
    bytes: Any
    config_hash: bytes
    strict_alignment: bool = False
    emit_debug_markers: bool = False


@dataclass
class EncodeResponse:
    tokens: Any  # np.ndarray of uint16 (empty on failure)
    warnings: list[Issue] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)
    pad_bytes: int = 0  # PAD-BYTEs that complete the last bundle

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class DecodeRequest:
    tokens: Any
    config_hash: bytes
    strict_invertibility: bool = True


@dataclass
class DecodeResponse:
    bytes: bytes
    warnings: list[Issue] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


def _concat(parts: list[np.ndarray], dtype: str) -> np.ndarray:
    import numpy as np

    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def encode(tok: Tokenizer, req: EncodeRequest) -> EncodeResponse:
    """The spec's encode: tokens, or no tokens and a non-empty `errors` list."""
    import numpy as np

    enc = Encoder(
        tok, strict_alignment=req.strict_alignment, emit_debug_markers=req.emit_debug_markers
    )
    try:
        tok.check_config_hash(req.config_hash, byte_offset=0)
        parts = enc.feed(req.bytes)
        parts += enc.finish()
    except ScxFailure as err:
        return EncodeResponse(np.zeros(0, dtype="<u2"), enc.warnings, [err.issue])
    return EncodeResponse(_concat(parts, "<u2"), enc.warnings, [], enc.pad_bytes)


def decode(tok: Tokenizer, req: DecodeRequest) -> DecodeResponse:
    """The spec's decode: bytes, or no bytes and a non-empty `errors` list."""
    import numpy as np

    dec = Decoder(tok, strict_invertibility=req.strict_invertibility)
    try:
        tok.check_config_hash(req.config_hash, token_index=0)
        parts = dec.feed(np.asarray(req.tokens, dtype=np.int64).astype("<u2", casting="unsafe"))
        parts += dec.finish()
    except ScxFailure as err:
        return DecodeResponse(b"", dec.warnings, [err.issue])
    return DecodeResponse(_concat(parts, "u1").tobytes(), dec.warnings, [])


def encode_bytes(tok: Tokenizer, data: bytes, **options: bool) -> np.ndarray:
    """encode() that raises ScxFailure instead of returning errors (tests, tools)."""
    enc = Encoder(tok, **options)
    parts = enc.feed(data)
    parts += enc.finish()
    return _concat(parts, "<u2")


def iter_decode(
    tok: Tokenizer, chunks: Iterable[np.ndarray], *, strict: bool = True
) -> Iterator[np.ndarray]:
    dec = Decoder(tok, strict_invertibility=strict)
    for chunk in chunks:
        yield from dec.feed(chunk)
    yield from dec.finish()


def encode_chunks(
    tok: Tokenizer,
    chunks: Iterable[Any],
    *,
    jobs: int = 1,
    strict_alignment: bool = False,
    emit_debug_markers: bool = False,
    warnings: list[Issue] | None = None,
    padding: list[int] | None = None,
) -> Iterator[np.ndarray]:
    """Encode a stream of byte chunks; with `jobs` > 1, blocks are encoded by a thread pool
    (the compiled kernel releases the GIL while it encodes) and joined in input order: the
    same tokens. `warnings` and `padding` (the PAD-BYTEs that complete the last bundle) are
    filled in at the end."""
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    import numpy as np

    enc = Encoder(tok, strict_alignment=strict_alignment, emit_debug_markers=emit_debug_markers)
    try:
        if jobs <= 1:
            for chunk in chunks:
                yield from enc.feed(chunk)
            yield from enc.finish()
            return
        bb = tok.bundle_bytes
        enc._started = True
        yield np.array([tk.TOK_CONFIG, *tok.h_tok], dtype="<u2")
        carry = b""
        queue: deque[Future[list[np.ndarray]]] = deque()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for piece in chunks:
                chunk = bytes(piece)
                data = carry + chunk
                whole = len(data) // bb * bb
                if whole:
                    arr = np.frombuffer(data, dtype=np.uint8, count=whole)
                    queue.append(pool.submit(enc.tokens_for, arr, enc.bundles))
                    enc.bundles += whole // bb
                carry = data[whole:]
                enc.bytes_in += len(chunk)
                while len(queue) > 2 * jobs:
                    yield from queue.popleft().result()
            while queue:
                yield from queue.popleft().result()
        enc.carry = carry
        yield from enc.finish()
    finally:
        if warnings is not None:
            warnings.extend(enc.warnings)
        if padding is not None:
            padding.append(enc.pad_bytes)


def load_config(registry_path: str, trust_paths: list[str] | None) -> tuple[Tokenizer, bytes]:
    """Read a registry file, check its signature against the trusted keys, compile it.

    `trust_paths` are trust files (None: MATRIXCTL_SCX_TRUST). No trusted key, or no valid
    signature by one, is UNSIGNED_REGISTRY.
    """
    from matrixctl.io import Source

    paths = trust_paths if trust_paths else signing.trust_from_env()
    with Source.open(registry_path) as src:
        data = bytes(src.buf[: src.size])
    try:
        rf = parse(data)
    except FormatError as err:
        raise err.with_path(registry_path) from None
    keys = signing.load_trust(paths or [])
    try:
        authority = authorize(rf, keys)
    except ScxFailure as err:
        err.path = registry_path
        if not keys:
            err.hint = f"name trusted signing keys with --trust FILE (or {signing.TRUST_ENV})"
        raise
    return Tokenizer(rf, authority), data


def decode_token_stream(
    tok: Tokenizer,
    fp: Any,
    out: Any,
    *,
    strict: bool = True,
    tick: Any = None,
    name: str = "<stdin>",
) -> dict[str, Any]:
    """Decode an MXTOKENS token stream read from `fp` into `out` (a binary file).

    Errors name the token index and, where known, the byte offset of that token in the input.
    """
    import numpy as np

    from matrixctl.formats import token_stream as ts
    from matrixctl.io import read_exact

    head = read_exact(fp, ts.HEADER_SIZE, "token stream header", offset=0)
    if not head.startswith(ts.MAGIC):
        raise FormatError(
            "UNKNOWN_FORMAT",
            f"not a matrixctl token stream (MXTOKENS): {head[:8]!r}",
            path=name,
            offset=0,
        )
    header = ts.StreamHeader.parse(head)
    dec = Decoder(tok, strict_invertibility=strict)
    frames: list[tuple[int, int]] = []  # (first token index, byte offset of its ids)
    tokens = 0
    written = 0

    def where(err: ScxFailure) -> ScxFailure:
        idx = err.issue.token_index
        if idx is not None and frames:
            import bisect

            k = bisect.bisect_right([f[0] for f in frames], idx) - 1
            if k >= 0:
                first, off = frames[k]
                err.offset = off + (idx - first) * header.itemsize
        err.path = name
        return err

    try:
        for event in ts.iter_events(_Ticking(fp, tick), header):
            if event.kind != ts.KIND_TOKENS:
                continue
            ids = event.tokens
            if ids.dtype != np.dtype("<u2"):
                high = np.flatnonzero(ids > 0xFFFF)
                if high.size:
                    i = tokens + int(high[0])
                    raise fail(
                        tk.UNKNOWN_TOKEN,
                        f"token id {int(ids[high[0]])} does not fit SCX's u16 token space",
                        token_index=i,
                    )
                ids = ids.astype("<u2")
            frames.append((tokens, event.offset + ts.FRAME_SIZE))
            tokens += ids.size
            for part in dec.feed(ids):
                out.write(part.data)
                written += part.size
        for part in dec.finish():
            out.write(part.data)
            written += part.size
    except ScxFailure as err:
        raise where(err) from None
    except FormatError as err:
        raise err.with_path(name) from None
    return {"tokens": tokens, "bytes": written, "warnings": dec.warnings}


class _Ticking:
    def __init__(self, fp: Any, tick: Any) -> None:
        self._fp = fp
        self._tick = tick

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._fp.read(n)
        if self._tick:
            self._tick(len(data))
        return data
