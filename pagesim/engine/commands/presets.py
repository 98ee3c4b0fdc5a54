"""``pagesim presets``: what can be chosen by name: scheduler presets (with the vLLM version each
follows and its settings), eviction policies, victim policies, preemption modes, step orders and
model presets."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, fields

from pagesim.engine.model_presets import MODEL_PRESETS, ModelPreset, format_params
from pagesim.engine.policy.scheduling.config import SchedulerConfig
from pagesim.engine.policy.memory.eviction import EVICTION_POLICIES
from pagesim.engine.policy.scheduling.preemption import PREEMPTION_MODES, VICTIM_POLICIES
from pagesim.engine.policy.scheduling.presets import PRESETS, make_config
from pagesim.engine.policy.scheduling.steps import STEP_ORDERS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "presets",
        help="list scheduler presets, eviction / victim / preemption plug-ins and model presets",
        description=__doc__,
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def _settings(preset: str) -> dict:
    config = make_config(preset)
    return {f.name: getattr(config, f.name) for f in fields(SchedulerConfig) if f.name != "extra"}


def run(args: argparse.Namespace) -> int:
    listing = {
        "scheduler_presets": {
            name: {"follows": p.follows, "settings": _settings(name)} for name, p in PRESETS.items()
        },
        "eviction_policies": list(EVICTION_POLICIES),
        "victim_policies": list(VICTIM_POLICIES),
        "preemption_modes": list(PREEMPTION_MODES),
        "step_orders": list(STEP_ORDERS),
        "model_presets": {name: model_listing(m) for name, m in MODEL_PRESETS.items()},
    }
    if args.json:
        print(json.dumps(listing, indent=2, default=str))
        return 0
    print("Scheduler presets:")
    for name, p in PRESETS.items():
        print(f"  {name:10s} {p.follows}")
        for key, value in p.settings.items():
            print(f"  {'':10s}   {key} = {value}")
    print(f"Eviction policies:  {', '.join(EVICTION_POLICIES)}")
    print(f"Victim policies:    {', '.join(VICTIM_POLICIES)}")
    print(f"Preemption modes:   {', '.join(PREEMPTION_MODES)}")
    print(f"Step orders:        {', '.join(STEP_ORDERS)}")
    print("Model presets (pagesim simulate --model NAME; Hugging Face ids resolve too):")
    print(f"  {'name':16s} {'context':>8s} {'params':>8s} {'active':>8s} {'KV B/token':>10s}  attention")
    for name, m in MODEL_PRESETS.items():
        print(f"  {name:16s} {m.max_position_embeddings:>8,} {format_params(m.num_params):>8s} "
              f"{format_params(m.num_active_params):>8s} {m.kv_bytes_per_token:>10,}  {m.attention_label}"
              f"{', MoE ' + str(m.moe.num_experts) + ' experts, ' + str(m.moe.experts_per_token) + ' per token' if m.moe else ''}")
    return 0


def model_listing(m: ModelPreset) -> dict:
    """A model's shapes plus what follows from them: parameters, KV bytes, attention type."""
    return {
        **asdict(m), "source": m.source, "context_length": m.max_position_embeddings,
        "num_params": m.num_params, "num_active_params": m.num_active_params,
        "kv_bytes_per_token": m.kv_bytes_per_token, "attention_type": m.attention_label,
    }
