"""Fuzz harness: embd (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("embd", common.examine_target("embd"))
