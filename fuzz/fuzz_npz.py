"""Fuzz harness: npz (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("npz", common.examine_target("npz"))
