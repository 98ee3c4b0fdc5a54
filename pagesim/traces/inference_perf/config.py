"""What an inference-perf run was asked to send, read from its ``config.yaml``.

The fields are those of inference-perf's ``Config`` as its October 2025 main branch wrote them
(the shared ground truth's runs: ``load.request_timeout`` present, ``load.trace`` not yet; the
``config.py`` of commits b81afa4..ad40050) and as 2026 releases write them (``config/`` package):
``num_unique_system_prompts`` / ``num_users_per_system_prompt`` are read as the aliases of
``num_groups`` / ``num_prompts_per_group`` they are, and a 2026 length may be a distribution.

What is read, and what is refused rather than guessed:

- ``load.type`` ``constant`` or ``poisson`` (``concurrent``, ``trace_replay``,
  ``trace_session_replay`` are refused), ``load.stages`` (each ``rate`` > 0 per second and a whole
  ``duration`` > 0 seconds, sending ``int(rate * duration)`` requests, at least one),
  ``load.interval`` (seconds slept after a stage; default 1), ``load.request_timeout``; a
  ``load.sweep`` (stages found at run time), a LoRA traffic split and ``num_workers: 0`` (the
  in-process sender, which stops a stage at its end time) are refused;
- ``data.type`` ``shared_prefix``, ``random`` or ``synthetic`` (see ``workload``), with the fields
  each needs; multi-turn chat, multimodal payloads, a prompt trace, a chat template and a custom
  corpus are refused;
- ``server.model_name`` (else ``tokenizer.pretrained_model_name_or_path``), ``server.ignore_eos``,
  ``api.type`` and ``api.streaming``.

Stages run back to back: inference-perf's ``LoadGenerator.mp_run`` runs stage ``k``, waits until
every request of it has finished, sleeps ``load.interval`` and starts stage ``k + 1``, whose
``run_stage`` schedules its sends from ``time.perf_counter() + 1`` (a second to fill the request
queue; load_generator.py:217-220 and :407-422 at 3b6f82a). A ``LoadStage``'s ``start_s`` is that
origin, with the first stage's at 0 and the wait for the last requests to finish taken as 0 (it
depends on the server): ``start_s[k+1] = start_s[k] + duration_s[k] + interval + 1``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.traces.generate.workload import MAX_REQUESTS
from pagesim.traces.inference_perf.keys import InferencePerfError, Node
from pagesim.traces.inference_perf.lengths import Lengths, distribution, fixed_length, length_or_distribution

DATA_TYPES = ("shared_prefix", "random", "synthetic")
LOAD_TYPES = ("constant", "poisson")
API_TYPES = ("completion", "chat")
QUEUE_LEAD_S = 1.0  # run_stage: start_time = time.perf_counter() + 1
MAX_STAGE_DURATION_S = 10_000_000  # 116 days; a Poisson stage draws one count per second
MAX_PROMPTS = 10_000_000  # distinct shared-prefix prompts (groups x prompts per group)
#: Tokens that inference-perf's built-in synthetic text holds at the least: 2025's (the sonnets in
#: synthetic_datagen.py, after its one-line instruction) is 4,185 words, each one token or more for a
#: tokenizer that splits at spaces; rounded down. A longer synthetic prompt would be cut to the
#: text's length, which depends on the tokenizer, so it is refused. (2026's assets/shakespeare.txt
#: was not in the source read; the same bound is kept, which can only refuse too much.)
SYNTHETIC_TEXT_TOKENS = 4_000


@dataclass(frozen=True)
class LoadStage:
    """One load stage: ``rate_per_s`` requests per second for ``duration_s`` seconds.

    ``start_s`` is the origin of the stage's schedule, seconds from the first stage's: its first
    send follows one inter-arrival gap later, and a ``constant`` stage's last send is at
    ``start_s + duration_s``. For ``poisson`` stages it is nominal (a Poisson stage ends at its
    last request, near its nominal end); a trace records the origins it drew in
    ``trace.metadata["stage_start_s"]``.
    """

    rate_per_s: float
    duration_s: float
    start_s: float

    @property
    def num_requests(self) -> int:
        """``int(rate * duration)``, as inference-perf's ``run_stage`` computes it."""
        return int(self.rate_per_s * self.duration_s)


