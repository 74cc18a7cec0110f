"""Tokenizers: the pi symbol-map tokenizer and the SCX lane-packed byte tokenizer."""
