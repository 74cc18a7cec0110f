"""Fuzz harness: extract jsonl (see fuzz/common.py): the extractor, and the two JSON Lines
paths of `ingest docs` (the line reader and the compiled text-field extractor with its
fallback) compared on every input (`common.jsonl_target`)."""

import common

if __name__ == "__main__":
    common.main("extract_jsonl", common.jsonl_target())
