"""Fuzz harness: the spm model tokenizer on llama.cpp's llama-spm vocabulary (see
fuzz/model_tokenizers.py and fuzz/common.py)."""

import common
import model_tokenizers

if __name__ == "__main__":
    common.main("tokenizer_spm", model_tokenizers.target("spm", "llama-spm"))