@dataclass(frozen=True)
class SharedPrefixWorkload:
    """``num_groups`` system prompts, ``prompts_per_group`` questions after each."""

    num_groups: int
    prompts_per_group: int
    system_prompt_tokens: int
    question: Lengths
    output: Lengths

    def describe(self) -> str:
        return (f"shared_prefix: {self.num_groups} groups x {self.prompts_per_group} prompts, "
                f"{self.system_prompt_tokens} + {self.question.describe()} -> {self.output.describe()} tokens")


@dataclass(frozen=True)
class LengthWorkload:
    """``random`` or ``synthetic``: lengths drawn once per run (``total_count`` of each), request
    ``n`` of a stage taking the ``n``-th. ``shared_text``: every prompt is the start of one text."""

    kind: str
    prompt: Lengths
    output: Lengths
    prompt_count: int
    output_count: int
    shared_text: bool

    def describe(self) -> str:
        text = " (prompts are the starts of one text)" if self.shared_text else ""
        return f"{self.kind}{text}: {self.prompt.describe()} -> {self.output.describe()} tokens"


@dataclass(frozen=True)
class RunConfig:
    model_name: str | None
    ignore_eos: bool
    streaming: bool
    api_type: str
    request_timeout_s: float | None
    load_type: str
    interval_s: float
    stages: tuple[LoadStage, ...]
    workload: SharedPrefixWorkload | LengthWorkload
    report_file_prefix: str


def parse_config(top: Node) -> RunConfig:
    """The run ``config.yaml`` (its top node) describes; an ``InferencePerfError`` naming the key
    of the first thing that is missing, malformed or not supported."""
    load = top["load"].required()
    load_type = load["type"].choice(LOAD_TYPES, default="constant")
    load["sweep"].unsupported_if_set("its stages are chosen at run time from a saturation probe")
    load["lora_traffic_split"].unsupported_if_set("pagesim replays one model, without LoRA adapters")
    if load["num_workers"].present and load["num_workers"].count() == 0:
        raise load["num_workers"].error("is 0 (requests sent in-process), which is not supported: that "
                                        "sender stops each stage at its end time rather than at its count")
    interval_s = load["interval"].number(minimum=0, maximum=1e9) if load["interval"].present else 1.0
    stages = _stages(load["stages"], interval_s)
    server = top["server"]
    model_name = (server["model_name"].optional_text()
                  or top["tokenizer"]["pretrained_model_name_or_path"].optional_text())
    storage_prefix = top["storage"]["local_storage"]["report_file_prefix"]
    prefix = storage_prefix.optional_text() or ""
    if "/" in prefix or "\\" in prefix or prefix in (".", ".."):
        raise storage_prefix.error("must be a plain file-name prefix")
    return RunConfig(
        model_name=model_name,
        ignore_eos=server["ignore_eos"].flag(False),
        streaming=top["api"]["streaming"].flag(False),
        api_type=top["api"]["type"].choice(API_TYPES, default="completion"),
        request_timeout_s=load["request_timeout"].optional_number(positive=True),
        load_type=load_type,
        interval_s=interval_s,
        stages=stages,
        workload=_workload(top["data"].required(), stages),
        report_file_prefix=prefix,
    )


def _stages(node: Node, interval_s: float) -> tuple[LoadStage, ...]:
    elements = node.elements()
    if not elements:
        raise node.error("is empty: a run needs at least one load stage")
    stages, start_s, total = [], 0.0, 0
    for element in elements:
        if not isinstance(element.required().value, dict):
            raise element.error("must be a mapping with rate and duration")
        for field in ("num_requests", "concurrency_level"):
            element[field].unsupported_if_set("a stage of a constant or poisson load has a rate and a duration")
        rate = element["rate"].number(positive=True, maximum=1e9)
        duration = element["duration"].number(positive=True, maximum=MAX_STAGE_DURATION_S, integer=True)
        stage = LoadStage(rate_per_s=rate, duration_s=duration, start_s=start_s)
        if stage.num_requests < 1:
            raise element.error(f"sends no request: int(rate x duration) = int({rate:g} x {duration:g}) is 0")
        total += stage.num_requests
        if total > MAX_REQUESTS:
            raise node.error(f"send more than {MAX_REQUESTS:,} requests in all")
        stages.append(stage)
        start_s += duration + interval_s + QUEUE_LEAD_S
    return tuple(stages)


