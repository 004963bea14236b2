"""Every page and section of docs/ that a command's help text sends the reader to exists:
`docs/NAME.md` ships, and a section cited by name (`docs/NAME.md ("Section")` or
`docs/NAME.md, "Section"`) begins a heading or a bold paragraph title of that page."""

from __future__ import annotations

import pathlib
import re

import click

from rfrs_ref.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
CITATION = re.compile(r'(docs/[a-z0-9-]+\.md)(?:,\s*|\s*\(\s*)["“]([^"”]+)["”]')
PAGE = re.compile(r"docs/[a-z0-9-]+\.md")


def _help_texts(cmd: click.Command, path: str):
    """(where, text) of a command's help and of each of its options' help, recursively."""
    yield path, cmd.help or ""
    for p in cmd.params:
        if isinstance(p, click.Option):
            yield f"{path} {p.opts[0]}", p.help or ""
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(None):
            yield from _help_texts(cmd.get_command(None, name), f"{path} {name}")


def _titles(page: pathlib.Path) -> list[str]:
    text = page.read_text()
    heads = re.findall(r"^#+\s+(.*?)\s*$", text, re.M)
    bold = re.findall(r"\*\*([^*]+)\*\*", text)
    return [" ".join(t.split()).lower() for t in heads + bold]


def test_help_texts_cite_pages_and_sections_that_exist():
    bad, cited = [], 0
    for where, text in _help_texts(main, "rfrs-ref"):
        text = " ".join(text.split())
        for page in PAGE.findall(text):
            if not (ROOT / page).is_file():
                bad.append(f"{where}: {page} does not exist")
        for page, section in CITATION.findall(text):
            cited += 1
            section = " ".join(section.split()).lower()
            if (ROOT / page).is_file() and not any(t.startswith(section)
                                                   for t in _titles(ROOT / page)):
                bad.append(f"{where}: {page} has no section {section!r}")
    assert cited >= 2  # the pattern still finds the citations (compact, recommend)
    assert not bad, "\n".join(bad)
