"""CI's short run of the fuzz harnesses under fuzz/: every harness's target (the function
inspect and verify call for its reader) gets a few seeded mutations of a seed, and must answer
with nothing or the project's typed error. The long, coverage-guided runs are `make fuzz`."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
HARNESSES = sorted(FUZZ.glob("fuzz_*.py"))
SEED_FILES = {
    "matrix_atom": GOLDEN / "matrix_atom_v1.bin",
    "svgt": GOLDEN / "svgt_v1.svgt",
    "token_stream": GOLDEN / "token_stream_v1.mxt",
    "ztensor": GOLDEN / "ztensor_v1_multi.zt",
    "stb": GOLDEN / "stb_v01_tiny.stb",
    "embd": GOLDEN / "embd_v1_tiny.weights",
    "scx_registry": GOLDEN / "scx_registry_v1.scxr",
    "extract_html": CORPUS / "guide.html",
    "extract_jsonl": CORPUS / "records.jsonl",
    "extract_markdown": CORPUS / "notes" / "readme.md",
}
EXECUTIONS = 25


def test_every_reader_has_a_harness() -> None:
    names = {h.stem.removeprefix("fuzz_") for h in HARNESSES}
    assert len(names) >= 21 and {"ztensor", "gguf", "cbor", "npz", "extract_html"} <= names


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("harness", HARNESSES, ids=lambda p: p.stem)
def test_harness_short_run(harness: Path) -> None:
    sys.path.insert(0, str(FUZZ))
    try:
        import common
    finally:
        sys.path.remove(str(FUZZ))
    m = re.search(r'common\.main\("(\w+)", common\.(\w+)\(([^)]*)\)\)', harness.read_text())
    assert m, harness
    name, factory, args = m.group(1), m.group(2), m.group(3)
    target = getattr(common, factory)(*[a.strip().strip('"') for a in args.split(",") if a])
    seed_file = SEED_FILES.get(name)
    seed = seed_file.read_bytes() if seed_file else b""
    rng = random.Random(f"ci-{name}")
    target(seed)
    for _ in range(EXECUTIONS):
        target(common._mutate(rng, seed))  # raises on anything but a typed error
