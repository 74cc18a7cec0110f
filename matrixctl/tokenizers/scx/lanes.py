"""Vectorized numpy kernels: lane lookup, bundle assembly, token classes and byte expansion.

Nothing here loops over bytes or tokens in Python. A lane of W bytes is read as one integer key
(little-endian: byte 0 is the low byte). Lanes of 1 or 2 bytes look their slots up in a direct
table; wider lanes go through a one-probe hash table (`Probe`: one gather for the slot, one to
check the key) built for registries of up to PROBE_MAX composites, backed by a two-choice cuckoo
hash table (exact for any number of composites) for the keys whose slot is shared.

Encoder slots: every lane becomes W u16 slots. A raw lane is its W bytes (the RAW_BYTE ids); a
composite lane is its id followed by W-1 SKIP slots. Rows of slots get BUNDLE_START and
BUNDLE_END columns and the SKIPs are squeezed out in one compaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from matrixctl.tokenizers.scx import tokens as tk
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

# Odd 64-bit multipliers for the cuckoo hash (fixed, so table layout is deterministic).
MULTIPLIERS = (
    0x9E3779B97F4A7C15,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0xD6E8FEB86659FD93,
    0xFF51AFD7ED558CCD,
    0xC4CEB9FE1A85EC53,
    0x94D049BB133111EB,
    0xBF58476D1CE4E5B9,
)


# More odd multipliers for the one-probe table, from the splitmix64 sequence (fixed seed, so the
# table layout is deterministic).
def _splitmix(count: int) -> tuple[int, ...]:
    out, x, mask = [], 0x5CA1AB1E, (1 << 64) - 1
    for _ in range(count):
        x = (x + 0x9E3779B97F4A7C15) & mask
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append((z ^ (z >> 31)) | 1)
    return tuple(out)


PROBE_MULTIPLIERS = _splitmix(64)
PROBE_MAX = 4096  # composites; above this the cuckoo table alone answers
PROBE_MIN_BITS = 12
PROBE_MAX_BITS = 20
PROBE_SHARED = 1  # a slot id that no composite has: several keys hash to this slot

# The three SKIP slots after a composite id, packed above it in a u64 of four u16 slots.
COMPOSITE_SKIPS_4 = tk.SKIP << 16 | tk.SKIP << 32 | tk.SKIP << 48


def key_dtype(width: int) -> str:
    return "<u4" if width <= 4 else "<u8"


def lane_keys(lanes: np.ndarray, width: int) -> np.ndarray:
    """Integer keys of lanes (`lanes`: uint8, shape (n, width), C-contiguous): u32 for lanes of
    up to 4 bytes, u64 above."""
    import numpy as np

    dtype = np.dtype(key_dtype(width))
    if width in (4, 8):
        return lanes.reshape(-1).view(dtype)
    keys = lanes[:, 0].astype(dtype)
    for i in range(1, width):
        keys |= lanes[:, i].astype(dtype) << dtype.type(8 * i)
    return keys


def pattern_key(pattern: bytes) -> int:
    return int.from_bytes(pattern, "little")


@dataclass
class Cuckoo:
    """Two tables of 2**bits slots; a key sits at h1(key) in table 1 or at h2(key) in table 2.

    h(key) = (key * multiplier mod 2**kbits) >> (kbits - bits), with kbits = 32 for keys of
    lanes up to 4 bytes and 64 above (multiplicative hashing in the key's own width).
    """

    bits: int
    kbits: int
    m1: int
    m2: int
    keys1: np.ndarray
    ids1: np.ndarray
    keys2: np.ndarray
    ids2: np.ndarray

    @classmethod
    def build(cls, items: dict[int, int], width: int) -> Cuckoo:
        import numpy as np

        kbits = 32 if width <= 4 else 64
        dtype = key_dtype(width)
        bits = max(4, (2 * max(1, len(items)) - 1).bit_length())
        mask = (1 << kbits) - 1
        pairs = [
            (MULTIPLIERS[i] & mask | 1, MULTIPLIERS[j] & mask | 1)
            for i in range(8)
            for j in range(8)
            if i != j
        ]
        while True:
            for m1, m2 in pairs:
                tables = _cuckoo_insert(items, bits, kbits, m1, m2)
                if tables is not None:
                    k1, i1, k2, i2 = tables
                    return cls(
                        bits,
                        kbits,
                        m1,
                        m2,
                        np.array(k1, dtype=dtype),
                        np.array(i1, dtype=np.uint16),
                        np.array(k2, dtype=dtype),
                        np.array(i2, dtype=np.uint16),
                    )
            bits += 1  # pragma: no cover - 56 multiplier pairs at load <= 1/2 do not all fail

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The id for each key, 0 where the key is not in the table."""
        import numpy as np

        kt = keys.dtype.type
        shift = kt(self.kbits - self.bits)
        h1 = np.multiply(keys, kt(self.m1))
        h1 >>= shift
        h2 = np.multiply(keys, kt(self.m2))
        h2 >>= shift
        # A key sits in at most one table; an empty slot (key 0, id 0) that "matches" key 0
        # contributes id 0, so OR-ing the two answers is exact.
        ids: np.ndarray = np.where(self.keys1.take(h1) == keys, self.ids1.take(h1), 0)
        ids |= np.where(self.keys2.take(h2) == keys, self.ids2.take(h2), 0)
        return ids


@dataclass
class Probe:
    """A one-probe hash table in front of the cuckoo table: slot(key) = (key * mult mod
    2**kbits) >> (kbits - bits); `ids[slot]` is the only composite whose key hashes there (0: none,
    PROBE_SHARED: several, the cuckoo table answers), and `keys[id]` is that composite's key, so
    a lookup is two gathers and a compare. Built with 2**bits >= n**2 / 4 slots and the first
    multiplier that gives every key a slot of its own (almost always one exists)."""

    bits: int
    kbits: int
    mult: int
    ids: np.ndarray
    keys: np.ndarray
    shared: bool
    backup: Cuckoo

    @classmethod
    def build(
        cls,
        items: dict[int, int],
        width: int,
        backup: Cuckoo,
        *,
        min_bits: int = PROBE_MIN_BITS,
        max_bits: int = PROBE_MAX_BITS,
    ) -> Probe | None:
        import numpy as np

        if not items or len(items) > PROBE_MAX:
            return None
        kbits = 32 if width <= 4 else 64
        dtype = np.dtype(key_dtype(width))
        kt = dtype.type
        mask = (1 << kbits) - 1
        keys = np.array(sorted(items), dtype=dtype)
        ids = np.array([items[int(k)] for k in keys], dtype=np.uint16)
        n = keys.size
        bits = min(max_bits, max(min_bits, (n * n // 4).bit_length()))
        best: tuple[int, int, int, np.ndarray] | None = None
        for size in range(bits, max_bits + 1):
            for mult in PROBE_MULTIPLIERS:
                slots = np.multiply(keys, kt(mult & mask)) >> kt(kbits - size)
                clashes = n - int(np.unique(slots).size)
                if best is None or clashes < best[0]:
                    best = (clashes, size, mult & mask, slots)
                if clashes == 0:
                    break
            if best is not None and best[0] == 0:
                break
        assert best is not None
        clashes, bits, mult, slots = best
        table = np.zeros(1 << bits, dtype=np.uint16)
        table[slots] = ids
        if clashes:
            counts = np.bincount(slots.astype(np.intp), minlength=1 << bits)
            table[counts > 1] = PROBE_SHARED
        by_id = np.zeros(int(ids.max()) + 1, dtype=dtype)
        by_id[ids] = keys
        return cls(bits, kbits, mult, table, by_id, bool(clashes), backup)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The id for each key, 0 where the key is not in the table (the cuckoo table's answer)."""
        import numpy as np

        kt = keys.dtype.type
        slot = np.multiply(keys, kt(self.mult))
        slot >>= kt(self.kbits - self.bits)
        cand = self.ids.take(slot)
        again = np.flatnonzero(cand == PROBE_SHARED) if self.shared else None
        # keys[0] is 0: a key 0 in an empty slot "matches" id 0, which means "not found".
        cand *= self.keys.take(cand) == keys
        if again is not None and again.size:
            cand[again] = self.backup.lookup(keys.take(again))
        return cand


def _hash(key: int, mult: int, bits: int, kbits: int) -> int:
    return ((key * mult) & ((1 << kbits) - 1)) >> (kbits - bits)


def _cuckoo_insert(
    items: dict[int, int], bits: int, kbits: int, m1: int, m2: int
) -> tuple[list[int], list[int], list[int], list[int]] | None:
    size = 1 << bits
    keys = [[0] * size, [0] * size]
    ids = [[0] * size, [0] * size]
    mults = (m1, m2)
    for key, tid in sorted(items.items()):
        cur_key, cur_id, side = key, tid, 0
        for _ in range(64):
            slot = _hash(cur_key, mults[side], bits, kbits)
            if ids[side][slot] == 0:
                keys[side][slot], ids[side][slot] = cur_key, cur_id
                break
            keys[side][slot], cur_key = cur_key, keys[side][slot]
            ids[side][slot], cur_id = cur_id, ids[side][slot]
            side ^= 1
        else:
            return None
    # An empty slot holds key 0 and id 0; a lookup of key 0 then finds id 0, "no composite".
    return keys[0], ids[0], keys[1], ids[1]


def _drop_ends(a: np.ndarray, rows: int, width: int, head: int, keep: int) -> np.ndarray:
    """Items head .. head + keep of each of the `rows` rows of `width` items of `a`, as one
    contiguous array: one copy of `rows` runs (a 2-D slice copies item by item, slowly)."""
    import numpy as np

    runs = a.reshape(rows, width)[:, head : head + keep]
    out = runs.view(np.dtype((np.void, keep * a.itemsize))).copy()
    return out.view(a.dtype).reshape(-1)


class LaneCodec:
    """The compiled tables of one config: encode lanes to slots, classify and expand tokens."""

    def __init__(self, rf: RegistryFile) -> None:
        import numpy as np

        reg = rf.registry
        self.width = w = reg.lane_width
        self.lanes = n = rf.alignment.bundle_lanes
        self.bundle_bytes = n * w
        self.pad_byte = reg.pad_byte
        active = {c.pattern: c.token_id for c in reg.composites if not c.deprecated}
        self.n_active = len(active)
        self._direct: np.ndarray | None = None
        self._cuckoo: Cuckoo | None = None
        self._probe: Probe | None = None
        if w <= 2:
            # Slot table: the W u16 slots of every possible lane, packed in one integer.
            keys = np.arange(1 << (8 * w), dtype=np.uint32)
            if w == 1:
                table = keys.astype("<u2")
                for pat, tid in active.items():
                    table[pat[0]] = tid
            else:
                table = ((keys & 0xFF) | ((keys >> 8) << 16)).astype("<u4")
                for pat, tid in active.items():
                    table[pattern_key(pat)] = tid | (tk.SKIP << 16)
            self._direct = table
        elif active:
            items = {pattern_key(p): t for p, t in active.items()}
            self._cuckoo = Cuckoo.build(items, w)
            self._probe = Probe.build(items, w, self._cuckoo)
        # Decoder tables.
        cls = np.full(tk.TOKEN_LIMIT, C_UNKNOWN, dtype=np.uint8)
        cls[:256] = C_RAW
        for tid, c in (
            (tk.BUNDLE_START, C_BSTART),
            (tk.BUNDLE_END, C_BEND),
            (tk.PAD_LANE, C_PAD_LANE),
            (tk.LANE_MARK, C_LANE_MARK),
            (tk.BUNDLE_PAD, C_BUNDLE_PAD),
            (tk.SHARD_START, C_SHARD_START),
            (tk.SHARD_END, C_SHARD_END),
            (tk.CHUNK_MARK, C_CHUNK_MARK),
            (tk.TOK_CONFIG, C_CONFIG),
            (tk.STREAM_END, C_STREAM_END),
        ):
            cls[tid] = c
        for tid in tk.ERROR_SENTINELS:
            cls[tid] = C_ERROR
        expand = np.zeros((tk.TOKEN_LIMIT, w), dtype=np.uint8)
        expand[:256, 0] = np.arange(256, dtype=np.uint8)
        for comp in reg.composites:
            cls[comp.token_id] = C_COMP_DEP if comp.deprecated else C_COMP
            expand[comp.token_id] = np.frombuffer(comp.pattern, dtype=np.uint8)
        self.cls = cls
        self.expand = expand
        self.expand_void = expand.view(f"V{w}").reshape(-1)
        length = np.zeros(tk.TOKEN_LIMIT, dtype=np.uint8)
        length[:256] = 1
        length[(cls == C_COMP) | (cls == C_COMP_DEP)] = w
        self.length = length
        self.names = {c.token_id: c.semantics for c in reg.composites}
        # Each lane's canonical id by its key, for W <= 2 (one gather per lane).
        self._canon: np.ndarray | None = None
        if w <= 2:
            canon = np.zeros(1 << (8 * w), dtype=np.uint16)
            for pat, tid in active.items():
                canon[pattern_key(pat)] = tid
            self._canon = canon
        # For W in 1, 2, 4, by id: what turns the low bytes of a composite's unit in
        # `decode_bundles` (W-1 SKIPs, then the id) into its pattern, as one integer; 0 for
        # every other id.
        self._pattern_fix: np.ndarray | None = None
        if w in (1, 2, 4):
            unit = np.full((tk.TOKEN_LIMIT, w), tk.SKIP & 0xFF, dtype=np.uint8)
            unit[:, w - 1] = np.arange(tk.TOKEN_LIMIT) & 0xFF
            fix = (expand ^ unit).reshape(-1).view(f"<u{w}").copy()
            fix[cls != C_COMP] = 0
            self._pattern_fix = fix

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """For lane keys of W > 2 bytes: the active composite id of each, 0 where none."""
        if self._probe is not None:
            return self._probe.lookup(keys)
        assert self._cuckoo is not None
        return self._cuckoo.lookup(keys)

    # Encoding --------------------------------------------------------------------------------

    def lane_slots(self, data: np.ndarray) -> tuple[np.ndarray, int]:
        """Slots (n_lanes, W) u16 for whole lanes of `data`, and how many lanes are composites."""
        import numpy as np

        w = self.width
        if self._direct is not None:
            if w == 1:
                # A one-byte composite replaces one byte by one id: no SKIP slots to squeeze.
                return self._direct.take(data).reshape(-1, 1), 0
            slots = self._direct.take(data.view("<u2")).view("<u2").reshape(-1, 2)
            n_comp = int(np.count_nonzero(slots[:, 1] == tk.SKIP)) if self.n_active else 0
            return slots, n_comp
        lanes = data.reshape(-1, w)
        if self._cuckoo is None:
            return lanes.astype("<u2"), 0
        ids = self.lookup(lane_keys(lanes, w))
        if w == 4:
            # Four u16 slots fit one u64: blend whole lanes, raw ^ ((raw ^ comp) & mask) with
            # mask all ones on composite lanes (faster than np.where here).
            packed = data.astype("<u2").view("<u8")
            comp = ids.astype("<u8")
            comp |= np.uint64(COMPOSITE_SKIPS_4)
            mask = (ids != 0).view(np.uint8).astype("<u8")
            np.negative(mask, out=mask)
            comp ^= packed
            comp &= mask
            packed ^= comp
            return packed.view("<u2").reshape(-1, 4), int(np.count_nonzero(ids))
        slots = lanes.astype("<u2")
        hit = ids != 0
        n_comp = int(np.count_nonzero(hit))
        if n_comp:
            # copyto(where=) instead of boolean-index assignment: several times faster.
            np.copyto(slots[:, 0], ids, where=hit)
            np.copyto(slots[:, 1:], tk.SKIP, where=hit[:, None])
        return slots, n_comp

    def bundle_tokens(
        self, data: np.ndarray, first_bundle: int, debug: bool, chunk_bundles: int
    ) -> np.ndarray:
        """Tokens of whole bundles (no shard markers): `data` holds a multiple of N*W bytes."""
        import numpy as np

        w, n = self.width, self.lanes
        nb = data.size // self.bundle_bytes
        slots, n_comp = self.lane_slots(data)
        if debug:
            marked = np.empty((slots.shape[0], w + 1), dtype="<u2")
            marked[:, 0] = tk.LANE_MARK
            marked[:, 1:] = slots
            slots = marked
        per_bundle = slots.shape[1] * n
        lead = 2 if debug else 1
        rows = np.empty((nb, per_bundle + lead + 1), dtype="<u2")
        if debug:
            j = np.arange(first_bundle, first_bundle + nb, dtype=np.int64)
            rows[:, 0] = np.where(j % chunk_bundles == 0, tk.CHUNK_MARK, tk.SKIP)
        rows[:, lead - 1] = tk.BUNDLE_START
        # One copy per row through a void view (a 2-D slice copies item by item, slowly).
        row_bytes = np.dtype((np.void, 2 * per_bundle))
        rows[:, lead : lead + per_bundle].view(row_bytes)[...] = (
            np.ascontiguousarray(slots).reshape(nb, per_bundle).view(row_bytes)
        )
        rows[:, -1] = tk.BUNDLE_END
        flat = rows.reshape(-1)
        if n_comp or debug:
            # np.compress is several times faster than boolean indexing here.
            return np.compress(flat != tk.SKIP, flat)
        return flat

    def partial_bundle(self, tail: bytes, debug: bool, chunk_mark: bool) -> list[int]:
        """Tokens of the final, short bundle: whole lanes, then PAD_LANE and the partial lane."""
        import numpy as np

        w = self.width
        whole = len(tail) // w * w
        out: list[int] = [tk.CHUNK_MARK] if chunk_mark else []
        out.append(tk.BUNDLE_START)
        if whole:
            slots, _ = self.lane_slots(np.frombuffer(tail[:whole], dtype=np.uint8))
            if debug:
                for row in slots.tolist():
                    out.append(tk.LANE_MARK)
                    out.extend(s for s in row if s != tk.SKIP)
            else:
                out.extend(int(s) for s in slots.reshape(-1) if s != tk.SKIP)
        if whole < len(tail):
            if debug:
                out.append(tk.LANE_MARK)
            out.append(tk.PAD_LANE)
            out.extend(tail[whole:])
        out += [tk.BUNDLE_PAD, tk.BUNDLE_END]
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

        w = self.width
        if self._canon is not None:
            return self._canon.take(data if w == 1 else data.view("<u2"))
        if self._cuckoo is None:
            return np.zeros(data.size // w, dtype=np.uint16)
        return self.lookup(lane_keys(data.reshape(-1, w), w))

    def decode_bundles(self, t: np.ndarray) -> tuple[np.ndarray, int] | None:
        """The bytes of `t` and its bundle count when `t` is exactly whole bundles in canonical
        form without debug markers: BUNDLE_START, N lanes, BUNDLE_END, again and again, every
        lane the active composite of its bytes or, when it has none, its W byte tokens. None
        for anything else (the caller then finds and names the problem the slow way).

        Every token gets a span in slots: a byte 1, any other id W. A cumulative sum places each
        token at the last slot of its span in an array of SKIP slots; then every bundle must be
        a row of N + 2 units of W slots: the first unit exactly (SKIPs and) BUNDLE_START, the
        last (SKIPs and) BUNDLE_END, every lane unit W bytes or (SKIPs and) a composite. A
        token that does not start a unit leaves a SKIP or a non-byte where a byte must be, or
        a SKIP in a unit's last slot, so the rows prove the structure. A lane's bytes come from
        its byte slots or, for a composite, from a table by id; the encoder's lookup of those
        bytes must give back exactly the ids the stream used (which also refuses deprecated
        and unassigned ids: the lookup returns only active composites).
        """
        import numpy as np

        w, n = self.width, self.lanes
        if t.size == 0:
            return None
        spans = (t >= 256).view(np.uint8)
        if w > 1:
            spans = spans * np.uint8(w - 1)
            spans += np.uint8(1)
        else:
            spans = spans + np.uint8(1) - spans  # all ones
        ends = np.empty(t.size, dtype=np.intp)
        np.cumsum(spans, dtype=np.intp, out=ends)  # with out=: several times faster
        row = (n + 2) * w
        total = int(ends[-1])
        nb = total // row
        if nb == 0 or total != nb * row:
            return None
        buf = np.full(total + w, tk.SKIP, dtype="<u2")
        buf[w - 1 :][ends] = t  # token i ends at slot ends[i] - 1 of buf[w:]
        slots = buf[w:]
        low = slots.astype(np.uint8)
        if w in (1, 2, 4):
            # Whole-array operations on the units as integers (2-D slices of short rows are
            # slow in numpy); the bundle markers' units are checked on their own and dropped.
            word = np.dtype(f"<u{2 * w}")
            top = 16 * (w - 1)
            skips = sum(tk.SKIP << (16 * i) for i in range(w - 1))
            units = slots.view(word)
            rows = units.reshape(nb, n + 2)
            if not (rows[:, 0] == word.type(skips | tk.BUNDLE_START << top)).all():
                return None
            if not (rows[:, -1] == word.type(skips | tk.BUNDLE_END << top)).all():
                return None
            comp_all = units >= word.type(tk.COMPOSITE_FIRST << top)
            high = word.type(int.from_bytes(b"\x00\xff" * w, "little"))
            ok = (units & high) == 0
            ok |= comp_all
            # Marker units are never ok (their SKIP or marker slots are not bytes, their ids
            # are below the composites): every other unit must be.
            if int(np.count_nonzero(ok)) != nb * n:
                return None
            have_all = (units >> word.type(top)).astype(np.uint16)
            have_all *= comp_all  # the composite ids, 0 for byte lanes and markers
            assert self._pattern_fix is not None
            # A composite's unit holds W-1 SKIPs and its id: its low bytes XOR _pattern_fix[id]
            # are its pattern; a byte lane's are its bytes (id 0: XOR 0).
            values = low.view(f"<u{w}")
            comp_at = np.flatnonzero(comp_all)
            if comp_at.size * 4 < units.size:  # few composites: fix only their units
                values[comp_at] ^= self._pattern_fix.take(have_all.take(comp_at))
            else:
                values ^= self._pattern_fix.take(have_all)
            data = _drop_ends(low, nb, (n + 2) * w, w, n * w)
            have = _drop_ends(have_all, nb, n + 2, 1, n)
        else:
            units3 = slots.reshape(nb, n + 2, w)
            last = units3[:, :, w - 1]
            if not (last[:, 0] == tk.BUNDLE_START).all():
                return None
            if not (last[:, -1] == tk.BUNDLE_END).all():
                return None
            ids = last[:, 1:-1]
            comp = ids >= tk.COMPOSITE_FIRST
            bytes_ok = (units3[:, 1:-1, :] < 256).all(axis=2)
            bytes_ok |= comp
            if not bytes_ok.all():
                return None
            have = ids * comp
            lanes = low.reshape(nb, n + 2, w)[:, 1:-1, :].copy()
            np.copyto(lanes, self.expand.take(have, axis=0), where=comp[:, :, None])
            data = lanes.reshape(-1)
        if not np.array_equal(self.canonical_ids(data), have.reshape(-1)):
            return None
        return data, nb
