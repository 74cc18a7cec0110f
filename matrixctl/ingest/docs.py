"""`ingest docs`: documents to a complete ingest pack.

The shape (docs/architecture.md, "ingest docs"): the input kinds (`ingest/kinds/`) say how each
input is sniffed, read and cut; the planner (`ingest/units.py`) turns the inputs into work
units; the one tokenizing step (`ingest/step.py`) turns a unit into ids through the tokenizer
interface (`ingest/tokenizer.py`); an executor (`ingest/executors/`: serial, processes, dask)
runs the units; the one ordered writer (`ingest/writer.py`) builds the pack, the same bytes
whatever the executor and `--jobs`.

This module checks the options, loads the tokenizer, starts the executor and hands the rest to
the writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from matrixctl.errors import UsageError
from matrixctl.ingest import kinds
from matrixctl.ingest.executors import start
from matrixctl.ingest.kinds.base import MAX_WHOLE, Options
from matrixctl.ingest.sources import parse_shard
from matrixctl.ingest.step import Step
from matrixctl.ingest.tokenizer import PiRecipe
from matrixctl.ingest.writer import Tick, write_pack
from matrixctl.tokenizers import pi


@dataclass
class IngestOptions:
    symbols: str | None = None
    tokenizer: str | None = None  # a model's tokenizer (GGUF, ingest gguf folder, tokenizer.json)
    atom_size: int = 256
    dtype: str = "auto"
    svgt: str | None = None
    eos_id: str | None = None  # an id, "none", or None for the map's eos_id
    jobs: int = 1
    shard: str | None = None
    text_field: str = "text"
    missing_field: str = "skip"
    encoding_errors: str = "error"
    on_error: str = "fail"
    strict: bool = False
    max_doc_size: int = MAX_WHOLE
    input_kind: str = "auto"
    executor: str = "local"  # local (serial or --jobs processes) | dask (ingest/executors/)
    scheduler: str | None = None  # dask: a scheduler address; None: DASK_SCHEDULER_ADDRESS or local
    resume: bool = False  # dask: reuse the staged units that check out


def resolve_eos(
    vocab_size: int, default: int | None, value: str | None, what: str = "the symbol map"
) -> int | None:
    """The end-of-document id: `--eos-id` (an id or none), else the tokenizer's own."""
    if value is None:
        if default is None:
            raise UsageError(
                f"{what} has no end-of-document id, so documents cannot be separated",
                hint="pass --eos-id ID (an id of the vocabulary) or --eos-id none",
            )
        return default
    if value.lower() == "none":
        return None
    if not value.isdigit():
        raise UsageError(f"--eos-id must be an id or none, got {value!r}")
    eos = int(value)
    if eos >= vocab_size:
        raise UsageError(f"--eos-id {eos} is outside the vocabulary [0, {vocab_size})")
    return eos


@dataclass
class TokenizerPlan:
    """The build's tokenizer as the pack and the executors need it."""

    recipe: Any  # PiRecipe | ModelRecipe
    vocab_size: int
    eos_id: int | None
    pad_id: int
    raw: bytes  # the pack's tokenizer file
    file: str
    meta: dict[str, Any]


def _pi_plan(opts: IngestOptions) -> TokenizerPlan:
    from matrixctl.formats import ingest_pack as pack_format

    smap, raw, tok = _load_map(opts.symbols or pi.default_map_path(), opts.executor == "local")
    eos = resolve_eos(smap.vocab_size, smap.eos_id, opts.eos_id)
    meta = {"symbol_map": {"file": pack_format.SYMBOLS, "canonical_hash": smap.canonical_hash()}}
    return TokenizerPlan(
        PiRecipe(smap, raw, tok), smap.vocab_size, eos, smap.pad_id, raw, pack_format.SYMBOLS, meta
    )


