"""Fuzz harness: stb sidecar (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("stb_sidecar", common.examine_target("stb-sidecar", ".stb.json"))
