"""A study: one workload and deployment, and the grid of settings to simulate it under.

A study spec is a TOML document::

    name = "my-study"
    [source]                  # --workload or --trace, as in `pagesim simulate`
    workload = "shared-system-prompt"
    rate = 6.0
    num_requests = 400
    [base]                    # settings every run starts from
    model = "llama3-8b"
    gpu = "a100-40gb"
    kv_cache_gb = 2.0
    [[grid]]                  # a cartesian product over these axes ...
    block_size = [8, 16, 32]
    preemption = ["recompute", "swap"]
    [[grid]]                  # ... and another, for another page of the report
    allocator = ["max", "pow2", "oracle"]

Each ``[[grid]]`` table is a cartesian product of its axes over the ``[base]`` settings; the study
is the union of its grids, with runs that coincide counted once. A run is a flat ``RunConfig``
dict (source + settings); its id is a hash of that dict (``pagesim.reports.run_config``), so the
same run keeps its id across invocations (which is what lets a study resume). ``overrides``
(``KEY=VALUE`` with a dotted key into the document, the value in TOML syntax or a bare string)
change the document before validation.

vLLM's names for the same settings are accepted and renamed (``VLLM_SOURCE_NAMES``,
``VLLM_SETTING_NAMES``): ``num_prompts``, ``request_rate``, ``tensor_parallel_size``,
``num_gpu_blocks_override``, ``enable_prefix_caching``, ``enable_chunked_prefill``, ``swap_space``;
``kv_offloading_gb`` (``RunSpec``'s name) is accepted for ``kv_offloading_size`` too.

KV offloading (a second KV tier in CPU memory, ``pagesim/engine/policy/offload``) is two settings:
``kv_offloading_size`` (GiB over the replica's GPUs, as vLLM's ``--kv-offloading-size``; absent or
0: off) and ``kv_offloading_policy`` (the offload store's eviction: lru, arc, lfu). Without an
offload store the policy means nothing, so a run of size 0 carries no policy
(``pagesim.reports.run_config.moot_settings``): ``kv_offloading_size = [0, 64]`` x
``kv_offloading_policy = ["lru", "arc"]`` is three runs, the HBM-only one shared by both policies.

``request_timeout_s`` (a setting, in ``[base]`` or a grid axis; inference-perf's ``request_timeout``
is accepted for it): the benchmark client gives up on a request unfinished that many seconds after
sending it, and the server aborts it (``pagesim.sim.replica``); absent: no timeout. Like the seed and the
sample lengths it changes how the run's requests are served, not what it builds.

``serving_path`` (``"vllm"`` or ``"none"``; absent: ``vllm`` under the ``vllm-v1`` policy, ``none``
otherwise), ``async_scheduling`` (absent: the path's) and ``attention_kernel`` (``"flash"``, the
default, or ``"paged-2023"``, which a run with ``engine_overhead_ms = "kwon2023"`` gets unless told):
the time outside the forward pass and the paged decode kernel, as ``simulate``'s flags of the same
names (``pagesim.sim.serving_path``, ``pagesim.sim.cost.roofline``).

``slo_ttft_s`` and ``slo_tpot_s`` (absent: 2 s and 0.1 s, ``simulate``'s ``--slo-ttft`` /
``--slo-tpot`` defaults): the SLO a run's goodput counts requests against (``goodput_rps``; and
``goodput_rps_per_gpu``, which every run's summary has: its goodput over the GPUs it used).

Disaggregated prefill/decode (``pagesim.reports.pd``): ``gpus`` (a GPU budget) and ``pd_split``
(``"P:D"``, e.g. ``"1:7"``, or ``"colocated"``: ``gpus / tp`` colocated replicas), the KV links
(``kv_link_bandwidth`` GB/s, ``kv_link_latency_us``, ``gpus_per_node``), the two routers
(``prefill_router``, ``decode_router``) and each pool's own settings (``prefill_tp``,
``decode_max_num_seqs``, ... for the keys of ``pagesim.reports.pd.POOL_KEYS``)::

    [base]
    gpus = 8
    [[grid]]
    pd_split = ["1:7", "2:6", "4:4", "colocated"]
    kv_link_bandwidth = [450, 12.5]

is seven runs: the colocated run has no links (``moot_settings``) and is one run for both
bandwidths. A P:D split must spend the budget (``P x prefill tp + D x decode tp = gpus``); P/D
settings in a grid none of whose runs is a P:D split are refused, as is ``replicas`` beside
``pd_split``. The report's page "P:D split vs goodput per GPU, TTFT and TPOT"
(``pagesim.reports.pd_pages``) draws such a grid.

``seed = [0, 1, 2]`` in ``[base]`` repeats every grid once per seed (a grid may also list its own
``seed`` axis); the report then gives each setting's metrics as a mean with a 95% interval and calls
a difference only where intervals separate (``pagesim.reports.noise``). A run's seed seeds the simulator and
shifts the workload's seed, so seeds draw different requests.

``plugins = ["my_victim.py:MyVictim", ...]`` (top level; paths relative to the working directory)
loads the user's own policy pieces (``pagesim.engine.policy.plugins.user``) before the settings are checked,
so grid values may name them (``victim = ["running-tail", "my-victim"]``; a ``Scheduler`` subclass
by ``scheduler = ["default", "MyScheduler"]``). Every run then carries the spec strings, which each
worker loads again, and a digest of the files, so an edited plug-in gets new run ids. Loading a
plug-in runs its file, so a spec that lists plug-ins is refused unless the caller allows them
(``allow_plugins``; ``pagesim study --allow-plugins``): running someone else's study file must
not run their code unasked.

A study is bounded before anything is enumerated: its grids may make at most ``max_runs`` runs
(``MAX_RUNS`` unless the caller raises it; ``--max-runs``), counted from the axes' lengths.
Every run is then checked before the first one runs: its settings one by one (``_check_run``),
and planned as its worker will build it (``_check_plan``: ``tp = 3`` against a model of 32
heads, a plug-in's name under its setting, the weights and the KV cache against the GPU), so a
run fails at run time only for what happens while it runs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagesim.reports import pd
from pagesim.reports.run_config import RunConfig, describe_config, moot_settings, offloading, run_id
from pagesim.traces.generate.workload import MAX_REQUESTS

SOURCE_KEYS = {"workload": str, "trace": str, "rate": float, "num_requests": int, "arrival": str, "format": str,
               "seed": int}
# NOTE: settings added after studies were first run stay out of a run's config at their default,
# so the run ids of a study that does not use them (and resuming it) outlive their addition.
LATER_SETTINGS = {"scheduler": (None, "default"), "ep": (None, 1), "dtype": (None, "auto"),
                  "kv_cache_dtype": (None, "auto"), "kv_offloading_size": (None,), "kv_offloading_policy": (None,),
                  "request_timeout_s": (None,), "serving_path": (None,), "async_scheduling": (None,),
                  "attention_kernel": (None, "flash"), "scheduling_policy": (None, "fcfs"),
                  "slo_ttft_s": (None,), "slo_tpot_s": (None,), **{key: (None,) for key in pd.SETTINGS}}
# (setting -> the values that mean its default)
# Settings a run has (base or grid axis) and their defaults; None = the preset's / the deployment's.
SETTINGS: dict[str, Any] = {
    "model": "llama3-8b", "gpu": "a100-40gb", "tp": 1, "policy": "pagesim", "allocator": "paged",
    "block_size": 16, "eviction": None, "preemption": None, "victim": None, "kv_cache_gb": None,
    "num_gpu_blocks": None, "swap_space_gb": 4.0, "rate_scale": 1.0, "seed": 0, "replicas": 1,
    "router": "round-robin", "max_num_seqs": None, "prefix_caching": None,
    # per-run source and paper-setup settings (None: the source's / the preset's)
    "workload": None, "rate": None, "n": 1, "beam_width": 1, "sample_lengths": "drawn",
    "placement": "buddy", "max_model_len": None, "max_num_batched_tokens": None, "chunked_prefill": None,
    "engine_overhead_ms": 0.0, "scheduler": None,
    # the deployment's number formats and expert parallelism (simulate's --dtype, --kv-cache-dtype, --ep)
    "ep": None, "dtype": None, "kv_cache_dtype": None,
    # KV offloading: GiB of CPU memory for the offload store (None or 0: off) and its eviction policy
    "kv_offloading_size": None, "kv_offloading_policy": None,
    # the benchmark client's timeout in seconds (None: none; sim.replica aborts a request past it)
    "request_timeout_s": None,
    # the time outside the forward pass (sim.serving_path: "vllm" or "none"; None: vllm under the vllm-v1
    # policy, none otherwise), vLLM's --async-scheduling (None: the path's), and the roofline's paged
    # decode kernel (sim.cost.roofline.ATTENTION_KERNELS; None: flash)
    "serving_path": None, "async_scheduling": None, "attention_kernel": None,
    # vLLM's --scheduling-policy: "fcfs" (None: the default) or "priority" (vLLM 0.33's: pagesim/engine/policy/scheduling/config.py)
    "scheduling_policy": None,
    # the SLO goodput counts against (None: simulate's defaults, 2 s and 0.1 s)
    "slo_ttft_s": None, "slo_tpot_s": None,
    # disaggregated prefill/decode (pagesim.reports.pd): a GPU budget, its P:D split, the KV links, the
    # routers, each pool's own settings (None: absent)
    **{key: None for key in pd.SETTINGS},
}
SETTING_TYPES = {"model": str, "gpu": str, "tp": int, "policy": str, "allocator": str, "block_size": int,
                 "eviction": str, "preemption": str, "victim": str, "kv_cache_gb": float, "num_gpu_blocks": int,
                 "swap_space_gb": float, "rate_scale": float, "seed": int, "replicas": int, "router": str,
                 "max_num_seqs": int, "prefix_caching": bool, "workload": str, "rate": float, "n": int,
                 "beam_width": int, "sample_lengths": str, "placement": str, "max_model_len": int,
                 "max_num_batched_tokens": int, "chunked_prefill": bool, "engine_overhead_ms": (float, str),
                 "scheduler": str, "ep": int, "dtype": str, "kv_cache_dtype": str, "kv_offloading_size": float,
                 "kv_offloading_policy": str, "request_timeout_s": float, "serving_path": str,
                 "async_scheduling": bool, "attention_kernel": str, "scheduling_policy": str,
                 "slo_ttft_s": float, "slo_tpot_s": float}
SETTING_TYPES.update(pd.SETTING_TYPES)
SETTING_TYPES.update({name: SETTING_TYPES[key] for name, (_pool, key) in pd.POOL_SETTINGS.items()})
TOP_KEYS = {"name", "description", "source", "base", "grid", "profile", "paper", "plugins"}
# vLLM's names (``vllm serve`` / ``vllm bench serve`` flags, dashes as underscores) -> pagesim's: a spec may
# use either; they are renamed before anything else, so a run's config (and id) is the same either way.
VLLM_SOURCE_NAMES = {"num_prompts": "num_requests", "request_rate": "rate"}
VLLM_SETTING_NAMES = {"tensor_parallel_size": "tp", "num_gpu_blocks_override": "num_gpu_blocks",
                      "enable_prefix_caching": "prefix_caching", "enable_chunked_prefill": "chunked_prefill",
                      "request_rate": "rate", "swap_space": "swap_space_gb"}
# pagesim's other names for a setting (``RunSpec``'s field; inference-perf's request_timeout), renamed the same way
SETTING_ALIASES = {"kv_offloading_gb": "kv_offloading_size", "request_timeout": "request_timeout_s"}
PAPERS = ("kwon2023",)
MAX_RUNS = 10_000  # runs a study may make unless --max-runs says more
MAX_SPEC_BYTES = 4 * 2**20  # a study spec is a page of TOML; a bigger file is not one


class SpecError(ValueError):
    """A study spec that cannot run; the message names the key."""


@dataclass
class StudySpec:
    name: str
    source: dict[str, Any]
    base: dict[str, Any]
    grids: list[dict[str, list]]
    description: str = ""
    paper: str | None = None  # a paper whose figures the report prints beside ours ("kwon2023")
    document: dict = field(default_factory=dict)  # the validated document, for the report's cover

    def axes(self) -> dict[str, list]:
        """Every axis any grid varies, with the values it takes (in first-seen order)."""
        out: dict[str, list] = {}
        for grid in self.grids:
            for key, values in grid.items():
                seen = out.setdefault(key, [])
                seen.extend(v for v in values if v not in seen)
        return out

    def runs(self) -> list[RunConfig]:
        configs: dict[str, RunConfig] = {}
        for grid in self.grids or [{}]:
            keys = list(grid)
            for values in itertools.product(*(grid[k] for k in keys)):
                config = {"source": self.source, **self.base, **dict(zip(keys, values))}
                for key, defaults in LATER_SETTINGS.items():
                    # (a study written before the setting existed has no value for it: its default)
                    if config.get(key, defaults[0]) in defaults:
                        config.pop(key, None)
                for key in moot_settings(config):
                    config.pop(key, None)
                configs.setdefault(run_id(config), config)
        return list(configs.values())


def load_spec(path: str | Path, overrides: Iterable[str] = (), *, allow_plugins: bool = False,
              max_runs: int = MAX_RUNS) -> StudySpec:
    from pagesim.engine.files import read_small_text

    text = read_small_text(path, limit_bytes=MAX_SPEC_BYTES, what="study spec")  # (regular files only)
    return parse_spec(text, overrides, origin=str(path), allow_plugins=allow_plugins, max_runs=max_runs)


def parse_spec(text: str, overrides: Iterable[str] = (), *, origin: str = "spec", allow_plugins: bool = False,
               max_runs: int = MAX_RUNS) -> StudySpec:
    """The study ``text`` describes (``origin``: its file, for messages). Parsed by
    ``pagesim.engine.files.loads_toml``: a spec nested more than ``MAX_NESTING`` levels is refused
    before ``tomllib`` (which recurses) reads it."""
    from pagesim.engine.files import InputFileError, loads_toml

    try:
        doc = loads_toml(text, path=origin)
    except InputFileError as exc:
        raise SpecError(str(exc)) from None
    for item in overrides:
        apply_override(doc, item)
    return validate(doc, origin, allow_plugins=allow_plugins, max_runs=max_runs)


def apply_override(doc: dict, item: str) -> None:
    """``a.b=VALUE``: set a key of the document; VALUE is TOML (``[8, 16]``, ``2.5``) or a bare string."""
    from pagesim.engine.files import InputFileError, loads_toml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(f"--set expects KEY=VALUE (e.g. source.num_requests=200), got {item!r}")
    try:
        value = loads_toml(f"v = {raw}", path=f"--set {key.strip()}")["v"]
    except InputFileError as exc:
        if "nested" in exc.problem:
            raise SpecError(f"--set {key.strip()}: the value is {exc.problem.partition(' (')[0]}") from None
        value = raw
    parts = key.strip().split(".")
    node: Any = doc
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise SpecError(f"--set {key}: {'.'.join(parts[:i])} has no entry {part}")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise SpecError(f"--set {key}: {'.'.join(parts[: i + 1])} is not a table")
    if isinstance(node, list):
        raise SpecError(f"--set {key}: name a key inside a grid entry (e.g. grid.0.block_size)")
    node[parts[-1]] = value


def validate(doc: dict, origin: str = "spec", *, allow_plugins: bool = False, max_runs: int = MAX_RUNS) -> StudySpec:
    unknown = set(doc) - TOP_KEYS
    if unknown:
        raise SpecError(f"{origin}: unknown top-level key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(sorted(TOP_KEYS))})")
    name = doc.get("name", "study")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{origin}: name must be a non-empty string")
    source = _source(doc.get("source"), origin)
    base = {k: v for k, v in SETTINGS.items()}
    base.update(_plugins(doc.get("plugins", []), origin, allow_plugins))
    base.update(_profile(doc.get("profile"), origin))
    base_doc = doc.get("base", {})
    seeds = None
    if isinstance(base_doc, dict) and isinstance(base_doc.get("seed"), list):
        # ``seed = [0, 1, 2]`` in [base]: every grid repeated once per seed (the noise the report judges by)
        seeds = _settings({"seed": base_doc["seed"]}, f"{origin}: base", scalar=False)["seed"]
        if len(set(seeds)) != len(seeds):
            raise SpecError(f"{origin}: base.seed lists a seed twice: {seeds}")
        if any(seed < 0 for seed in seeds):
            raise SpecError(f"{origin}: base.seed: seeds are non-negative integers, got {seeds}")
        base_doc = {**base_doc, "seed": seeds[0]}
    base.update(_settings(base_doc, f"{origin}: base", scalar=True))
    grids_doc = doc.get("grid", [])
    if isinstance(grids_doc, dict):
        grids_doc = [grids_doc]
    if not isinstance(grids_doc, list):
        raise SpecError(f"{origin}: grid must be a table or an array of tables ([[grid]])")
    grids = [_settings(g, f"{origin}: grid[{i}]", scalar=False) for i, g in enumerate(grids_doc)]
    if seeds is not None:
        grids = [{**g, "seed": g.get("seed", seeds)} for g in (grids or [{}])]
    paper = doc.get("paper")
    if paper is not None and paper not in PAPERS:
        raise SpecError(f"{origin}: paper = {paper!r}: the report compares with {', '.join(PAPERS)} only")
    count = sum(math.prod(len(values) for values in grid.values()) for grid in grids or [{}])
    if count > max_runs:
        raise SpecError(f"{origin}: the grids make {count:,} runs, more than the {max_runs:,} a study may make "
                        f"unless asked; to run them all, pass --max-runs {count}")
    spec = StudySpec(name, source, base, grids, description=str(doc.get("description", "")),
                     paper=paper, document=doc)
    _check_offload_axes(base, grids, origin)  # (before runs(), which drops a policy no store uses)
    _check_pd_axes(base, grids, origin)  # (likewise: P/D settings no P:D run uses)
    runs = spec.runs()
    for config in runs:
        _check_run(config, origin)
    planned: set[str] = set()
    for config in runs:
        _check_plan(config, spec.base, origin, planned)
    return spec


def _vllm_names(table: Any, names: dict[str, str], where: str, whose: str = "vLLM's name") -> Any:
    """``table`` with vLLM's key names renamed to pagesim's (both given for one setting: an error)."""
    if not isinstance(table, dict):
        return table
    out = dict(table)
    for vllm_name, ours in names.items():
        if vllm_name in out:
            if ours in out:
                raise SpecError(f"{where}: {vllm_name} ({whose}) and {ours} are the same setting: give one")
            out[ours] = out.pop(vllm_name)
    return out


def _source(value: Any, origin: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SpecError(f"{origin}: a [source] table is required (workload = NAME or trace = PATH)")
    value = _vllm_names(value, VLLM_SOURCE_NAMES, f"{origin}: source")
    unknown = set(value) - set(SOURCE_KEYS)
    if unknown:
        raise SpecError(f"{origin}: source: unknown key(s) {', '.join(sorted(unknown))} (allowed: {', '.join(SOURCE_KEYS)})")
    if ("workload" in value) == ("trace" in value):
        raise SpecError(f"{origin}: source: give workload = NAME or trace = PATH (one of them)")
    out = {}
    for key, val in value.items():
        out[key] = _typed(val, SOURCE_KEYS[key], f"{origin}: source.{key}")
    if "workload" in out and "num_requests" not in out:
        raise SpecError(f"{origin}: source: workload {out['workload']!r} needs num_requests")
    if "num_requests" in out and not 1 <= out["num_requests"] <= MAX_REQUESTS:
        raise SpecError(f"{origin}: source.num_requests must be in [1, {MAX_REQUESTS:,}], got {out['num_requests']:,}")
    if "rate" in out and not 0 < out["rate"] < math.inf:
        raise SpecError(f"{origin}: source.rate must be a positive number of requests/s")
    if "trace" in out:
        from pagesim.engine.files import InputFileError, require_regular_file

        path = Path(out["trace"])
        try:  # (a FIFO or a device is named as what it is, not as missing)
            require_regular_file(path, what="trace file")
        except InputFileError as exc:
            raise SpecError(f"{origin}: source.trace: {exc}") from None
        # The file's identity is part of every run's id: an edited trace is not served stale results.
        stat = path.stat()
        out["trace_identity"] = f"{stat.st_size}:{stat.st_mtime_ns}"
    return out


def _profile(value: Any, origin: str) -> dict[str, Any]:
    """``profile = "FILE"``: a fitted profile (``pagesim calibrate --from-measurements``), whose
    roofline parameters and frontend terms every run takes (``pagesim.sim.fit.profile_file``); held
    in the settings with the profile's digest, so a refitted profile gives new run ids."""
    if value is None:
        return {}
    if not isinstance(value, str) or not value:
        raise SpecError(f"{origin}: profile must be the path of a fitted profile (a string)")
    from pagesim.sim.fit.profile_file import FittedProfileError, digest, read_fitted

    try:
        data = read_fitted(value)
    except FittedProfileError as exc:
        raise SpecError(f"{origin}: profile: {exc}") from None
    if data is None:
        raise SpecError(f"{origin}: profile: {value} is not a fitted profile; a study runs the roofline, which takes "
                        "the parameters pagesim calibrate --from-measurements fits (a kernel-timed profile times one "
                        "device's kernels at tp 1: use it with simulate or validate)")
    terms = data["serving_path"]
    return {"profile": {"path": value, "sha256": digest(data), "gpu": data["gpu"], "roofline": data["roofline"],
                        "frontend_ms": [terms["frontend_in_s"] * 1e3, terms["frontend_out_s"] * 1e3]}}


