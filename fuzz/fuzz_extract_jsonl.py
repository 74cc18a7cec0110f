"""Fuzz harness: extract jsonl (see fuzz/common.py).

Besides the extractor's own oracle (a typed error or documents), the bytes go through both
JSON Lines paths of `ingest docs`, which must agree: the line reader (`jsonl_texts_stream`,
orjson and the standard library line by line) and the buffer path (`jsonl_texts`: the compiled
text-field extractor, `matrixctl/_jsonl_kernel.c`, with that line path for every line it
leaves). Same texts, line numbers, counters and error (code, message, offset); and every line
the extractor takes is one orjson takes with the same text."""

import io
import struct
from typing import Any

import common


def target() -> Any:
    import orjson

    from matrixctl import _jsonl_kernel
    from matrixctl.errors import MatrixError
    from matrixctl.ingest import extract

    documents = common.extractor_target("jsonl")

    def outcome(texts: Any, counters: Any) -> tuple[Any, ...]:
        got: list[tuple[int, str]] = []
        try:
            for line, text in texts:
                got.append((line, text if isinstance(text, str) else str(text, "utf-8")))
        except MatrixError as err:
            return got, (err.code, err.message, err.offset), None
        except extract.SkipFile as skip:
            return got, ("skip", skip.reason), None
        return got, None, (counters.lines, counters.skipped_records)

    def run(data: bytes) -> None:
        documents(data)
        for opts in (extract.Options(), extract.Options(missing_field="error", max_doc=64)):
            c1, c2 = extract.Counters(), extract.Counters()
            a = outcome(extract.jsonl_texts_stream(io.BytesIO(data), "f", opts, c1), c1)
            b = outcome(extract.jsonl_texts(bytearray(data), "f", opts, c2), c2)
            assert a == b, (a, b)
        out = bytearray(len(data) + 16)
        rows = _jsonl_kernel.texts(data, 0, len(data), b"text", 1 << 30, out)
        for start, stop, off, n, kind in struct.iter_unpack("5q", rows):
            if kind:
                obj = orjson.loads(data[start:stop])
                want = obj["text"].replace("\r\n", "\n").encode()
                assert out[off : off + n] == want and (kind == 1) == want.isascii()

    return run


if __name__ == "__main__":
    common.main("extract_jsonl", target())
