"""Fuzz harness: matrix atom (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("matrix_atom", common.examine_target("matrix-atom"))
