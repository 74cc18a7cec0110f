"""zTensor 2 writing: `Zt2Writer` (blobs, the deterministic CBOR manifest, the footer),
`Zt2Sink` for `convert`, and `save_file` for the API's `save`."""

from __future__ import annotations

import struct
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from matrixctl import cbor
from matrixctl.errors import FormatError, UsageError
from matrixctl.formats.ztensor2.layout import (
    ALIGN,
    CANONICAL_ALIGN,
    DENSE,
    DIGESTS,
    FOOTER,
    FOOTER_SIZE,
    FORMAT,
    GGUF_TYPES,
    MAGIC,
    SEEK_MAGIC,
    SEEK_SKIPPABLE,
    STORAGE,
    TO_MATRIX_LAYOUT,
    TO_ZT2,
    VERSION,
    ZSTD_FRAME,
    ZSTD_LEVEL,
    ZSTD_SEEKABLE,
    ZT2_WRITE,
    shown,
)
from matrixctl.formats.ztensor2.manifest import manifest_hash, name_problem
from matrixctl.formats.ztensor2.parts import Digester
from matrixctl.formats.ztensor2.source import VERBATIM
from matrixctl.tensors import (
    CHUNK_BYTES,
    DTYPES,
    Outputs,
    PartStreams,
    TensorInfo,
    TensorSink,
    copy_stream,
)

# Writing ------------------------------------------------------------------------------------


