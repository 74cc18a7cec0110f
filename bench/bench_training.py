"""Measurement: the speed rows of issue 30 (docs/training.md).

    python bench/bench_training.py PACKDIR [--batch 64] [--workers 2] [--repeat 3]

1. Atoms/s through a PyTorch DataLoader with `--workers` workers: `matrixctl.torch_dataset`
   (dtype int64) against a plain `np.memmap` map-style dataset over the same atom payload (the
   anchor: what a user writes by hand), both with the same batch size, one epoch each, best of
   `--repeat`.
2. Export to Megatron (`convert PACKDIR PREFIX --to megatron`) against `cp` of the same bytes
   (the pack's document ids, copied with `cp` from a file holding just them), page cache warm,
   best of `--repeat`; the ratio cp/export is the row's figure (the target is >= 0.5).
3. Opening the dataset in a worker: the time from a worker's start to its first atom
   (`worker_init_fn` to the first sample), median over the workers of `--repeat` loaders.

Prints one line per row. Needs torch (the `torch` extra). Writes only into a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np


class MemmapAtoms:
    """The anchor: a map-style dataset over the payload with numpy only."""

    def __init__(self, path: str, offset: int, count: int, atom_size: int, dtype: str) -> None:
        self.args = (path, offset, count, atom_size, dtype)
        self.atoms = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count, atom_size))

    def __len__(self) -> int:
        return self.atoms.shape[0]

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.atoms[i], dtype=np.int64)


def _best(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def dataloader_rows(pack: str, batch: int, workers: int, repeat: int) -> None:
    from torch.utils.data import DataLoader

    import matrixctl

    opened = matrixctl.open_pack(pack)
    count = len(opened)
    header = opened.manifest
    atoms_path = os.path.join(pack, header["atom_file"])
    ours = matrixctl.torch_dataset(pack, dtype="int64", batch_size=batch)
    anchor = MemmapAtoms(atoms_path, 64, count, opened.atom_size, opened.dtype.str)

    def run(ds: object, **kw: object) -> None:
        for _ in DataLoader(ds, batch_size=batch, num_workers=workers, **kw):  # type: ignore[arg-type]
            pass

    t_ours = _best(lambda: run(ours), repeat)
    t_anchor = _best(lambda: run(anchor, shuffle=True), repeat)
    print(
        f"dataloader {workers} workers, batch {batch}: torch_dataset {count / t_ours:,.0f} atoms/s"
    )
    print(
        f"dataloader {workers} workers, batch {batch}: np.memmap map-style {count / t_anchor:,.0f} atoms/s"
    )


def export_rows(pack: str, repeat: int) -> None:
    import matrixctl

    opened = matrixctl.open_pack(pack)
    tokens = int(opened.manifest["tokens"])
    with tempfile.TemporaryDirectory() as tmp:
        plain = os.path.join(tmp, "ids.raw")
        with (
            open(os.path.join(pack, opened.manifest["atom_file"]), "rb") as src,
            open(plain, "wb") as dst,
        ):
            src.seek(64)
            dst.write(src.read(tokens * opened.dtype.itemsize))

        def cp() -> None:
            subprocess.run(["cp", plain, os.path.join(tmp, "copy.raw")], check=True)

        def export() -> None:
            for ext in (".bin", ".idx"):
                if os.path.exists(os.path.join(tmp, "m" + ext)):
                    os.unlink(os.path.join(tmp, "m" + ext))
            matrixctl.convert(pack, os.path.join(tmp, "m"), to="megatron")

        t_cp, t_export = _best(cp, repeat), _best(export, repeat)
    size = tokens * opened.dtype.itemsize
    print(f"cp of the ids: {size / t_cp / 1e6:,.0f} MB/s")
    print(
        f"export --to megatron: {size / t_export / 1e6:,.0f} MB/s (cp/export {t_cp / t_export:.2f})"
    )


def open_rows(pack: str, workers: int, repeat: int) -> None:
    """The time from worker start (worker_init_fn) to its first sample, reported by the
    worker through the sample itself."""
    code = (
        "import sys, time, statistics\n"
        "from torch.utils.data import DataLoader, get_worker_info\n"
        "import matrixctl\n"
        "def init(_):\n"
        "    get_worker_info().dataset.t0 = time.perf_counter()\n"
        "def first(rows):\n"
        "    ds = get_worker_info().dataset\n"
        "    return time.perf_counter() - ds.t0\n"
        "waits = []\n"
        "for _ in range(int(sys.argv[3])):\n"
        "    ds = matrixctl.torch_dataset(sys.argv[1], batch_size=1)\n"
        "    loader = DataLoader(ds, batch_size=1, num_workers=int(sys.argv[2]),\n"
        "                        worker_init_fn=init, collate_fn=first)\n"
        "    it = iter(loader)\n"
        "    waits += [next(it) for _ in range(int(sys.argv[2]))]\n"
        "    del it\n"
        "print(f'opening the dataset in a worker: {statistics.median(waits) * 1e3:.2f} ms (median of {len(waits)})')\n"
    )
    subprocess.run([sys.executable, "-c", code, pack, str(workers), str(repeat)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("cp") is None:
        sys.exit("cp is needed for the export row")
    dataloader_rows(args.pack, args.batch, args.workers, args.repeat)
    export_rows(args.pack, args.repeat)
    open_rows(args.pack, args.workers, args.repeat)


if __name__ == "__main__":
    main()
