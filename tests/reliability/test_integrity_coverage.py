"""The integrity coverage table of docs/reliability.md, by bit flips: in every format with a
CRC or digest, each of the 8 flips of a sample of bytes outside the documented uncovered
ranges makes `verify` fail; the uncovered and warning-only ranges are exactly the ones the
table lists (so the table stays true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from matrixctl.validate.engine import examine

GOLDEN = Path(__file__).resolve().parents[1] / "golden"

# file: (undetected byte ranges, warning-only byte ranges), inclusive, as docs/reliability.md
TABLE: dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {
    "matrix_atom_v1.bin": ([], []),
    "token_stream_v1.mxt": ([], []),
    "scx_registry_v1.scxr": ([], []),
    "svgt_v1.svgt": ([(32, 47)], []),
    "stb_v01_tiny.stb": (
        [(32, 32), (34, 35), (64, 64), (67, 67), (96, 99), (116, 119), (128, 135),
         (192, 194), (256, 259)],
        [(8, 15)],
    ),
    "embd_v1_tiny.weights": ([(8, 8)], [(527, 530)]),
    "ztensor_v1_dense.zt": (
        [(83, 83), (134, 134), (153, 153), (155, 155), (157, 157), (187, 187), (189, 189)],
        [(101, 105)],
    ),
    "ztensor_v1_multi.zt": (
        [(64, 66), (128, 128), (192, 195), (207, 207), (277, 277), (346, 346), (423, 423),
         (425, 425), (427, 436), (439, 447), (449, 453)],
        [(225, 229), (295, 299), (363, 367), (448, 448)],
    ),
}  # fmt: skip


def _inside(off: int, ranges: list[tuple[int, int]]) -> bool:
    return any(a <= off <= b for a, b in ranges)


def _verdict(path: Path, data: bytes) -> str:
    """'error' (verify fails), 'warning' (only --strict fails) or 'none' for one file."""
    path.write_bytes(data)
    report = examine(str(path), scan=True)[0]
    if not report.ok():
        return "error"
    return "warning" if not report.ok(strict=True) else "none"


@pytest.mark.parametrize("name", sorted(TABLE))
def test_bit_flips_in_covered_bytes_fail_verify(tmp_path: Path, name: str) -> None:
    data = (GOLDEN / name).read_bytes()
    undetected, warning_only = TABLE[name]
    path = tmp_path / name
    step = max(1, len(data) // 120)  # a sample of about 120 bytes per file
    offsets = set(range(0, len(data), step))
    offsets |= {a for a, _ in undetected + warning_only}
    for off in sorted(offsets):
        worst = "error"
        for bit in range(8):
            flipped = bytearray(data)
            flipped[off] ^= 1 << bit
            verdict = _verdict(path, bytes(flipped))
            if verdict == "none" or (verdict == "warning" and worst == "error"):
                worst = verdict
            if worst == "none":
                break
        expected = (
            "none"
            if _inside(off, undetected)
            else "warning"
            if _inside(off, warning_only)
            else "error"
        )
        assert worst == expected, f"{name} byte {off}: {worst}, the table says {expected}"
