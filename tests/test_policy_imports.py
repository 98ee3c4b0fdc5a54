"""The policy is pure Python: importing it (and the CLI paths that use only it) must not import
torch or simpy, so the simulator can run it at scale and `pagesim memory` starts instantly."""

from __future__ import annotations

import subprocess
import sys

POLICY_MODULES = [
    "engine",
    "engine.policy",
    "engine.policy.block_pool",
    "engine.policy.block_key",
    "engine.policy.prefix_cache",
    "engine.policy.eviction",
    "engine.policy.swap_pool",
    "engine.policy.kv_manager",
    "engine.policy.request",
    "engine.policy.preemption",
    "engine.policy.config",
    "engine.policy.output",
    "engine.policy.scheduler",
    "engine.policy.steps",
    "engine.policy.steps.vllm_v0",
    "engine.policy.steps.vllm_v1",
    "engine.oracle",
    "engine.oracle.cli",
    "engine.policy.presets",
    "engine.policy.contiguous",
    "engine.policy.contiguous_scheduler",
    "engine.policy.buddy",
    "engine.policy.usage",
    "engine.policy.capacity",
    "engine.policy.cli_args",
    "engine.policy.user_plugins",
    "engine.runtime.cli",
    "engine.model_presets",
    "engine.cli",
]


def test_policy_imports_neither_torch_nor_simpy():
    code = (
        "import sys, importlib\n"
        f"for name in {POLICY_MODULES!r}: importlib.import_module(name)\n"
        "import engine.cli; engine.cli.build_parser()\n"
        "print(sorted(m for m in ('torch', 'simpy', 'triton') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
