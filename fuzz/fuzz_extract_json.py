"""Fuzz harness: extract json (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("extract_json", common.extractor_target("json"))
