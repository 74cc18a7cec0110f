"""The tokenizer interface of the ingest step, and π's implementation of it.

The step (`ingest/step.py`) knows a tokenizer only through `IngestTokenizer`: text in, ids
out, at the width the pack stores, plus what the planner needs to know to cut a plain text
file (`cut_followers`). π implements it here (`PiIngest`), and so do the model tokenizers
(`ModelIngest`, `--tokenizer`); a new tokenizer is one more class with these four members
(docs/architecture.md, "Adding a tokenizer").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from matrixctl.ingest.kinds.base import Text
from matrixctl.tokenizers import pi

if TYPE_CHECKING:
    import numpy as np

    from matrixctl.tokenizer_files import ModelSource
    from matrixctl.tokenizers.model.base import ModelTokenizer

TEXT_BATCH = 4 << 20  # bytes of prepared text matched by one kernel call (`encode_texts`)


class IngestTokenizer(Protocol):
    """What the ingest step needs of a tokenizer."""

    @property
    def dtype(self) -> Any:
        """The numpy dtype of the ids it gives (uint16 or uint32)."""

    def encode_document(self, pieces: Iterator[str]) -> Iterator[np.ndarray]:
        """One document given as text pieces in order: its ids, in parts."""

    def encode_texts(
        self, texts: Iterator[Text], eos_id: int | None
    ) -> Iterator[tuple[np.ndarray, list[tuple[int, int]]]]:
        """Documents of one text each, in batches: each batch's ids (every non-empty
        document followed by `eos_id` unless None) and its documents as (item, ids without the
        EOS; 0: empty, no ids and no EOS)."""

    def cut_followers(self) -> bytes | None:
        """Where plain text may be cut into pieces that give the same ids: after a line feed,
        before an ASCII byte that is not a carriage return and not in the bytes returned; None:
        text is never cut."""


class PiIngest:
    """π (`matrixctl.tokenizers.pi`) behind the step's interface."""

    def __init__(self, tok: pi.Tokenizer, smap: pi.SymbolMap) -> None:
        self.tok = tok
        self.smap = smap
        self._followers: bytes | None = None
        self._followers_known = False

    @property
    def dtype(self) -> Any:
        return self.tok.dtype

    def encode_document(self, pieces: Iterator[str]) -> Iterator[np.ndarray]:
        """In the tokenizer's own dtype (uint16 for a map of at most 65,536 ids): the kernel
        writes the ids at that width, no int64 array is made. One piece (most documents) is
        matched at once; several go through the stream encoder."""
        import numpy as np

        tok = self.tok
        first = next(pieces, None)
        if first is None:
            return
        second = next(pieces, None)
        if second is None:
            data = tok.prepare(first)
            if not data:
                return
            if tok.prefix:
                data = tok.prefix + data
            yield np.frombuffer(tok.trie.match(data, len(data), tok.itemsize)[0], dtype=tok.dtype)
            return
        enc = tok.stream()
        yield np.frombuffer(enc.feed_bytes(first), dtype=tok.dtype)
        yield np.frombuffer(enc.feed_bytes(second), dtype=tok.dtype)
        for piece in pieces:
            yield np.frombuffer(enc.feed_bytes(piece), dtype=tok.dtype)
        yield np.frombuffer(enc.finish_bytes(), dtype=tok.dtype)

    def encode_texts(
        self, texts: Iterator[Text], eos_id: int | None
    ) -> Iterator[tuple[np.ndarray, list[tuple[int, int]]]]:
        """Each text is prepared as `Tokenizer.prepare` does; the prepared documents are
        matched about TEXT_BATCH bytes at a time by one kernel call, which writes every batch's
        ids at the tokenizer's width into one buffer (`Trie.match_docs`).

        A text given as bytes or a memoryview is UTF-8 without CRLF (a column's cell, see
        kinds/columnar.py; a JSON Lines record's text, see kinds/jsonl.py). Unless the map's
        marking rewrites text (wordpiece), it is prepared where it lies: ASCII as it is
        (normalization never changes it), other text by `_jsonl_kernel.normalize_utf8`, which
        normalizes only the runs `pi.normalize` normalizes and returns the same bytes when
        they are already normalized (no string of the whole text, no re-encoding)."""
        import unicodedata
        from functools import partial

        import numpy as np

        from matrixctl import _jsonl_kernel

        tok = self.tok
        plain = tok.marking is None or tok.marking.scheme != "wordpiece"
        form: Any = tok.map.normalization.upper()  # as pi.normalize calls it
        normalize = None if form == "NONE" else partial(unicodedata.normalize, form)
        normalize_utf8 = _jsonl_kernel.normalize_utf8
        gap = pi.NORMALIZE_GAP
        prefix = tok.prefix
        eos = -1 if eos_id is None else eos_id
        batch: list[bytes | memoryview] = []
        docs: list[tuple[int, int]] = []
        size = 0

        def flush() -> tuple[np.ndarray, list[tuple[int, int]]]:
            ids, counts = tok.trie.match_docs(batch, tok.itemsize, eos)
            found = np.frombuffer(counts, dtype=np.int64).tolist()
            at = 0
            for i, (item, n) in enumerate(docs):
                if n < 0:  # a text in the batch: its count from the kernel
                    docs[i] = (item, found[at])
                    at += 1
            return np.frombuffer(ids, dtype=tok.dtype), docs

        data: bytes | memoryview
        for item, text in texts:
            if isinstance(text, str):
                data = text.encode() if plain and text.isascii() else tok.prepare(text)
            elif not plain:
                data = tok.prepare(str(text, "utf-8"))
            elif normalize is not None:
                data = normalize_utf8(text, gap, normalize)
            else:
                data = text
            if not data:
                docs.append((item, 0))
                continue
            batch.append(prefix + data if prefix else data)
            docs.append((item, -1))
            size += len(data)
            if size >= TEXT_BATCH:
                yield flush()
                batch, docs, size = [], [], 0
        if batch or docs:
            yield flush() if batch else (np.zeros(0, dtype=tok.dtype), docs)

    def cut_followers(self) -> bytes | None:
        """After a line feed, before an ASCII byte that no symbol of the map has right after a
        line feed inside it (docs/inputs.md, "Plain text in pieces"). Never, for a map whose
        space marking adds a prefix to each document or splits words (wordpiece)."""
        if self._followers_known:
            return self._followers
        smap = self.smap
        marking = smap.space_marking
        followers: bytearray | None = None
        if marking is None or not (marking.scheme == "wordpiece" or marking.adds_prefix):
            followers = bytearray()
            for sid, text in smap.symbols:
                if sid in smap.specials or "\n" not in text:
                    continue
                key = smap.key(text)
                at = key.find(b"\n")
                while 0 <= at < len(key) - 1:
                    if key[at + 1] not in followers:
                        followers.append(key[at + 1])
                    at = key.find(b"\n", at + 1)
            followers.append(0)
        self._followers = None if followers is None else bytes(followers)
        self._followers_known = True
        return self._followers


