"""A Hugging Face model folder as a tensor source: `config.json` + `model.safetensors`
(+ `vocab.txt`, and the sentence-transformers files when present).

Recognised by its files, not its name: a folder holding `config.json` and `model.safetensors`
(or a sharded checkpoint's `model.safetensors.index.json`). It is read, never written, and
nothing in it is executed (no pickle, no custom code):

    config.json                  JSON object; the architecture numbers become file metadata
    model.safetensors            the tensors, through matrixctl's safetensors reader
    model.safetensors.index.json a sharded checkpoint (when there is no model.safetensors): its
                                 weight_map names each tensor's shard, a file in this folder
    vocab.txt                    WordPiece vocabulary, one token per line, id = line number
                                 (the line's text without its "\\n", as transformers reads it)
    special_tokens_map.json      pad/unk/cls/sep/mask token strings (default: BERT's)
    tokenizer.json               checked against vocab.txt by `verify` when present
    tokenizer_config.json        do_lower_case
    1_Pooling/config.json        pooling mode (sentence-transformers)
    modules.json                 whether a Normalize module follows
    sentence_bert_config.json    max_seq_length

`metadata()` gives the model's numbers under the EMBD keys (`num_layers`, `hidden_size`, ...,
plus `layer_norm_eps`, `pooling`, ...) and the vocabulary under the GGUF keys
(`tokenizer.ggml.tokens`, `tokenizer.ggml.cls_token_id`, ...), so `convert MODEL_DIR
out.weights` fills the EMBD metadata and vocabulary sections from the folder. Checking the
folder is `matrixctl.validate.hf_model`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from matrixctl import codes
from matrixctl.codes import Severity
from matrixctl.errors import FormatError, MatrixError
from matrixctl.findings import Problem
from matrixctl.formats import embd
from matrixctl.tensors import TensorInfo, TensorSource

if TYPE_CHECKING:
    from matrixctl.formats.st_container import StSource
    from matrixctl.io import Folder, Source

FORMAT = "hf-model-dir"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_SHARDS = 10_000
VOCAB = "vocab.txt"
SPECIAL_MAP = "special_tokens_map.json"
TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
POOLING = os.path.join("1_Pooling", "config.json")
MODULES = "modules.json"
ST_CONFIG = "sentence_bert_config.json"
MAX_JSON = 64 << 20
MAX_VOCAB_FILE = 64 << 20

# config.json key -> EMBD metadata key (integers)
CONFIG_KEYS = {
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_emb",
    "vocab_size": "vocab_size",
    "type_vocab_size": "type_vocab_size",
}
POOLING_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
}

G = FORMAT
HF_CONFIG = codes.define(
    "HF_CONFIG",
    "config.json cannot be read, is not a JSON object, or a field it uses has the wrong type.",
    group=G,
)
HF_FILE = codes.define(
    "HF_FILE",
    "A file of the model folder (vocab.txt, tokenizer.json, special_tokens_map.json, ...) "
    "cannot be read, is too large, or is not what it should be (UTF-8 text, a JSON object).",
    group=G,
)
HF_NO_VOCAB = codes.define(
    "HF_NO_VOCAB",
    "The folder has no vocab.txt: converted files carry no vocabulary.",
    group=G,
    severity=Severity.WARNING,
)
HF_SPECIAL = codes.define(
    "HF_SPECIAL",
    "A special token (pad, unk, cls, sep, mask) is not in vocab.txt, or config.json's "
    "pad_token_id names another token.",
    group=G,
    severity=Severity.WARNING,
)
HF_MISMATCH = codes.define(
    "HF_MISMATCH",
    "config.json disagrees with the tensors or with vocab.txt (vocab_size, hidden_size, "
    "number of layers, a tensor's shape).",
    group=G,
)
HF_INDEX = codes.define(
    "HF_INDEX",
    "model.safetensors.index.json (a sharded checkpoint) cannot be read, names a shard that is "
    "missing or outside the folder, or disagrees with the shards: a tensor missing from its "
    "shard, found in two shards, or in a shard but not in the weight_map.",
    group=G,
)
HF_TOKENIZER = codes.define(
    "HF_TOKENIZER",
    "vocab.txt and tokenizer.json give different ids for a token: the vocabulary is misordered "
    "in one of them.",
    group=G,
)


def incomplete(path: str) -> str | None:
    """For a folder that holds part of a Hugging Face model folder but is not one: what it
    has and what it lacks, for the error line; None when it holds none of the marking files."""
    has = [f for f in (CONFIG, WEIGHTS, INDEX) if os.path.isfile(os.path.join(path, f))]
    if not has or is_model_dir(path):
        return None
    lacks = CONFIG if CONFIG not in has else f"{WEIGHTS} (or a sharded checkpoint's {INDEX})"
    return f"has {' and '.join(has)} but no {lacks}: a Hugging Face model folder needs both"


def is_model_dir(path: str) -> bool:
    """A folder is a Hugging Face model folder when it holds config.json and model.safetensors
    or model.safetensors.index.json."""
    return os.path.isfile(os.path.join(path, CONFIG)) and (
        os.path.isfile(os.path.join(path, WEIGHTS)) or os.path.isfile(os.path.join(path, INDEX))
    )


@dataclass
class Shard:
    """One safetensors file of the folder: model.safetensors, or a shard of a sharded one."""

    name: str  # file name inside the folder
    source: Source


@dataclass
class HfModel:
    path: str
    config: dict[str, Any]
    weights: list[Shard]
    weight_map: dict[str, str] | None = None  # tensor -> shard file, for a sharded checkpoint
    tokens: list[str] | None = None
    special: dict[str, int] = field(default_factory=dict)
    special_text: dict[str, str] = field(default_factory=dict)
    extras: dict[str, str] = field(default_factory=dict)  # pooling, normalize, ...
    problems: list[Problem] = field(default_factory=list)

    def close(self) -> None:
        for shard in self.weights:
            shard.source.close()

    @property
    def weights_size(self) -> int:
        return sum(shard.source.size for shard in self.weights)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def model_metadata(self) -> dict[str, str]:
        """The model's numbers under the EMBD metadata keys (text values)."""
        cfg = self.config
        out: dict[str, str] = {}
        name = cfg.get("_name_or_path") or cfg.get("name_or_path")
        if isinstance(name, str) and name.strip():
            out["model_name"] = name.strip().rstrip("/").split("/")[-1]
        else:
            out["model_name"] = os.path.basename(os.path.abspath(self.path))
        for key, meta_key in CONFIG_KEYS.items():
            value = cfg.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                out[meta_key] = str(value)
        if "hidden_size" in out:
            out["embedding_dim"] = out["hidden_size"]  # the pooling's dimension wins below
        eps = cfg.get("layer_norm_eps")
        if isinstance(eps, int | float) and not isinstance(eps, bool):
            out["layer_norm_eps"] = repr(float(eps))
        for key in ("hidden_act", "model_type", "position_embedding_type"):
            if isinstance(cfg.get(key), str):
                out[key] = cfg[key]
        out.update(self.extras)
        return out