def _plugins(value: Any, origin: str, allowed: bool) -> dict[str, Any]:
    """Load the spec's plug-ins (registering their names for the checks); the settings they add.
    Nothing is loaded (no file runs) unless the caller allows plug-ins."""
    from pagesim.engine.policy.plugins.user import load_plugins, source_digest

    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SpecError(f"{origin}: plugins must be a list of \"FILE.py:CLASS\" strings")
    if not value:
        return {}
    if not allowed:
        files = ", ".join(dict.fromkeys(v.rpartition(":")[0] or v for v in value))
        raise SpecError(f"{origin}: the spec's plugins would run the code in {files}; pagesim runs no code a spec "
                        "names unless asked: pass --allow-plugins if you trust it")
    try:
        plugins = load_plugins(value)
    except ValueError as exc:
        raise SpecError(f"{origin}: {exc}") from None
    return {"plugins": list(value), "plugins_digest": source_digest(plugins)}


def _settings(table: Any, where: str, *, scalar: bool) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table")
    table = _vllm_names(table, VLLM_SETTING_NAMES, where)
    table = _vllm_names(table, SETTING_ALIASES, where, "another name")
    if "plugins" in table:
        raise SpecError(f"{where}: plugins is a top-level key (plugins = [\"FILE.py:CLASS\"]), not a setting")
    unknown = set(table) - set(SETTINGS)
    if unknown:
        raise SpecError(f"{where}: unknown setting(s) {', '.join(sorted(unknown))} (settings: {', '.join(SETTINGS)})")
    out = {}
    for key, value in table.items():
        if scalar:
            out[key] = _typed(value, SETTING_TYPES[key], f"{where}.{key}")
            continue
        values = value if isinstance(value, list) else [value]
        if not values:
            raise SpecError(f"{where}.{key}: an axis needs at least one value")
        out[key] = [_typed(v, SETTING_TYPES[key], f"{where}.{key}") for v in values]
    return out


