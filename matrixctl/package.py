"""What the package knows about itself: its version and where its bundled files are.

The lowest module of the layer contract (pyproject.toml, docs/architecture.md): any module
may import it, and it imports nothing of matrixctl. Modules read the version and the data
folder here, never through the root package (`import matrixctl` would tie them to the
public API's module, which only re-exports). `matrixctl.__version__` is this `__version__`.

The data folder is a path beside this file: importlib.resources costs about 10 ms of
start-up, and matrixctl is never installed zipped.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))  # the folder of the matrixctl package
DATA_DIR = os.path.join(PACKAGE_DIR, "data")  # the bundled files (package data)


def data_path(name: str) -> str:
    """The path of the bundled file `name` in matrixctl/data/."""
    return os.path.join(DATA_DIR, name)
