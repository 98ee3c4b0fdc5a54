"""Hostile files at every reader of JSON and TOML a user names (issue 56): each is refused in one
line, warned about, or read without quoting it, in bounded time and memory.

Each case builds its files in a fresh folder and runs the installed ``pagesim`` in a subprocess
(``tests/bad_inputs_harness.py``), then judges the outcome by the case's ``expect``:

- ``refuse``: a positive exit status, exactly one ``pagesim CMD: error: ...`` line (beside
  pagesim's warnings), nothing on stdout, the case's words in that line;
- ``warn``: exit 0 and one ``pagesim CMD: warning: ...`` line holding the case's words;
- ``no-leak``: any exit but a signal, no traceback, and none of the case's secret strings in
  stdout, stderr or any file pagesim wrote in the case's folder (a study's ``results.jsonl``);
  the other kinds check their ``absent`` strings the same way.

Every case must finish within its time limit and ``MAX_RSS_BYTES``; none may show a traceback.
``classify`` names what went wrong (traceback, silent, hang, message) so the table can be counted
before and after a change: ``PAGESIM_READERS_LOG=FILE pytest ...`` appends one JSON line per case.

The cases: JSON nested 100,000 deep in each JSON reader (a JSONL trace, detected and named; a
ShareGPT trace; the sharegpt, custom and hf bench datasets; a study spec's TOML, as an array, an
inline table and through ``--set``), ``output_tokens: 1e300``, a 12 MB custom-dataset line, a
ShareGPT prompt over the line cap with a tokenizer, hostile ``compare`` files (null, nested, NaN,
infinite, negative figures, lists whose lengths disagree, deep nesting), ``trace gen`` lengths past
the bound, a FIFO as a study's trace, a trace whose first line is a secret, a NaN throughput in a
study's ``results.jsonl``, a tokenizer that maps everything to one id, a ``config.json`` whose
shapes disagree, and deep nesting in the files read whole (a ``config.json``, a profile, an oracle
golden log). Below the table, the guards in process: the nesting measure against parsed documents
(hypothesis), TOML strings and comments, a deep entry far into a streamed ShareGPT file, the NaN
record left out of what the report draws, no false alarm from the one-id warning.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.bad_inputs_harness import MAX_RSS_BYTES, Outcome, error_line, run_pagesim
from tests.test_bad_inputs import ORACLE_SPEC, Files as BadInputFiles

LIMIT_S = 30.0
QUICK_S = 10.0  # a FIFO must be refused at once
DEEP = 100_000  # levels of nesting in the deep cases (the reproduction)
CAP_CHARS = 4 * 2**20  # the line cap of traces and datasets (traces.loaders.stream.MAX_LINE_CHARS)
SECRET = "hunter2"

STUDY = """\
name = "readers"
[source]
workload = "shared-system-prompt"
rate = 6.0
num_requests = 20
[[grid]]
block_size = [8, 16]
"""
SIM = ["simulate", "--no-progress", "--num-prompts", "5"]


def deep_array(levels: int = DEEP) -> str:
    return "[" * levels + "]" * levels


def deep_object(levels: int = DEEP) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def words(count: int, start: int = 0) -> str:
    return " ".join(f"w{(start + k) % 50}" for k in range(count))


def turn_pair(prompt: str, completion: str, name: str = "c") -> dict:
    return {"id": name, "conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": completion}]}


def sharegpt(count: int = 8) -> list[dict]:
    return [turn_pair(words(12, k), words(20, k + 3), f"c{k}") for k in range(count)]


def bench_result(**changes) -> dict:
    """A small vLLM bench result file (three requests, detailed lists), with ``changes``."""
    result = {"backend": "vllm", "model_id": "m", "num_prompts": 3, "duration": 2.0, "completed": 3, "failed": 0,
              "total_input_tokens": 30, "total_output_tokens": 12, "request_throughput": 1.5,
              "request_goodput": None, "output_throughput": 6.0, "total_token_throughput": 21.0,
              "mean_ttft_ms": 20.0, "median_ttft_ms": 20.0, "p99_ttft_ms": 29.8, "mean_tpot_ms": 5.0,
              "input_lens": [10, 10, 10], "output_lens": [4, 4, 4], "ttfts": [0.01, 0.02, 0.03],
              "itls": [[0.005] * 3, [0.005] * 3, [0.005] * 3], "errors": ["", "", ""]}
    result.update(changes)
    return result


class Files(BadInputFiles):
    """``tests/test_bad_inputs.py``'s case files, and the readers' own: JSONL, specs, tokenizers, studies."""

    def jsonl(self, name: str, lines: list[str]) -> str:
        return self.write(name, "".join(line + "\n" for line in lines))

    def spec(self, name: str, text: str) -> str:
        return self.write(name, text)

    def tokenizer(self, kind: str) -> str:
        return str(self.shared[f"tokenizer-{kind}"])

    def study_with(self, change: Callable[[list[dict]], None]) -> str:
        """A copy of the finished study whose records ``change`` edits (NaN written as NaN)."""
        folder = self.root / "study"
        folder.mkdir()
        for name in ("study.json",):
            (folder / name).write_bytes((self.shared["study"] / name).read_bytes())
        records = [json.loads(line) for line in (self.shared["study"] / "results.jsonl").read_text().splitlines()]
        change(records)
        (folder / "results.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        return str(folder)


def _nan_throughput(records: list[dict]) -> None:
    records[0]["summary"]["throughput_rps"] = float("nan")


def _study_on(f: Files, trace: str) -> list[str]:
    spec = f.spec("spec.toml", f'name = "t"\n[source]\ntrace = "{trace}"\n[[grid]]\nblock_size = [8, 16]\n')
    return ["study", spec, "-o", str(f.root / "out"), "--workers", "1"]


def _config_json(f: Files) -> str:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 5, "num_hidden_layers": 2,
              "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096,
              "torch_dtype": "float16", "_name_or_path": "my-model"}
    return str(Path(f.json("model/config.json", config)).parent)


@dataclass(frozen=True)
class Case:
    id: str
    what: str
    argv: Callable[[Files], list[str]]
    words: tuple[str, ...] = ()  # each in the error (or warning) line, case-insensitive
    expect: str = "refuse"  # refuse | warn | no-leak
    limit_s: float = LIMIT_S
    absent: tuple[str, ...] = ()  # in no output and no file under the case's folder
    not_words: tuple[str, ...] = ()  # not in the error line


CASES = [
    # ----------------------------------------------------------------- trace stats: JSONL and ShareGPT
    Case("stats-jsonl-deep-detected", "a JSONL line holding 100,000 nested arrays, format detected",
         lambda f: ["trace", "stats", f.jsonl("deep.jsonl", ['{"prompt_len": 5, "output_len": 5, "x": '
                                                             + deep_array() + "}"])], ("deep.jsonl", "nested")),
    Case("stats-jsonl-deep", "the same with --format jsonl",
         lambda f: ["trace", "stats", f.jsonl("deep.jsonl", ['{"prompt_len": 5, "output_len": 5}',
                                                             '{"prompt_len": 5, "output_len": 5, "x": '
                                                             + deep_object() + "}"]), "--format", "jsonl"],
         ("deep.jsonl:2", "nested")),
    Case("stats-mooncake-deep", "a Mooncake line whose hash_ids nest 100,000 deep",
         lambda f: ["trace", "stats", f.jsonl("m.jsonl", ['{"timestamp": 0, "input_length": 5, "output_length": 5, '
                                                         '"hash_ids": ' + deep_array() + "}"]), "--format", "mooncake"],
         ("m.jsonl:1", "nested")),
    Case("stats-sharegpt-deep", "a ShareGPT entry whose conversations nest 100,000 deep",
         lambda f: ["trace", "stats", f.write("deep.json", '[{"id": "a", "conversations": ' + deep_array() + "}]"),
                    "--format", "sharegpt"], ("deep.json", "nested")),
    Case("stats-sharegpt-deep-detected", "a JSON array of 100,000 nested arrays, format detected",
         lambda f: ["trace", "stats", f.write("deep.json", deep_array())], ("deep.json", "nested")),
    Case("stats-sharegpt-deep-second", "a deep entry after a good one (the reader's later buffers)",
         lambda f: ["trace", "stats", f.write("deep.json", json.dumps(sharegpt(3))[:-1] + ', {"id": "x", '
                                              '"conversations": ' + deep_object() + "}]"), "--format", "sharegpt"],
         ("deep.json", "nested")),
    # ----------------------------------------------------------------- bench datasets
    Case("dataset-sharegpt-deep", "simulate --dataset-name sharegpt on a deep entry",
         lambda f: [*SIM, "--dataset-name", "sharegpt", "--dataset-path",
                    f.write("deep.json", '[{"id": "a", "conversations": ' + deep_array() + "}]")],
         ("deep.json", "nested")),
    Case("dataset-custom-deep", "simulate --dataset-name custom on a line nested 100,000 deep",
         lambda f: [*SIM, "--dataset-name", "custom", "--dataset-path",
                    f.jsonl("deep.jsonl", ['{"prompt": "hello there", "x": ' + deep_array() + "}"])],
         ("deep.jsonl:1", "nested")),
    Case("dataset-hf-deep", "simulate --dataset-name hf on a JSONL line nested 100,000 deep",
         lambda f: [*SIM, "--dataset-name", "hf", "--dataset-path",
                    f.jsonl("deep.jsonl", ['{"conversations": ' + deep_array() + "}"])], ("deep.jsonl:1", "nested")),
    Case("dataset-custom-1e300", "output_tokens: 1e300 with --custom-output-len -1",
         lambda f: [*SIM, "--dataset-name", "custom", "--custom-output-len", "-1", "--dataset-path",
                    f.jsonl("big.jsonl", ['{"prompt": "hello there you", "output_tokens": 4}',
                                          '{"prompt": "hello there", "output_tokens": 1e300}'])],
         ("big.jsonl:2", "output_tokens")),
    Case("dataset-custom-long-line", "a 12 MB line in a custom dataset",
         lambda f: [*SIM, "--dataset-name", "custom", "--dataset-path",
                    f.jsonl("long.jsonl", ['{"prompt": "hello there"}',
                                           json.dumps({"prompt": "word " * (12 * 2**20 // 5)})])],
         ("long.jsonl:2", "4 MiB")),
    Case("dataset-sharegpt-huge-prompt", "a ShareGPT prompt a few MB over the line cap, with a tokenizer",
         lambda f: [*SIM, "--dataset-name", "sharegpt", "--tokenizer", f.tokenizer("words"), "--dataset-path",
                    f.json("huge.json", [*sharegpt(3), turn_pair(words(CAP_CHARS // 3 + 2**20 // 3), words(9),
                                                                 "huge")])],
         ("huge.json", "entry 3", "4 MiB")),
    Case("stats-sharegpt-huge-prompt", "trace stats on the same file, with a tokenizer",
         lambda f: ["trace", "stats", f.json("huge.json", [*sharegpt(3), turn_pair(words(9), words(
             CAP_CHARS // 3 + 2**20 // 3), "huge")]), "--format", "sharegpt", "--tokenizer", f.tokenizer("words")],
         ("huge.json", "entry 3", "4 MiB")),
    Case("tokenizer-one-id", "a tokenizer that maps every word of the prompts to one id",
         lambda f: ["trace", "stats", f.json("s.json", sharegpt(12)), "--format", "sharegpt",
                    "--tokenizer", f.tokenizer("unk")], ("tokenizer", "one id"), expect="warn"),
    Case("dataset-tokenizer-one-id", "the same, reading a custom dataset",
         lambda f: [*SIM, "--dataset-name", "custom", "--tokenizer", f.tokenizer("unk"), "--dataset-path",
                    f.jsonl("c.jsonl", [json.dumps({"prompt": words(30, k)}) for k in range(8)])],
         ("tokenizer", "one id"), expect="warn"),
    # ----------------------------------------------------------------- study specs
    Case("study-toml-deep-array", "a spec value of 100,000 nested arrays",
         lambda f: ["study", f.spec("spec.toml", STUDY + "[base]\nseed = " + deep_array() + "\n"), "-o", "out"],
         ("spec.toml", "nested")),
    Case("study-toml-deep-table", "a spec value of 100,000 nested inline tables",
         lambda f: ["study", f.spec("spec.toml", STUDY + "[base]\nseed = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n"),
                    "-o", "out"], ("spec.toml", "nested")),
    Case("study-set-deep", "--set with a value of 60,000 nested arrays (argv's limit is 128 KiB)",
         lambda f: ["study", f.spec("spec.toml", STUDY), "-o", "out", "--set", "base.seed=" + deep_array(60_000)],
         ("--set", "nested")),
    Case("study-trace-fifo", "a FIFO as the study's trace: said to be a FIFO, not missing",
         lambda f: _study_on(f, f.fifo("pipe.csv")), ("pipe.csv", "FIFO"), limit_s=QUICK_S, not_words=("no such",)),
    Case("study-trace-secret", "a study whose trace's first line is a secret: in no output, not in results.jsonl",
         lambda f: _study_on(f, f.write("notes.csv", f"SECRET={SECRET}\nmore=things\n")), expect="no-leak",
         absent=(SECRET,), limit_s=60.0),
    Case("stats-secret", "trace stats on a file whose first line is a secret",
         lambda f: ["trace", "stats", f.write("notes.csv", f"SECRET={SECRET}\nmore=things\n")], ("notes.csv",),
         absent=(SECRET,)),
    Case("stats-secret-header", "a CSV whose header is a secret and lacks a column",
         lambda f: ["trace", "stats", f.write("t.csv", f"TIMESTAMP,ContextTokens,{SECRET}\n0,1,2\n"),
                    "--format", "azure"], ("t.csv", "GeneratedTokens"), absent=(SECRET,)),
    Case("stats-secret-value", "a JSONL value that is a secret where a number belongs",
         lambda f: ["trace", "stats", f.jsonl("t.jsonl", ['{"prompt_len": 5, "output_len": 5}',
                                                          f'{{"prompt_len": "{SECRET}", "output_len": 5}}'])],
         ("t.jsonl:2", "prompt_len"), absent=(SECRET,)),
    # ----------------------------------------------------------------- report
    Case("report-nan-throughput", "a NaN throughput in a study's results.jsonl: a bad record, not drawn",
         lambda f: ["report", f.study_with(_nan_throughput), "-o", str(f.root / "r.pdf")],
         ("results.jsonl:1", "throughput_rps"), expect="warn", limit_s=60.0),
    # ----------------------------------------------------------------- trace gen
    Case("gen-prompt-len-huge", "trace gen --prompt-len 100000000000000 (1e14 tokens)",
         lambda f: ["trace", "gen", "--prompt-len", str(10**14), "--output-len", "10", "--rate", "4",
                    "--num-requests", "5", "-o", "out.jsonl"], ("--prompt-len",)),
    Case("gen-prompt-len-lognormal-huge", "trace gen --prompt-len lognormal:mean=1e14,cv=1",
         lambda f: ["trace", "gen", "--prompt-len", "lognormal:mean=1e14,cv=1", "--output-len", "10", "--rate", "4",
                    "--num-requests", "5", "-o", "out.jsonl"], ("--prompt-len",)),
    Case("gen-output-len-uniform-huge", "trace gen --output-len uniform:1:10**20",
         lambda f: ["trace", "gen", "--prompt-len", "10", "--output-len", f"uniform:1:{10**20}", "--rate", "4",
                    "--num-requests", "5", "-o", "out.jsonl"], ("--output-len",)),
    Case("gen-system-prompt-huge", "trace gen --system-prompts 2:10**14:0.5",
         lambda f: ["trace", "gen", "--prompt-len", "10", "--output-len", "10", "--system-prompts", f"2:{10**14}:0.5",
                    "--rate", "4", "--num-requests", "5", "-o", "out.jsonl"], ("--system-prompts",)),
    # ----------------------------------------------------------------- compare
    Case("compare-null-ttft", "a null among the per-request TTFTs",
         lambda f: ["compare", f.json("a.json", bench_result()), f.json("b.json", bench_result(ttfts=[None, 0.1, 0.2]))],
         ("b.json", "ttfts")),
    Case("compare-nested-ttft", "a list inside the per-request TTFTs",
         lambda f: ["compare", f.json("a.json", bench_result(ttfts=[[0.1], 0.1, 0.2])), f.json("b.json", bench_result())],
         ("a.json", "ttfts")),
    Case("compare-null-itl", "a null inside an itls entry",
         lambda f: ["compare", f.json("a.json", bench_result()),
                    f.json("b.json", bench_result(itls=[[None], [0.1], [0.1]]))], ("b.json", "itls")),
    Case("compare-nan-duration", "duration NaN",
         lambda f: ["compare", f.json("a.json", bench_result()), f.json("b.json", bench_result(duration=float("nan")))],
         ("b.json", "duration")),
    Case("compare-inf-throughput", "request_throughput Infinity",
         lambda f: ["compare", f.json("a.json", bench_result(request_throughput=float("inf"))),
                    f.json("b.json", bench_result())], ("a.json", "request_throughput")),
    Case("compare-huge-float", "a TTFT mean of 1e400 (infinite once read)",
         lambda f: ["compare", f.json("a.json", bench_result()),
                    f.write("b.json", json.dumps(bench_result()).replace('"mean_ttft_ms": 20.0', '"mean_ttft_ms": 1e400'))],
         ("b.json", "mean_ttft_ms")),
    Case("compare-zero-base-nan", "a zero figure beside NaN (the +nan% row)",
         lambda f: ["compare", f.json("a.json", bench_result(failed=0)), f.json("b.json", bench_result(failed=float("nan")))],
         ("b.json", "failed")),
    Case("compare-negative-duration", "duration -2",
         lambda f: ["compare", f.json("a.json", bench_result(duration=-2.0)), f.json("b.json", bench_result())],
         ("a.json", "duration")),
    Case("compare-completed-negative", "completed -1",
         lambda f: ["compare", f.json("a.json", bench_result()), f.json("b.json", bench_result(completed=-1))],
         ("b.json", "completed")),
    Case("compare-lengths-disagree", "three TTFTs beside 999 input lengths",
         lambda f: ["compare", f.json("a.json", bench_result()), f.json("b.json", bench_result(input_lens=[10] * 999))],
         ("b.json", "ttfts", "input_lens")),
    Case("compare-string-figure", "a figure that is a string",
         lambda f: ["compare", f.json("a.json", bench_result(duration="2.0")), f.json("b.json", bench_result())],
         ("a.json", "duration")),
    Case("compare-deep", "a result file nested 100,000 deep",
         lambda f: ["compare", f.json("a.json", bench_result()),
                    f.write("b.json", json.dumps(bench_result())[:-1] + ', "x": ' + deep_array() + "}")],
         ("b.json", "nested")),
    # ----------------------------------------------------------------- files read whole: config.json, profile, oracle
    Case("memory-config-json-deep", "a config.json nested 100,000 deep",
         lambda f: ["memory", "--model", str(Path(f.write("model/config.json", deep_object())).parent)],
         ("config.json", "nested")),
    Case("simulate-profile-deep", "a profile nested 100,000 deep",
         lambda f: ["simulate", "--no-progress", "--workload", "kwon2023-sharegpt", "--rate", "4", "--num-requests",
                    "5", "--model", "tiny", "--num-gpu-blocks", "1000", "--profile", f.write("p.json", deep_array())],
         ("p.json", "nested")),
    Case("oracle-golden-deep", "oracle compare with a golden log line nested 100,000 deep",
         lambda f: ["oracle", "compare", f.json("spec.json", ORACLE_SPEC),
                    f.jsonl("golden.jsonl", ['{"step": 0, "x": ' + deep_array() + "}"])], ("golden.jsonl:1", "nested")),
    # ----------------------------------------------------------------- model config.json
    Case("memory-config-json-heads", "a config.json whose heads do not divide: called config.json, not a preset",
         lambda f: ["memory", "--model", _config_json(f)], ("config.json", "num_key_value_heads"),
         not_words=("model preset", "my-model")),
]


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict[str, Path]:
    """Made once: two word-level tokenizers (one that knows the test's words, one that knows none
    of them, so every word is [UNK]) and a finished two-run study."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = tmp_path_factory.mktemp("bad_inputs_readers")
    out: dict[str, Path] = {}
    for kind, vocab in (("words", {"[UNK]": 0, **{f"w{k}": k + 1 for k in range(50)}}),
                        ("unk", {"[UNK]": 0, "hello": 1})):
        tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        (root / kind).mkdir()
        tok.save(str(root / kind / "tokenizer.json"))
        out[f"tokenizer-{kind}"] = root / kind

    from pagesim.reports.execute import run_study
    from pagesim.reports.spec import parse_spec

    run_study(parse_spec(STUDY), root / "study", workers=1, progress=False)
    out["study"] = root / "study"
    return out


