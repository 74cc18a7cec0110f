"""`matrixctl convert` without typer: the command's body, and the start-up fast path to it.

A `convert` of stored bytes is mostly start-up: importing typer (and its click) and building the
command from its annotations cost about as much as copying 75 MB. So `cli/entry.py` hands the
words to `parse_convert`, which accepts a plain use of the command's options only: every
option at most once (the repeatable ones, `--select`, `--exclude`, `--dtype`, `--meta`, as
often as wanted), written `--name VALUE`, `--name=VALUE` or `-x VALUE`, no value that could be
read as an option, whole numbers in plain decimal digits, exactly two positional words (SRC and
DST), no `--` and no `--help`. `run_convert` then runs `run`, the one body of the command, as
cli/app.py's `main()` would. Anything else goes to the full command line (`cli/convert.py`
calls the same `run`), so help texts and usage errors stay typer's own; tests/cli/test_startup.py
runs both paths on the same words and compares exit codes, stdout, stderr and the output file.
"""

from __future__ import annotations

import sys
from typing import Any

from matrixctl.cli import common

# Option spellings -> (parameter, kind): "str", "int", "list" (repeatable) or "flag". Kept equal
# to cli/convert.py's options by tests/cli/test_startup.py (compared with the typer command).
CONVERT_OPTIONS: dict[str, tuple[str, str]] = {
    "--to": ("to", "str"),
    "--atoms": ("atoms", "str"),
    "--select": ("select", "list"),
    "--exclude": ("exclude", "list"),
    "--dtype": ("dtype", "list"),
    "--vocab-size": ("vocab_size", "int"),
    "--compress": ("compress", "str"),
    "--digest": ("digest", "str"),
    "--quantize": ("quantize", "str"),
    "--zt-version": ("zt_version", "int"),
    "--meta": ("meta", "list"),
    "--per-file": ("per_file", "int"),
    "--densify": ("densify", "flag"),
    "--keep-quantized": ("keep_quantized", "flag"),
    "--json": ("json_out", "flag"),
    "--quiet": ("quiet", "flag"),
    "-q": ("quiet", "flag"),
    "--spool-limit": ("spool_limit", "str"),
}
# The options whose typer callbacks change the run's state as they are parsed (cli/options.py).
_CALLBACKS = ("json_out", "quiet", "spool_limit")


def parse_convert(args: list[str]) -> dict[str, Any] | None:
    """The parameters of `convert ...` when the words are a plain use of its options; None
    for anything else (the full command line then parses them). `_order` lists the options
    with a typer callback in the order they were written (typer runs them in that order)."""
    if args[:1] != ["convert"]:
        return None
    from matrixctl.cli.entry import parse_plain

    parsed = parse_plain(args[1:], CONVERT_OPTIONS)
    if parsed is None:
        return None
    found, positional, order = parsed
    if len(positional) != 2:
        return None
    found["src"], found["dst"] = positional
    found["_order"] = [p for p in order if p in _CALLBACKS]
    return found


def run_convert(params: dict[str, Any]) -> int:
    """`convert` with parameters from `parse_convert`, as cli/app.py's `main()` runs it: the
    same state set up, the same callbacks in the same order, the same failure mapping."""
    from matrixctl.cli.entry import failure, start_run

    params = dict(params)
    order = params.pop("_order", [])
    spool_limit = params.pop("spool_limit", None)
    start_run()
    try:
        try:
            for param in order:
                if param == "json_out":
                    common._set_json(True)
                elif param == "quiet":
                    common._set_quiet(True)
                else:
                    common._set_spool_limit(spool_limit)
            if spool_limit is None:
                common._set_spool_limit(None)
            run(**params)
        finally:
            sys.stdout.flush()
        return 0
    except BaseException as exc:
        return failure(exc)


def run(
    src: str,
    dst: str,
    to: str | None = None,
    atoms: str | None = None,
    select: list[str] | None = None,
    exclude: list[str] | None = None,
    dtype: list[str] | None = None,
    vocab_size: int | None = None,
    compress: str | None = None,
    digest: str | None = None,
    quantize: str | None = None,
    zt_version: int | None = None,
    meta: list[str] | None = None,
    per_file: int | None = None,
    densify: bool = False,
    keep_quantized: bool = False,
    json_out: bool = False,
    quiet: bool = False,
) -> None:
    """The body of `matrixctl convert` (its help is cli/convert.py's docstring)."""
    from matrixctl import converters as conv
    from matrixctl.cli.common import emit_json, json_needs_stdout, note, progress, warn
    from matrixctl.io import Source
    from matrixctl.opening import open_path

    json_needs_stdout(json_out, dst)
    dst_fmt = conv.destination_format(dst, to)
    with open_path(src) as (source, src_fmt):
        if src_fmt is None:
            from matrixctl.codes import UNKNOWN_FORMAT
            from matrixctl.errors import FormatError
            from matrixctl.formats import registry

            known = registry.explain_unknown(source) if isinstance(source, Source) else None
            raise FormatError(
                UNKNOWN_FORMAT,
                known or "format not recognised from its bytes",
                path=source.name,
            )
        dst_fmt = conv.ztensor_version(dst_fmt, zt_version, src_fmt)
        converter = conv.find(src_fmt, dst_fmt)
        options: dict[str, Any] = {
            "atoms": atoms,
            "select": select or None,
            "exclude": exclude or None,
            "meta": meta or None,
            "per_file": per_file,
            "dtype": dtype or None,
            "compress": compress,
            "digest": digest,
            "densify": densify or None,
            "keep_quantized": keep_quantized or None,
            "vocab_size": vocab_size,
            "quantize": quantize.lower() if quantize else None,
        }
        conv.check_options(converter, options)
        if "progress" in converter.options:
            with progress("converting", None) as bar:
                options["progress"] = bar
                result = converter.load()(source, dst, options)  # type: ignore[arg-type]
        else:
            result = converter.load()(source, dst, options)  # type: ignore[arg-type]
    for text in result.notes:
        warn(text)
    if json_out:
        emit_json({"input": src, "output": dst, "from": src_fmt, "to": dst_fmt, **result.summary})
    elif not quiet:
        done = result.summary
        if "tensors" in done:
            note(
                f"converted {done['tensors']} of {done['of']} tensors {src_fmt} -> {dst_fmt}: {dst}"
            )
        else:
            note(f"converted {src_fmt} -> {dst_fmt}: {dst}")