def _typed(value: Any, kind: type | tuple, where: str) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, float) and not math.isfinite(value):  # (a run's id could not survive JSON)
        raise SpecError(f"{where}: expected a finite number, got {value!r}")
    if not isinstance(value, kinds) or (int in kinds and isinstance(value, bool)):
        raise SpecError(f"{where}: expected {' or '.join(k.__name__ for k in kinds)}, got {value!r}")
    return value


def _check_run(config: RunConfig, origin: str) -> None:
    """What can be refused before anything runs (the rest fails per run, recorded with its error)."""
    split = _check_split(config, origin)
    if split is not None and split.disaggregated:
        for pool, count in (("prefill", split.prefill), ("decode", split.decode)):
            try:
                _check_run(pd.pool_config(config, pool, count), origin)
            except SpecError as exc:
                raise SpecError(f"{exc} (the {pool} pool of pd_split = {config['pd_split']!r})") from None
        return
    config = pd.colocated_config(config, split)
    from pagesim.engine.catalog.kv_layout import KV_CACHE_DTYPES
    from pagesim.engine.catalog.params import WEIGHT_FORMATS
    from pagesim.engine.model_presets import MODEL_PRESETS, nearest_names, resolve_model_name
    from pagesim.engine.policy import EVICTION_POLICIES, PREEMPTION_MODES, VICTIM_POLICIES
    from pagesim.engine.policy.scheduling.waiting_queue import SCHEDULING_POLICIES
    from pagesim.engine.policy.baselines.contiguous import PLACEMENTS
    from pagesim.engine.policy.scheduling.presets import PRESETS
    from pagesim.engine.policy.plugins.user import SCHEDULERS
    from pagesim.sim.cluster import MAX_REPLICAS
    from pagesim.sim.hardware import gpu_names, resolve_gpu_name
    from pagesim.sim.router import ROUTERS
    from pagesim.sim.setup import ALLOCATORS
    from pagesim.traces.generate.presets import WORKLOADS

    try:
        resolve_gpu_name(config["gpu"])
    except ValueError:
        raise SpecError(f"{origin}: gpu = {config['gpu']!r} is not one of {', '.join(gpu_names())} "
                        f"(or an alias of one, such as h100)") from None
    profile = config.get("profile")
    if profile and resolve_gpu_name(config["gpu"]) != resolve_gpu_name(profile["gpu"]):
        raise SpecError(f"{origin}: profile {profile['path']} was fitted on {profile['gpu']}; a run on gpu = "
                        f"{config['gpu']!r} would take that GPU's efficiencies (fit one there, or leave gpu out of "
                        f"the grid)")
    if profile and config.get("attention_kernel") not in (None, "flash"):
        raise SpecError(f"{origin}: attention_kernel changes the roofline profile {profile['path']} was fitted with")
    for key, allowed in (("dtype", ("auto", *WEIGHT_FORMATS)), ("kv_cache_dtype", KV_CACHE_DTYPES)):
        if config.get(key) is not None and config[key] not in allowed:
            raise SpecError(f"{origin}: {key} = {config[key]!r} is not one of {', '.join(allowed)}")
    for key, allowed in (("allocator", ALLOCATORS), ("policy", PRESETS),
                         ("eviction", EVICTION_POLICIES), ("preemption", PREEMPTION_MODES),
                         ("victim", VICTIM_POLICIES), ("placement", PLACEMENTS), ("router", ROUTERS),
                         ("workload", WORKLOADS), ("scheduler", SCHEDULERS),
                         ("scheduling_policy", SCHEDULING_POLICIES)):
        if config.get(key) is not None and config[key] not in allowed:
            raise SpecError(f"{origin}: {key} = {config[key]!r} is not one of {', '.join(allowed)}")
    if "workload" in config["source"] and config["source"]["workload"] not in WORKLOADS:
        raise SpecError(f"{origin}: source.workload = {config['source']['workload']!r} is not one of "
                        f"{', '.join(WORKLOADS)}")
    for key in ("kv_cache_gb", "swap_space_gb"):
        value = config[key]
        if value is not None and not (0 <= value < math.inf and (value > 0 or key == "swap_space_gb")):
            raise SpecError(f"{origin}: {key} must be a positive, finite number of GiB, got {value}")
    for key in ("num_gpu_blocks", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "n", "beam_width"):
        if config[key] is not None and config[key] < 1:
            raise SpecError(f"{origin}: {key} must be >= 1, got {config[key]}")
    if resolve_model_name(config["model"]) is None and not Path(config["model"]).exists():
        near = nearest_names(config["model"])
        raise SpecError(f"{origin}: model = {config['model']!r} is neither a preset"
                        f"{' (did you mean ' + ', '.join(near) + '?)' if near else ''} nor a config.json "
                        f"(presets: {', '.join(MODEL_PRESETS)})")
    for key in ("block_size", "tp", "replicas", "ep"):  # (ep may be left out: 1)
        if config.get(key) is not None and config[key] < 1:
            raise SpecError(f"{origin}: {key} must be >= 1, got {config[key]}")
    if config["replicas"] > MAX_REPLICAS:
        raise SpecError(f"{origin}: replicas = {config['replicas']} is more than the {MAX_REPLICAS} a run may build")
    if config["seed"] < 0:
        raise SpecError(f"{origin}: seed must be a non-negative integer, got {config['seed']}")
    if config["rate_scale"] <= 0 or not math.isfinite(config["rate_scale"]):
        raise SpecError(f"{origin}: rate_scale must be a positive number, got {config['rate_scale']}")
    if config["rate"] is not None and not 0 < config["rate"] < math.inf:
        raise SpecError(f"{origin}: rate must be a positive number of requests/s, got {config['rate']}")
    if config["workload"] is not None and "workload" not in config["source"]:
        raise SpecError(f"{origin}: a workload setting replaces [source] workload; this study reads a trace")
    if config["n"] > 1 and config["beam_width"] > 1:
        raise SpecError(f"{origin}: n and beam_width cannot both be > 1 in one run")
    if config["sample_lengths"] not in ("drawn", "same"):
        raise SpecError(f"{origin}: sample_lengths must be 'drawn' or 'same', got {config['sample_lengths']!r}")
    _check_offloading(config, origin)
    _check_serving(config, origin)
    for key in ("slo_ttft_s", "slo_tpot_s"):
        value = config.get(key)
        if value is not None and not 0 < value < math.inf:
            raise SpecError(f"{origin}: {key} must be a positive, finite number of seconds, got {value:g}")
    timeout_s = config.get("request_timeout_s")
    if timeout_s is not None and not 0 < timeout_s < math.inf:
        raise SpecError(f"{origin}: request_timeout_s must be a positive, finite number of seconds, got {timeout_s:g}")
    overhead = config["engine_overhead_ms"]
    if not isinstance(overhead, str) and not 0 <= overhead < math.inf:
        raise SpecError(f"{origin}: engine_overhead_ms must be a finite number of milliseconds >= 0, got {overhead:g}")
    if isinstance(overhead, str) and overhead != "kwon2023":
        raise SpecError(f"{origin}: engine_overhead_ms is milliseconds per step, or 'kwon2023' (derived from the "
                        f"PagedAttention paper's vLLM), got {overhead!r}")


