"""Fuzz harness: gguf (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("gguf", common.examine_target("gguf"))