# ----------------------------------------------------------------------------- judging
_WARNING = re.compile(r"^pagesim [\w-]+( [\w-]+)?: warning: (.*)$")


def check(case: Case, outcome: Outcome, root: Path, inputs: set[Path]) -> None:
    """Asserts the case's expectation (see the module docstring)."""
    assert outcome.killed_for is None, f"stopped by the watchdog ({outcome.killed_for}):\n" + outcome.describe()
    assert "Traceback" not in outcome.stderr, "a traceback:\n" + outcome.describe()
    assert outcome.returncode >= 0, "killed by a signal:\n" + outcome.describe()
    said = ""
    if case.expect == "refuse":
        assert outcome.returncode > 0, "not a refusal:\n" + outcome.describe()
        said = error_line(outcome, outcome.argv[0])
        assert outcome.stdout.strip() == "", "output beside the error:\n" + outcome.describe()
    elif case.expect == "warn":
        assert outcome.returncode == 0, "not a success:\n" + outcome.describe()
        warnings = [m.group(2) for line in outcome.stderr.splitlines() if (m := _WARNING.match(line))]
        matching = [w for w in warnings if all(word.lower() in w.lower() for word in case.words)]
        assert len(matching) == 1, f"expected one warning with {case.words}:\n" + outcome.describe()
        said = matching[0]
    for word in case.words if case.expect == "refuse" else ():
        assert word.lower() in said.lower() or word.lower() in said.lower().replace(",", ""), \
            f"{word!r} not in the error:\n" + outcome.describe()
    for word in case.not_words:
        assert word.lower() not in said.lower(), f"{word!r} in the error:\n" + outcome.describe()
    produced = outcome.stdout + outcome.stderr + _written_text(root, inputs)
    for secret in case.absent:
        assert secret not in produced, f"{secret!r} quoted in the output or a file written:\n" + outcome.describe()
    assert outcome.wall_s <= case.limit_s, f"over {case.limit_s:.0f} s:\n" + outcome.describe()
    assert outcome.max_rss_bytes <= MAX_RSS_BYTES, "peak memory over 500 MiB:\n" + outcome.describe()


