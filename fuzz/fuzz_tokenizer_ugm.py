"""Fuzz harness: the ugm model tokenizer on llama.cpp's nomic-bert-moe vocabulary (see
fuzz/model_tokenizers.py and fuzz/common.py)."""

import common
import model_tokenizers

if __name__ == "__main__":
    common.main("tokenizer_ugm", model_tokenizers.target("ugm", "nomic-bert-moe"))
