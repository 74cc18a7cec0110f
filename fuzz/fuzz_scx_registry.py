"""Fuzz harness: scx registry (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("scx_registry", common.examine_target("scx-registry"))