def _written_text(root: Path, inputs: set[Path]) -> str:
    """Every regular file under ``root`` but the case's own inputs: what pagesim wrote."""
    texts = []
    for path in root.rglob("*"):
        if path in inputs or path.is_symlink() or not path.is_file():
            continue
        texts.append(path.read_bytes().decode(errors="replace"))
    return "\n".join(texts)


def classify(case: Case, outcome: Outcome, root: Path, inputs: set[Path]) -> str:
    """What went wrong, in one word: traceback (or a signal), hang (time or memory), silent (a
    success where a refusal or a warning was due), message (refused, but in the wrong words,
    quoting what it must not, or past the bounds), or ok."""
    if outcome.killed_for is not None:
        return "hang"
    if "Traceback" in outcome.stderr or outcome.returncode < 0:
        return "traceback"
    if case.expect == "refuse" and outcome.returncode == 0:
        return "silent"
    if case.expect == "warn" and outcome.returncode == 0 and not any(
            all(w.lower() in line.lower() for w in case.words) for line in outcome.stderr.splitlines()
            if _WARNING.match(line)):
        return "silent"
    try:
        check(case, outcome, root, inputs)
    except AssertionError:
        return "message"
    return "ok"


# ----------------------------------------------------------------------------- the test
def test_every_case_has_a_unique_id_and_an_expectation():
    assert len({c.id for c in CASES}) == len(CASES)
    assert all(c.expect in ("refuse", "warn", "no-leak") for c in CASES)


