"""SCX-TOK-V1: the lane-packed, signed, replay-safe byte tokenizer (docs/formats/scx.md).

Modules:

- `tokens`: the fixed token table, the error codes of the spec, the hashes (H_API, H_TOK).
- `registry`: the registry file (SCX-TOK-REG-V1): entries, alignment law, signatures.
- `signing`: Ed25519 keys, key ids, trust files, signatures over H_TOK.
- `lanes`: one config's tables and the compiled kernel (lane lookup, bundles, token classes).
- `issues`: the spec's error object (`Issue`) and `ScxFailure`.
- `config`: the signed config (`Tokenizer`, `authorize`, `load_config`).
- `encoder`: the streaming encoder (`Encoder`, `encode_chunks`,
  `encode_file`).
- `decoder`: the streaming decoder (`Decoder`); `segment`: its checking path.
- `api`: the error-addressable encode / decode API; re-exports the names above.
- `shards`: the binary substrate alignment law on files: shard files and `pack shards`.
- `manifest`: the AGL tokenizer manifest (AGL-TOK-MANIFEST-V1): write, read, verify.
"""
