"""The ``pagesim`` command line: one dispatcher, each subcommand owned by the package it belongs to.

Every subcommand registers itself through a small ``add_parser(subparsers)`` function in its own
module and is imported lazily, so ``pagesim --help`` stays fast and ``pagesim memory`` never
imports torch or simpy. Bad input is reported as ``pagesim: error: ...`` with exit status 2,
never as a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading

# name -> module that defines add_parser(subparsers) and whose parser sets ``func``.
SUBCOMMANDS: dict[str, str] = {
    "memory": "pagesim.engine.commands.memory",
    "presets": "pagesim.engine.commands.presets",
    "oracle": "pagesim.engine.oracle.cli",
    "trace": "pagesim.traces.cli",
    "simulate": "pagesim.sim.cli",
    "replay": "pagesim.sim.replay_cli",
    "serve": "pagesim.sim.serve.cli",
    "run": "pagesim.engine.runtime.cli",
    "calibrate": "pagesim.engine.calibrate.cli",
    "validate": "pagesim.reports.validation.cli",
    "reproduce": "pagesim.sim.paper_cli",
    "study": "pagesim.reports.cli",
    "report": "pagesim.reports.cli",
    "demo": "pagesim.reports.cli",
    "compare": "pagesim.reports.compare",
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


#: vLLM flags pagesim has no twin for: flag -> (where the flag comes from, what to do instead).
#: The bench flags are vLLM 0.33's ``vllm bench serve`` flags (benchmarks/serve.py ``add_cli_args`` and
#: benchmarks/datasets/datasets.py ``add_dataset_parser``) that simulate and run leave out.
_BENCH = "vllm bench serve"
_SERVE = "vllm serve"
_NO_SERVER = "pagesim serves the requests itself; no server address is needed"
_NO_SAMPLING = "the simulator and the engine stop at each request's output length; sampling does not change the work"
_NO_DATASET = "pagesim has no {} dataset (see --dataset-name's choices)"
FOREIGN_FLAGS: dict[str, tuple[str, str]] = {
    "--base-url": (_BENCH, _NO_SERVER),
    "--host": (_BENCH, _NO_SERVER),
    "--port": (_BENCH, _NO_SERVER),
    "--endpoint": (_BENCH, "pagesim serves the requests itself; no endpoint is needed"),
    "--header": (_BENCH, "no HTTP request is sent"),
    "--insecure": (_BENCH, "no HTTP request is sent"),
    "--ready-check-timeout-sec": (_BENCH, "there is no server to wait for"),
    "--ignore-eos": (_BENCH, "pagesim always stops at the dataset's output length, as --ignore-eos does"),
    "--input-len": (_BENCH, "give the dataset's own length flag, e.g. --random-input-len"),
    "--output-len": (_BENCH, "give the dataset's own length flag, e.g. --random-output-len"),
    "--tokenizer-mode": (_BENCH, "--tokenizer reads a tokenizer.json with the tokenizers package"),
    "--skip-tokenizer-init": (_BENCH, "leave it out"),
    "--trust-remote-code": (_BENCH, "pagesim reads config.json and tokenizer.json itself; leave it out"),
    "--served-model-name": (_BENCH, "leave it out: --model names the model"),
    "--use-beam-search": (_BENCH, "pagesim run takes --beam-width W"),
    "--logprobs": (_BENCH, "no log-probabilities are returned"),
    "--top-k": (_BENCH, _NO_SAMPLING),
    "--min-p": (_BENCH, _NO_SAMPLING),
    "--frequency-penalty": (_BENCH, _NO_SAMPLING),
    "--presence-penalty": (_BENCH, _NO_SAMPLING),
    "--repetition-penalty": (_BENCH, _NO_SAMPLING),
    "--extra-body": (_BENCH, "no HTTP request is sent"),
    "--chat-template-kwargs": (_BENCH, "pagesim applies no chat template (prompts are counted as written)"),
    "--skip-chat-template": (_BENCH, "leave it out: pagesim never applies a chat template"),
    "--enable-multimodal-chat": (_BENCH, "pagesim simulates text requests only"),
    "--lora-modules": (_BENCH, "pagesim does not model LoRA adapters"),
    "--lora-assignment": (_BENCH, "pagesim does not model LoRA adapters"),
    "--request-id-prefix": (_BENCH, "requests are numbered in the output tables"),
    "--disable-tqdm": (_BENCH, "use --no-progress"),
    "--profile": (_BENCH, "vLLM's is the server's torch profiler; pagesim run has no server (simulate's --profile "
                          "is a calibration profile)"),
    "--probe-request-rate": (_BENCH, "not modelled; a trace can mix short requests in"),
    "--self-timed": (_BENCH, "replay a trace with its own arrival times: --trace PATH"),
    "--plot-timeline": (_BENCH, "simulate --out DIR writes timeline.json (Perfetto)"),
    "--timeline-itl-thresholds": (_BENCH, "simulate --out DIR writes timeline.json (Perfetto)"),
    "--plot-dataset-stats": (_BENCH, "pagesim trace stats describes a trace"),
    "--no-stream": (_BENCH, "pagesim reads a local dataset file; nothing is streamed"),
    "--hf-subset": (_BENCH, "--dataset-name hf reads a local Parquet or JSONL file"),
    "--hf-split": (_BENCH, "--dataset-name hf reads a local Parquet or JSONL file"),
    "--hf-name": (_BENCH, "--dataset-name hf reads a local Parquet or JSONL file"),
    "--random-batch-size": (_BENCH, "pagesim models generation requests, not batched embedding requests"),
    "--no-reranker": (_BENCH, _NO_DATASET.format("random-rerank")),
    "--custom-ensure-client-side-data": (_BENCH, "leave it out"),
    "--save-detailed": (_BENCH, "simulate and run write per-request lists with --save-result"),  # (elsewhere)
    "--data-parallel-size": (_SERVE, "use --replicas N (with --router) for data parallelism"),
    "-dp": (_SERVE, "use --replicas N (with --router) for data parallelism"),
    "--enable-expert-parallel": (_SERVE, "use --ep N (simulate)"),
}
#: flags of vLLM's datasets pagesim does not have, by their prefix
FOREIGN_PREFIXES: dict[str, tuple[str, str]] = {
    "--random-mm-": (_BENCH, _NO_DATASET.format("random-mm")),
    "--spec-bench-": (_BENCH, _NO_DATASET.format("spec_bench")),
    "--speed-bench-": (_BENCH, _NO_DATASET.format("speed_bench")),
    "--timed-trace-": (_BENCH, "replay a trace with its own arrival times: --trace PATH"),
    "--blazedit-": (_BENCH, _NO_DATASET.format("blazedit")),
    "--asr-": (_BENCH, "pagesim simulates text requests only"),
    "--bfcl-": (_BENCH, _NO_DATASET.format("bfcl")),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagesim",
        description="What-if simulator and real engine for paged KV-cache LLM serving.",
    )
    parser.add_argument("--version", action="version", version=_version(),
                        help="the version, and whether this install runs compiled modules (pagesim/engine/compiled.py)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in dict.fromkeys(SUBCOMMANDS.values()):  # a module may define several
        importlib.import_module(module_name).add_parser(subparsers)
    parser.set_defaults(_subparsers=subparsers)
    return parser


def _version() -> str:
    import importlib.metadata

    from pagesim.engine import COMPILED
    from pagesim.engine.compiled import describe

    try:
        version = importlib.metadata.version("pagesim")
    except importlib.metadata.PackageNotFoundError:  # (run from a source tree that is not installed)
        version = "(not installed)"
    return f"pagesim {version} ({describe(COMPILED)})"


def unknown_flags_message(subparser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: ...`` with, for each flag, what to do: for a vLLM flag pagesim
    does not use, that it is one and what to do instead; for a typo of a known flag, that flag."""
    known = [opt for action in subparser._actions for opt in action.option_strings]
    words = []
    for k, extra in enumerate(extras):
        flag = extra.split("=", 1)[0]
        if not flag.startswith("-"):
            if k == 0 or not extras[k - 1].startswith("-"):  # (not an unknown flag's value)
                words.append(f"{extra!r}")
            continue
        hint = foreign_flag_hint(flag)
        if hint is None:
            near = nearest_flag(flag, known)
            hint = f"did you mean {near}?" if near else None
        words.append(f"{flag} ({hint})" if hint else flag)
    return "unrecognized arguments: " + ", ".join(words)


