"""matrixctl: inspect, verify, convert and build the binary files ML pipelines pass around.

The package is a library with a thin command line on top (`matrixctl.cli`). Its Python API
(docs/api.md) is `open`, `load`, `save`, `convert`, `verify`, `inspect`, `load_tokenizer` and
`open_pack`, defined in `matrixctl.api`, and `torch_dataset`
(`matrixctl.training`). Importing the package is cheap: those names, and
`__version__` (kept in the base module `matrixctl.package`), are loaded on first use (module
`__getattr__`), and numpy only by the code that needs it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself costs start-up time; mypy treats this name as typing's

if TYPE_CHECKING:
    from typing import Any

    from matrixctl.api import (
        Report,
        TensorFile,
        Tokenizer,
        convert,
        inspect,
        load,
        load_tokenizer,
        open,
        open_pack,
        save,
        verify,
    )
    from matrixctl.dataset import PackDataset
    from matrixctl.package import __version__
    from matrixctl.training import torch_dataset

__all__ = [
    "PackDataset",
    "Report",
    "TensorFile",
    "Tokenizer",
    "__version__",
    "convert",
    "inspect",
    "load",
    "load_tokenizer",
    "open",
    "open_pack",
    "save",
    "torch_dataset",
    "verify",
]
# The names defined outside `matrixctl.api`, loaded lazily from their own module.
_ELSEWHERE = {"torch_dataset": "matrixctl.training"}
_API = frozenset(__all__) - {"__version__", *_ELSEWHERE}  # `matrixctl.api`'s, loaded lazily


def __getattr__(name: str) -> Any:
    if name == "__version__":
        # Kept in the base module `matrixctl.package` (which every module reads it from);
        # loaded on first use too, so `import matrixctl` loads no other module.
        from matrixctl.package import __version__

        globals()[name] = __version__
        return __version__
    if name in _API or name in _ELSEWHERE:
        import importlib

        value = getattr(importlib.import_module(_ELSEWHERE.get(name, "matrixctl.api")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'matrixctl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API, *_ELSEWHERE, "__version__"})
