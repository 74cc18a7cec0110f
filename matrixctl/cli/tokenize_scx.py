"""`matrixctl tokenize scx`: keys, signed registries, encode and decode (SCX-TOK-V1)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from matrixctl.cli.common import (
    JsonOption,
    QuietOption,
    SpoolLimitOption,
    emit_json,
    json_needs_stdout,
    note,
    progress,
    warn,
)

app = typer.Typer(
    help="SCX (SCX-TOK-V1): a byte tokenizer whose merges come from a signed registry file; "
    "each token stream names the config that made it, so another config cannot decode it.",
    no_args_is_help=True,
)

RegistryOption = Annotated[
    str,
    typer.Option(
        "--registry", "-r", help="A signed SCX registry file (SCX-TOK-REG-V1, from `sign`)."
    ),
]
TrustOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trust",
        metavar="FILE",
        help="Trusted public signing keys (a `.pub` file from keygen, or a list of such lines); "
        "repeatable. Default: the files in MATRIXCTL_SCX_TRUST. Nothing is trusted otherwise.",
    ),
]
OutOption = Annotated[
    str, typer.Option("-o", "--output", help="Output file; - writes to stdout (not a terminal).")
]
FRAME_TOKENS = 1 << 20  # tokens per TOKENS frame of `encode`'s output


@app.command("keygen")
def keygen(
    output: Annotated[
        str,
        typer.Option(
            "-o",
            "--output",
            help="Private key file to create (mode 0600); the public key goes to OUTPUT.pub.",
        ),
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace existing key files.")] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Create an Ed25519 key pair for signing SCX registries: OUTPUT and OUTPUT.pub.

    OUTPUT is the private key (mode 0600, never printed): keep it secret. OUTPUT.pub holds one
    line `pi-ed25519 <hex> <key id>` (pi is the spec's name for the signing authority): give it
    to whoever must trust the key (`--trust`).
    """
    from matrixctl.tokenizers.scx import signing

    pub_path = output + ".pub"
    key, pem = signing.generate()
    public = signing.public_line(key.public_key, key.key_id).encode("ascii")
    signing.write_key_pair(output, pem, public, force=force)
    if json_out:
        emit_json(
            {
                "key_id": key.key_id,
                "public_key": key.public_key.hex(),
                "private_key_file": output,
                "public_key_file": pub_path,
            }
        )
    else:
        note(f"wrote private key {output} (mode 0600) and public key {pub_path}: {key.key_id}")


