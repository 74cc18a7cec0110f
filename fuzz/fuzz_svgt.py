"""Fuzz harness: svgt (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("svgt", common.examine_target("svgt"))
