"""SCX-TOK-V1: the lane-packed, signed, replay-safe byte tokenizer (docs/formats/scx.md).

Modules:

- `tokens`: the fixed token table, the error codes of the spec, the hashes (H_API, H_TOK).
- `registry`: the registry file (SCX-TOK-REG-V1): entries, alignment law, signatures.
- `signing`: Ed25519 keys, key ids, trust files, signatures over H_TOK.
- `lanes`: the vectorized numpy kernels (lane lookup, bundle assembly, stream checks).
- `api`: the error-addressable encode / decode API and the streaming encoder and decoder.
- `shards`: the binary substrate alignment law on files: shard files and `pack shards`.
- `manifest`: the AGL tokenizer manifest (AGL-TOK-MANIFEST-V1): write, read, verify.
"""
