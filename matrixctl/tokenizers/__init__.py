"""Tokenizers: the π symbol-map tokenizer (`pi`); others live beside it in their own modules."""
