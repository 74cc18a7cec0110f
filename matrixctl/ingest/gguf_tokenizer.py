"""`ingest gguf`: the agreement of π with the model's tokenizer, measured from the GGUF file.

The measurement itself (the reference tokenizer, π's tokens of the bundled sample, the
share they agree on) is `matrixctl.tokenizers.agreement`, which `verify` also uses; this
module hands it the merges or scores the tokenizer type needs, read from the GGUF file.
"""

from __future__ import annotations

from typing import Any

from matrixctl.formats import gguf as gguf_format
from matrixctl.tokenizers import reference as ref
from matrixctl.tokenizers.agreement import Measured, VocabPlan, measure_with


def measure(gf: gguf_format.GgufFile, buf: Any, plan: VocabPlan) -> Measured:
    """The agreement on the bundled sample, with the GGUF's merges (BPE) or scores
    (SentencePiece) as the model's tokenizer type needs them."""
    kind = ref.tokenizer_type(plan.model, plan.pre)
    if not kind.measurable:
        return Measured(kind, None, None, f"no reference tokenizer for {kind.name}")
    merges = gguf_format.tokenizer_merges(gf, buf) if kind.family == "bpe" else None
    scores = (
        gguf_format.float_array(gf, buf, "tokenizer.ggml.scores", plan.tokens)
        if kind.family == "sentencepiece"
        else None
    )
    return measure_with(plan, kind, merges, scores)
