"""Fuzz harness: the wpm model tokenizer on llama.cpp's bert-bge vocabulary (see
fuzz/model_tokenizers.py and fuzz/common.py)."""

import common
import model_tokenizers

if __name__ == "__main__":
    common.main("tokenizer_wpm", model_tokenizers.target("wpm", "bert-bge"))
