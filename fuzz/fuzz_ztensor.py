"""Fuzz harness: ztensor (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("ztensor", common.examine_target("ztensor"))
