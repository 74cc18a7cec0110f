"""Run every benchmark script in bench/ (bench_*.py) and collect their tables.

    python bench/run.py [NAME ...]     # e.g. `python bench/run.py atoms` runs bench_atoms.py

Each script prints markdown; the combined output goes to stdout and bench/out/results.md.
Figures belong in docs/benchmarks.md with the command that produced them.

The package's bytecode is compiled first (`compileall`, as pip does when it installs a wheel):
with PYTHONDONTWRITEBYTECODE set, or sources newer than their cached bytecode, every start of
`matrixctl` would compile its modules again (about 30-40 ms for a `convert`), a cost no
installed copy pays.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in names]
    out_dir = HERE / "out"
    out_dir.mkdir(exist_ok=True)
    import compileall

    compileall.compile_dir(str(HERE.parent / "matrixctl"), quiet=1)
    parts = [f"# matrixctl benchmarks, {time.strftime('%Y-%m-%d')}\n"]
    failed = 0
    for script in scripts:
        sys.stderr.write(f"== {script.name}\n")
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, check=False
        )
        sys.stderr.write(proc.stderr[-2000:])
        if proc.returncode:
            failed += 1
            parts.append(f"\n## {script.name}: FAILED (exit {proc.returncode})\n")
            continue
        parts.append(f"\n## {script.name}\n{proc.stdout}")
    text = "".join(parts)
    (out_dir / "results.md").write_text(text)
    sys.stdout.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
