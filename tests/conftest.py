"""pytest fixtures shared by every test folder; the helpers themselves live in tests/helpers/."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_cli


@pytest.fixture
def cli():
    return run_cli
