"""Bad input at every subcommand: each is refused with one error line, a non-zero exit, in bounded
time and memory.

Every case builds its bad file(s) in a fresh folder and runs the installed ``pagesim`` in a
subprocess (``tests/bad_inputs_harness.py``), then checks what a user sees: a positive exit status
(not a signal), no traceback, stderr holding exactly one ``pagesim CMD: error: ...`` line (beside
pagesim's warnings and an argparse usage block), nothing on stdout, the words the case names in
that line (the offending file's name wherever a file is at fault), all within the case's time limit
in CPU seconds (the wall clock, which a busy machine stretches, only guards against hangs) and
``MAX_RSS_BYTES`` of peak memory. The cases that could block or never end — the gzip bombs,
``/dev/zero`` and FIFOs — have 10 s.

The table covers truncated, binary, NUL-laden and non-UTF-8 files, gzip bombs in small form,
FIFOs, devices and folders where files belong, huge and non-finite numbers, unsorted times, wrong
format flags, bad TOML, bad plug-ins, bad profiles, bad oracle specs and bad numbers in flags.
What pagesim repairs with a warning (a CSV cut mid-row, a corrupt line of a study's results) is not
here: those succeed (``tests/test_study_faults.py`` has the study's).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import shutil
import textwrap
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bad_inputs_harness import MAX_RSS_BYTES, ROOT, error_line, run_pagesim

# CPU seconds (bad_inputs_harness: a busy machine stretches wall time, not CPU time)
LIMIT_S = 30.0  # a refusal of ordinary bad input (the engine's commands import torch first)
QUICK_S = 10.0  # a gzip bomb, /dev/zero or a FIFO: the bound

HUGE_INT = str(2**70)
MISSING = re.compile(r"\bno such\b|\bno config\.json\b|\bnot a config\.json path\b")
SIM = ["simulate", "--no-progress", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "20"]
SIM_PREEMPTING = ["simulate", "--no-progress", "--json", "--workload", "kwon2023-sharegpt", "--rate", "4",
                  "--num-requests", "50", "--num-gpu-blocks", "300"]  # tight enough that victims are chosen
SIM_TINY = [*SIM, "--model", "tiny", "--num-gpu-blocks", "1000"]  # the shipped profile's model, a small pool
RUN = ["run", "--no-progress", "--model", "tiny", "--workload", "kwon2023-alpaca", "--rate", "4", "--num-requests", "8"]


def run_with_model(model: str) -> list[str]:
    return [*RUN[:3], model, *RUN[4:]]


VALIDATE = ["validate", "--workload", "kwon2023-alpaca", "--rate", "4", "--num-requests", "8"]

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
GENERIC_COLUMNS = ["--columns", "arrival=arrival,prompt=prompt,output=output"]


def azure_rows(count: int) -> str:
    return "".join(f"2023-11-16 18:00:{i:02d}.{i:07d},{100 + i},{10 + i}\n" for i in range(count))


AZURE = AZURE_HEADER + azure_rows(40)
UNSORTED_ROWS = "".join(reversed(azure_rows(5).splitlines(keepends=True)))
SHAREGPT = json.dumps([{"id": "a", "conversations": [{"from": "human", "value": "hi"},
                                                     {"from": "gpt", "value": "hello there"}]}])
SHIPPED_PROFILE = ROOT / "pagesim" / "sim" / "profiles" / "tiny-cpu.json"

STUDY = """\
name = "bad"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 20
[[grid]]
block_size = [8, 16]
"""

ORACLE_SPEC = {
    "config": {"block_size": 4, "enable_chunked_prefill": True, "enable_prefix_caching": True, "max_model_len": 64,
               "max_num_batched_tokens": 16, "max_num_seqs": 2, "num_blocks": 20, "watermark": 0.0},
    "requests": [{"arrival_step": 0, "id": "r0", "ignore_eos": True, "max_tokens": 4,
                  "prompt_token_ids": [101, 102, 103, 104, 105]}],
    "vllm_version": "0.32.0",
}

VICTIM = """\
from pagesim.engine.policy.scheduling.preemption import VictimPolicy