def foreign_flag_hint(flag: str) -> str | None:
    """``a vllm bench serve flag pagesim does not use: ...`` for a vLLM flag with no twin here."""
    found = FOREIGN_FLAGS.get(flag.replace("_", "-") if flag.startswith("--") else flag)
    if found is None:
        found = next((v for prefix, v in FOREIGN_PREFIXES.items() if flag.replace("_", "-").startswith(prefix)), None)
    if found is None:
        return None
    origin, advice = found
    return f"a {origin} flag pagesim does not use: {advice}"


def nearest_flag(flag: str, known: list[str]) -> str | None:
    """The known flag ``flag`` is a typo of, or None: the one flag at the smallest typo distance
    (``typo_distance``) within what a typo plausibly does to a name of that length (none under 4
    letters, one edit up to 7, two beyond); vLLM's spelling with underscores maps to the dashes.

    NOTE: difflib's similarity ratio offered ``--trace`` for ``--backend`` and ``--rate`` for
    ``--label``: names that share letters are not typos of each other."""
    dashed = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
    if dashed != flag and dashed in known:
        return dashed
    name = dashed.lstrip("-")
    allowed = 0 if len(name) < 4 else 1 if len(name) <= 7 else 2
    if allowed == 0:
        return None
    scored = sorted((typo_distance(name, other.lstrip("-")), other) for other in known if other.startswith("--"))
    best = [other for distance, other in scored if distance == scored[0][0]] if scored else []
    if not scored or scored[0][0] > allowed or len(best) > 1:  # (two equally near: no guess)
        return None
    return best[0]