#: Settings that change neither what a run builds nor how its requests arrive (the seed draws other
#: requests of the same kind): runs differing only in them are planned once (a new setting is
#: planned per value until it is listed here).
NOT_BUILT = frozenset({"seed", "sample_lengths", "router", "request_timeout_s", "slo_ttft_s", "slo_tpot_s",
                       "prefill_router", "decode_router"})


def _check_plan(config: RunConfig, base: dict[str, Any], origin: str, planned: set[str]) -> None:
    """Plan the run as its worker will build it (``pagesim.reports.runner.plan_run``: its arrivals, tp and
    ep against the model, number formats, the scheduler's settings together, the weights and the
    KV cache against the GPUs, the KV blocks over the replicas), allocating nothing and drawing no
    request; a run that could only fail so is refused here, before the first run, naming the
    settings that make it."""
    from pagesim.reports.runner import plan_run

    key = json.dumps({k: v for k, v in config.items() if k not in NOT_BUILT}, sort_keys=True)
    if key in planned:
        return
    planned.add(key)
    try:
        plan_run(config)
    except ValueError as exc:
        raise SpecError(f"{origin}: the run with {describe_config(config, base, seed=False)} cannot be built: "
                        f"{exc}") from None


def _check_offload_axes(base: dict[str, Any], grids: list[dict[str, list]], origin: str) -> None:
    """Every ``kv_offloading_policy`` the spec names (in [base] or a grid), and that a grid varying
    it has an offload store to apply it to (else its runs would be one run)."""
    from pagesim.engine.policy.offload import OFFLOAD_POLICIES

    for table in (base, *grids):
        value = table.get("kv_offloading_policy")
        for policy in value if isinstance(value, list) else [value]:
            if policy is not None and policy not in OFFLOAD_POLICIES:
                raise SpecError(f"{origin}: kv_offloading_policy = {policy!r} is not one of "
                                f"{', '.join(OFFLOAD_POLICIES)}")
    for i, grid in enumerate(grids):
        if len(grid.get("kv_offloading_policy", [])) < 2:
            continue
        sizes = grid.get("kv_offloading_size", [base["kv_offloading_size"]])
        if not any(sizes) or "paged" not in grid.get("allocator", [base["allocator"]]):
            raise SpecError(f"{origin}: grid[{i}]: kv_offloading_policy varies, but no run of the grid has an offload "
                            "store (kv_offloading_size > 0, paged allocator) for the policy to act on")