class PiRecipe:
    """How to make the π tokenizer of a build wherever it runs: the checked symbol map and its
    bytes as read (picklable; a Dask worker builds from it). `fingerprint` names what
    decides the ids (a staged unit's key)."""

    def __init__(self, smap: pi.SymbolMap, raw: bytes, tok: pi.Tokenizer | None = None) -> None:
        self.smap = smap
        self.raw = raw
        self.tok = tok
        self.fingerprint = "pi:" + smap.canonical_hash()

    def __getstate__(self) -> dict[str, Any]:
        return {"smap": self.smap, "raw": self.raw, "tok": None, "fingerprint": self.fingerprint}

    def build(self) -> PiIngest:
        """The tokenizer: the one given, else its compiled matcher from the per-user map cache
        (tokenizers/pi_cache.py; a few ms) when an entry for these bytes is sound, else built
        (about 0.16 CPU s for the bundled map) and stored for the next build."""
        from matrixctl.tokenizers import pi_cache

        tok = self.tok
        if tok is None:
            hit = pi_cache.load(self.raw)
            if hit is not None:
                tok = pi.Tokenizer(self.smap, hit[1])
            else:
                tok = pi.Tokenizer(self.smap)
                pi_cache.store(self.raw, self.smap, tok.trie)
        return PiIngest(tok, self.smap)


class ModelIngest:
    """A model's own tokenizer (`matrixctl.tokenizers.model`) behind the step's interface.

    The text goes to the model's tokenizer as the input kind extracted it (docs/tokenizers.md,
    "In ingest docs"): none of π's normalizations (NFKC, space marking, case folding) touch it;
    the model's own normalizer is the only one. A document is encoded whole (a model's
    pre-tokenizer and merges see all of it): its pieces are joined first, and plain text is
    never cut into pieces (`cut_followers` is None)."""

    def __init__(self, tok: ModelTokenizer) -> None:
        import numpy as np

        self.tok = tok
        self._dtype = np.dtype("<u2" if tok.vocab_size <= 1 << 16 else "<u4")

    @property
    def dtype(self) -> Any:
        return self._dtype

    def encode_document(self, pieces: Iterator[str]) -> Iterator[np.ndarray]:
        import numpy as np

        text = "".join(pieces)
        if text:
            yield np.array(self.tok.encode_ordinary(text), dtype=self._dtype)

    def encode_texts(
        self, texts: Iterator[Text], eos_id: int | None
    ) -> Iterator[tuple[np.ndarray, list[tuple[int, int]]]]:
        """Each text encoded whole, about TEXT_BATCH bytes of text per batch. A text that gives
        no ids (empty, or only what the model's normalizer drops) is an empty document: no
        ids, no EOS."""
        import numpy as np

        encode = self.tok.encode_ordinary
        tail = [] if eos_id is None else [eos_id]
        ids: list[int] = []
        docs: list[tuple[int, int]] = []
        size = 0
        for item, given in texts:
            text = given if isinstance(given, str) else str(given, "utf-8")
            got = encode(text) if text else []
            if got:
                ids += got
                ids += tail
            docs.append((item, len(got)))
            size += len(text)
            if size >= TEXT_BATCH:
                yield np.array(ids, dtype=self._dtype), docs
                ids, docs, size = [], [], 0
        if docs:
            yield np.array(ids, dtype=self._dtype), docs

    def cut_followers(self) -> bytes | None:
        return None


class ModelRecipe:
    """How to make a model tokenizer of a build wherever it runs: its `ModelSource` (the
    metadata or tokenizer.json it is built from, picklable). `fingerprint` names the source's
    SHA-256, so a staged Dask unit is reused only with the same tokenizer."""

    def __init__(self, source: ModelSource, tok: ModelTokenizer | None = None) -> None:
        self.source = source
        self.tok = tok
        self.fingerprint = f"model:{source.kind}:{source.sha256}"

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "tok": None, "fingerprint": self.fingerprint}

    def build(self) -> ModelIngest:
        return ModelIngest(self.tok if self.tok is not None else self.source.build())