class BadVictim(VictimPolicy):
    name = "bad-victim"
    seen = []

    def choose(self, candidates):
{body}
"""
CHOOSE = {
    "none": "return None",
    "str": "return 'the oldest one'",
    "raises": "raise KeyError('no victim today')",
    "exit": "import sys\nsys.exit(0)",
    # a request from an earlier call that is no longer a candidate (finished or already preempted)
    "stranger": "stale = [r for r in self.seen if all(r is not c for c in candidates)]\n"
                "type(self).seen.extend(candidates)\nreturn stale[0] if stale else candidates[-1]",
}


def victim_plugin(behaviour: str) -> str:
    return VICTIM.format(body=textwrap.indent(CHOOSE[behaviour], " " * 8))


def with_plugin(path: str, cls: str) -> str:
    """The study spec listing the plug-in ``path:cls``."""
    return f'plugins = ["{path}:{cls}"]\n' + STUDY


# ----------------------------------------------------------------------------- the cases' files
class Files:
    """Makes a case's files in its own folder; each method returns the path to pass to pagesim."""

    def __init__(self, root: Path, shared: dict[str, Path]):
        self.root = root
        self.shared = shared

    def write(self, name: str, content: str | bytes) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        return str(path)

    def json(self, name: str, obj) -> str:
        return self.write(name, json.dumps(obj))  # NaN written as NaN, as Python's json does

    def fifo(self, name: str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        return str(path)

    def link(self, name: str, target: str) -> str:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
        return str(path)

    def folder(self, name: str) -> str:
        (self.root / name).mkdir(parents=True, exist_ok=True)
        return str(self.root / name)

    def garbage(self, name: str, size: int = 64 * 1024) -> str:
        return self.write(name, random.Random(name).randbytes(size))

    def gzip(self, name: str, text: str) -> str:
        return self.write(name, gzip.compress(text.encode()))

    def profile(self, name: str, change: Callable[[dict], None]) -> str:
        profile = json.loads(SHIPPED_PROFILE.read_text())
        change(profile)
        return self.json(name, profile)

    def oracle(self, name: str, change: Callable[[dict], None]) -> str:
        spec = json.loads(json.dumps(ORACLE_SPEC))
        change(spec)
        return self.json(name, spec)

    def study_folder(self, name: str) -> str:
        return str(shutil.copytree(self.shared["study"], self.root / name))

    def bomb(self, name: str) -> str:
        return self.link(self.shared[name].name, str(self.shared[name]))


def _set(path: str, value):
    """A change to a nested document: ``_set("tables.dense_layer.median_s.0", nan)``."""
    *keys, last = path.split(".")

    def change(doc):
        for key in keys:
            doc = doc[int(key)] if isinstance(doc, list) else doc[key]
        doc[int(last) if isinstance(doc, list) else last] = value

    return change


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    argv: Callable[[Files], list[str]]
    words: tuple[str, ...] = ()  # each in the error line (case-insensitive; 1,000 counts as 1000)
    limit_s: float = LIMIT_S

    @property
    def says_it_is_missing(self) -> re.Pattern | None:
        """What the error must not say of the 10 s cases' files: a bomb, a FIFO or a device is there."""
        return MISSING if self.limit_s == QUICK_S else None


NAN = float("nan")

CASES = [
    # ----------------------------------------------------------------- trace
    Case("trace-gzip-bomb", "300 MB of NUL bytes in a 300 KB gzip, at the default decompression cap",
         lambda f: ["trace", "stats", f.bomb("zeros.csv.gz")], ("zeros.csv.gz",), QUICK_S),
    Case("trace-gzip-bomb-small-cap", "200 MB of valid rows in a 300 KB gzip, --max-decompressed-gb 0.01",
         lambda f: ["trace", "stats", f.bomb("rows.csv.gz"), "--max-decompressed-gb", "0.01"],
         ("rows.csv.gz", "--max-decompressed-gb"), QUICK_S),
    Case("trace-dev-zero", "/dev/zero as the trace",
         lambda f: ["trace", "stats", "/dev/zero"], ("/dev/zero",), QUICK_S),
    Case("trace-fifo", "a FIFO as the trace (must not block)",
         lambda f: ["trace", "stats", f.fifo("pipe.csv")], ("pipe.csv",), QUICK_S),
    Case("trace-directory", "a folder as the trace",
         lambda f: ["trace", "stats", f.folder("traces.csv")], ("traces.csv",)),
    Case("trace-truncated-gzip", "a gzip cut in half",
         lambda f: ["trace", "stats", f.write("cut.csv.gz", gzip.compress(AZURE.encode())[:200])], ("cut.csv.gz",)),
    Case("trace-binary", "64 KiB of random bytes",
         lambda f: ["trace", "stats", f.garbage("garbage.csv")], ("garbage.csv",)),
    Case("trace-nul-bytes", "NUL bytes in the middle of a row",
         lambda f: ["trace", "stats", f.write("nul.csv", AZURE.replace(",105,", ",1\0\0\0,"))], ("nul.csv",)),
    Case("trace-not-utf8", "Latin-1 bytes in a row",
         lambda f: ["trace", "stats", f.write("latin1.csv", AZURE.replace(",105,", ",10é,").encode("latin-1"))],
         ("latin1.csv",)),
    Case("trace-empty", "an empty file",
         lambda f: ["trace", "stats", f.write("empty.csv", "")], ("empty.csv",)),
    Case("trace-unsorted", "arrival times out of order",
         lambda f: ["trace", "stats", f.write("unsorted.csv", AZURE_HEADER + UNSORTED_ROWS)],
         ("unsorted.csv", "sorted")),
    Case("trace-huge-float", "a prompt length of 1e400",
         lambda f: ["trace", "stats", f.write("huge.csv", "arrival,prompt,output\n0,10,5\n1,1e400,5\n"),
                    *GENERIC_COLUMNS], ("huge.csv",)),
    Case("trace-huge-int", "a prompt length of 2**70",
         lambda f: ["trace", "stats", f.write("huge.csv", f"arrival,prompt,output\n0,10,5\n1,{HUGE_INT},5\n"),
                    *GENERIC_COLUMNS], ("huge.csv",)),
    Case("trace-nan-arrival", "an arrival time of nan",
         lambda f: ["trace", "stats", f.write("nan.csv", "arrival,prompt,output\n0,10,5\nnan,10,5\n"),
                    *GENERIC_COLUMNS], ("nan.csv",)),
    Case("trace-negative-output", "an output length of -1",
         lambda f: ["trace", "stats", f.write("negative.csv", "arrival,prompt,output\n0,10,5\n1,10,-1\n"),
                    *GENERIC_COLUMNS], ("negative.csv",)),
    Case("trace-long-line", "one 8 MiB line",
         lambda f: ["trace", "stats", f.write("long.csv", AZURE_HEADER + "2023-11-16 18:00:00.0," + "9" * (8 << 20)
                                              + ",5\n")], ("long.csv",)),
    Case("trace-wrong-format", "an Azure CSV read as --format mooncake",
         lambda f: ["trace", "stats", f.write("azure.csv", AZURE), "--format", "mooncake"], ("azure.csv",)),
    Case("trace-truncated-sharegpt", "a ShareGPT JSON array cut mid-object",
         lambda f: ["trace", "stats", f.write("sharegpt.json", SHAREGPT[:-12]), "--format", "sharegpt"],
         ("sharegpt.json",)),
    Case("trace-gz-name-plain", "plain text named .gz",
         lambda f: ["trace", "stats", f.write("plain.csv.gz", AZURE)], ("plain.csv.gz",)),
    Case("trace-block-size-0", "trace stats --block-size 0",
         lambda f: ["trace", "stats", f.write("azure.csv", AZURE), "--block-size", "0"], ("--block-size",)),
    Case("trace-gen-zero-requests", "trace gen --num-requests 0",
         lambda f: ["trace", "gen", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "0",
                    "-o", "out.jsonl"]),
    Case("trace-gen-rate-nan", "trace gen --rate nan",
         lambda f: ["trace", "gen", "--workload", "kwon2023-sharegpt", "--rate", "nan", "--num-requests", "5",
                    "-o", "out.jsonl"], ("--rate",)),
    Case("trace-gen-bad-distribution", "trace gen --prompt-len uniform:9:1",
         lambda f: ["trace", "gen", "--prompt-len", "uniform:9:1", "--output-len", "10", "--rate", "4",
                    "--num-requests", "5", "-o", "out.jsonl"], ("uniform",)),
    Case("trace-gen-output-is-folder", "trace gen -o onto a folder",
         lambda f: ["trace", "gen", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests", "5",
                    "-o", f.folder("out.jsonl")], ("out.jsonl",)),
    # ----------------------------------------------------------------- simulate
    Case("simulate-trace-fifo", "a FIFO as --trace (must not block)",
         lambda f: ["simulate", "--no-progress", "--trace", f.fifo("pipe.csv")], ("pipe.csv",), QUICK_S),
    Case("simulate-trace-dev-zero", "/dev/zero as --trace",
         lambda f: ["simulate", "--no-progress", "--trace", "/dev/zero"], ("/dev/zero",), QUICK_S),
    Case("simulate-trace-gzip-bomb", "the 300 MB NUL-byte gzip as --trace",
         lambda f: ["simulate", "--no-progress", "--trace", f.bomb("zeros.csv.gz")], ("zeros.csv.gz",), QUICK_S),
    Case("simulate-rate-nan", "--rate nan", lambda f: [*SIM, "--rate", "nan"], ("--rate",)),
    Case("simulate-rate-negative", "--rate -1", lambda f: [*SIM, "--rate", "-1"], ("--rate",)),
    Case("simulate-zero-requests", "--num-requests 0", lambda f: [*SIM, "--num-requests", "0"]),
    Case("simulate-huge-requests", "--num-requests 2**70", lambda f: [*SIM, "--num-requests", HUGE_INT]),
    Case("simulate-block-size-0", "--block-size 0", lambda f: [*SIM, "--block-size", "0"], ("block",)),
    Case("simulate-negative-blocks", "--num-gpu-blocks -1", lambda f: [*SIM, "--num-gpu-blocks", "-1"],
         ("--num-gpu-blocks",)),
    Case("simulate-huge-blocks", "--num-gpu-blocks 2**62: refused with the size, not a vague memory error",
         lambda f: [*SIM, "--num-gpu-blocks", str(2**62)], (str(2**62),)),
    Case("simulate-replicas-10000", "--replicas 10000", lambda f: [*SIM, "--replicas", "10000"], ("10000",)),
    Case("simulate-max-num-seqs-0", "--max-num-seqs 0", lambda f: [*SIM, "--max-num-seqs", "0"]),
    Case("simulate-kv-cache-nan", "--kv-cache-gb nan", lambda f: [*SIM, "--kv-cache-gb", "nan"], ("--kv-cache-gb",)),
    Case("simulate-swap-space-inf", "--swap-space inf", lambda f: [*SIM, "--swap-space", "inf"], ("--swap-space",)),
    Case("simulate-utilization-nan", "--gpu-memory-utilization nan",
         lambda f: [*SIM, "--gpu-memory-utilization", "nan"], ("utilization", "nan")),
    Case("simulate-bad-arrival", "--arrival piecewise:x@y", lambda f: [*SIM, "--arrival", "piecewise:x@y"]),
    Case("simulate-out-is-a-file", "--out onto a regular file",
         lambda f: [*SIM, "--out", f.write("results.txt", "keep me\n")], ("results.txt",)),
    Case("simulate-unknown-flag", "vLLM's --host", lambda f: [*SIM, "--host", "localhost"], ("--host",)),
    # ----------------------------------------------------------------- profiles (simulate / validate)
    Case("profile-not-json", "a profile that is not JSON",
         lambda f: [*SIM_TINY, "--profile", f.write("profile.json", "tables: yes\n")], ("profile.json",)),
    Case("profile-truncated", "a profile cut in half",
         lambda f: [*SIM_TINY, "--profile",
                    f.write("profile.json", SHIPPED_PROFILE.read_text()[:5000])], ("profile.json",)),
    Case("profile-wrong-version", "schema_version 99",
         lambda f: [*SIM_TINY, "--profile", f.profile("profile.json", _set("schema_version", 99))],
         ("profile.json", "version")),
    Case("profile-fifo", "a FIFO as --profile (must not block)",
         lambda f: [*SIM_TINY, "--profile", f.fifo("profile.json")], ("profile.json",), QUICK_S),
    Case("profile-nan-median", "a NaN median",
         lambda f: [*SIM_TINY, "--profile",
                    f.profile("profile.json", _set("tables.dense_layer.median_s.0", NAN))], ("profile.json",)),
    Case("profile-nan-samples", "NaN among a point's timed samples",
         lambda f: [*SIM_TINY, "--profile",
                    f.profile("profile.json", _set("tables.dense_layer.samples_s.0.0", NAN))], ("profile.json",)),
    Case("profile-before-the-pool", "a bad profile is refused before the pool is built (tiny's default: 9M blocks)",
         lambda f: [*SIM, "--model", "tiny", "--profile", f.write("profile.json", "{\n")], ("profile.json",)),
    Case("profile-binary", "random bytes as the profile",
         lambda f: [*SIM_TINY, "--profile", f.garbage("profile.json")], ("profile.json",)),
    Case("validate-profile-not-json", "validate with a profile that is not JSON",
         lambda f: [*VALIDATE, "--profile", f.write("profile.json", "{\n")], ("profile.json",)),
    Case("validate-profile-dev-zero", "validate with /dev/zero behind the profile's name",
         lambda f: [*VALIDATE, "--profile", f.link("profile.json", "/dev/zero")], ("profile.json",), QUICK_S),
    Case("validate-negative-noise-runs", "validate --noise-runs -1",
         lambda f: [*VALIDATE, "--profile", "tiny-cpu", "--noise-runs", "-1"], ("--noise-runs",)),
    # ----------------------------------------------------------------- plug-ins (simulate)
    Case("plugin-missing-file", "--plugin naming a file that is not there",
         lambda f: [*SIM, "--plugin", "nowhere.py:Victim", "--victim", "x"], ("nowhere.py",)),
    Case("plugin-syntax-error", "a plug-in file with a syntax error",
         lambda f: [*SIM, "--plugin", f.write("broken.py", "def choose(:\n") + ":X", "--victim", "x"],
         ("broken.py", "SyntaxError")),
    Case("plugin-no-class", "a plug-in file without the class named",
         lambda f: [*SIM, "--plugin", f.write("empty_plugin.py", "x = 1\n") + ":Victim", "--victim", "x"],
         ("empty_plugin.py", "Victim")),
    Case("plugin-wrong-base", "a class that subclasses no policy",
         lambda f: [*SIM, "--plugin", f.write("plain.py", "class Plain:\n    pass\n") + ":Plain", "--victim", "x"],
         ("Plain",)),
    Case("plugin-sys-exit-at-import", "a plug-in file calling sys.exit(0) when imported",
         lambda f: [*SIM, "--plugin", f.write("exits.py", "import sys\nsys.exit(0)\n") + ":X", "--victim", "x"],
         ("exits.py",)),
    Case("plugin-keyboard-interrupt-at-import", "a plug-in file raising KeyboardInterrupt when imported",
         lambda f: [*SIM, "--plugin", f.write("interrupts.py", "raise KeyboardInterrupt\n") + ":X", "--victim", "x"],
         ("interrupts.py",)),
    Case("plugin-choose-none", "a victim policy whose choose() returns None",
         lambda f: [*SIM_PREEMPTING, "--plugin", f.write("none_victim.py", victim_plugin("none")) + ":BadVictim",
                    "--victim", "bad-victim"], ("none_victim.py", "choose", "None")),
    Case("plugin-choose-str", "a victim policy whose choose() returns a string",
         lambda f: [*SIM_PREEMPTING, "--plugin", f.write("str_victim.py", victim_plugin("str")) + ":BadVictim",
                    "--victim", "bad-victim"], ("str_victim.py", "choose")),
    Case("plugin-choose-stranger", "a victim policy whose choose() returns a request that is not a candidate",
         lambda f: [*SIM_PREEMPTING, "--plugin", f.write("stale_victim.py", victim_plugin("stranger")) + ":BadVictim",
                    "--victim", "bad-victim"], ("stale_victim.py", "choose")),
    Case("plugin-choose-raises", "a victim policy whose choose() raises",
         lambda f: [*SIM_PREEMPTING, "--plugin", f.write("raising_victim.py", victim_plugin("raises")) + ":BadVictim",
                    "--victim", "bad-victim"], ("raising_victim.py", "choose", "no victim today")),
    Case("plugin-choose-exits", "a victim policy whose choose() calls sys.exit(0)",
         lambda f: [*SIM_PREEMPTING, "--plugin", f.write("exiting_victim.py", victim_plugin("exit")) + ":BadVictim",
                    "--victim", "bad-victim"], ("exiting_victim.py", "choose")),
    # ----------------------------------------------------------------- run (the engine)
    Case("run-negative-blocks", "run --num-gpu-blocks -1", lambda f: [*RUN, "--num-gpu-blocks", "-1"],
         ("--num-gpu-blocks",)),
    Case("run-trace-binary", "run on a trace of random bytes",
         lambda f: ["run", "--no-progress", "--model", "tiny", "--trace", f.garbage("garbage.jsonl")],
         ("garbage.jsonl",)),
    Case("run-model-config-garbage", "run --model on a folder whose config.json is random bytes",
         lambda f: run_with_model(str(Path(f.garbage("llama/config.json")).parent)),
         ("config.json",)),
    Case("run-model-config-fifo", "run --model on a folder whose config.json is a FIFO",
         lambda f: run_with_model(str(Path(f.fifo("llama/config.json")).parent)),
         ("config.json",), QUICK_S),
    # ----------------------------------------------------------------- memory, presets
    Case("memory-lengths-nan", "memory --lengths 100,nan", lambda f: ["memory", "--lengths", "100,nan"], ("nan",)),
    Case("memory-lengths-huge", "memory --lengths 1e400", lambda f: ["memory", "--lengths", "100,1e400"], ("1e400",)),
    Case("memory-kv-bytes-negative", "memory --kv-bytes -1", lambda f: ["memory", "--kv-bytes", "-1"], ("--kv-bytes",)),
    Case("memory-kv-bytes-nan", "memory --kv-bytes nanGB", lambda f: ["memory", "--kv-bytes", "nanGB"],
         ("--kv-bytes",)),
    Case("memory-config-not-json", "memory --model on a config.json that is not JSON",
         lambda f: ["memory", "--model", f.write("model/config.json", "{'hidden_size': 4096")], ("config.json",)),
    Case("memory-config-dev-zero", "memory --model on a config.json that is /dev/zero",
         lambda f: ["memory", "--model", f.link("model/config.json", "/dev/zero")], ("config.json",), QUICK_S),
    Case("presets-unknown-flag", "presets --yaml", lambda f: ["presets", "--yaml"], ("--yaml",)),
    # ----------------------------------------------------------------- oracle
    Case("oracle-spec-not-json", "an oracle spec that is not JSON",
         lambda f: ["oracle", "replay", f.write("spec.json", "config = {}\n")], ("spec.json",)),
    Case("oracle-spec-truncated", "an oracle spec cut mid-request",
         lambda f: ["oracle", "replay", f.write("spec.json", json.dumps(ORACLE_SPEC)[:-60])], ("spec.json",)),
    Case("oracle-spec-unknown-key", "an unknown top-level key",
         lambda f: ["oracle", "replay", f.oracle("spec.json", _set("schedule_policy", "priority"))],
         ("spec.json", "schedule_policy")),
    Case("oracle-spec-unknown-config-key", "an unknown key in config",
         lambda f: ["oracle", "replay", f.oracle("spec.json", _set("config.swap_space", 4))],
         ("spec.json", "swap_space")),
    Case("oracle-spec-unknown-request-key", "an unknown key in a request",
         lambda f: ["oracle", "replay", f.oracle("spec.json", _set("requests.0.priority", 1))],
         ("spec.json", "priority")),
    Case("oracle-spec-wrong-type", "num_blocks as a string",
         lambda f: ["oracle", "replay", f.oracle("spec.json", _set("config.num_blocks", "twenty"))],
         ("spec.json", "num_blocks")),
    Case("oracle-spec-negative-blocks", "num_blocks -1",
         lambda f: ["oracle", "replay", f.oracle("spec.json", _set("config.num_blocks", -1))],
         ("spec.json", "num_blocks")),
    Case("oracle-spec-nan-tokens", "max_tokens NaN",
         lambda f: ["oracle", "replay", f.oracle("spec.json", _set("requests.0.max_tokens", NAN))],
         ("spec.json", "max_tokens")),
    Case("oracle-spec-fifo", "a FIFO as the spec (must not block)",
         lambda f: ["oracle", "replay", f.fifo("spec.json")], ("spec.json",), QUICK_S),
    Case("oracle-golden-binary", "oracle compare with a golden log of random bytes",
         lambda f: ["oracle", "compare", f.oracle("spec.json", _set("config.num_blocks", 20)),
                    f.garbage("golden.log.jsonl")], ("golden.log.jsonl",)),
    Case("oracle-golden-fifo", "oracle compare with a FIFO as the golden log",
         lambda f: ["oracle", "compare", f.oracle("spec.json", _set("config.num_blocks", 20)),
                    f.fifo("golden.log.jsonl")], ("golden.log.jsonl",), QUICK_S),
    # ----------------------------------------------------------------- calibrate, reproduce
    Case("calibrate-threads-0", "calibrate --threads 0", lambda f: ["calibrate", "--threads", "0"], ("--threads",)),
    Case("calibrate-out-folder", "calibrate --out onto a folder",
         lambda f: ["calibrate", "--out", f.folder("profiles")], ("profiles",)),
    Case("calibrate-out-foreign-file", "calibrate --out onto a file that is not a profile",
         lambda f: ["calibrate", "--quick", "--out", f.write("notes.json", "my notes\n")], ("notes.json",)),
    Case("reproduce-unknown-figure", "reproduce --figures 99",
         lambda f: ["reproduce", "kwon2023", "--figures", "99"], ("--figures",)),
    Case("reproduce-zero-requests", "reproduce --num-requests 0",
         lambda f: ["reproduce", "kwon2023", "--num-requests", "0"], ("--num-requests",)),
    Case("reproduce-overhead-nan", "reproduce --engine-overhead-ms nan",
         lambda f: ["reproduce", "kwon2023", "--engine-overhead-ms", "nan"], ("--engine-overhead-ms",)),
    # ----------------------------------------------------------------- study
    Case("study-toml-syntax", "a spec that is not TOML",
         lambda f: ["study", f.write("spec.toml", STUDY.replace("rate = 6.0", "rate = = 6")), "-o", "out"],
         ("spec.toml",)),
    Case("study-toml-truncated", "a spec cut in the middle of a table header",
         lambda f: ["study", f.write("spec.toml", STUDY[:STUDY.index("[[grid]]") + 4]), "-o", "out"], ("spec.toml",)),
    Case("study-toml-unknown-key", "block_sise in [[grid]]",
         lambda f: ["study", f.write("spec.toml", STUDY.replace("block_size", "block_sise")), "-o", "out"],
         ("spec.toml", "block_sise")),
    Case("study-toml-wrong-type", "num_requests as a string",
         lambda f: ["study", f.write("spec.toml", STUDY.replace("num_requests = 20", "num_requests = 'twenty'")),
                    "-o", "out"], ("spec.toml", "num_requests")),
    Case("study-toml-empty-grid", "a grid axis with no values",
         lambda f: ["study", f.write("spec.toml", STUDY.replace("[8, 16]", "[]")), "-o", "out"],
         ("spec.toml", "block_size")),
    Case("study-toml-nan-rate", "rate = nan",
         lambda f: ["study", f.write("spec.toml", STUDY.replace("rate = 6.0", "rate = nan")), "-o", "out"],
         ("spec.toml", "rate")),
    Case("study-toml-huge-requests", "num_requests = 2**70",
         lambda f: ["study", f.write("spec.toml", STUDY.replace("num_requests = 20", f"num_requests = {HUGE_INT}")),
                    "-o", "out"], ("spec.toml", "num_requests")),
    Case("study-toml-nul-bytes", "NUL bytes in the spec",
         lambda f: ["study", f.write("spec.toml", STUDY.replace('"bad"', '"b\0\0d"')), "-o", "out"], ("spec.toml",)),
    Case("study-toml-binary", "random bytes as the spec",
         lambda f: ["study", f.garbage("spec.toml"), "-o", "out"], ("spec.toml",)),
    Case("study-toml-fifo", "a FIFO as the spec (must not block)",
         lambda f: ["study", f.fifo("spec.toml"), "-o", "out"], ("spec.toml",), QUICK_S),
    Case("study-toml-dev-zero", "/dev/zero behind the spec's name",
         lambda f: ["study", f.link("spec.toml", "/dev/zero"), "-o", "out"], ("spec.toml",), QUICK_S),
    Case("study-toml-folder", "a folder as the spec",
         lambda f: ["study", f.folder("spec.toml"), "-o", "out"], ("spec.toml",)),
    Case("study-set-no-equals", "--set without =",
         lambda f: ["study", f.write("spec.toml", STUDY), "-o", "out", "--set", "block_size"], ("KEY=VALUE",)),
    Case("study-set-bad-index", "--set grid.9.block_size=[8]",
         lambda f: ["study", f.write("spec.toml", STUDY), "-o", "out", "--set", "grid.9.block_size=[8]"], ("grid.9",)),
    Case("study-set-bad-value", "--set source.num_requests=[",
         lambda f: ["study", f.write("spec.toml", STUDY), "-o", "out", "--set", "source.num_requests=["],
         ("num_requests",)),
    Case("study-workers-0", "--workers 0",
         lambda f: ["study", f.write("spec.toml", STUDY), "-o", "out", "--workers", "0"], ("--workers",)),
    Case("study-out-is-a-file", "-o onto a regular file",
         lambda f: ["study", f.write("spec.toml", STUDY), "-o", f.write("out.txt", "x\n")], ("out.txt",)),
    Case("study-plugins-not-allowed", "plugins = [...] without --allow-plugins",
         lambda f: ["study", f.write("spec.toml", with_plugin(f.write("mine.py", victim_plugin("none")), "BadVictim")),
                    "-o", "out"], ("mine.py", "--allow-plugins")),
    Case("study-plugin-exits", "with --allow-plugins, a plug-in calling sys.exit(0) when imported",
         lambda f: ["study", f.write("spec.toml", with_plugin(f.write("exits.py", "import sys; sys.exit(0)"), "X")),
                    "-o", "out", "--allow-plugins"], ("exits.py",)),
    # ----------------------------------------------------------------- report
    Case("report-not-a-study", "a folder without study.json",
         lambda f: ["report", f.folder("empty"), "-o", "r.pdf"], ("empty",)),
    Case("report-study-json-binary", "study.json of random bytes",
         lambda f: _report_with(f, "study.json", lambda p: p.write_bytes(random.Random(1).randbytes(4096))),
         ("study.json",)),
    Case("report-study-json-truncated", "study.json cut in half",
         lambda f: _report_with(f, "study.json", lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2])),
         ("study.json",)),
    Case("report-results-fifo", "results.jsonl is a FIFO (must not block)",
         lambda f: _report_with(f, "results.jsonl", lambda p: (p.unlink(), os.mkfifo(p))), ("results.jsonl",), QUICK_S),
    Case("report-results-dev-zero", "results.jsonl is /dev/zero",
         lambda f: _report_with(f, "results.jsonl", lambda p: (p.unlink(), p.symlink_to("/dev/zero"))),
         ("results.jsonl",), QUICK_S),
    Case("report-dir-is-a-file", "a regular file as the study folder",
         lambda f: ["report", f.write("study.txt", "x\n"), "-o", "r.pdf"], ("study.txt",)),
    Case("report-noise-nan", "--noise-threshold nan",
         lambda f: ["report", f.study_folder("s"), "-o", "r.pdf", "--noise-threshold", "nan"], ("--noise-threshold",)),
    # ----------------------------------------------------------------- demo
    Case("demo-workers-0", "demo --workers 0", lambda f: ["demo", "-o", "out", "--workers", "0"], ("--workers",)),
    Case("demo-out-is-a-file", "demo -o onto a regular file",
         lambda f: ["demo", "-o", f.write("out.txt", "x\n")], ("out.txt",)),
    Case("demo-noise-negative", "demo --noise-threshold -5",
         lambda f: ["demo", "-o", "out", "--noise-threshold", "-5"], ("--noise-threshold",)),
    # ----------------------------------------------------------------- compare
    Case("compare-not-json", "a result file that is not JSON",
         lambda f: ["compare", f.write("a.json", "duration: 3\n"), f.write("b.json", "{}")], ("a.json",)),
    Case("compare-binary", "a result file of random bytes",
         lambda f: ["compare", f.garbage("a.json"), f.write("b.json", "{}")], ("a.json",)),
    Case("compare-fifo", "a FIFO as a result file (must not block)",
         lambda f: ["compare", f.fifo("a.json"), f.write("b.json", "{}")], ("a.json",), QUICK_S),
    Case("compare-dev-zero", "/dev/zero as a result file",
         lambda f: ["compare", "/dev/zero", f.write("b.json", "{}")], ("/dev/zero",), QUICK_S),
    Case("compare-truncated", "a result file cut mid-list",
         lambda f: ["compare", f.write("a.json", '{"completed": 3, "ttfts": [0.1, 0.2'), f.write("b.json", "{}")],
         ("a.json",)),
    Case("compare-array", "a JSON array instead of an object",
         lambda f: ["compare", f.write("a.json", "[1, 2, 3]"), f.write("b.json", "{}")], ("a.json",)),
    Case("compare-missing", "a result file that is not there",
         lambda f: ["compare", f.write("a.json", "{}"), "missing.json"], ("missing.json",)),
]


