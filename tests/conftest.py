"""pytest fixtures shared by every test folder; the helpers themselves live in tests/helpers/."""

from __future__ import annotations

import sys

import pytest

from matrixctl.converters import tensors as converter_tensors
from tests.helpers.cli import run_cli

# Until tests/ingest/test_gguf_ingest.py (kept as it is while ingest/ is rebuilt) imports
# `matrixctl.converters.tensors`: the converter registry was the subpackage `matrixctl.convert`
# before the name went to the API function alone. An entry for the old submodule's path (and
# not its parent's) lets that one import line resolve without a module named matrixctl.convert.
sys.modules.setdefault("matrixctl.convert.tensors", converter_tensors)


@pytest.fixture
def cli():
    return run_cli