@pytest.mark.slow  # about a minute and a half on two cores: forty fresh pagesim processes
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_hostile_file_is_refused_warned_or_kept_out_of_the_output(case, shared, tmp_path):
    argv = case.argv(Files(tmp_path, shared))
    inputs = set(tmp_path.rglob("*"))
    outcome = run_pagesim(argv, cwd=tmp_path, limit_s=case.limit_s)
    if "PAGESIM_READERS_LOG" in os.environ:  # a table of classes, to count before and after a change
        with open(os.environ["PAGESIM_READERS_LOG"], "a", encoding="utf-8") as log:
            log.write(json.dumps({"id": case.id, "class": classify(case, outcome, tmp_path, inputs),
                                  "exit": outcome.returncode, "wall_s": round(outcome.wall_s, 2),
                                  "peak_mib": round(outcome.max_rss_bytes / 2**20),
                                  "stderr_tail": outcome.stderr.strip().splitlines()[-1:]}) + "\n")
    check(case, outcome, tmp_path, inputs)


# ----------------------------------------------------------------------------- the guards, in process
_KEYS = st.sampled_from(["a", "[{", '"x\\', '\\"', "é]", "}"])
_LEAVES = st.one_of(st.integers(-5, 5), st.none(), st.booleans(),
                    st.sampled_from(["", "s", '[[["', "\\", '"\\"]]', "é[{", '\\\\"', '\\\\\\"[[']))