@app.command("sign")
def sign(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE",
            help="A registry source (JSON, or the JSON of `inspect --json REGISTRY`), a "
            "registry file to add a signature to, or a tokenizer manifest (the manifest.json "
            "of `pack shards`) to re-sign with a new key.",
        ),
    ],
    output: OutOption,
    key: Annotated[str, typer.Option("--key", "-k", help="The private signing key (from keygen).")],
    parent: Annotated[
        str | None,
        typer.Option(
            "--parent",
            help="The previous revision's registry file: the new one must append to it.",
        ),
    ] = None,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
) -> None:
    """Sign an SCX config: build and sign a registry, add a signature, or rotate a manifest.

    The signature is Ed25519 over the config hash (H_TOK, a hash of the spec version, the
    lane width, the merges, the alignment settings and the API version), so the same config
    signed by another key has the same config hash. Signing a manifest records the new key as
    pi_key_id and moves the old signature to key_history.
    """
    import json

    from matrixctl.errors import FormatError, UsageError
    from matrixctl.io import Source, atomic_output, refuse_binary_to_terminal
    from matrixctl.tokenizers.scx import manifest as scx_manifest
    from matrixctl.tokenizers.scx import registry as scx_registry
    from matrixctl.tokenizers.scx import signing

    json_needs_stdout(json_out, output)
    private = signing.load_private(key)
    with Source.open(source) as src:
        data = bytes(src.buf[: src.size])
        name = src.name
    summary: dict[str, Any] = {"input": source, "output": output, "key_id": private.key_id}
    if scx_manifest.sniff(data[:64], len(data)):
        if parent is not None:
            raise UsageError("--parent applies to registries, not manifests")
        try:
            man = scx_manifest.parse(data)
        except FormatError as err:
            raise err.with_path(name) from None
        sig = scx_registry.Signature(private.public_key, private.sign(man.config_hash))
        rotated = man.rotated(sig)
        text = rotated.to_bytes()
        with atomic_output(output, what="a manifest") as fp:
            fp.write(text)
        summary.update(
            kind="manifest",
            config_hash=man.config_hash.hex(),
            previous_key_id=man.pi_key_id,
            manifest_hash=rotated.h_manifest.hex(),
        )
        message = (
            f"rotated {name} from {man.pi_key_id} to {private.key_id} (same config hash) "
            f"-> {output}"
        )
    else:
        if data.startswith(scx_registry.MAGIC):
            try:
                rf = scx_registry.parse(data)
            except FormatError as err:
                raise err.with_path(name) from None
            kind = "registry"
        else:
            try:
                doc = json.loads(data.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise FormatError(
                    scx_registry.SCX_REG_SOURCE,
                    f"neither a registry, a manifest nor a JSON registry source ({exc})",
                    path=name,
                ) from None
            try:
                rf = scx_registry.from_source(doc)
            except FormatError as err:
                raise err.with_path(name) from None
            kind = "source"
        if parent is not None:
            with Source.open(parent) as psrc:
                try:
                    prf = scx_registry.parse(bytes(psrc.buf[: psrc.size]))
                except FormatError as err:
                    raise err.with_path(psrc.name) from None
            try:
                scx_registry.check_append_only(prf, rf)
            except FormatError as err:
                raise err.with_path(name) from None
        elif rf.registry.revision:
            raise UsageError(
                f"revision {rf.registry.revision} names a parent; pass it with --parent so the "
                "append-only rule can be checked"
            )
        signed = rf.with_signature(
            scx_registry.Signature(private.public_key, private.sign(rf.h_tok))
        )
        refuse_binary_to_terminal(output, "a registry")
        with atomic_output(output, what="a registry") as fp:
            fp.write(signed.to_bytes())
        summary.update(
            kind=kind,
            h_reg=rf.h_reg.hex(),
            h_align=rf.h_align.hex(),
            h_tok=rf.h_tok.hex(),
            signatures=[s.key_id for s in signed.signatures],
            composites=len(rf.registry.composites),
        )
        message = (
            f"signed {name} ({len(rf.registry.composites)} composites, "
            f"{rf.registry.lane_mode_name}) with {private.key_id}: "
            f"config hash {rf.h_tok.hex()[:16]}... -> {output}"
        )
    if json_out:
        emit_json(summary)
    else:
        note(message)


@app.command("encode")
def encode(
    registry: RegistryOption,
    input_path: Annotated[
        str, typer.Argument(metavar="[INPUT|-]", help="Bytes to encode; - or nothing is stdin.")
    ] = "-",
    output: OutOption = "-",
    trust: TrustOption = None,
    strict_alignment: Annotated[
        bool,
        typer.Option(
            "--strict-alignment",
            help="Refuse input whose length is not a whole number of bundles (the registry "
            "sets a bundle: N lanes of W bytes) instead of padding the last bundle with the "
            "registry's pad byte.",
        ),
    ] = False,
    debug_markers: Annotated[
        bool,
        typer.Option(
            "--debug-markers",
            help="Add marker tokens for debugging (LANE_MARK before every lane, CHUNK_MARK at "
            "every chunk); decoding does not need them.",
        ),
    ] = False,
    jobs: Annotated[
        int,
        typer.Option(
            "--jobs", "-j", min=1, max=64, help="Encoding threads (the tokens do not change)."
        ),
    ] = 1,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Encode bytes into an SCX-TOK-V1 token stream (a matrixctl token stream, uint16).

    The registry's signature must come from a trusted key (UNSIGNED_REGISTRY otherwise). The
    output is an MXTOKENS stream (`pack atoms` reads it) whose tokens start with TOK_CONFIG and
    the config hash, so a decoder can refuse tokens made by another config.
    """
    import numpy as np

    from matrixctl.atoms import input_size
    from matrixctl.formats.token_stream import TokenStreamWriter
    from matrixctl.io import atomic_output, display_name, open_input_stream
    from matrixctl.tokenizers.scx import api

    json_needs_stdout(json_out, output)
    tok, _ = api.load_config(registry, trust)
    warnings: list[api.Issue] = []
    padding: list[int] = []
    tokens = 0
    counted = [0]

    def tick(n: int) -> None:
        counted[0] += n
        bar.advance(n)

    with (
        progress("encoding", input_size(input_path)) as bar,
        open_input_stream(input_path) as src,
        atomic_output(output, what="a token stream") as out,
    ):
        writer = TokenStreamWriter(out, dtype="uint16", vocab_size=1 << 16)
        # Frames of exactly FRAME_TOKENS (the last may be short): the bytes do not depend on
        # how the encoder hands the tokens out (--jobs, read sizes)
        batch: list[np.ndarray] = []
        held = 0
        try:
            for arr in api.encode_file(
                tok,
                src,
                jobs=jobs,
                tick=tick,
                strict_alignment=strict_alignment,
                emit_debug_markers=debug_markers,
                warnings=warnings,
                padding=padding,
            ):
                batch.append(arr)
                held += arr.size
                if held >= FRAME_TOKENS:
                    joined = np.concatenate(batch)
                    whole = held - held % FRAME_TOKENS
                    for at in range(0, whole, FRAME_TOKENS):
                        writer.write(joined[at : at + FRAME_TOKENS])
                    tokens += whole
                    batch, held = [joined[whole:]], held - whole
        except api.ScxFailure as err:
            raise err.with_path(display_name(input_path)) from None
        if held:
            writer.write(np.concatenate(batch))
            tokens += held
        writer.end_document("")
        writer.close()
    for w in warnings:
        warn(f"[{w.code}] {w.message} ({w.where()})")
    if json_out:
        emit_json(
            {
                "input": input_path,
                "output": output,
                "bytes": counted[0],
                "tokens": tokens,
                "h_tok": tok.h_tok.hex(),
                "authority": tok.authority.key_id if tok.authority else None,
                "padding": padding[0],
                "warnings": [w.to_json() for w in warnings],
            }
        )
    else:
        padded = f", last bundle padded with {padding[0]} bytes" if padding[0] else ""
        note(
            f"encoded {counted[0]:,} bytes into {tokens:,} SCX tokens{padded} "
            f"(config hash {tok.h_tok.hex()[:16]}...) -> {output}"
        )


@app.command("decode")
def decode(
    registry: RegistryOption,
    input_path: Annotated[
        str,
        typer.Argument(
            metavar="[INPUT|-]", help="A token stream from `encode`; - or nothing is stdin."
        ),
    ] = "-",
    output: OutOption = "-",
    trust: TrustOption = None,
    lenient: Annotated[
        bool,
        typer.Option(
            "--lenient",
            help="Accept decodable but non-canonical streams (raw lanes that have a composite, "
            "deprecated composites, missing debug markers) with warnings; by default they are "
            "INVERTIBILITY_VIOLATION (strict_invertibility).",
        ),
    ] = False,
    json_out: JsonOption = False,
    quiet: QuietOption = False,
    spool_limit: SpoolLimitOption = None,
) -> None:
    """Decode an SCX token stream back into the exact bytes (the strict inverse of encode).

    Any error (an unknown token, a broken bundle or shard, tokens of another config, a count
    that disagrees) stops with its code and token index; nothing is written.
    """
    from matrixctl.atoms import input_size
    from matrixctl.io import atomic_output, display_name, open_input_stream
    from matrixctl.tokenizers.scx import api
    from matrixctl.tokenizing import decode_token_stream

    json_needs_stdout(json_out, output)

    tok, _ = api.load_config(registry, trust)
    with (
        progress("decoding", input_size(input_path)) as bar,
        open_input_stream(input_path) as src,
        atomic_output(output, what="decoded bytes") as out,
    ):
        result = decode_token_stream(
            tok, src, out, strict=not lenient, tick=bar.advance, name=display_name(input_path)
        )
    for w in result["warnings"]:
        warn(f"[{w.code}] {w.message} ({w.where()})")
    result["warnings"] = [w.to_json() for w in result["warnings"]]
    result.update(input=input_path, output=output, h_tok=tok.h_tok.hex())
    if json_out:
        emit_json(result)
    else:
        note(f"decoded {result['tokens']:,} SCX tokens into {result['bytes']:,} bytes -> {output}")
