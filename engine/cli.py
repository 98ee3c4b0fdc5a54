"""The ``pagesim`` command line: one dispatcher, each subcommand owned by the package it belongs to.

Every subcommand registers itself through a small ``add_parser(subparsers)`` function in its own
module and is imported lazily, so ``pagesim --help`` stays fast and ``pagesim memory`` never
imports torch or simpy. Bad input is reported as ``pagesim: error: ...`` with exit status 2,
never as a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import signal
import sys
import threading

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


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: it unwinds exactly as Ctrl-C does (a study keeps its
    finished runs and stops its workers), and the process exits 143 (128 + SIGTERM), as shells
    report a terminated process."""

    exit_status = 128 + signal.SIGTERM


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def interruption(exc: KeyboardInterrupt) -> str:
    """``terminated`` (SIGTERM) or ``interrupted`` (Ctrl-C), for a command's message."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


def interrupted_status(exc: KeyboardInterrupt) -> int:
    """The exit status for an interruption: 143 for SIGTERM, 130 (128 + SIGINT) for Ctrl-C."""
    return getattr(exc, "exit_status", 128 + signal.SIGINT)


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
    parser.add_argument("--version", action="version", version=_version(),
                        help="the version, and whether this install runs compiled modules (engine/compiled.py)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in dict.fromkeys(SUBCOMMANDS.values()):  # a module may define several
        importlib.import_module(module_name).add_parser(subparsers)
    parser.set_defaults(_subparsers=subparsers)
    return parser


def _version() -> str:
    import importlib.metadata

    from engine import COMPILED
    from engine.compiled import describe

    try:
        version = importlib.metadata.version("pagesim")
    except importlib.metadata.PackageNotFoundError:  # (run from a source tree that is not installed)
        version = "(not installed)"
    return f"pagesim {version} ({describe(COMPILED)})"


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
    with _sigterm_as_interrupt():
        return _dispatch(parser, args)


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises ``Terminated`` while a command runs (main thread only: elsewhere Python
    cannot set handlers); the previous handler is put back after, for callers of ``main``."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:  # (None: a handler set from C, which Python cannot put back; the default then)
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import warnings

    from engine.catalog.hf_config import ModelConfigWarning
    from traces.source import show_as_lines

    try:
        with warnings.catch_warnings():  # (puts the previous hook back, for callers of main)
            show_as_lines(args.command, ModelConfigWarning)  # a config.json read on an assumption: one line
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
    except MemoryError as exc:  # where a size came from the input, the message names it; and the sizes known here
        from engine.memory_fit import memory_error_words

        parser.exit(2, f"pagesim {args.command}: error: {memory_error_words(exc)}\n")
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: no traceback
        print(f"pagesim {args.command}: {interruption(exc)}", file=sys.stderr)
        return interrupted_status(exc)


if __name__ == "__main__":
    sys.exit(main())
