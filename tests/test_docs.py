"""The docs name what exists: every repository path, every `python -m tx COMMAND`, each option
given to it and each config key a doc names, in README.md, docs/*.md and tpu/README.md."""

import re

import pytest
from conftest import ROOT

DOCS = [ROOT / "README.md", ROOT / "tpu" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("configs", "tx", "tests", "benchmarks", "docs", "results", "tpu")
# A path of the repository: starts at one of its folders, names no placeholder or glob.
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./-]*[\w/])(?![<{*\w])")
# `python -m tx CMD ...`, `python train.py ...`, or the `tx` script at the start of a command.
COMMAND = re.compile(
    r"(python -m tx|python train\.py|^\$? ?tx|(?<=&& )tx)\s+([a-z]+)([^\n`|]*)", re.M
)
OPTION = re.compile(r"(?<![\w-])(--[a-z][\w-]*)(?:[= ]|$)")
CONFIG_KEY = re.compile(r"--config\.([a-z_]+)\.([a-z_][a-z0-9_]*)")


def _text(doc) -> str:
    return doc.read_text(encoding="utf-8")


def _code(text: str) -> list[str]:
    """The doc's code: fenced blocks and inline `spans` (where commands and paths are named)."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return fenced + inline


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc):
    text = _text(doc)
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    missing = []
    for link in links:
        if "://" in link or link.startswith("mailto:"):
            continue
        if not (doc.parent / link).exists():
            missing.append(link)
    for span in _code(text):
        for path in PATH.findall(span):
            path = path.split(":")[0].rstrip(".")
            if any(c in path for c in "<>*{}") or path.endswith("/..."):
                continue
            if not (ROOT / path).exists() and not _made_by_a_command(path):
                missing.append(path)
    assert not missing, f"{doc.name} names paths that do not exist: {sorted(set(missing))}"


def _made_by_a_command(path: str) -> bool:
    """Paths the commands write (results of a benchmark, runs): not in a fresh clone."""
    made = ("results/table", "results/cards/table", "benchmarks/results/")
    return path.startswith(made) and path.endswith((".json", ".md", ".png", "/"))


@pytest.fixture(scope="module")
def parsers():
    from tx.cli.main import parsers

    return parsers()


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_command_and_option_a_doc_names_exists(doc, parsers):
    from tx.cli import COMMANDS

    top, commands = parsers
    wrong = []
    for span in _code(_text(doc)):
        for how, name, rest in COMMAND.findall(span):
            if how.startswith("python train.py"):
                name, rest = "train", f"{name} {rest}"
            if name not in COMMANDS:
                if how.startswith("python -m tx"):  # a bare `tx` may be the package's folder
                    wrong.append(f"command {name!r}")
                continue
            known = set(commands[name]._option_string_actions) | set(top._option_string_actions)
            for option in OPTION.findall(rest.split("#")[0]):
                if option not in known and not option.startswith("--config"):
                    wrong.append(f"{name} {option}")
    assert not wrong, f"{doc.name} names what the command line lacks: {sorted(set(wrong))}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_config_key_a_doc_names_exists(doc):
    from tx.config import defaults

    cfg = defaults()
    wrong = [
        f"{section}.{key}"
        for section, key in CONFIG_KEY.findall(_text(doc))
        if section not in cfg or key not in cfg[section]
    ]
    assert not wrong, f"{doc.name} names config keys that do not exist: {sorted(set(wrong))}"