_DOCS = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
                     max_leaves=30)


@given(doc=_DOCS, ascii_only=st.booleans(), cuts=st.lists(st.integers(0, 10_000), max_size=4),
       limit=st.integers(0, 8))
def test_the_nesting_measure_is_exact_on_any_document_however_it_is_cut(doc, ascii_only, cuts, limit):
    """Strings holding brackets, quotes and backslashes never count; a text fed in pieces (cut
    anywhere: inside a string, between backslashes) is measured as the whole."""
    from pagesim.engine.files import JsonNesting, first_too_deep, nesting_depth, nesting_exceeds

    text = json.dumps(doc, ensure_ascii=ascii_only)
    whole = first_too_deep(text, limit)
    assert (whole is not None) == (nesting_depth(doc) > limit) == nesting_exceeds(text, limit)
    if whole is not None:
        assert text[whole] in "[{"
    meter, found, start = JsonNesting(limit), None, 0
    for end in sorted({min(c, len(text)) for c in cuts} | {len(text)}):
        past = meter.feed(text[start:end])
        if past is not None:
            found = start + past
            break
        start = end
    assert found == whole


def test_toml_strings_and_comments_hold_brackets_that_do_not_count():
    from pagesim.engine.files import InputFileError, loads_toml

    brackets = "[" * 100
    text = (f'a = "{brackets}"\nb = \'{brackets}\'\nc = """\n{brackets}\n"""\nd = \'\'\'{brackets}\'\'\'\n'
            f"# {brackets}\n[[grid]]\nx = [[1], [2]]\n")
    assert loads_toml(text, path="s.toml")["grid"] == [{"x": [[1], [2]]}]
    for deep in ("x = " + "[" * 65 + "]" * 65, "[" + ".".join(["t"] * 70) + "]\nx = 1"):
        with pytest.raises(InputFileError, match="nested more than 64 levels"):
            loads_toml(deep, path="s.toml")


