"""Measurement: storage bytes read by `matrixctl.open_pack` and by random atom reads.

    python bench/bench_pack_reads.py PACKDIR [--atoms 50]

Evicts the pack's atom file from the page cache (posix_fadvise DONTNEED on that one file), opens
the pack, evicts again, reads N random atoms (every byte of each), and prints the bytes the
process read from storage (/proc/self/io read_bytes) for the open and for the atoms. Linux only.
"""

from __future__ import annotations

import argparse
import os
import random

import matrixctl


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def storage_read() -> int:
    with open("/proc/self/io") as fp:
        rows = dict(line.split(": ") for line in fp.read().splitlines())
    return int(rows["read_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pack")
    parser.add_argument("--atoms", type=int, default=50)
    args = parser.parse_args()
    atoms = os.path.join(args.pack, "matrix_atoms.bin")
    evict(atoms)
    before = storage_read()
    pack = matrixctl.open_pack(args.pack)
    opened = storage_read() - before
    evict(atoms)
    before = storage_read()
    rng = random.Random(0)
    picks = rng.sample(range(len(pack)), min(args.atoms, len(pack)))
    for i in picks:
        int(pack[i].sum())
    read = storage_read() - before
    row = pack.atom_size * pack.dtype.itemsize
    print(f"payload {os.path.getsize(atoms) // 1024} KiB: {len(pack)} atoms of {row} B")
    print(f"open_pack read {opened // 1024} KiB")
    print(
        f"{len(picks)} random atoms read {read // 1024} KiB ({read / len(picks) / 1024:.1f} KiB each)"
    )


if __name__ == "__main__":
    main()