def _model_plan(opts: IngestOptions) -> TokenizerPlan:
    """A model's tokenizer (`--tokenizer`): its vocabulary size and end-of-document id are the
    model's; the pad id is the model's, else its EOS, else 0 (docs/formats/ingest-pack.md)."""
    import json

    from matrixctl.formats import ingest_pack as pack_format
    from matrixctl.ingest.tokenizer import ModelRecipe
    from matrixctl.tokenizer_files import load_model_tokenizer

    assert opts.tokenizer is not None
    tok, source = load_model_tokenizer(opts.tokenizer)
    eos = resolve_eos(tok.vocab_size, tok.eos_id, opts.eos_id, "the model's tokenizer")
    pad = next((i for i in (tok.pad_id, tok.eos_id, 0) if i is not None), 0)
    record = source.record(tok)
    raw = (json.dumps(record, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return TokenizerPlan(
        ModelRecipe(source, tok),
        tok.vocab_size,
        eos,
        pad,
        raw,
        pack_format.MODEL_TOKENIZER,
        {"symbol_map": None, "model_tokenizer": record},
    )


def _load_map(path: str, build: bool) -> tuple[pi.SymbolMap, bytes, pi.Tokenizer | None]:
    """The symbol map at `path`, its bytes, and (when `build`: the local executor) its
    tokenizer, through the per-user map cache (tokenizers/pi_cache.py) as `tokenize pi
    encode` does: a sound entry for the map's exact bytes gives the checked map and its
    compiled matcher; otherwise the map is checked in full (and with `build`, its matcher is
    compiled and the entry stored). `--jobs N` workers share this process's matcher
    (`Workers`); Dask workers build their own."""
    from matrixctl.tokenizers import pi_cache

    if build:
        return pi_cache.load_tokenizer(path)
    raw = pi.read_map_bytes(path)
    hit = pi_cache.load(raw)
    return (pi.check_map_bytes(raw, path) if hit is None else hit[0]), raw, None


def ingest_docs(
    srcs: list[str], out_dir: str, opts: IngestOptions, tick: Tick | None = None
) -> dict[str, Any]:
    """Documents to a complete, verified-by-construction ingest pack. Returns a summary."""
    from matrixctl.formats import matrix_atom
    from matrixctl.formats import svgt as svgt_fmt
    from matrixctl.ingest.pack import PackPlan

    if opts.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if opts.missing_field not in ("skip", "error"):
        raise UsageError("--missing-field must be skip or error")
    if opts.encoding_errors not in ("error", "replace", "skip-file"):
        raise UsageError("--encoding-errors must be error, replace or skip-file")
    if opts.on_error not in ("fail", "skip"):
        raise UsageError("--on-error must be fail or skip")
    if opts.max_doc_size < 1:
        raise UsageError("--max-doc-size must be at least 1 byte")
    if opts.input_kind != "auto" and opts.input_kind not in kinds.REGISTRY:
        raise UsageError(f"--input-kind must be auto or one of {', '.join(kinds.NAMES)}")
    if srcs.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    if opts.executor not in ("local", "dask"):
        raise UsageError("--executor must be local or dask")
    if opts.executor != "dask" and (opts.scheduler or opts.resume):
        raise UsageError("--scheduler and --resume go with --executor dask")
    if opts.tokenizer is not None and opts.symbols is not None:
        raise UsageError(
            "--tokenizer and --symbols each name the tokenizer: give one",
            hint="--tokenizer for a model's own ids, --symbols for a π map",
        )
    shard = parse_shard(opts.shard)
    tk = _pi_plan(opts) if opts.tokenizer is None else _model_plan(opts)
    vocab_size = tk.vocab_size
    eos = tk.eos_id
    dtype = matrix_atom.choose_dtype(opts.dtype, vocab_size)
    assert dtype is not None
    if dtype == "uint16" and vocab_size > matrix_atom.UINT16_LIMIT:
        raise UsageError(
            f"--dtype uint16 cannot hold the tokenizer's ids (vocab_size {vocab_size:,})"
        )
    if not 1 <= opts.atom_size < matrix_atom.UINT32_LIMIT:
        raise UsageError("--atom-size must be between 1 and 2**32 - 1")
    grid = svgt_fmt.parse_grid(opts.svgt, opts.atom_size) if opts.svgt else None
    if grid and vocab_size > matrix_atom.UINT16_LIMIT:
        raise UsageError(
            "--svgt needs ids below 65536 (SVG-Tensor stores uint16) but the tokenizer's "
            f"vocab_size is {vocab_size:,}"
        )
    step = Step(
        None,
        eos,
        Options(
            opts.text_field,
            opts.missing_field,
            opts.encoding_errors,
            opts.max_doc_size,
            opts.input_kind,
        ),
        "",
        "<u2" if dtype == "uint16" else "<u4",
        opts.on_error,
        opts.strict,
    )
    plan = PackPlan(
        atom_size=opts.atom_size,
        dtype=dtype,
        vocab_size=vocab_size,
        pad_id=tk.pad_id,
        eos_id=eos,
        grid=grid,
        tokenizer_raw=tk.raw,
        tokenizer_meta=tk.meta,
        tokenizer_file=tk.file,
        manifest_head={"source": srcs[0] if len(srcs) == 1 else list(srcs)},
    )
    options = {
        "text_field": opts.text_field,
        "missing_field": opts.missing_field,
        "encoding_errors": opts.encoding_errors,
        "on_error": opts.on_error,
        "strict": opts.strict,
        "max_doc_size": opts.max_doc_size,
        "input_kind": opts.input_kind,
    }
    # The executor starts now (worker processes forked with the matcher loaded above, or a
    # Dask cluster starting), while the writer lists the inputs.
    executor = start(
        opts.executor,
        step,
        opts.jobs,
        out_dir=out_dir,
        scheduler=opts.scheduler,
        resume=opts.resume,
        recipe=tk.recipe,
    )
    try:
        summary = write_pack(
            srcs,
            out_dir,
            plan,
            executor,
            options=options,
            shard=shard,
            serial=opts.executor == "local" and opts.jobs == 1,
            tick=tick,
        )
        report = executor.report()
        if report is not None:
            summary["executor"] = report
        return summary
    except OSError as exc:
        raise _disk_full(exc, out_dir) from None
    finally:
        executor.close()


def _disk_full(exc: OSError, out_dir: str) -> Exception:
    """A full disk or a file size limit met while the pack was written names the pack: the
    write that met it (a token file, a worker's result) named no file, so the error line said
    `<stdout>`, or it was raised where an input was read and named that input. A Dask
    worker's error naming its staging folder (beside the pack) is kept as it is."""
    import errno
    import os

    from matrixctl import codes
    from matrixctl.errors import MatrixError, OutputError, from_os_error

    full = (codes.OUT_NO_SPACE, codes.OUT_TOO_LARGE)
    if isinstance(exc, OutputError) and exc.code in full:
        staging = os.path.join(
            os.path.dirname(os.path.abspath(out_dir)), f".{os.path.basename(out_dir)}.dask-"
        )
        if not (exc.path and os.path.abspath(exc.path).startswith(staging)):
            exc.path = out_dir
        return exc
    if not isinstance(exc, MatrixError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return from_os_error(exc, out_dir, writing=True)
    return exc