def _read_limited(path: str, limit: int, what: str) -> bytes:
    try:
        size = os.path.getsize(path)
        if size > limit:
            raise FormatError(
                HF_FILE, f"{what} is {size:,} bytes, above the {limit:,}-byte limit", path=path
            )
        with open(path, "rb") as fp:
            return fp.read(limit + 1)
    except OSError as exc:
        raise FormatError(HF_FILE, f"{what} cannot be read ({exc.strerror})", path=path) from None


def read_json(path: str, what: str, code: str = HF_FILE) -> dict[str, Any]:
    raw = _read_limited(path, MAX_JSON, what)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(code, f"{what} is not valid JSON ({exc})", path=path) from None
    if not isinstance(doc, dict):
        raise FormatError(code, f"{what} is not a JSON object", path=path)
    return doc


def read_vocab(path: str) -> list[str]:
    """vocab.txt as transformers' BertTokenizer reads it: one token per line, the line without
    its trailing "\\n" (a "\\r" is kept), id = line number."""
    raw = _read_limited(path, MAX_VOCAB_FILE, VOCAB)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(
            HF_FILE, f"vocab.txt is not UTF-8 ({exc.reason})", path=path, offset=exc.start
        ) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _special_strings(model: HfModel) -> dict[str, str]:
    """pad/unk/cls/sep/mask token strings: special_tokens_map.json, else BERT's."""
    out = dict(embd.BERT_SPECIAL_TOKENS)
    path = model.file(SPECIAL_MAP)
    if not os.path.isfile(path):
        return out
    doc = read_json(path, SPECIAL_MAP)
    for name in embd.SPECIALS:
        value = doc.get(f"{name}_token")
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def _extras(model: HfModel) -> None:
    """sentence-transformers and tokenizer settings that a runtime needs, as text metadata."""
    optional = (
        (POOLING, "pooling"),
        (MODULES, "modules"),
        (ST_CONFIG, "sentence-transformers config"),
        (TOKENIZER_CONFIG, "tokenizer config"),
    )
    docs: dict[str, Any] = {}
    for name, what in optional:
        path = model.file(name)
        if not os.path.isfile(path):
            continue
        try:
            if name == MODULES:
                raw = _read_limited(path, MAX_JSON, name)
                docs[name] = json.loads(raw.decode("utf-8"))
            else:
                docs[name] = read_json(path, name)
        except (FormatError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            model.problems.append(
                Problem(HF_FILE, f"{what} ({name}) cannot be used: {exc}", field=name)
            )
    pooling = docs.get(POOLING)
    if isinstance(pooling, dict):
        modes = [mode for key, mode in POOLING_MODES.items() if pooling.get(key) is True]
        if modes:
            model.extras["pooling"] = "+".join(modes)
        dim = pooling.get("word_embedding_dimension")
        if isinstance(dim, int) and not isinstance(dim, bool):
            model.extras["embedding_dim"] = str(dim)
    modules = docs.get(MODULES)
    if isinstance(modules, list):
        kinds = [m.get("type", "") for m in modules if isinstance(m, dict)]
        model.extras["normalize"] = (
            "true" if any(str(k).endswith("Normalize") for k in kinds) else "false"
        )
    st_cfg = docs.get(ST_CONFIG)
    if isinstance(st_cfg, dict) and isinstance(st_cfg.get("max_seq_length"), int):
        model.extras["max_seq_length"] = str(st_cfg["max_seq_length"])
    tok_cfg = docs.get(TOKENIZER_CONFIG)
    if isinstance(tok_cfg, dict) and isinstance(tok_cfg.get("do_lower_case"), bool):
        model.extras["do_lower_case"] = "true" if tok_cfg["do_lower_case"] else "false"


def read_index(path: str) -> dict[str, str]:
    """model.safetensors.index.json's weight_map (tensor name -> shard file name), every shard
    a plain file name inside the folder: a path that leaves it is refused, never followed."""
    doc = read_json(os.path.join(path, INDEX), INDEX, HF_INDEX)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(
            HF_INDEX, f"{INDEX} has no weight_map object", path=path, field="weight_map"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise FormatError(
                HF_INDEX,
                f"{INDEX}: the shard of {name!r} is {shard!r:.40}, not a file name",
                path=path,
                field=f"weight_map/{name}",
            )
        if (
            shard in ("", ".", "..")
            or "/" in shard
            or "\\" in shard
            or "\0" in shard
            or os.path.isabs(shard)
        ):
            raise FormatError(
                HF_INDEX,
                f"{INDEX}: shard {shard!r:.80} of {name!r} is not a file of this folder",
                path=path,
                field=f"weight_map/{name}",
            )
    if len(set(weight_map.values())) > MAX_SHARDS:
        raise FormatError(HF_INDEX, f"{INDEX} names more than {MAX_SHARDS:,} shards", path=path)
    return weight_map


def _open_weights(path: str) -> tuple[list[Shard], dict[str, str] | None]:
    from matrixctl.io import Source

    weight_map = None
    if os.path.isfile(os.path.join(path, WEIGHTS)):
        names = [WEIGHTS]  # transformers also prefers the single file when both exist
    else:
        weight_map = read_index(path)
        names = sorted(set(weight_map.values()))
    shards: list[Shard] = []
    try:
        for name in names:
            try:
                shards.append(Shard(name, Source.open(os.path.join(path, name))))
            except MatrixError as err:
                code = HF_INDEX if weight_map is not None else err.code
                raise FormatError(code, f"{name}: {err.message}", path=path, field=name) from None
    except BaseException:
        for shard in shards:
            shard.source.close()
        raise
    return shards, weight_map


def load(path: str) -> HfModel:
    """Read the folder's small files and open model.safetensors or its shards (mapped, not
    read)."""
    config = read_json(os.path.join(path, CONFIG), CONFIG, HF_CONFIG)
    shards, weight_map = _open_weights(path)
    model = HfModel(path, config, shards, weight_map)
    try:
        for key in (*CONFIG_KEYS, "layer_norm_eps"):
            value = config.get(key)
            kind = (int, float) if key == "layer_norm_eps" else (int,)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
                model.problems.append(
                    Problem(
                        HF_CONFIG, f"config.json {key} is {value!r:.30}, not a number", field=key
                    )
                )
        vocab = model.file(VOCAB)
        if os.path.isfile(vocab):
            try:
                model.tokens = read_vocab(vocab)
            except FormatError as err:
                model.problems.append(Problem(err.code, err.message, field=VOCAB))
        else:
            model.problems.append(
                Problem(
                    HF_NO_VOCAB, "no vocab.txt: the vocabulary cannot be carried over", field=VOCAB
                )
            )
        try:
            model.special_text = _special_strings(model)
        except FormatError as err:
            model.problems.append(Problem(err.code, err.message, field=SPECIAL_MAP))
            model.special_text = dict(embd.BERT_SPECIAL_TOKENS)
        if model.tokens is not None:
            first: dict[str, int] = {}
            for i, tok in enumerate(model.tokens):
                first.setdefault(tok, i)
            for name, text in model.special_text.items():
                model.special[name] = first.get(text, embd.NO_TOKEN)
        _extras(model)
    except BaseException:
        model.close()
        raise
    return model


class HfSource(TensorSource):
    """The folder opened for `convert`: its checks must pass (the safetensors rules of every
    shard and the index's consistency among them); tensors stream from the mapped files, in
    model.safetensors' order, or for a sharded checkpoint in its weight_map's order."""

    format = FORMAT

    def __init__(self, folder: Folder, checked: Any) -> None:
        from matrixctl.formats.st_container import StSource

        subject = checked
        self.model: HfModel = subject.model
        self.inner: list[StSource] = []
        self._owner: dict[str, StSource] = {}
        self._infos: list[TensorInfo] = []
        try:
            for shard, shard_checked in zip(self.model.weights, subject.shards, strict=True):
                try:
                    st = StSource(shard.source, shard_checked.st)
                except FormatError as err:
                    raise err.with_path(os.path.join(folder.path, shard.name)) from None
                self.inner.append(st)
                for info in st.tensors():
                    self._owner[info.name] = st  # duplicates were refused by the checks
                    self._infos.append(info)
            if self.model.weight_map is not None:
                # Decision: a sharded checkpoint's tensors come in the index's weight_map order
                # (transformers writes it sorted by name), whatever the shard boundaries.
                rank = {name: i for i, name in enumerate(self.model.weight_map)}
                self._infos.sort(key=lambda info: rank[info.name])
        except BaseException:
            self.model.close()
            raise

    def tensors(self) -> list[TensorInfo]:
        return list(self._infos)

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for st in self.inner:
            out.update(st.metadata())
        out.update(self.model.model_metadata())
        if self.model.tokens is not None:
            out.update(embd.vocabulary_metadata(self.model.tokens, self.model.special))
        return out

    def stream(self, info: TensorInfo, role: str = "data") -> Iterator[Any]:
        return self._owner[info.name].stream(info, role)

    def array(self, info: TensorInfo, role: str = "data", *, verify: bool = True) -> Any:
        return self._owner[info.name].array(info, role, verify=verify)

    def release(self, info: TensorInfo) -> None:
        self._owner[info.name].release(info)

    def close(self) -> None:
        self.model.close()


TENSOR_IO = {FORMAT: (HfSource, None)}
