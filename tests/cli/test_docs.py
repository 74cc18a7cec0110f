"""The docs are true: generated references current, every command and code documented."""

from __future__ import annotations

import re

from matrixctl.cli import docgen
from tests.helpers.cli import ROOT


def test_generated_sections_are_current() -> None:
    assert docgen.main(["--check"]) == 0, "run `make docs`"


def test_every_command_has_a_section_in_cli_md() -> None:
    text = (ROOT / "docs/cli.md").read_text()
    for path, _ in docgen.commands():
        if len(path) > 1:
            assert f"### `{' '.join(path)}`" in text, " ".join(path)


def test_every_code_is_in_errors_md() -> None:
    from matrixctl.codes import CODES

    docgen.import_everything()
    text = (ROOT / "docs/errors.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", text))
    missing = sorted(set(CODES) - documented)
    assert not missing, f"codes missing from docs/errors.md: {missing}"


def test_every_format_has_a_doc_page() -> None:
    from matrixctl.formats.registry import FORMATS

    pages = {p.stem for p in (ROOT / "docs/formats").glob("*.md")}
    for fmt in FORMATS:  # a page per format, or per family (scx-registry -> scx.md)
        assert (fmt.doc or fmt.name) in pages or fmt.name.split("-")[0] in pages, fmt.name


def test_readme_starts_with_the_two_setup_commands() -> None:
    text = (ROOT / "README.md").read_text()
    head = text[: text.index("## ")]
    assert "make demo" in head and "make test" in head
