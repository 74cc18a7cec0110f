"""Fuzz harness: the wpm model tokenizer on llama.cpp's bert-bge vocabulary (see
fuzz/common.py, model_tokenizer_target)."""

import common

if __name__ == "__main__":
    common.main("tokenizer_wpm", common.model_tokenizer_target("wpm", "bert-bge"))