def _align_up(pos: int, align: int) -> int:
    return -(-pos // align) * align


def attribute_value(value: Any) -> Any:
    """A metadata value as a zTensor 2 attribute ztensor 2.1.2 accepts: byte strings (which it
    refuses) become lowercase hex text; tuples become arrays; map keys text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return [attribute_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): attribute_value(v) for k, v in value.items()}
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        return value.item()
    return value


class Zt2Writer:
    """Stream objects into a zTensor 2 file.

    Canonical (spec 6.3; the default): raw parts, an xxh3 digest on every part, blobs packed
    at successive 64 KiB boundaries from 65536 in (object name, part name) order, identical
    contents sharing one blob (equality confirmed on the bytes), manifest last. Objects must
    be added in ascending bytewise name order. Otherwise (`level` set: zt.zstd-seekable/1
    frames of 1 MiB; or another digest): the same layout at 4096-byte alignment, which is
    what ztensor 2.1.2 writes for compressed files. The file object must be seekable and
    readable (blob sharing reads back the earlier copy), positioned at 0.
    """

    def __init__(
        self,
        fp: BinaryIO,
        *,
        digest: str | None = "xxh3",
        level: int | None = None,
        attributes: Mapping[str, Any] | None = None,
        align: int | None = None,
    ) -> None:
        if digest is not None and digest not in DIGESTS:
            raise UsageError(f"--digest for zTensor 2 must be one of {', '.join(DIGESTS)} or none")
        self.fp = fp
        self.digest = digest
        self.level = level
        self.canonical = level is None and digest == "xxh3" and align in (None, CANONICAL_ALIGN)
        self.align = align or (CANONICAL_ALIGN if level is None else ALIGN)
        if self.align % ALIGN:
            raise UsageError(f"zTensor 2 alignment must be a multiple of 4096, got {self.align}")
        self.attributes = {str(k): attribute_value(v) for k, v in (attributes or {}).items()}
        self.objects: dict[str, dict[str, Any]] = {}
        self.last_name: bytes | None = None
        self.seen: dict[tuple[str, int], list[int]] = {}
        self.pos = 0
        self.fp.write(MAGIC)
        self.pos = len(MAGIC)

    def add(
        self,
        name: str,
        shape: tuple[int, ...] | list[int],
        layout: str,
        parts: list[tuple[str, str, str | None, int, Iterator[Any]]],
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """One object; `parts` is (role, dtype, logical type, decoded byte size, byte stream)
        per part. Parts are written in ascending name order, as canonical form wants."""
        why = name_problem(name)
        if why:
            raise FormatError(ZT2_WRITE, f"tensor name {shown(name, 60)} {why}", field=name)
        if name in self.objects:
            raise FormatError(ZT2_WRITE, f"tensor {name!r} is added twice", field=name)
        key = name.encode("utf-8")
        if self.last_name is not None and key < self.last_name:
            self.canonical = False
        self.last_name = key
        if unicodedata.normalize("NFC", name) != name:
            self.canonical = False
        out: dict[str, dict[str, Any]] = {}
        for role, dtype, ltype, nbytes, stream in sorted(parts, key=lambda p: p[0].encode()):
            if dtype not in STORAGE:
                raise FormatError(ZT2_WRITE, f"{name}/{role}: unknown dtype {dtype!r}", field=name)
            out[role] = self._part(f"{name}/{role}", dtype, ltype, nbytes, stream)
        obj: dict[str, Any] = {"shape": list(shape), "layout": layout, "parts": out}
        if attributes:
            obj["attributes"] = {str(k): attribute_value(v) for k, v in attributes.items()}
        self.objects[name] = obj

    def _pad_to(self, offset: int) -> None:
        if offset > self.pos:
            self.fp.write(bytes(offset - self.pos))
            self.pos = offset

    def _part(
        self, where: str, dtype: str, ltype: str | None, nbytes: int, stream: Iterator[Any]
    ) -> dict[str, Any]:
        before = self.pos
        offset = _align_up(self.pos, self.align)
        digester = Digester(self.digest) if self.digest else None
        got = 0
        part: dict[str, Any] = {"dtype": dtype}
        if ltype is not None:
            part["type"] = ltype
        if self.level is None:
            if nbytes:  # an empty part takes no padding (its offset is where the next begins)
                self._pad_to(offset)
            got = copy_stream(
                self.fp,
                stream,
                nbytes,
                where=where,
                code=ZT2_WRITE,
                update=digester.update if digester is not None else None,
            )
            self.pos += got
            length = got
        else:
            self._pad_to(offset)
            length = self._zstd(stream, digester, nbytes)
            got = self._zstd_got
            part["encoding"] = ZSTD_SEEKABLE
            part["decoded_length"] = got
        if got != nbytes:
            raise FormatError(
                ZT2_WRITE,
                f"{where}: {got:,} bytes arrived, shape and dtype give {nbytes:,}",
                field=where,
            )
        if digester is not None:
            part["digest"] = digester.text()
        if self.level is None and part.get("digest"):
            same = self._shared(part["digest"], offset, length)
            if same is not None:
                self.fp.seek(before)
                self.fp.truncate()
                self.pos = before
                offset = same
            else:
                self.seen.setdefault((part["digest"], length), []).append(offset)
        part["blob"] = [offset, length]
        return part

    def _shared(self, digest: str, offset: int, length: int) -> int | None:
        """The offset of an earlier blob with the same bytes (compared, not trusted to the
        hash), or None."""
        for earlier in self.seen.get((digest, length), []):
            if self._same_bytes(earlier, offset, length):
                return earlier
        return None

    def _same_bytes(self, a: int, b: int, length: int) -> bool:
        fp = self.fp
        fp.flush()
        step = CHUNK_BYTES
        try:
            for start in range(0, length, step):
                n = min(step, length - start)
                fp.seek(a + start)
                x = fp.read(n)
                fp.seek(b + start)
                if fp.read(n) != x:
                    return False
            return True
        finally:
            fp.seek(self.pos)

    def _zstd(self, stream: Iterator[Any], digester: Digester | None, nbytes: int) -> int:
        import zstandard

        cctx = zstandard.ZstdCompressor(
            level=self.level or ZSTD_LEVEL, write_checksum=True, write_content_size=False
        )
        table: list[tuple[int, int]] = []
        pending = bytearray()
        got = 0
        written = 0

        def flush_frame(data: Any) -> None:
            nonlocal written
            # Size not pledged, as ztensor 2.1.2 compresses: same window, same bytes.
            cobj = cctx.compressobj()
            frame = cobj.compress(data) + cobj.flush()
            self.fp.write(frame)
            table.append((len(frame), len(data)))
            written += len(frame)

        for piece in stream:
            view = memoryview(piece).cast("B")
            got += view.nbytes
            if got > nbytes:
                break
            if digester is not None:
                digester.update(view)
            start = 0
            if pending:
                take = min(ZSTD_FRAME - len(pending), view.nbytes)
                pending += view[:take]
                start = take
                if len(pending) == ZSTD_FRAME:
                    flush_frame(bytes(pending))
                    pending.clear()
            while view.nbytes - start >= ZSTD_FRAME:
                flush_frame(view[start : start + ZSTD_FRAME])
                start += ZSTD_FRAME
            if start < view.nbytes:
                pending += view[start:]
        if pending:  # an empty part is a seek table of 0 frames, as ztensor 2.1.2 writes it
            flush_frame(bytes(pending))
        entries = b"".join(struct.pack("<II", c, d) for c, d in table)
        seek = entries + struct.pack("<IBI", len(table), 0, SEEK_MAGIC)
        tail = struct.pack("<II", SEEK_SKIPPABLE, len(seek)) + seek
        self.fp.write(tail)
        written += len(tail)
        self.pos += written
        self._zstd_got = got
        return written

    def manifest(self) -> dict[str, Any]:
        root: dict[str, Any] = {"objects": self.objects}
        if self.attributes:
            root["attributes"] = self.attributes
        return root

    def finish(self) -> int:
        """Write the manifest blob and the footer; return the file size."""
        raw = cbor.dumps(self.manifest())
        moff = _align_up(self.pos, self.align)
        self._pad_to(moff)
        self.fp.write(raw)
        self.fp.write(FOOTER.pack(moff, len(raw), manifest_hash(raw), VERSION, 0, MAGIC))
        self.pos += len(raw) + FOOTER_SIZE
        return self.pos


class Zt2Sink(TensorSink):
    """`convert` into zTensor 2: canonical by default (raw, xxh3, 64 KiB, sorted names);
    `--compress zstd[:LEVEL]` writes zt.zstd-seekable/1 parts at 4096-byte alignment;
    `--digest sha256|none` changes the digests (not canonical then)."""

    format = FORMAT
    dtypes = frozenset(TO_ZT2)
    layouts = frozenset({"dense", "sparse_csr", "sparse_coo", "quantized_group"})
    keeps_metadata = True
    accepts = ("compress", "digest")

    def refuse(self, info: TensorInfo) -> str | None:
        if info.layout.startswith("zt2:"):
            if VERBATIM in info.attributes:
                return None
            return f"its layout {info.layout[4:]} cannot be read from its source"
        why = super().refuse(info)
        if why or info.layout != "quantized_group":
            return why
        if ggml_layout(info) is None:
            return (
                "only quantized_group tensors that hold raw ggml blocks (GGUF --keep-quantized) "
                "have a zTensor 2 profile (gguf.<type>/1)"
            )
        return None

    def order(self, plan: list[TensorInfo]) -> list[TensorInfo]:
        return sorted(plan, key=lambda i: i.name.encode("utf-8"))

    def begin(self, out: Outputs, plan: list[TensorInfo], metadata: Mapping[str, Any]) -> None:
        level = self.options.get("compress_level")
        digest = self.options.get("digest", "xxh3")
        self._notes: list[str] = []
        self.writer = Zt2Writer(out.main, digest=digest, level=level, attributes=metadata)
        self.count = 0

    def add(self, info: TensorInfo, parts: PartStreams) -> None:
        if VERBATIM in info.attributes:
            meta = info.attributes[VERBATIM]
            attrs = {k: v for k, v in info.attributes.items() if k != VERBATIM}
            sizes = {c.role: c.count for c in info.components}
            copied = [
                (role, dtype, ltype, sizes[role], parts(role))
                for role, (dtype, ltype) in meta["parts"].items()
            ]
            self.writer.add(info.name, info.shape, meta["layout"], copied, attrs)
            self.count += 1
            return
        if info.layout == "quantized_group":
            layout, attrs = ggml_layout(info) or ("", {})
            c = next(p for p in info.components if p.role == "packed_weight")
            self.writer.add(
                info.name,
                info.shape,
                layout,
                [("data", "u8", None, c.nbytes, parts("packed_weight"))],
                attrs,
            )
        else:
            layout = {v: k for k, v in TO_MATRIX_LAYOUT.items()}[info.layout]
            pieces: list[tuple[str, str, str | None, int, Iterator[Any]]] = []
            for p in info.parts():
                dtype, ltype = TO_ZT2[p.dtype]
                pieces.append((p.role, dtype, ltype, p.nbytes, parts(p.role)))
            self.writer.add(info.name, info.shape, layout, pieces, info.attributes)
        self.count += 1

    def finish(self) -> dict[str, Any]:
        size = self.writer.finish()
        w = self.writer
        return {
            "bytes": size,
            "zt_version": 2,
            "canonical": w.canonical,
            "encoding": "raw" if w.level is None else f"zstd:{w.level}",
            "digest": w.digest or "none",
        }

    def notes(self) -> list[str]:
        if not self.writer.canonical and self.writer.level is None and self.writer.digest:
            return ["the output is valid zTensor 2 but not canonical (a name is not in NFC)"]
        return list(self._notes)


def ggml_layout(info: TensorInfo) -> tuple[str, dict[str, Any]] | None:
    """(gguf.<type>/1, attributes) for a quantized_group tensor of raw ggml blocks."""
    a = info.attributes
    if a.get("quantization") != "ggml":
        return None
    from matrixctl.formats.gguf import GGML_BY_NAME

    g = GGML_BY_NAME.get(str(a.get("ggml_type")))
    if g is None or not g.quantized or g.name.lower() not in GGUF_TYPES:
        return None
    if (a.get("block_size"), a.get("type_size")) != (g.block_size, g.type_size):
        return None
    rest = {
        k: v
        for k, v in a.items()
        if k not in ("quantization", "ggml_type", "ggml_type_id", "block_size", "type_size")
    }
    rest |= {"elems_per_block": g.block_size, "block_bytes": g.type_size}
    return f"gguf.{g.name.lower()}/1", rest


def save_file(
    tensors: Mapping[str, Any],
    path: str,
    *,
    compress: str | None = None,
    digest: str | None = "xxh3",
    attributes: Mapping[str, Any] | None = None,
) -> int:
    """Write numpy arrays as a zTensor 2 file, atomically; return its size. Canonical (the
    bytes ztensor 2.1.2's `save_file` writes for the same arrays) unless `compress`
    (`zstd[:LEVEL]`) or `digest` (`sha256`, None) say otherwise. bf16 and float8 arrays are
    ml_dtypes arrays; bool is stored as u8 with logical type bool."""
    import numpy as np

    from matrixctl.formats.ztensor import parse_compress
    from matrixctl.io import atomic_output

    level = parse_compress(compress)
    for name in tensors:  # names are UTF-8 text in the manifest: checked before anything is written
        if not isinstance(name, str) or not _encodable(name):
            raise UsageError(f"tensor name {name!r} is not valid Unicode text (UTF-8)")
    with atomic_output(path, what="a zTensor 2 file") as fp:
        writer = Zt2Writer(fp, digest=digest, level=level, attributes=attributes)
        for name in sorted(tensors, key=lambda n: n.encode("utf-8")):
            arr = np.asarray(tensors[name], order="C")  # ascontiguousarray makes 0-d 1-d
            kind = _numpy_dtype(arr.dtype)
            if kind is None:
                raise UsageError(f"{name}: numpy dtype {arr.dtype} has no zTensor 2 type")
            dtype, ltype = TO_ZT2[kind]
            raw = arr.reshape(-1).view(np.uint8)
            writer.add(name, arr.shape, DENSE, [("data", dtype, ltype, raw.nbytes, iter([raw]))])
        return writer.finish()


def _numpy_dtype(dt: Any) -> str | None:
    """The matrixctl dtype of a numpy dtype (ml_dtypes' by name)."""
    by_name = {"bfloat16": "bf16", "float8_e4m3fn": "f8_e4m3", "float8_e5m2": "f8_e5m2"}
    if dt.name in by_name:
        return by_name[dt.name]
    for name, d in DTYPES.items():
        if d.numeric and dt.kind != "V" and dt == d.storage.replace("|b1", "?"):
            return name
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True
