"""Fuzz harness: pi symbol map (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("pi_symbol_map", common.examine_target("pi-symbol-map"))