def _workload(data: Node, stages: tuple[LoadStage, ...]) -> SharedPrefixWorkload | LengthWorkload:
    kind = data["type"].required().choice(DATA_TYPES)
    data["multimodal"].unsupported_if_set("pagesim's prompts are text")
    data["use_chat_template"].unsupported_if_set("the template's tokens depend on the tokenizer")
    if kind == "shared_prefix":
        return _shared_prefix(data["shared_prefix"].required())
    data["trace"].unsupported_if_set("prompt lengths replayed from a trace file")
    most = max(stage.num_requests for stage in stages)
    counts = []
    for name in ("input_distribution", "output_distribution"):
        # main.py: total_count, when unset, is the largest stage's count + 1
        total = data[name].required()["total_count"]
        count = total.count(minimum=1, maximum=MAX_REQUESTS) if total.present else most + 1
        if count < most:
            raise total.error(f"({count:,}) is smaller than the largest stage's {most:,} requests: "
                              "inference-perf takes request n's lengths from entry n")
        counts.append(count)
    prompt, output = distribution(data["input_distribution"]), distribution(data["output_distribution"])
    shared_text = False
    if kind == "synthetic":
        # NOTE: before f624ba7 (2026-06-24) every synthetic prompt was the text's first tokens; since,
        # each starts at a random offset. data.corpus_file_path came a week before (eded533), so a
        # config that writes the key is read as the later behaviour (wrong only for that week's).
        corpus = data["corpus_file_path"]
        corpus.unsupported_if_set("a custom corpus's length in tokens depends on the tokenizer")
        shared_text = not corpus.given
        if prompt.largest > SYNTHETIC_TEXT_TOKENS:
            raise data["input_distribution"].error(
                f"reaches {prompt.largest:,} tokens: synthetic prompts are cut to the length of "
                f"inference-perf's built-in text, of which pagesim can vouch for {SYNTHETIC_TEXT_TOKENS:,}")
    return LengthWorkload(kind, prompt, output, counts[0], counts[1], shared_text)


def _shared_prefix(node: Node) -> SharedPrefixWorkload:
    node["enable_multi_turn_chat"].unsupported_if_set("its prompts grow with each user's earlier turns")
    node["multimodal"].unsupported_if_set("pagesim's prompts are text")
    groups = node.either("num_groups", "num_unique_system_prompts").count(minimum=1, maximum=MAX_PROMPTS)
    per_group = node.either("num_prompts_per_group", "num_users_per_system_prompt").count(
        minimum=1, maximum=MAX_PROMPTS)
    if groups * per_group > MAX_PROMPTS:
        raise node.error(f"asks for {groups * per_group:,} prompts; at most {MAX_PROMPTS:,} are read")
    system = node["system_prompt_len"].required()
    if isinstance(system.value, dict):
        raise system.error("is a distribution, which is not supported: each group's system prompt "
                           "would have its own length (give a whole number)")
    return SharedPrefixWorkload(
        num_groups=groups,
        prompts_per_group=per_group,
        system_prompt_tokens=int(fixed_length(system, minimum=0).mean),
        question=_with_legacy(node, "question_len", "question_distribution"),
        output=_with_legacy(node, "output_len", "output_distribution"),
    )


def _with_legacy(node: Node, field: str, legacy: str) -> Lengths:
    """A shared-prefix length: a distribution under ``field``, or (2026's ``_resolve_distribution``)
    the legacy ``legacy`` distribution when ``field`` is a number and ``legacy`` is set."""
    value = node[field]
    if node[legacy].present:
        if isinstance(value.value, dict):
            raise node.error(f"gives {field} as a distribution and {legacy} too: keep one")
        return distribution(node[legacy])
    return length_or_distribution(value)


def ensure_traceable(config: RunConfig, config_path: str) -> None:
    """Refuse a run whose requests' token counts the configuration does not fix."""
    if not config.ignore_eos:
        raise InferencePerfError(
            f"{config_path}: server.ignore_eos is false: each output ended where the model emitted EOS, "
            "so the configured output lengths are only caps and the trace would be a guess")
    if config.api_type != "completion":
        raise InferencePerfError(
            f"{config_path}: api.type {config.api_type!r} is not supported for a trace: the server's "
            "chat template adds tokens that depend on the tokenizer (supported: completion)")
