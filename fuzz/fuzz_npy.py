"""Fuzz harness: npy (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("npy", common.examine_target("npy"))
