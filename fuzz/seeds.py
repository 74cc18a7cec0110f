"""Build fuzz/corpus/<harness>/ from the golden files, the fixtures and small files matrixctl
writes itself (deterministic). Run by `make fuzz` before the harnesses."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "fuzz" / "corpus"


def _cli(*args: str) -> None:
    from matrixctl.cli.app import main

    with contextlib.redirect_stderr(io.StringIO()):
        code = main([*args, "-q"])
    if code != 0:
        raise SystemExit(f"seed command failed: {args}")


def build() -> None:
    import numpy as np

    from tests.helpers import ggufcraft

    golden = ROOT / "tests" / "golden"
    shutil.rmtree(CORPUS, ignore_errors=True)
    seeds: dict[str, list[Path]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ids = d / "ids.txt"
        ids.write_text(" ".join(str(i) for i in range(1, 300)))
        _cli("pack", "atoms", str(ids), "-n", "16", "-o", str(d / "a.bin"))
        _cli("pack", "svgt", str(d / "a.bin"), "--grid", "4x4", "-o", str(d / "a.svgt"))
        _cli("tokenize", "pi", "encode", str(ids), "-o", str(d / "t.mxt"))
        np.savez(d / "n.npz", a=np.arange(5), b=np.ones((2, 2), dtype=np.float32))
        np.save(d / "n.npy", np.arange(10, dtype=np.int16))
        _cli("convert", str(d / "n.npz"), str(d / "s.safetensors"))
        _cli("convert", str(d / "n.npz"), str(d / "z.zt"), "--compress", "zstd")
        _cli("convert", str(d / "n.npz"), str(d / "x.stb"), "--select", "b")
        ggufcraft.write_model(str(d / "g.gguf"), extra=False, embd_type="Q8_0")
        _cli("ingest", "docs", str(ROOT / "fixtures" / "corpus"), "-o", str(d / "pack"))
        _cli("convert", str(d / "pack"), str(d / "m"), "--to", "megatron")
        seeds = {
            "matrix_atom": [golden / "matrix_atom_v1.bin", golden / "matrix_atom_v1_legacy_crc.bin",
                            d / "a.bin"],
            "svgt": [golden / "svgt_v1.svgt", d / "a.svgt"],
            "token_stream": [golden / "token_stream_v1.mxt", d / "t.mxt"],
            "pi_symbol_map": [d / "pack" / "pi_symbol_map.json"],
            "doc_index": [d / "pack" / "doc_index.bin"],
            "megatron": [d / "m.idx"],
            "ztensor": [golden / "ztensor_v1_dense.zt", golden / "ztensor_v1_multi.zt", d / "z.zt"],
            "safetensors": [d / "s.safetensors"],
            "npy": [d / "n.npy"],
            "npz": [d / "n.npz"],
            "stb": [golden / "stb_v01_tiny.stb", d / "x.stb"],
            "stb_sidecar": [d / "x.stb.json"],
            "embd": [golden / "embd_v1_tiny.weights"],
            "gguf": [d / "g.gguf"],
            "scx_registry": [golden / "scx_registry_v1.scxr"],
            "scx_manifest": [],
            "scx_shard": [],
            "cbor": [],
            "extract_html": [ROOT / "fixtures" / "corpus" / "guide.html"],
            "extract_json": [],
            "extract_jsonl": [ROOT / "fixtures" / "corpus" / "records.jsonl"],
            "extract_markdown": [ROOT / "fixtures" / "corpus" / "notes" / "readme.md"],
        }  # fmt: skip
        from tests.helpers import zt2craft

        seeds["ztensor2"] = []
        for n, case in enumerate(zt2craft.CASES):  # the zTensor 2 conformance set
            (d / f"zt2-{n}.zt").write_bytes(case.build())
            seeds["ztensor2"].append(d / f"zt2-{n}.zt")
        _cli("convert", str(d / "n.npz"), str(d / "z2.zt"), "--to", "ztensor-v2")
        seeds["ztensor2"].append(d / "z2.zt")
        seeds.update(_columnar(d))
        extra: dict[str, list[bytes]] = {
            "extract_json": [json.dumps([{"text": "a"}, {"text": "b\u00e9"}]).encode()],
            "scx_manifest": [json.dumps({"format": "scx-manifest"}).encode()],
            **_compressed(),
        }
        for name in sorted(set(seeds) | set(extra)):
            paths = seeds.get(name, [])
            out = CORPUS / name
            out.mkdir(parents=True, exist_ok=True)
            for i, p in enumerate(paths):
                if p.exists():
                    (out / f"seed{i}").write_bytes(p.read_bytes())
            for i, data in enumerate(extra.get(name, [])):
                (out / f"extra{i}").write_bytes(data)
        from matrixctl import cbor

        out = CORPUS / "cbor"
        values = [{"a": [1, -2, 3.5, True, None], "b": b"\x00\x01"}, [[[]]], "text", 2**40]
        for i, value in enumerate(values):
            (out / f"value{i}").write_bytes(cbor.dumps(value))
        _q8_0(CORPUS / "q8_0")


def _q8_0(out: Path) -> None:
    """Tensors for the Q8_0 quantizer: a dtype byte (0 f32, 1 f16, 2 bf16, 3 f64), then values:
    ordinary ones, one NaN, one infinity, one beyond the float16 scale, tiny ones."""
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(7).standard_normal(64).astype(np.float32)
    cases = {"normal": x.copy(), "nan": x.copy(), "inf": x.copy(), "big": x.copy()}
    cases["nan"][3], cases["inf"][40], cases["big"][7] = np.nan, -np.inf, 9e6
    cases["tiny"] = (x * np.float32(1e-38)).astype(np.float32)
    for name, values in cases.items():
        (out / f"{name}-f32").write_bytes(b"\x00" + values.tobytes())
        (out / f"{name}-f64").write_bytes(b"\x03" + values.astype(np.float64).tobytes())
    (out / "normal-f16").write_bytes(b"\x01" + x.astype(np.float16).tobytes())


def _compressed() -> dict[str, list[bytes]]:
    """Multi-member / multi-frame / multi-stream inputs of each compression ingest reads."""
    import bz2
    import gzip
    import lzma

    import zstandard

    text = (ROOT / "fixtures" / "corpus" / "records.jsonl").read_bytes()
    half = len(text) // 2
    a, b = text[:half], text[half:]
    zstd = zstandard.ZstdCompressor(level=3)
    no_size = zstandard.ZstdCompressor(level=1, write_content_size=False)
    return {
        "decompress_gzip": [gzip.compress(a) + gzip.compress(b), gzip.compress(text) + bytes(8)],
        "decompress_zstd": [zstd.compress(a) + no_size.compress(b), zstd.compress(text)],
        "decompress_xz": [lzma.compress(a) + lzma.compress(b), lzma.compress(text)],
        "decompress_bz2": [bz2.compress(a) + bz2.compress(b), bz2.compress(text)],
    }


def _columnar(d: Path) -> dict[str, list[Path]]:
    """Small Parquet and Arrow (file and stream) inputs with a `text` column (pyarrow)."""
    try:
        import pyarrow
        import pyarrow.ipc
        from pyarrow import parquet
    except ImportError:
        return {"columnar_parquet": [], "columnar_arrow": []}
    table = pyarrow.table(
        {"text": ["a", "b\u00e9", None, "long " * 20], "n": [1, 2, 3, 4],
         "meta": [{"text": "x"}, None, {"text": "y"}, {"text": None}]}
    )  # fmt: skip
    parquet.write_table(table, d / "t.parquet", row_group_size=2)
    parquet.write_table(table, d / "tz.parquet", compression="zstd")
    with (
        pyarrow.OSFile(str(d / "t.arrow"), "wb") as sink,
        pyarrow.ipc.new_file(sink, table.schema) as w,
    ):
        w.write_table(table, max_chunksize=2)
    with (
        pyarrow.OSFile(str(d / "s.arrows"), "wb") as sink,
        pyarrow.ipc.new_stream(sink, table.schema) as w,
    ):
        w.write_table(table)
    return {
        "columnar_parquet": [d / "t.parquet", d / "tz.parquet"],
        "columnar_arrow": [d / "t.arrow", d / "s.arrows"],
    }


if __name__ == "__main__":
    build()
    print(f"seeds in {CORPUS}")
