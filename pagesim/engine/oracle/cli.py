"""``pagesim oracle``: replay a vLLM oracle workload through a preset, and compare with vLLM's log.

- ``pagesim oracle replay SPEC.json [--preset P] [--output FILE] [--json]`` writes pagesim's
  decisions in the oracle's canonical record format (one JSON object per step, sorted keys, no
  spaces): to stdout, or to ``--output`` with a one-line summary on stdout. ``--json`` prints one
  JSON object instead: the summary and the records.
- ``pagesim oracle compare SPEC.json GOLDEN.log.jsonl [--preset P]`` replays and compares record
  by record. The last line is ``identical`` (exit 0), or the first differing step is printed with
  the fields that differ and both records (exit 1).

The preset defaults to the one for the spec's vLLM version (0.32.0: ``vllm-v1``; 0.6.3:
``vllm-v0``). Bad input (missing file, malformed spec or log, unknown preset) is one error line,
exit 2. When vLLM 0.6.3 itself would abort (swap space exhausted, a multi-sequence recompute), so
does the replay, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pagesim.engine.oracle.replay import ReplayResult, replay
from pagesim.engine.oracle.spec import load_spec
from pagesim.engine.policy import PRESETS, DecisionLog
from pagesim.engine.policy.scheduling.output import dump_record
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VLLM_V0_ABORTS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "oracle",
        help="replay vLLM oracle workloads through a preset and compare with vLLM's decisions",
        description="Replay a vLLM oracle workload through a preset, and compare with vLLM's own log.",
    )
    sub = p.add_subparsers(dest="oracle_command", metavar="ACTION")
    sub.required = True
    r = sub.add_parser("replay", help="write pagesim's decision log for a spec in the oracle's format")
    r.add_argument("spec", help="workload spec (case_NNN.spec.json)")
    r.add_argument("--preset", choices=list(PRESETS), help="scheduler preset (default: the spec's vLLM version's)")
    r.add_argument("--output", "-o", help="write the JSONL log here instead of stdout")
    r.add_argument("--json", action="store_true", help="print one JSON object: summary and records")
    r.set_defaults(func=run_replay)
    c = sub.add_parser("compare", help="replay a spec and compare with a golden log; last line 'identical'")
    c.add_argument("spec", help="workload spec (case_NNN.spec.json)")
    c.add_argument("golden", help="vLLM's decision log (case_NNN.log.jsonl)")
    c.add_argument("--preset", choices=list(PRESETS), help="scheduler preset (default: the spec's vLLM version's)")
    c.set_defaults(func=run_compare)


def _replay(args: argparse.Namespace) -> ReplayResult | None:
    spec = load_spec(args.spec)
    try:
        return replay(spec, args.preset)
    except VLLM_V0_ABORTS as exc:
        print(f"pagesim oracle: stopped where vLLM 0.6.3 aborts too: {exc}", file=sys.stderr)
        return None


def _summary(result: ReplayResult) -> dict:
    s = result.scheduler
    return {
        "spec": result.spec.path,
        "vllm_version": result.spec.vllm_version,
        "preset": result.preset,
        "steps": len(result.records),
        "requests": len(result.spec.requests),
        "finished": s.num_finished_requests,
        "rejected": s.num_rejected_requests,
        "preemptions": s.num_preemptions,
    }


def _summary_line(summary: dict) -> str:
    return (
        f"{summary['spec']}: vLLM {summary['vllm_version']} workload through preset {summary['preset']}: "
        f"{summary['steps']} steps, {summary['finished']}/{summary['requests']} requests finished, "
        f"{summary['preemptions']} preemptions"
    )


def run_replay(args: argparse.Namespace) -> int:
    from pagesim.engine.outputs import OutputFile

    target = OutputFile(args.output, "-o") if args.output and not args.json else None  # checked before the replay
    result = _replay(args)
    if result is None:
        return 1
    summary = _summary(result)
    if args.json:
        print(json.dumps({**summary, "records": result.records}, sort_keys=True))
        return 0
    if target is not None:
        out = target.path
        try:
            with target.open(encoding="ascii") as f:
                DecisionLog(result.records).write_jsonl(f)
        except OSError as exc:
            raise ValueError(f"cannot write {out}: {exc.strerror or exc}") from None
        print(f"{_summary_line(summary)} -> {out}")
        return 0
    for record in result.records:
        sys.stdout.write(dump_record(record) + "\n")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    golden_path = Path(args.golden)
    golden = DecisionLog.read_jsonl(golden_path)  # a missing file, a FIFO, a folder: one error line
    result = _replay(args)
    if result is None:
        return 1
    print(_summary_line(_summary(result)))
    print(f"{golden_path}: {len(golden)} steps")
    diff = DecisionLog(result.records).first_difference(golden)
    if diff is None:
        print("identical")
        return 0
    index, ours, theirs = diff
    step = (theirs or ours)["step"]
    if ours is None or theirs is None:
        print(f"first difference at step {step}: only {'vLLM' if ours is None else 'pagesim'} has it")
    else:
        fields = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        print(f"first difference at step {step} (record {index}), in: {', '.join(fields)}")
    print(f"  vLLM:    {dump_record(theirs) if theirs is not None else '(none)'}")
    print(f"  pagesim: {dump_record(ours) if ours is not None else '(none)'}")
    return 1
