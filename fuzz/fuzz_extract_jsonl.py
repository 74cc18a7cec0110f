"""Fuzz harness: extract jsonl (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("extract_jsonl", common.extractor_target("jsonl"))
