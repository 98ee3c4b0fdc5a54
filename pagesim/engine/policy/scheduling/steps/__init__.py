"""Step orders: the passes one ``schedule()`` makes over the running, swapped and waiting queues.

- ``vllm-v1`` (``vllm_v1.py``): running, then swapped, then waiting. vLLM v1's order, and pagesim's.
- ``vllm-v0`` (``vllm_v0.py``): vLLM 0.6.3's orders with and without chunked prefill, with its
  block accounting and budget, which its preset needs to make vLLM's decisions step for step.

Both act through the scheduler's primitives (``base.py``), so the block pool, KV manager, request
state, output processing and decision log are one policy whichever order runs.
"""

from pagesim.engine.policy.scheduling.steps.base import Step, StepOrder
from pagesim.engine.policy.scheduling.steps.vllm_v0 import VllmV0StepOrder
from pagesim.engine.policy.scheduling.steps.vllm_v1 import VllmV1StepOrder

STEP_ORDERS: dict[str, type[StepOrder]] = {cls.name: cls for cls in (VllmV1StepOrder, VllmV0StepOrder)}

__all__ = ["STEP_ORDERS", "Step", "StepOrder", "VllmV0StepOrder", "VllmV1StepOrder"]