def _check_split(config: RunConfig, origin: str) -> pd.Split | None:
    """A run's P:D split of its GPU budget (None: no ``pd_split``), its links and routers, and
    what a disaggregated run does not model (its pools are checked as runs of their own)."""
    from pagesim.sim.router import ROUTERS

    try:
        split = pd.split_of(config)
        if split is not None and split.disaggregated:
            pd.check_links(config)
    except ValueError as exc:
        raise SpecError(f"{origin}: {exc}") from None
    if split is None or not split.disaggregated:
        return split
    for key in pd.ROUTER_SETTINGS:
        if config.get(key) is not None and config[key] not in ROUTERS:
            raise SpecError(f"{origin}: {key} = {config[key]!r} is not one of {', '.join(ROUTERS)}")
    refused = {"n": (config["n"] > 1, "sends one sequence per request (vLLM's proxy sends each sample as its own "
                                       "request)"),
               "beam_width": (config["beam_width"] > 1, "sends one sequence per request"),
               "request_timeout_s": (config.get("request_timeout_s") is not None, "does not model client timeouts yet"),
               "allocator": (config["allocator"] != "paged", "moves paged KV blocks (a contiguous baseline has none)"),
               "kv_offloading_size": (offloading(config), "with KV offloading (vLLM's MultiConnector) is not modelled")}
    for key, (bad, why) in refused.items():
        if bad:
            raise SpecError(f"{origin}: pd_split = {config['pd_split']!r} with {key} = {config[key]!r}: disaggregated "
                            f"serving {why}")
    return split


