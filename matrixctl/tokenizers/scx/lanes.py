"""One config's lane tables: lane lookup, bundle encoding, token classes and byte expansion.

Lane lookup, the encoding of whole bundles and the decoding of whole canonical bundles run in
the compiled kernel (matrixctl/_scx_kernel.c: a direct table for lanes of 1 or 2 bytes, a hash
table keyed by the lane's little-endian integer above; the GIL is released, so encode threads
run in parallel). The token classes and the byte expansion of data tokens, which the decoder's
checking paths use, are numpy tables. Nothing here loops over bytes or tokens in Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from matrixctl import _scx_kernel
from matrixctl.tokenizers.scx import tokens as scx_tokens
from matrixctl.tokenizers.scx.registry import RegistryFile

if TYPE_CHECKING:
    import numpy as np

# Token classes for the decoder (u8). Classes from C_ERROR up stop a stream.
C_RAW = 0
C_COMP = 1
C_BSTART = 2
C_BEND = 3
C_SHARD_START = 4
C_SHARD_END = 5
C_LANE_MARK = 6
C_CHUNK_MARK = 7
C_COMP_DEP = 8
C_PAD_LANE = 9
C_BUNDLE_PAD = 10
C_CONFIG = 11
C_STREAM_END = 12
C_ERROR = 13
C_UNKNOWN = 14
# The classes a canonical stream's full bundles and shard markers use (the decoder's fast
# path), without and with debug markers.
FAST_MAX = C_SHARD_END
FAST_MAX_DEBUG = C_CHUNK_MARK

INSIDE_OK = (C_RAW, C_COMP, C_COMP_DEP, C_PAD_LANE, C_LANE_MARK, C_BUNDLE_PAD)
OUTSIDE_OK = (C_SHARD_START, C_SHARD_END, C_CHUNK_MARK)


class LaneCodec:
    """The compiled tables of one config: encode lanes to tokens, classify and expand tokens."""

    def __init__(self, rf: RegistryFile) -> None:
        import numpy as np

        reg = rf.registry
        self.width = w = reg.lane_width
        self.lanes = n = rf.alignment.bundle_lanes
        self.bundle_bytes = n * w
        self.pad_byte = reg.pad_byte
        self.n_active = sum(1 for c in reg.composites if not c.deprecated)
        # Decoder tables.
        cls = np.full(scx_tokens.TOKEN_LIMIT, C_UNKNOWN, dtype=np.uint8)
        cls[:256] = C_RAW
        for tid, c in (
            (scx_tokens.BUNDLE_START, C_BSTART),
            (scx_tokens.BUNDLE_END, C_BEND),
            (scx_tokens.PAD_LANE, C_PAD_LANE),
            (scx_tokens.LANE_MARK, C_LANE_MARK),
            (scx_tokens.BUNDLE_PAD, C_BUNDLE_PAD),
            (scx_tokens.SHARD_START, C_SHARD_START),
            (scx_tokens.SHARD_END, C_SHARD_END),
            (scx_tokens.CHUNK_MARK, C_CHUNK_MARK),
            (scx_tokens.TOK_CONFIG, C_CONFIG),
            (scx_tokens.STREAM_END, C_STREAM_END),
        ):
            cls[tid] = c
        for tid in scx_tokens.ERROR_SENTINELS:
            cls[tid] = C_ERROR
        expand = np.zeros((scx_tokens.TOKEN_LIMIT, w), dtype=np.uint8)
        expand[:256, 0] = np.arange(256, dtype=np.uint8)
        for comp in reg.composites:
            cls[comp.token_id] = C_COMP_DEP if comp.deprecated else C_COMP
            expand[comp.token_id] = np.frombuffer(comp.pattern, dtype=np.uint8)
        self.cls = cls
        self.expand = expand
        self.expand_void = expand.view(f"V{w}").reshape(-1)
        length = np.zeros(scx_tokens.TOKEN_LIMIT, dtype=np.uint8)
        length[:256] = 1
        length[(cls == C_COMP) | (cls == C_COMP_DEP)] = w
        self.length = length
        self.names = {c.token_id: c.semantics for c in reg.composites}
        # The kernel's tables: the active composites are the ids of class C_COMP.
        active = (cls == C_COMP).view(np.uint8)
        self.kernel = _scx_kernel.Codec(w, n, expand.tobytes(), active.tobytes())

    # Encoding --------------------------------------------------------------------------------

    def bundle_tokens(
        self,
        data: np.ndarray,
        first_bundle: int,
        debug: bool,
        chunk_bundles: int,
        shard_bundles: int = 0,
    ) -> np.ndarray:
        """Tokens of whole bundles, the first of which is bundle `first_bundle` of the stream:
        `data` holds a multiple of N*W bytes. With `shard_bundles`, SHARD_START comes before
        every bundle j with j % shard_bundles == 0 and SHARD_END after every bundle j with
        (j + 1) % shard_bundles == 0; 0: no shard markers."""
        return self.bundle_blocks(data, first_bundle, debug, chunk_bundles, shard_bundles, 0)[0]

    def bundle_blocks(
        self,
        data: np.ndarray,
        first_bundle: int,
        debug: bool,
        chunk_bundles: int,
        shard_bundles: int,
        block_bundles: int,
    ) -> list[np.ndarray]:
        """`bundle_tokens` cut after every `block_bundles` bundles (0: one array), all made in
        one kernel call (the GIL released once)."""
        import numpy as np

        # Pooled blocks, written in place and reused once their arrays are gone (encode_blocks)
        blocks: list[Any] = self.kernel.encode_blocks(
            data, first_bundle, debug, chunk_bundles, shard_bundles, block_bundles
        )
        return [np.frombuffer(raw, dtype="<u2") for raw in blocks]

    def partial_bundle(self, tail: bytes, debug: bool, chunk_mark: bool) -> list[int]:
        """Tokens of the final, short bundle: whole lanes, then PAD_LANE and the partial lane."""
        w = self.width
        whole = len(tail) // w * w
        out: list[int] = [scx_tokens.CHUNK_MARK] if chunk_mark else []
        out.append(scx_tokens.BUNDLE_START)
        ids = memoryview(self.kernel.lookup(tail[:whole])).cast("H")
        for lane, tid in enumerate(ids):
            if debug:
                out.append(scx_tokens.LANE_MARK)
            if tid:
                out.append(tid)
            else:
                out.extend(tail[lane * w : lane * w + w])
        if whole < len(tail):
            if debug:
                out.append(scx_tokens.LANE_MARK)
            out.append(scx_tokens.PAD_LANE)
            out.extend(tail[whole:])
        out += [scx_tokens.BUNDLE_PAD, scx_tokens.BUNDLE_END]
        return out

    # Decoding --------------------------------------------------------------------------------

    def expand_tokens(self, data_tokens: np.ndarray, n_comp: int) -> np.ndarray:
        """The bytes of data tokens (RAW_BYTE and composites), in order."""
        import numpy as np

        if n_comp == 0 or self.width == 1:
            if self.width == 1:
                return self.expand[:, 0].take(data_tokens)
            return data_tokens.astype(np.uint8)
        rows = self.expand_void.take(data_tokens).view(np.uint8).reshape(-1, self.width)
        keep = np.empty(rows.shape, dtype=bool)
        keep[:, 0] = True
        keep[:, 1:] = (self.length.take(data_tokens) > 1)[:, None]
        return np.compress(keep.reshape(-1), rows.reshape(-1))

    def canonical_ids(self, data: np.ndarray) -> np.ndarray:
        """For whole lanes of `data`: the active composite id the encoder would use, or 0."""
        import numpy as np

        return np.frombuffer(self.kernel.lookup(data), dtype="<u2")

    def decode_bundles(self, t: np.ndarray) -> tuple[np.ndarray, int] | None:
        """The bytes of `t` and its bundle count when `t` is exactly whole bundles in canonical
        form without debug markers: BUNDLE_START, N lanes, BUNDLE_END, again and again, every
        lane the active composite of its bytes or, when it has none, its W byte tokens. None
        for anything else (the caller then finds and names the problem the slow way). One pass
        in the kernel; a deprecated or unassigned id, a byte lane that has an active composite
        or a composite whose pattern another composite owns is not canonical."""
        import numpy as np

        found = self.kernel.decode(np.ascontiguousarray(t, dtype="<u2"))
        if found is None:
            return None
        data, nb = found
        return np.frombuffer(data, dtype=np.uint8), nb
