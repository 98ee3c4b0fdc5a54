"""The ``pagesim`` command line: one dispatcher, each subcommand owned by the package it belongs to.

Every subcommand registers itself through a small ``add_parser(subparsers)`` function in its own
module and is imported lazily, so ``pagesim --help`` stays fast and ``pagesim memory`` never
imports torch or simpy. Bad input is reported as ``pagesim: error: ...`` with exit status 2,
never as a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys

# name -> module that defines add_parser(subparsers) and whose parser sets ``func``.
SUBCOMMANDS: dict[str, str] = {
    "memory": "engine.policy.capacity_cli",
    "presets": "engine.policy.presets_cli",
    "oracle": "engine.oracle.cli",
    "trace": "traces.cli",
    "simulate": "sim.cli",
    "run": "engine.runtime.cli",
    "calibrate": "engine.calibrate.cli",
    "validate": "reports.validation.cli",
    "reproduce": "sim.paper_cli",
    "study": "reports.cli",
    "report": "reports.cli",
    "demo": "reports.cli",
    "compare": "reports.compare",
}


class UsageError(Exception):
    """Raised by a subcommand for bad input; printed as a one-line error, exit status 2."""


#: vLLM flags pagesim has no twin for, and what to do instead
FOREIGN_FLAGS: dict[str, str] = {
    "--base-url": "pagesim serves the requests itself; no server address is needed",
    "--host": "pagesim serves the requests itself; no server address is needed",
    "--port": "pagesim serves the requests itself; no server address is needed",
    "--endpoint": "pagesim serves the requests itself; no endpoint is needed",
    "--ignore-eos": "pagesim always stops at the dataset's output length, as --ignore-eos does",
    "--data-parallel-size": "use --replicas N (with --router) for data parallelism",
    "-dp": "use --replicas N (with --router) for data parallelism",
    "--enable-expert-parallel": "use --ep N (simulate)",
    "--trust-remote-code": "pagesim reads config.json itself; leave it out",
    "--served-model-name": "leave it out: --model names the model",
    "--save-detailed": "simulate and run write per-request lists with --save-result",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagesim",
        description="What-if simulator and real engine for paged KV-cache LLM serving.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in dict.fromkeys(SUBCOMMANDS.values()):  # a module may define several
        importlib.import_module(module_name).add_parser(subparsers)
    parser.set_defaults(_subparsers=subparsers)
    return parser


def unknown_flags_message(subparser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: ...`` with, for each flag, the nearest known one or what to do."""
    known = [opt for action in subparser._actions for opt in action.option_strings]
    words = []
    for k, extra in enumerate(extras):
        flag = extra.split("=", 1)[0]
        if not flag.startswith("-"):
            if k == 0 or not extras[k - 1].startswith("-"):  # (not an unknown flag's value)
                words.append(f"{extra!r}")
            continue
        hint = FOREIGN_FLAGS.get(flag)
        if hint is None:
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}?" if close else None
        words.append(f"{flag} ({hint})" if hint else flag)
    return "unrecognized arguments: " + ", ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        subparser = args._subparsers.choices[args.command]
        subparser.error(unknown_flags_message(subparser, extras))
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError) as exc:
        parser.exit(2, f"pagesim {args.command}: error: {exc}\n")
    except BrokenPipeError:  # `pagesim ... | head`: the reader left; not an error
        try:
            sys.stdout = open(os.devnull, "w")  # so the interpreter's final flush does not complain
        except OSError:
            pass
        return 0
    except OSError as exc:  # a file that cannot be read or written
        where = f"{exc.filename}: " if exc.filename else ""
        parser.exit(2, f"pagesim {args.command}: error: {where}{exc.strerror or exc}\n")
    except MemoryError:
        parser.exit(2, f"pagesim {args.command}: error: not enough memory for what was asked\n")
    except KeyboardInterrupt:  # Ctrl-C: no traceback; 128 + SIGINT, as shells report it
        print(f"pagesim {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
