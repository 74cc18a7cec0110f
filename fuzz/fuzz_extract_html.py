"""Fuzz harness: extract html (see fuzz/common.py)."""

import common

if __name__ == "__main__":
    common.main("extract_html", common.extractor_target("html"))
