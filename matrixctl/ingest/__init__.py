"""`ingest docs` and `ingest merge`: documents to verified ingest packs (spec section 6).

extract.py (text from HTML/JSON/JSON Lines/Markdown/text), sources.py (the inputs, their order
and shards), pipeline.py (worker processes and the one ordered writer), pack.py (the pack folder:
atoms, document index, projection, map, manifest; atomic), merge.py (shard packs into one).
"""