def test_a_deep_entry_in_a_later_block_is_named_and_those_before_it_are_read(tmp_path, monkeypatch):
    from pagesim.traces.bench import reading
    from pagesim.traces.errors import TraceFormatError

    monkeypatch.setattr(reading, "READ_CHARS", 64)  # many blocks: the deep entry is far from the file's start
    entries = sharegpt(20)
    text = json.dumps(entries)[:-1] + ', {"id": "x", "conversations": ' + deep_object(200) + "}]"
    path = tmp_path / "deep.json"
    path.write_text(text)
    read = []
    with pytest.raises(TraceFormatError, match=r"deep.json:1: entry 20: JSON nested more than 64 levels deep"):
        for index, _, entry in reading.iter_json_array(path):
            read.append(entry)
    assert read == entries
    path.write_text(json.dumps([*entries, {"x": json.loads(deep_object(63))}]))  # 64 levels inside the array: kept
    assert len(list(reading.iter_json_array(path))) == 21


def test_a_nan_record_is_left_out_of_the_study_the_report_draws(shared, tmp_path):
    from pagesim.reports.results import load_study
    from pagesim.reports.store import ResultsWarning

    folder = Files(tmp_path, shared).study_with(_nan_throughput)
    with pytest.warns(ResultsWarning, match=r"results.jsonl:1: summary.throughput_rps is not a finite number"):
        study = load_study(folder)
    first_id = json.loads((Path(folder) / "results.jsonl").read_text().splitlines()[0])["id"]
    assert first_id not in {r["id"] for r in study.records} and len(study.records) == 1


def test_a_tokenizer_of_the_text_is_not_warned_about(shared, tmp_path):
    """The one-id warning is for a tokenizer that maps most of the text to one id, not for one
    that knows the words (no false alarm on ordinary data)."""
    import warnings

    from pagesim.traces.bench import load_tokenizer, sharegpt_trace

    path = tmp_path / "s.json"
    path.write_text(json.dumps(sharegpt(12)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        sharegpt_trace(path, load_tokenizer(str(shared["tokenizer-words"])), num_prompts=12)
    assert not seen, [str(w.message) for w in seen]


def test_number_problems_describe_and_never_quote():
    from pagesim.engine.files import number_problem

    assert number_problem(3) is None and number_problem(2.0, integer=True) is None
    cases = [(float("nan"), "found NaN"), (float("inf"), "an infinity"), (-7, "a negative number"),
             (2.5, "a fraction"), ("1234", "found a string"), (None, "found null"), ([1], "found a list"),
             (True, "found a boolean"), (11, "at most 10")]
    for value, words in cases:
        said = number_problem(value, integer=True, maximum=10)
        assert words in said, (value, said)
        assert not isinstance(value, (int, str)) or str(value) not in said.replace("10", ""), said
