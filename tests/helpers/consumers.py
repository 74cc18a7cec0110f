"""The real readers and writers of the training exports, imported for the tests.

mosaicml-streaming 0.13's package `__init__` imports its vision datasets, which import
torchvision; PyPI's torchvision does not load beside the CPU build of torch the test extra pins
(`operator torchvision::nms does not exist`). The MDS reader and writer do not use them, so
`streaming()` puts an empty `streaming.vision` in place before the import.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest


def streaming() -> Any:
    pytest.importorskip("torch")
    if "streaming" not in sys.modules:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    return pytest.importorskip("streaming")


def megatron_indexed() -> Any:
    pytest.importorskip("torch")
    return pytest.importorskip("megatron.core.datasets.indexed_dataset")
