"""The policy is pure Python: importing it (and the CLI paths that use only it) must not import
torch or simpy, so the simulator can run it at scale and `pagesim memory` starts instantly."""

from __future__ import annotations

import subprocess
import sys

POLICY_MODULES = [
    "pagesim.engine",
    "pagesim.engine.policy",
    "pagesim.engine.policy.block_pool",
    "pagesim.engine.policy.block_key",
    "pagesim.engine.policy.prefix_cache",
    "pagesim.engine.policy.eviction",
    "pagesim.engine.policy.swap_pool",
    "pagesim.engine.policy.kv_manager",
    "pagesim.engine.policy.request",
    "pagesim.engine.policy.preemption",
    "pagesim.engine.policy.config",
    "pagesim.engine.policy.output",
    "pagesim.engine.policy.scheduler",
    "pagesim.engine.policy.steps",
    "pagesim.engine.policy.steps.vllm_v0",
    "pagesim.engine.policy.steps.vllm_v1",
    "pagesim.engine.oracle",
    "pagesim.engine.oracle.cli",
    "pagesim.engine.policy.presets",
    "pagesim.engine.policy.contiguous",
    "pagesim.engine.policy.contiguous_scheduler",
    "pagesim.engine.policy.buddy",
    "pagesim.engine.policy.usage",
    "pagesim.engine.policy.capacity",
    "pagesim.engine.policy.cli_args",
    "pagesim.engine.policy.user_plugins",
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
