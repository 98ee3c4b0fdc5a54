"""The policy is pure Python: importing it (and the CLI paths that use only it) must not import
torch or simpy, so the simulator can run it at scale and `pagesim memory` starts instantly."""

from __future__ import annotations

import subprocess
import sys

POLICY_MODULES = [
    "pagesim.engine",
    "pagesim.engine.policy",
    "pagesim.engine.policy.memory.block_pool",
    "pagesim.engine.policy.memory.block_key",
    "pagesim.engine.policy.memory.prefix_cache",
    "pagesim.engine.policy.memory.eviction",
    "pagesim.engine.policy.memory.swap_pool",
    "pagesim.engine.policy.memory.kv_manager",
    "pagesim.engine.policy.scheduling.request",
    "pagesim.engine.policy.scheduling.preemption",
    "pagesim.engine.policy.scheduling.config",
    "pagesim.engine.policy.scheduling.output",
    "pagesim.engine.policy.scheduling.scheduler",
    "pagesim.engine.policy.scheduling.steps",
    "pagesim.engine.policy.scheduling.steps.vllm_v0",
    "pagesim.engine.policy.scheduling.steps.vllm_v1",
    "pagesim.engine.oracle",
    "pagesim.engine.oracle.cli",
    "pagesim.engine.policy.scheduling.presets",
    "pagesim.engine.policy.baselines.contiguous",
    "pagesim.engine.policy.baselines.contiguous_scheduler",
    "pagesim.engine.policy.baselines.buddy",
    "pagesim.engine.policy.memory.usage",
    "pagesim.engine.catalog.capacity",
    "pagesim.engine.commands.policy_args",
    "pagesim.engine.policy.plugins.user",
    "pagesim.engine.runtime.cli",
    "pagesim.engine.model_presets",
    "pagesim.engine.cli",
]


def test_policy_imports_neither_torch_nor_simpy():
    code = (
        "import sys, importlib\n"
        f"for name in {POLICY_MODULES!r}: importlib.import_module(name)\n"
        "import pagesim.engine.cli; pagesim.engine.cli.build_parser()\n"
        "print(sorted(m for m in ('torch', 'simpy', 'triton') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
