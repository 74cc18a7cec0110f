"""Shared machinery of the fuzz harnesses (one `fuzz_<reader>.py` per reader).

Each harness feeds bytes to the function `inspect` and `verify` call for one reader
(`matrixctl.validate.engine.examine(path, scan=True, describe=True, fmt=FORMAT)`, the format
forced so a mutated magic still reaches the reader), or to a decoder directly (CBOR, the
document extractors). The oracle: any exception that is not the project's typed error is a
bug; libFuzzer's -timeout=2 and -rss_limit_mb=512 flag slow or hungry inputs (under 1 MB,
-max_len). Coverage-guided with atheris when it is installed (`pip install -e '.[fuzz]'`);
otherwise a seeded mutation fallback, clearly labelled as such in its output.

Run one: `python fuzz/fuzz_ztensor.py -max_total_time=60 fuzz/corpus/ztensor`; all:
`make fuzz FUZZ_SECONDS=60`.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MAX_LEN = 1 << 20


def examine_target(fmt: str, suffix: str = ".bin") -> Callable[[bytes], None]:
    """The bytes as a file of format `fmt` through inspect's and verify's engine."""
    from matrixctl.errors import MatrixError
    from matrixctl.validate.engine import examine, handler

    handler(fmt)  # imported now, so atheris.instrument_all() covers it
    folder = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    path = folder / f"matrixctl-fuzz-{os.getpid()}{suffix}"

    def target(data: bytes) -> None:
        path.write_bytes(data)
        with contextlib.suppress(MatrixError):  # a typed error is an answer, not a bug
            examine(str(path), scan=True, describe=True, fmt=fmt)

    return target


def cbor_target() -> Callable[[bytes], None]:
    from matrixctl import cbor
    from matrixctl.errors import MatrixError

    def target(data: bytes) -> None:
        for loads in (cbor.loads, cbor.loads_deterministic):  # zTensor v1, zTensor 2
            try:
                loads(data)
            except cbor.CborError as err:  # the decoders' typed error, inside the input
                if not 0 <= err.offset <= len(data):
                    raise AssertionError(f"offset {err.offset} outside the input") from None
            except MatrixError:
                pass

    return target


def q8_0_target() -> Callable[[bytes], None]:
    """The bytes as the values of a tensor that `convert --quantize q8_0` quantizes
    (`formats/gguf_write.py`): the first byte picks the dtype (f32, f16, bf16, f64), the rest
    are its values, cut to whole 32-value blocks (repeated to one block when shorter). The
    oracle: no numpy warning (turned into an error), a refusal exactly when a value is not
    finite or a block's float16 scale overflows, and otherwise every dequantized value finite
    and within half a step (plus the scale's float16 rounding) of the input."""
    import warnings

    import numpy as np

    from matrixctl.formats import gguf_write

    dtypes = ("f32", "f16", "bf16", "f64")
    sizes = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}

    def target(data: bytes) -> None:
        if not data:
            return
        dtype = dtypes[data[0] % len(dtypes)]
        body, block = data[1:], sizes[dtype] * gguf_write.QK8_0
        if not body:
            return
        if len(body) < block:  # a short input repeated to one whole block
            body = body * (block // len(body) + 1)
        count = len(body) // block * gguf_write.QK8_0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the quantizer's own warnings are bugs
            x = gguf_write._to_f32(body[: count * sizes[dtype]], dtype)
            bad = gguf_write.q8_0_refusal(x)
            stored = None if bad is not None else gguf_write.q8_0(x)
        with np.errstate(all="ignore"):  # the oracle's (a signalling NaN warns when cast)
            blocks = x.reshape(-1, gguf_write.QK8_0).astype(np.float64)
            finite = bool(np.isfinite(blocks).all())
            scale_ok = finite and bool((np.abs(blocks).max(axis=1) / 127 < 65520).all())
        if (bad is None) != scale_ok:
            raise AssertionError(f"refusal {bad!r} disagrees (finite {finite})")
        if stored is None:
            return
        raw = np.frombuffer(stored, dtype=np.uint8).reshape(-1, 34)
        d = raw[:, :2].copy().view("<f2").astype(np.float64).reshape(-1)
        back = d[:, None] * raw[:, 2:].copy().view(np.int8).astype(np.float64)
        if not np.isfinite(back).all():
            raise AssertionError("a dequantized value is not finite")
        step = np.abs(blocks).max(axis=1) / 127
        bound = 0.5 * step + 127 * (step * 2.0**-10 + 2.0**-24) + 1e-30
        if (np.abs(back - blocks) > bound[:, None]).any():
            raise AssertionError("a dequantized value is further than the bound")

    return target


def extractor_target(kind: str) -> Callable[[bytes], None]:
    from matrixctl.errors import MatrixError
    from matrixctl.ingest import kinds
    from matrixctl.ingest.kinds import base as kinds_base

    def target(data: bytes) -> None:
        reader = kinds_base.HashingReader(io.BytesIO(data))  # type: ignore[arg-type]
        try:
            documents = kinds.get(kind).documents
            assert documents is not None
            for _n, pieces in documents(
                reader, "fuzz", kinds_base.Options(), kinds_base.Counters()
            ):
                for _ in pieces:
                    pass
        except MatrixError:
            pass

    return target


def jsonl_target() -> Callable[[bytes], None]:
    """The bytes as a JSON Lines input, through the extractor (`extractor_target`) and both
    JSON Lines paths of `ingest docs`, which must agree: the line reader (`jsonl_texts_stream`,
    orjson and the standard library line by line) and the buffer path (`jsonl_texts`: the
    compiled text-field extractor, `matrixctl/_jsonl_kernel.c`, with that line path for every
    line it leaves). Same texts, line numbers, counters and error (code, message, offset); and
    every line the compiled extractor takes is one orjson takes with the same text."""
    import struct

    import orjson

    from matrixctl import _jsonl_kernel
    from matrixctl.errors import MatrixError
    from matrixctl.ingest.kinds import base as kinds_base
    from matrixctl.ingest.kinds import jsonl as kinds_jsonl

    documents = extractor_target("jsonl")

    def outcome(texts: Any, counters: Any) -> tuple[Any, ...]:
        got: list[tuple[int, str]] = []
        try:
            for line, text in texts:
                got.append((line, text if isinstance(text, str) else str(text, "utf-8")))
        except MatrixError as err:
            return got, (err.code, err.message, err.offset), None
        except kinds_base.SkipFile as skip:
            return got, ("skip", skip.reason), None
        return got, None, (counters.lines, counters.skipped_records)

    def target(data: bytes) -> None:
        documents(data)
        for opts in (kinds_base.Options(), kinds_base.Options(missing_field="error", max_doc=64)):
            c1, c2 = kinds_base.Counters(), kinds_base.Counters()
            a = outcome(kinds_jsonl.texts_stream(io.BytesIO(data), "f", opts, c1), c1)
            b = outcome(kinds_jsonl.texts(bytearray(data), "f", opts, c2), c2)
            if a != b:
                raise AssertionError(f"the two JSON Lines paths differ: {a!r} != {b!r}")
        out = bytearray(len(data) + 16)
        rows = _jsonl_kernel.texts(data, 0, len(data), b"text", 1 << 30, out)
        for start, stop, off, n, kind in struct.iter_unpack("5q", rows):
            if kind:
                want = orjson.loads(data[start:stop])["text"].replace("\r\n", "\n").encode()
                if out[off : off + n] != want or (kind == 1) != want.isascii():
                    raise AssertionError(f"the extractor took line {data[start:stop]!r} wrongly")

    return target


def seeds(name: str) -> list[bytes]:
    folder = ROOT / "fuzz" / "corpus" / name
    if not folder.is_dir():
        return [b""]
    return [p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()] or [b""]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    if not b or rng.random() < 0.05:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    r = rng.random()
    if r < 0.2:
        return bytes(b[: rng.randrange(len(b))])
    for _ in range(rng.choice([1, 1, 2, 4, 8, 16])):
        i = rng.randrange(len(b))
        op = rng.random()
        if op < 0.4:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.7:
            b[i] = rng.choice([0, 0xFF, 0x7F, 0x80, 0x01, rng.randrange(256)])
        elif op < 0.85 and len(b) > 4:
            j = rng.randrange(len(b) - 3)
            b[j : j + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x80", bytes(4)])
        else:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
    return bytes(b[:MAX_LEN])


def fallback(name: str, target: Callable[[bytes], None], seconds: float, seed: int) -> int:
    """SEEDED MUTATION FALLBACK (not coverage-guided): mutate the seeds for `seconds`."""
    rng = random.Random(f"{name}-{seed}")
    pool = seeds(name)
    execs = 0
    deadline = time.monotonic() + seconds
    print(f"[{name}] seeded mutation fallback (atheris not installed), seed {seed}")
    while time.monotonic() < deadline:
        data = _mutate(rng, rng.choice(pool))
        start = time.monotonic()
        target(data)
        if time.monotonic() - start > 2.0:
            raise AssertionError(f"[{name}] slow input ({len(data)} bytes) over 2 s")
        execs += 1
    print(f"[{name}] {execs} executions")
    return execs


def main(name: str, target: Callable[[bytes], None]) -> None:
    """Run under atheris when available (argv are libFuzzer's), else the labelled fallback
    (`--seconds N --seed S`)."""
    try:
        import atheris
    except ImportError:
        seconds, seed = 10.0, 2026
        args = sys.argv[1:]
        for i, a in enumerate(args):
            if a.startswith("-max_total_time="):
                seconds = float(a.split("=", 1)[1])
            if a == "--seed" and i + 1 < len(args):
                seed = int(args[i + 1])
        fallback(name, target, seconds, seed)
        return
    atheris.instrument_all()  # coverage of every module the target imported
    atheris.Setup(
        [sys.argv[0], f"-max_len={MAX_LEN}", "-timeout=2", "-rss_limit_mb=512", *sys.argv[1:]],
        target,
    )
    atheris.Fuzz()


DECOMPRESS_CAP = 64 << 20  # decompressed bytes one input may produce before the target stops


def decompress_target(kind: str) -> Callable[[bytes], None]:
    """The bytes as a compressed input of `ingest docs` (`ingest/kinds/compressed.py`), its kind
    forced (gzip, zstd, xz, bz2) so a mutated magic still reaches the decompressor; every
    member / frame / stream is read. A bomb is a legitimate input (it costs time, never
    memory): the target stops after DECOMPRESS_CAP decompressed bytes."""
    from matrixctl.errors import MatrixError
    from matrixctl.ingest.kinds import compressed

    compressed._new(kind)  # the decompressor's module imported now, for instrument_all()

    def target(data: bytes) -> None:
        fp, _dec = compressed.decompressing(io.BytesIO(data), kind, "fuzz")
        got = 0
        try:
            while got < DECOMPRESS_CAP:
                piece = fp.read(compressed.OUT_PIECE)
                if not piece:
                    break
                got += len(piece)
        except MatrixError:
            pass

    return target


def columnar_target(kind: str) -> Callable[[bytes], None]:
    """The bytes as a Parquet or Arrow IPC input of `ingest docs` (`ingest/kinds/columnar.py`,
    through pyarrow), every row of the `text` column read as a document."""
    from matrixctl.errors import MatrixError
    from matrixctl.ingest.kinds import base as kinds_base
    from matrixctl.ingest.kinds import columnar

    columnar._pyarrow("fuzz")  # pyarrow imported before instrument_all()
    folder = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    path = folder / f"matrixctl-fuzz-{os.getpid()}.{kind}"

    def target(data: bytes) -> None:
        path.write_bytes(data)
        try:
            for _row, pieces in columnar.documents(
                kind, str(path), "fuzz", kinds_base.Options(), kinds_base.Counters()
            ):
                for _ in pieces:
                    pass
        except MatrixError:
            pass

    return target


MARKDOWN_SIZE = 256 << 10  # characters the Markdown target stretches an input to


def markdown_target() -> Callable[[bytes], None]:
    """Markdown extraction (`ingest/kinds/markdown.py`) on the input stretched to a long text:
    the input decoded (UTF-8 with replacement) and repeated to MARKDOWN_SIZE characters, as
    one line and as it is (its own line ends). Quadratic scanning of a line shows as a slow
    input (libFuzzer's -timeout, the fallback's 2 s). The oracle besides time: the same
    output whether the text comes whole or in pieces of 4,093 characters (lines longer than
    a segment are cut where the line starts, not where the reads end)."""
    from matrixctl.ingest.kinds import markdown

    def extract(pieces: list[str]) -> str:
        return "".join(markdown.markdown_lines(markdown.split_lines(iter(pieces), 65_536)))

    def target(data: bytes) -> None:
        unit = data.decode("utf-8", "replace") or " **a"
        text = unit * (MARKDOWN_SIZE // len(unit) + 1)
        for body in (text.replace("\n", " "), text):
            whole = extract([body])
            cut = extract([body[i : i + 4093] for i in range(0, len(body), 4093)])
            if whole != cut:
                raise AssertionError("Markdown output depends on how the text is read")

    return target


DICTIONARY_RSS_MB = 512  # memory the dictionary target may add (libFuzzer's -rss_limit_mb too)
DICTIONARY_CAP = 64 << 20  # text bytes one input may give before the target stops


WRITER_DECODED = 64 << 20  # bytes of cells pyarrow decodes to write one row group
WRITER_GROUPS = 16  # row groups of one built file


def dictionary_target(kind: str) -> Callable[[bytes], None]:
    """A dictionary-encoded text column built from the input (`ingest/kinds/columnar.py`):
    the first bytes choose the entries' lengths (up to 2 MiB each), the rows (up to 50,000)
    and the index of each, compression and --max-doc-size; the file is written with pyarrow
    (Parquet or Arrow IPC) and, when the input asks, a few of its bytes are changed. Every
    row is read as `ingest docs` reads it. The oracle: a typed error or rows, a peak memory
    (resource's ru_maxrss, checked after each input, so a file whose rows decode to
    terabytes shows) at most DICTIONARY_RSS_MB over the process's when the target was made,
    and a cell over the limit never given."""
    import resource

    import numpy as np

    from matrixctl.errors import MatrixError
    from matrixctl.ingest.kinds import base as kinds_base
    from matrixctl.ingest.kinds import columnar

    pa = columnar._pyarrow("fuzz")
    folder = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    path = folder / f"matrixctl-fuzz-dict-{os.getpid()}.{kind}"
    # The bound is over the process's peak when the target was made (CI runs the harnesses
    # inside the test process, whose peak may already be high).
    bound = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10) + DICTIONARY_RSS_MB

    def build(data: bytes) -> int:
        """Write the file the input describes to `path`; its --max-doc-size."""
        head = (data + bytes(16))[:16]
        entries = 1 + head[0] % 8
        lengths = [(head[1 + i] << (head[9] % 16)) % (2 << 20) for i in range(entries)]
        rows = (int.from_bytes(head[10:12], "little") * 8) % 50_000 + 1
        group = max(rows // 4 + 1, 1 + head[14] * 64)  # each row group repeats the dictionary
        # pyarrow's writer decodes each row group it writes (2 GiB of cells overflow it: "Take
        # operation overflowed binary array capacity") and compresses every group's dictionary
        # page: its memory and time count against the bounds, so a row group's cells stay
        # under WRITER_DECODED and a file has at most WRITER_GROUPS of them. The file's whole
        # decoded size (rows x the longest entry, up to GBs) is still the bomb the reader must
        # not build.
        group = min(group, max(1, WRITER_DECODED // max(1, *lengths)))
        rows = min(rows, group * WRITER_GROUPS)
        picks = np.frombuffer((data[16:] or b"\0") * (rows // max(1, len(data) - 16) + 1), np.uint8)
        indices = pa.array((picks[:rows] % entries).astype(np.int32))
        values = pa.array([chr(97 + i) * n for i, n in enumerate(lengths)])
        table = pa.table({"text": pa.DictionaryArray.from_arrays(indices, values)})
        compression = ("zstd", "none", "snappy")[head[12] % 3]
        max_doc = (64, 4096, 1 << 20, 64 << 20)[head[13] % 4]
        if kind == "parquet":
            pa.parquet.write_table(  # dictionary pages of any size: never plain (decoded) pages
                table,
                str(path),
                compression=compression,
                row_group_size=group,
                dictionary_pagesize_limit=1 << 30,
            )
        else:
            options = pa.ipc.IpcWriteOptions(compression=None if compression != "zstd" else "zstd")
            with (
                pa.OSFile(str(path), "wb") as out,
                pa.ipc.new_file(out, table.schema, options=options) as writer,
            ):
                writer.write_table(table, max_chunksize=group)
        flips = head[15] % 4
        if flips:  # a few bytes changed, where the input says
            size = path.stat().st_size
            with open(path, "r+b") as fp:
                for i in range(flips):
                    at = int.from_bytes((data[16 + 2 * i : 18 + 2 * i] or b"\0\0"), "little")
                    fp.seek(at % size)
                    byte = fp.read(1)
                    fp.seek(at % size)
                    fp.write(bytes([byte[0] ^ 0x5A]))
        return max_doc

    def target(data: bytes) -> None:
        max_doc = build(data)
        opts = kinds_base.Options(max_doc=max_doc)
        got = 0
        try:
            for _row, text in columnar.texts(kind, str(path), "fuzz", opts, kinds_base.Counters()):
                if len(text) > max_doc:
                    raise AssertionError(f"a cell of {len(text)} bytes over --max-doc-size")
                got += len(text)
                if got > DICTIONARY_CAP:
                    break
        except MatrixError:
            pass
        finally:
            path.unlink(missing_ok=True)  # up to tens of MB: not left in /dev/shm
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
        if peak > bound:
            raise AssertionError(f"{peak} MB of memory, {DICTIONARY_RSS_MB} MB over the start")

    return target


def _model_tokenizer(family: str, name: str) -> Any:
    from matrixctl.tokenizer_files import load_model_tokenizer
    from tests.helpers.llama_vocab import vocab_path

    tok, _ = load_model_tokenizer(vocab_path(name))
    if tok.family != family:
        raise SystemExit(f"{name} is a {tok.family} vocabulary, not {family}")
    return tok


def model_tokenizer_target(family: str, name: str) -> Callable[[bytes], None]:
    """A model tokenizer (bpe, spm, wpm, ugm) on one of llama.cpp's test vocabularies
    (MATRIXCTL_LLAMA_VOCAB, fetched by `make`), fed the input as text (UTF-8 with
    replacement, and Latin-1 so every byte value is a code point). The oracle: no exception
    at all, every id in the vocabulary, decoding never raises, and decode(encode(text)) ==
    text where docs/tokenizers.md says it round-trips: always for byte-level BPE over a
    vocabulary with all 256 bytes; for SentencePiece, text with no U+2581 and no control
    token's text in it."""
    tok = _model_tokenizer(family, name)
    controls: list[str] = []
    if family == "spm":
        v = tok._vocab
        controls = [v.tokens[i] for i in range(v.n) if v.attrs[i] & 0b1001]

    def run(data: bytes) -> None:
        for text in (data.decode("utf-8", "replace"), data.decode("latin-1")):
            ids = tok.encode(text)
            if not all(0 <= i < tok.vocab_size for i in ids):
                raise AssertionError(f"id out of range for {text!r}")
            out = tok.decode_bytes(ids)
            if family == "bpe" and out != text.encode("utf-8", "surrogatepass"):
                raise AssertionError(f"no round trip: {text!r} -> {out!r}")
            if (
                family == "spm"
                and "\u2581" not in text
                and not any(c in text for c in controls)
                and out != text.encode("utf-8")
            ):
                raise AssertionError(f"no round trip: {text!r} -> {out!r}")

    return run