def _report_with(f: Files, name: str, damage: Callable[[Path], object]) -> list[str]:
    folder = Path(f.study_folder("s"))
    damage(folder / name)
    return ["report", str(folder), "-o", "r.pdf"]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Path]:
    """Made once: the two gzip bombs and a finished two-run study to damage."""
    root = tmp_path_factory.mktemp("bad_inputs")
    zeros = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
    chunk = bytes(1 << 20)
    data = b"".join(zeros.compress(chunk) for _ in range(300)) + zeros.flush()
    (root / "zeros.csv.gz").write_bytes(data)  # 300 MiB of NUL bytes in about 300 KiB
    rows = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b"100,10\n" * ((1 << 20) // 7)
    data = rows.compress(b"num_prefill_tokens,num_decode_tokens\n")
    data += b"".join(rows.compress(chunk) for _ in range(200)) + rows.flush()
    (root / "rows.csv.gz").write_bytes(data)  # 30 million valid rows (200 MiB) in about 300 KiB

    from pagesim.reports.execute import run_study
    from pagesim.reports.spec import parse_spec

    run_study(parse_spec(STUDY), root / "study", workers=1, progress=False)
    return {"zeros.csv.gz": root / "zeros.csv.gz", "rows.csv.gz": root / "rows.csv.gz", "study": root / "study"}


# ----------------------------------------------------------------------------- the test
def test_the_table_covers_every_subcommand_with_enough_cases(shared, tmp_path):
    assert len(CASES) >= 60 and len({c.id for c in CASES}) == len(CASES)
    commands = {"memory", "presets", "oracle", "trace", "simulate", "run", "calibrate", "validate", "reproduce",
                "study", "report", "demo", "compare"}
    covered = {case.argv(Files(tmp_path / case.id, shared))[0] for case in CASES}
    assert covered == commands, commands ^ covered


@pytest.mark.slow  # about a minute on two cores: over a hundred fresh pagesim processes
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_line(case, shared, tmp_path):
    argv = case.argv(Files(tmp_path, shared))
    outcome = run_pagesim(argv, cwd=tmp_path, limit_s=case.limit_s)
    assert outcome.killed_for is None, f"stopped by the watchdog ({outcome.killed_for}):\n" + outcome.describe()
    assert outcome.returncode > 0, "not a refusal:\n" + outcome.describe()
    message = error_line(outcome, argv[0])
    assert outcome.stdout.strip() == "", "output beside the error:\n" + outcome.describe()
    said = message.lower()
    for word in case.words:
        assert word.lower() in said or word.lower() in said.replace(",", ""), \
            f"{word!r} not in the error:\n" + outcome.describe()
    if case.says_it_is_missing:
        assert not case.says_it_is_missing.search(said), "the error says the file is missing:\n" + outcome.describe()
    if "PAGESIM_BAD_INPUTS_LOG" in os.environ:  # a table of what each case printed, for a review
        with open(os.environ["PAGESIM_BAD_INPUTS_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({"id": case.id, "what": case.what, "exit": outcome.returncode,
                                  "wall_s": round(outcome.wall_s, 2), "cpu_s": round(outcome.cpu_s, 2),
                                  "peak_mib": round(outcome.max_rss_bytes / 2**20), "error": message}) + "\n")
    assert outcome.cpu_s <= case.limit_s, f"over {case.limit_s:.0f} s of CPU time:\n" + outcome.describe()
    assert outcome.max_rss_bytes <= MAX_RSS_BYTES, "peak memory over 500 MiB:\n" + outcome.describe()
