"""The README and the documentation site (``docs/``, ``mkdocs.yml``) hold together.

- the README stays short and starts with its two commands (install and demo; install and test);
- every page ``mkdocs.yml``'s nav names exists, and every page in ``docs/`` is in the nav;
- every relative link in README.md and docs/ points at a file that exists, and at a heading
  that exists in it when it names one (ids as Python-Markdown's ``toc`` makes them);
- the command reference, generated from ``pagesim.engine.cli.build_parser()`` by the MkDocs hook
  ``docs/hooks/cli_reference.py``, has a section for every command and subcommand that names each
  of its option strings; building the parser imports no torch;
- where mkdocs is installed (``pip install -e '.[docs]'``), ``mkdocs build --strict`` passes.

None of it needs mkdocs except the last, which is skipped without it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"

DEMO_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && pagesim demo"
TEST_COMMAND = ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 "
                "&& pip install -e '.[dev]' && pytest -q")


def _load_hook():
    """The hook as a plain module (it imports no mkdocs)."""
    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = _load_hook()


@pytest.fixture(scope="module")
def hook():
    return HOOK


@pytest.fixture(scope="module")
def reference(hook) -> str:
    return hook.render_cli_reference()


def doc_pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def nav_pages() -> list[str]:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    found = []

    def walk(entry):
        if isinstance(entry, str):
            found.append(entry)
        elif isinstance(entry, list):
            for item in entry:
                walk(item)
        elif isinstance(entry, dict):
            for value in entry.values():
                walk(value)

    walk(config["nav"])
    return found


def page_text(path: Path, reference: str) -> str:
    """A page's Markdown as the site renders it: the CLI reference page with its marker filled in."""
    return path.read_text().replace(HOOK.MARKER, reference)


def outside_code(text: str) -> list[str]:
    """The lines of ``text`` outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slugify(text: str) -> str:
    """Python-Markdown's ``toc`` slug of a heading's text."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_ids(text: str) -> set[str]:
    """The ids of a page's headings: an explicit ``{#id}``, else the slug of the heading's text
    (code marks, emphasis and link targets dropped), a repeated slug getting ``_1``, ``_2``, ..."""
    ids: set[str] = set()
    for line in outside_code(text):
        match = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if not match:
            continue
        heading = match.group(1)
        explicit = re.search(r"\{#([\w-]+)\}\s*$", heading)
        if explicit:
            ids.add(explicit.group(1))
            continue
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").replace("*", "")
        slug, k = slugify(heading), 0
        unique = slug
        while unique in ids:
            k += 1
            unique = f"{slug}_{k}"
        ids.add(unique)
    return ids


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def relative_links(text: str) -> list[str]:
    links = []
    for line in outside_code(text):
        line = re.sub(r"`[^`]*`", "", line)
        links += [t for t in LINK.findall(line) if not re.match(r"^[a-z]+:", t)]
    return links


def test_readme_is_short_and_starts_with_its_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    assert lines[0] == "# pagesim"
    assert lines[2:9] == ["```bash", DEMO_COMMAND, "```", "", "```bash", TEST_COMMAND, "```"]


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    pages = nav_pages()
    assert pages, "mkdocs.yml has no nav"
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"in mkdocs.yml's nav but not in docs/: {missing}"
    unlisted = [str(p.relative_to(DOCS)) for p in doc_pages() if str(p.relative_to(DOCS)) not in pages]
    assert not unlisted, f"in docs/ but not in mkdocs.yml's nav: {unlisted}"


@pytest.mark.parametrize("source", [README, *doc_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings_that_exist(source, reference):
    broken = []
    for target in relative_links(page_text(source, reference)):
        path_part, _, anchor = target.partition("#")
        path = (source.parent / path_part).resolve() if path_part else source
        if not path.is_file():
            broken.append(f"{target}: no such file")
            continue
        if anchor and path.suffix == ".md" and anchor not in heading_ids(page_text(path, reference)):
            broken.append(f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert not broken, f"{source.relative_to(ROOT)}: " + "; ".join(broken)


def test_links_into_the_docs_from_the_readme_stay_inside_docs():
    for target in relative_links(README.read_text()):
        resolved = (ROOT / target.partition("#")[0]).resolve()
        assert DOCS in resolved.parents, f"README links outside docs/: {target}"


def subparsers(parser: argparse.ArgumentParser):
    """Every parser below and including ``parser``."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from subparsers(sub)


def sections(reference: str) -> dict[str, str]:
    """The reference's sections by command (``pagesim trace gen``), from its headings."""
    found: dict[str, str] = {}
    current = None
    for line in reference.splitlines():
        match = re.match(r"^#{2,3} `([^`]+)`", line)
        if match:
            current = match.group(1)
            found[current] = ""
        elif current is not None:
            found[current] += line + "\n"
    return found


def test_cli_reference_has_every_command_and_every_option(reference):
    from pagesim.engine.cli import build_parser

    by_command = sections(reference)
    parsers = list(subparsers(build_parser()))
    assert len(parsers) >= 20  # pagesim, its 14 commands, oracle's 2, trace's 3
    for parser in parsers:
        assert parser.prog in by_command, f"no section for {parser.prog}"
        rows = [line for line in by_command[parser.prog].splitlines() if line.startswith("| `")]
        for action in parser._actions:
            for option in action.option_strings:
                pattern = re.compile(r"(?<![\w-])" + re.escape(option) + r"(?![\w-])")
                assert any(pattern.search(row) for row in rows), f"{parser.prog}: {option} not in its table"
            if isinstance(action, argparse._SubParsersAction):
                for name in action.choices:
                    assert f"{parser.prog} {name}" in by_command, f"no section for {parser.prog} {name}"


def test_cli_reference_states_usage_defaults_and_groups(reference):
    by_command = sections(reference)
    simulate = by_command["pagesim simulate"]
    assert "usage: pagesim simulate" in simulate
    assert "**deployment**" in simulate and "**policy**" in simulate
    assert re.search(r"^\| `--gpu-memory-utilization F` \| `0\.9` \|", simulate, re.M)
    assert "%(default)" not in reference and "%%" not in reference


def test_the_parser_imports_no_torch():
    code = ("import sys; from pagesim.engine.cli import build_parser; build_parser(); "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_the_hook_fills_in_only_the_reference_page(hook):
    page = "# Command reference\n\n" + hook.MARKER + "\n"
    assert hook.on_page_markdown(page, None, None, None).startswith("# Command reference\n\n## `pagesim`")
    assert hook.on_page_markdown("# Another page\n", None, None, None) == "# Another page\n"


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
