"""Fuzz harness: extract markdown (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("extract_markdown", common.extractor_target("markdown"))
