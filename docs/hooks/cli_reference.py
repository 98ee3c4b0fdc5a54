"""The command reference page, built from the CLI's own argparse definitions so it cannot go stale.

``render_cli_reference()`` walks ``pagesim.engine.cli.build_parser()`` (which imports no torch)
and writes, for every command and every nested subcommand (``trace gen``, ``oracle compare``, ...):
its one-line summary, usage, description, and one table per argument group with each argument's
flags and metavar, default and help. It needs no mkdocs, so ``tests/test_docs.py`` calls it.

As a MkDocs hook (``hooks:`` in ``mkdocs.yml``), ``on_page_markdown`` puts the rendered text in
place of the line ``<!-- cli-reference -->`` of ``docs/reference/cli.md``.
"""

from __future__ import annotations

import argparse
import re

#: the line of ``docs/reference/cli.md`` the rendered reference replaces
MARKER = "<!-- cli-reference -->"

#: the width usage lines are wrapped at (fixed, so the page does not depend on the terminal)
USAGE_WIDTH = 100

#: characters Markdown would read as markup in plain help text
_MARKUP = re.compile(r"([\\*_\[\]#|>{}])")


def command_anchor(prog: str) -> str:
    """The heading id of a command's section: ``pagesim trace gen`` -> ``pagesim-trace-gen``."""
    return prog.replace(" ", "-")


def walk_parsers(parser: argparse.ArgumentParser):
    """Yield ``(parser, summary)`` for ``parser`` and every subparser below it, depth first, in the
    order the CLI defines them; ``summary`` is the subcommand's ``help=`` line (None at the top)."""
    stack = [(parser, None)]
    while stack:
        current, summary = stack.pop()
        yield current, summary
        children = []
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                children.extend((sub, helps.get(name)) for name, sub in action.choices.items())
        stack.extend(reversed(children))


def _text(text: str) -> str:
    """Help or description text as Markdown: RST ``code`` becomes `code`; code spans are kept,
    everything else has its markup characters escaped; one paragraph per blank-line block."""
    text = re.sub(r"``(.+?)``", r"`\1`", text)
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part)
        else:
            out.append(_MARKUP.sub(r"\\\1", part).replace("<", "&lt;"))
    return "".join(out)


def _paragraphs(text: str) -> str:
    blocks = [" ".join(block.split()) for block in re.split(r"\n\s*\n", text.strip())]
    return "\n\n".join(_text(block) for block in blocks if block)


def _help(action: argparse.Action, prog: str) -> str:
    """The action's help with argparse's ``%(default)s``-style fields filled in, as argparse does."""
    if not action.help:
        return ""
    fields = dict(vars(action), prog=prog)
    for name in list(fields):
        if fields[name] is argparse.SUPPRESS:
            del fields[name]
    if fields.get("choices") is not None:
        fields["choices"] = ", ".join(str(c) for c in fields["choices"])
    return action.help % fields


def _default(action: argparse.Action) -> str:
    """The default worth stating: a value an option stores when not given (not a flag's False)."""
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    if isinstance(action.default, (list, tuple)):
        if not action.default:
            return ""
        return "`" + " ".join(str(v) for v in action.default) + "`"
    return f"`{action.default}`"


def _cell(text: str) -> str:
    """A table cell: one line (plain text has its pipes escaped already, by ``_text``)."""
    return " ".join(text.split())


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _invocation(action: argparse.Action, prog: str) -> str:
    formatter = argparse.HelpFormatter(prog=prog, width=USAGE_WIDTH)
    return formatter._format_action_invocation(action)


def _render_parser(parser: argparse.ArgumentParser, summary: str | None) -> list[str]:
    prog = parser.prog
    level = "###" if len(prog.split()) > 2 else "##"  # a nested subcommand sits under its command
    lines = [f"{level} `{prog}` {{#{command_anchor(prog)}}}", ""]
    if summary:
        lines += [_paragraphs(summary[:1].upper() + summary[1:]) + ".", ""]
    lines += ["```text", _usage(parser), "```", ""]
    if parser.description:
        lines += [_paragraphs(parser.description), ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        lines += [f"**{_text(group.title)}**", ""]
        if group.description:
            lines += [_paragraphs(group.description), ""]
        subcommands = [a for a in actions if isinstance(a, argparse._SubParsersAction)]
        for action in subcommands:
            lines += ["| command | what it does |", "|---|---|"]
            for choice in action._choices_actions:
                anchor = command_anchor(f"{prog} {choice.dest}")
                lines.append(f"| [`{choice.dest}`](#{anchor}) | {_cell(_text(choice.help or ''))} |")
            lines.append("")
        arguments = [a for a in actions if not isinstance(a, argparse._SubParsersAction)]
        if arguments:
            lines += ["| argument | default | help |", "|---|---|---|"]
            for action in arguments:
                invocation = _cell(f"`{_invocation(action, prog)}`")
                lines.append(f"| {invocation} | {_default(action)} | {_cell(_text(_help(action, prog)))} |")
            lines.append("")
    return lines


def render_cli_reference() -> str:
    """The whole command reference as Markdown: a section per command, in the CLI's own order."""
    from pagesim.engine.cli import build_parser

    lines: list[str] = []
    for parser, summary in walk_parsers(build_parser()):
        lines += _render_parser(parser, summary)
    return "\n".join(lines).rstrip() + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """MkDocs hook: the reference page's marker line becomes the rendered reference."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render_cli_reference())
