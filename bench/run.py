"""`make bench`: run every bench/bench_*.py in turn and print their tables (stdout)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    worst = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n## {script.name}\n", flush=True)
        worst = max(worst, subprocess.run([sys.executable, str(script)], check=False).returncode)
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
