"""Fuzz harness: Markdown extraction on long stretched inputs, under a time bound (see
fuzz/common.py, `markdown_target`)."""

import common

if __name__ == "__main__":
    common.main("extract_markdown_linear", common.markdown_target())