def typo_distance(a: str, b: str) -> int:
    """Edits that turn ``a`` into ``b``: insert, delete or replace a letter, or swap two adjacent
    ones (the optimal string alignment distance)."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[len(b)]


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

    from pagesim.engine.catalog.hf_config import ModelConfigWarning
    from pagesim.traces.source import show_as_lines

    try:
        with warnings.catch_warnings():  # (puts the previous hook back, for callers of main)
            show_as_lines(args.command, ModelConfigWarning)  # a config.json read on an assumption: one line
            return int(args.func(args) or 0)
    except (UsageError, ValueError) as exc:
        parser.exit(2, f"pagesim {args.command}: error: {exc}\n")
    except ModuleNotFoundError as exc:
        hint = missing_extra_hint(exc)
        if hint is None:
            raise
        parser.exit(1, f"pagesim {args.command}: error: {hint}\n")
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
        from pagesim.engine.memory_fit import memory_error_words

        parser.exit(2, f"pagesim {args.command}: error: {memory_error_words(exc)}\n")
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: no traceback
        print(f"pagesim {args.command}: {interruption(exc)}", file=sys.stderr)
        return interrupted_status(exc)


#: The modules of the ``engine`` extra (pyproject.toml): the base install simulates without them.
ENGINE_EXTRA_MODULES = ("torch", "triton", "safetensors")
#: The modules of the ``serve`` extra: ``pagesim serve``'s HTTP stack.
SERVE_EXTRA_MODULES = ("fastapi", "starlette", "uvicorn", "prometheus_client")


def missing_extra_hint(exc: ModuleNotFoundError) -> str | None:
    """The one line that says which extra to install, for a module of the ``engine`` extra that
    this environment lacks (``pagesim run`` on the base install); None for any other module."""
    top = (exc.name or "").split(".")[0]
    if top in SERVE_EXTRA_MODULES:
        return (f"{top!r} is not installed, and pagesim serve needs its HTTP stack: pip install 'pagesim[serve]' "
                "(from a checkout: pip install -e '.[serve]')")
    if top not in ENGINE_EXTRA_MODULES:
        return None
    where = " (Linux: Triton has no wheels elsewhere; --backend torch runs without it)" if top == "triton" else ""
    return (f"{top!r} is not installed, and this needs the real engine: "
            f"pip install 'pagesim[engine]'{where} (from a checkout: pip install -e '.[engine]')")


if __name__ == "__main__":
    sys.exit(main())
