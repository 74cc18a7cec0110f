"""zTensor 2 as a `convert` source: which objects convert reads (`readable`, `copyable`), their
`TensorInfo` (`to_info`) and `Zt2Source`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from matrixctl.errors import FormatError
from matrixctl.formats.ztensor2.layout import (
    COO,
    CSR,
    DENSE,
    FORMAT,
    MATRIX_DTYPE,
    TO_MATRIX_LAYOUT,
    ZSTD_SEEKABLE,
    ZT2_NOT_READ,
    Obj,
    Part,
    Zt2File,
)
from matrixctl.formats.ztensor2.parts import (
    Digester,
    _check_digest,
    _known_digest,
    decode_seekable_into,
    stream_part,
)
from matrixctl.formats.ztensor2.profiles import gguf_type
from matrixctl.tensors import (
    DTYPES,
    Component,
    TensorInfo,
    TensorSource,
    drop_pages,
    storage_array,
)

if TYPE_CHECKING:
    from matrixctl.io import Source

# Reading for convert ------------------------------------------------------------------------


VERBATIM = "zt2.verbatim"  # a TensorInfo attribute only Zt2Sink reads (every other sink refuses)


def copyable(o: Obj) -> bool:
    """Whether zTensor 2 output can copy `o` as it is without interpreting it: its parts are
    in this file and decodable (an unknown layout or logical type is carried, never read)."""
    return all(p.local and p.encoding in (None, ZSTD_SEEKABLE) for p in o.parts.values())


def readable(o: Obj) -> str | None:
    """Why convert cannot read `o` (None: it can)."""
    if o.layout == DENSE and len(o.parts) == 1:
        d = o.parts.get("data")
        if (
            d is not None
            and d.shard is None
            and d.encoding in (None, ZSTD_SEEKABLE)
            and (d.dtype, d.type) in MATRIX_DTYPE
        ):
            return None  # what the loops below find for it, at once
    for p in o.parts.values():
        if not p.local:
            return f"part {p.role} lives in shard {p.shard!r}, which convert does not open"
        if p.encoding not in (None, ZSTD_SEEKABLE):
            return f"part {p.role} has encoding {p.encoding!r}, which this reader does not know"
    if o.layout in (DENSE, CSR, COO):
        for p in o.parts.values():
            if (p.dtype, p.type) not in MATRIX_DTYPE:
                return f"part {p.role} is {p.dtype}/{p.type}, which has no matrixctl dtype"
        return None
    if gguf_type(o.layout) is not None:
        from matrixctl.formats.gguf import GGML_BY_NAME

        g = GGML_BY_NAME.get(gguf_type(o.layout).upper())  # type: ignore[union-attr]
        if g is None:
            return f"layout {o.layout} names a ggml type matrixctl does not know"
        if (o.attributes.get("elems_per_block"), o.attributes.get("block_bytes")) != (
            g.block_size,
            g.type_size,
        ):
            return f"layout {o.layout}: block geometry disagrees with ggml's {g.name}"
        return None
    return f"layout {o.layout!r} has no matrixctl equivalent (inspect and verify read it)"


def to_info(o: Obj) -> TensorInfo:
    attrs = dict(o.attributes)
    if o.layout == DENSE:
        d = o.parts["data"]
        return TensorInfo(o.name, MATRIX_DTYPE[(d.dtype, d.type)], o.shape, "dense", (), attrs)
    gt = gguf_type(o.layout)
    if gt is not None:
        from matrixctl.formats.gguf import GGML_BY_NAME

        g = GGML_BY_NAME[gt.upper()]
        meta = {k: v for k, v in attrs.items() if k not in ("elems_per_block", "block_bytes")}
        meta |= {
            "quantization": "ggml",
            "ggml_type": g.name,
            "ggml_type_id": g.id,
            "block_size": g.block_size,
            "type_size": g.type_size,
        }
        return TensorInfo(
            o.name,
            "u8",
            o.shape,
            "quantized_group",
            (
                Component("packed_weight", "u8", o.parts["data"].decoded_size),
                Component("scales", "f32", 0),
                Component("zeros", "f32", 0),
            ),
            meta,
        )
    roles = ("values", "indices", "indptr") if o.layout == CSR else ("values", "coords")
    comps = []
    for role in roles:
        p = o.parts[role]
        dt = MATRIX_DTYPE[(p.dtype, p.type)]
        comps.append(Component(role, dt, p.decoded_size // DTYPES[dt].itemsize))
    return TensorInfo(
        o.name, comps[0].dtype, o.shape, TO_MATRIX_LAYOUT[o.layout], tuple(comps), attrs
    )


class Zt2Source(TensorSource):
    """A zTensor 2 file opened for `convert`: every structural rule of `verify` must pass."""

    format = FORMAT

    def __init__(self, src: Source, checked: Any) -> None:
        self.src = src
        self.subject = checked
        self.zt: Zt2File = self.subject.zt
        # Objects convert cannot read stay listed (so --select/--exclude see them) under a
        # layout no sink holds, `zt2:<layout>`: the sink refuses them by name if chosen.
        self.unread: dict[str, str] = {}
        self._infos = []
        for o in self.zt.objects.values():
            why = readable(o)
            if why is None:
                self._infos.append(to_info(o))
                continue
            label = o.layout
            if o.layout == DENSE:
                d = o.parts["data"]
                label = f"dense/{d.type or d.dtype}"
            comps = tuple(Component(r, "u8", p.decoded_size) for r, p in o.parts.items())
            attrs = dict(o.attributes)
            if copyable(o):
                # zTensor 2 output copies it as it is (layout, dtypes, types, decoded bytes).
                parts = {r: [p.dtype, p.type] for r, p in o.parts.items()}
                attrs[VERBATIM] = {"layout": o.layout, "parts": parts}
            else:
                self.unread[o.name] = why
            self._infos.append(TensorInfo(o.name, "u8", o.shape, f"zt2:{label}", comps, attrs))

    def tensors(self) -> list[TensorInfo]:
        return list(self._infos)

    def metadata(self) -> dict[str, Any]:
        return dict(self.zt.attributes)

    def _part(self, info: TensorInfo, role: str) -> Part:
        o = self.zt.objects[info.name]
        return o.parts["data" if role == "packed_weight" else role]

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        if info.name in self.unread:
            raise FormatError(
                ZT2_NOT_READ,
                f"object {info.name!r} cannot be converted: {self.unread[info.name]}",
                path=self.src.name,
                field=f"objects/{info.name}",
            )
        if info.layout == "quantized_group" and role != "packed_weight":
            return iter(())
        if VERBATIM in info.attributes:
            return stream_part(self.src.buf, self.zt.objects[info.name].parts[role])
        return stream_part(self.src.buf, self._part(info, role))

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        """Zero-copy view of raw data (after the digest check, unless `verify=False`)."""
        p = self._part(info, role)
        dt = MATRIX_DTYPE[(p.dtype, p.type)]
        if p.encoding == ZSTD_SEEKABLE and p.type != "bool":
            import numpy as np

            out = np.empty(p.decoded_size, dtype=np.uint8)  # decoded_length was checked
            stored = memoryview(self.src.buf)[p.offset : p.end]
            decode_seekable_into(stored, out, f"{p.obj}/{p.role}", p.offset, p.field)
            known = _known_digest(p) if verify else None
            if known is not None:
                digester = Digester(known)
                digester.update(out.data)
                _check_digest(p, digester)
            return out.view(np.dtype(DTYPES[dt].storage))
        if p.encoding is not None or p.type == "bool":
            import numpy as np

            out = np.empty(p.decoded_size, dtype=np.uint8)  # decoded_length was checked
            pos = 0
            for piece in stream_part(self.src.buf, p, verify_digest=verify):
                n = memoryview(piece).nbytes
                out[pos : pos + n] = np.frombuffer(piece, dtype=np.uint8)
                pos += n
            return out.view(np.dtype(DTYPES[dt].storage))
        if p.digest and verify:
            for _ in stream_part(self.src.buf, p):
                pass
        return storage_array(self.src.buf, dt, p.offset, p.length)

    def release(self, info: TensorInfo) -> None:
        for p in self.zt.objects[info.name].parts.values():
            drop_pages(self.src.buf, p.offset, p.length)
