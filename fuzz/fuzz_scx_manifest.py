"""Fuzz harness: scx manifest (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("scx_manifest", common.examine_target("scx-manifest"))
