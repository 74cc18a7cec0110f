"""Fuzz harness: stb (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("stb", common.examine_target("stb", ".stb"))
