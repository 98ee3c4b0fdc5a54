"""Where an inference-perf run's files are, and reading them whole within a size limit.

inference-perf's local storage writes one folder per run (``storage.local_storage.path``)::

    config.yaml                      the whole configuration, as the run used it (model_dump)
    summary_lifecycle_metrics.json   latencies, lengths and rates over every stage's requests
    stage_N_lifecycle_metrics.json   the same per load stage N (from 0)
    per_request_lifecycle_metrics.json   every request (large; not read here)

each name after ``storage.local_storage.report_file_prefix`` when one is set (filestorage/local.py
``save_report``). Experiment tools (as the shared ground truth's) put that folder as ``results/``
inside an experiment folder beside an ``exp-config.yaml`` describing the server. ``locate``
accepts the results folder, the experiment folder or ``config.yaml`` itself.

Files are read by ``pagesim.engine.files`` (regular files only, never more than a stated size); YAML is
parsed by ``yaml.safe_load`` (no Python objects), with its errors, a number too long for ``int``
and nesting past the parser's recursion restated as one line naming the file, line and column.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import yaml

from pagesim.engine.files import MAX_NESTING, InputFileError, loads_json, nesting_exceeds, read_small_text
from pagesim.traces.inference_perf.keys import InferencePerfError, Node

MAX_CONFIG_BYTES = 4 * 2**20  # a config.yaml is about 1.5 KiB, an exp-config.yaml a few lines
MAX_METRICS_BYTES = 64 * 2**20  # a lifecycle metrics file is about 6 KiB
CONFIG_NAME = "config.yaml"
EXP_CONFIG_NAME = "exp-config.yaml"


@dataclass(frozen=True)
class RunFiles:
    results_dir: Path
    config: Path  # the results folder's config.yaml
    exp_config: Path | None  # the experiment folder's exp-config.yaml, when there is one


def locate(path: str | PathLike[str]) -> RunFiles:
    """The run at ``path``: a results folder holding ``config.yaml``, an experiment folder holding
    ``results/config.yaml``, or a ``config.yaml``. The experiment's ``exp-config.yaml`` is the one
    beside the results folder (``results/../exp-config.yaml``)."""
    given = Path(path)
    if not os.path.lexists(given):
        raise InferencePerfError(f"{given}: no such file or folder")
    if not given.is_dir():
        config = given  # (read_small_text refuses a FIFO or a device by name)
    else:
        looked_for = [given / CONFIG_NAME, given / "results" / CONFIG_NAME]
        config = next((p for p in looked_for if os.path.lexists(p)), None)
        if config is None:
            raise InferencePerfError(f"{given}: not an inference-perf run: found neither "
                                     f"{looked_for[0]} nor {looked_for[1]}")
    results_dir = config.parent
    exp_config = results_dir.parent / EXP_CONFIG_NAME
    return RunFiles(results_dir, config, exp_config if os.path.lexists(exp_config) else None)


def _text(path: Path, *, limit_bytes: int, what: str) -> str:
    try:
        return read_small_text(path, limit_bytes=limit_bytes, what=what)
    except InputFileError as exc:
        raise InferencePerfError(str(exc)) from None


def read_yaml(path: Path, *, what: str) -> Node:
    """The YAML document ``path`` holds, as the top ``Node``."""
    text = _text(path, limit_bytes=MAX_CONFIG_BYTES, what=what)
    if nesting_exceeds(text, MAX_NESTING):  # flow style ([[[...]]]); block style is caught below
        raise InferencePerfError(f"{path}: YAML nested more than {MAX_NESTING} levels deep")
    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise InferencePerfError(f"{path}: not valid YAML{where}") from None
    except yaml.YAMLError:
        raise InferencePerfError(f"{path}: not valid YAML") from None
    except ValueError:  # an integer of more digits than int() reads (sys.get_int_max_str_digits)
        raise InferencePerfError(f"{path}: not valid YAML (a number with too many digits to read)") from None
    except RecursionError:  # (block style deeper than Python's stack: the limit below, far past it)
        raise InferencePerfError(f"{path}: YAML nested more than {MAX_NESTING} levels deep") from None
    if _depth_exceeds(document, MAX_NESTING):  # block style ("k:" indented level by level) the scan does not see
        raise InferencePerfError(f"{path}: YAML nested more than {MAX_NESTING} levels deep")
    top = Node(document, "", path)
    if not isinstance(document, dict):
        raise top.error(f"must hold a mapping of keys to values (an inference-perf {what})")
    return top


def _depth_exceeds(document, limit: int) -> bool:
    """Whether ``document`` (parsed YAML: dicts, lists, scalars) nests containers more than
    ``limit`` deep; iterative, so a deep document cannot exhaust the stack here."""
    stack = [(document, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth >= limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


def read_json(path: Path, *, what: str) -> Node:
    """The JSON document ``path`` holds, as the top ``Node`` (a mapping)."""
    try:
        document = loads_json(_text(path, limit_bytes=MAX_METRICS_BYTES, what=what), path=path)
    except InputFileError as exc:
        raise InferencePerfError(str(exc)) from None
    top = Node(document, "", path)
    if not isinstance(document, dict):
        raise top.error(f"must hold a JSON object (an inference-perf {what})")
    return top


def metrics_files(results_dir: Path, prefix: str) -> tuple[Path | None, dict[int, Path]]:
    """The run's ``summary_lifecycle_metrics.json`` (or None) and its per-stage files by index."""
    pattern = re.compile(re.escape(prefix) + r"stage_(\d{1,9})_lifecycle_metrics\.json")
    summary = results_dir / f"{prefix}summary_lifecycle_metrics.json"
    stages = {}
    with os.scandir(results_dir) as entries:
        for entry in entries:
            match = pattern.fullmatch(entry.name)
            if match:
                stages[int(match.group(1))] = results_dir / entry.name
    return (summary if os.path.lexists(summary) else None), dict(sorted(stages.items()))