def _check_pd_axes(base: dict[str, Any], grids: list[dict[str, list]], origin: str) -> None:
    """Every ``pd_split`` the spec names, and P/D settings only where a run of their grid is a P:D
    split (else ``runs()`` would drop them unsaid)."""
    for i, grid in enumerate(grids or [{}]):
        where = f"grid[{i}]" if grids else "base"
        splits = grid.get("pd_split", [base.get("pd_split")])
        for value in splits:
            if value is not None:
                try:
                    pd.parse_split(value)
                except ValueError as exc:
                    raise SpecError(f"{origin}: {where}: {exc}") from None
        if any(value not in (None, pd.COLOCATED) for value in splits):
            continue
        given = [k for k in pd.PD_ONLY if k in grid or base.get(k) is not None]
        if given:
            raise SpecError(f"{origin}: {where}: {given[0]} is set, but no run of the {'grid' if grids else 'study'} is "
                            f"a P:D split (pd_split = \"P:D\", e.g. \"1:7\") for it to act on")


def _check_serving(config: RunConfig, origin: str) -> None:
    """The serving path and the attention kernel, by name."""
    from pagesim.sim.cost.roofline import ATTENTION_KERNELS
    from pagesim.sim.serving_path import SERVING_PATHS

    for key, names in (("serving_path", SERVING_PATHS), ("attention_kernel", ATTENTION_KERNELS)):
        value = config.get(key)
        if value is not None and value not in names:
            raise SpecError(f"{origin}: {key} must be one of {', '.join(names)}, got {value!r}")


def _check_offloading(config: RunConfig, origin: str) -> None:
    """An offload store's size, and what it needs of the run: prefix caching (it keeps prefix-cache
    blocks by their keys) and vLLM v1's step order (what the policy preset sets)."""
    from pagesim.engine.policy.scheduling.presets import PRESETS, make_config

    size = config.get("kv_offloading_size")
    if size is not None and not 0 <= size < math.inf:
        raise SpecError(f"{origin}: kv_offloading_size must be a finite number of GiB >= 0, got {size:g}")
    if not offloading(config):
        return
    caching = config["prefix_caching"]
    if caching is None:
        caching = PRESETS[config["policy"]].settings.get("enable_prefix_caching", True)
    if not caching:
        why = "prefix_caching = false" if config["prefix_caching"] is False else f"policy {config['policy']!r} has none"
        raise SpecError(f"{origin}: kv_offloading_size = {size:g} needs prefix caching (the offload store keeps "
                        f"prefix-cache blocks by their keys), but {why}")
    try:
        make_config(config["policy"], enable_prefix_caching=True, num_offload_blocks=1)
    except ValueError as exc:
        raise SpecError(f"{origin}: kv_offloading_size = {size:g} with policy {config['policy']!r}: {exc}") from None
