"""Whether ``pagesim run``'s model and KV cache fit in memory, checked before anything is allocated.

Without it, a model too large for the machine (``--model llama3-8b`` on a CPU: 8 billion
parameters in float64) failed inside torch, half loaded, with its allocator's words. Here the
sizes are worked out from the shapes alone (a model on the ``meta`` device, which allocates
nothing) and refused in one line that gives each part, what is available, and what to change.

What loading takes (``pagesim.engine.model.weights``, as it is written now):

- random weights are drawn on the CPU in float32, all of them (``staging``: 4 bytes a parameter;
  a Hugging Face folder instead reads its ``*.safetensors`` files into host memory: their size);
- the model is made on the device in float32 and then cast to its dtype, each tensor converted
  into a copy (``build``: max(4, element) bytes a parameter plus its largest tensor converted),
  and the drawn tensors are copied in;
- once loaded, the weights take ``weights`` (element bytes a parameter) and the drawn ones are
  freed; then the KV cache is allocated (on the device), and the swap space and the offload store
  (in host memory, pinned on CUDA).

So the peak on the device's memory is the larger of ``build`` and ``weights`` + the KV cache,
and on the host (CUDA) the larger of ``staging`` and the swap space + offload store; on a CPU,
where both are one memory, ``staging + build`` or ``weights`` + everything the cache takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pagesim.engine.memory_fit import gib, host_available
from pagesim.engine.model.config import LlamaConfig


@dataclass(frozen=True, slots=True)
class WeightSizes:
    num_params: int
    weights_bytes: int  # the loaded model, in its dtype
    build_bytes: int  # the model while it is made and cast, on its device
    staging_bytes: int  # host memory holding the drawn or read tensors until they are copied in
    staging_words: str  # how they got there: "drawn in float32" or "read from its safetensors files"
    dtype_name: str

    def describe(self) -> str:
        n = self.num_params
        count = f"{n / 1e9:.3g} billion" if n >= 1e9 else f"{n / 1e6:.3g} million" if n >= 1e6 else f"{n:,}"
        return f"{count} parameters in {self.dtype_name}"


def weight_sizes(model: str, config: LlamaConfig, dtype: torch.dtype) -> WeightSizes:
    """The sizes loading ``model`` (a preset, random weights, or a Hugging Face folder) takes."""
    from pagesim.engine.model.llama import LlamaForCausalLM

    with torch.device("meta"):
        shapes = LlamaForCausalLM(config)
    numels = [p.numel() for p in shapes.parameters()]  # (a tied head is listed once)
    element = torch.empty((), dtype=dtype).element_size()
    num_params, largest = sum(numels), max(numels)
    folder = Path(model).expanduser()
    if folder.is_dir():
        staging = sum(path.stat().st_size for path in folder.glob("*.safetensors"))
        staging_words = "read from its safetensors files"
    else:
        staging, staging_words = 4 * num_params, "drawn in float32"
    return WeightSizes(num_params, element * num_params, max(4, element) * num_params + element * largest, staging,
                       staging_words, str(dtype).removeprefix("torch."))


def check_memory(model_config: LlamaConfig, dtype: torch.dtype, device: torch.device, sched_config, *,
                 model: str | None = None, kv_known: bool = True) -> None:
    """Refuse what does not fit: with ``model`` (not loaded yet) its weights and their loading
    too; the KV cache on the device unless ``kv_known`` is False (a CUDA cache sized after the
    model is loaded: checked again then); the swap space and the offload store in host memory."""
    from pagesim.engine.runtime.kv_cache import block_bytes

    per_block = block_bytes(model_config, sched_config.block_size, dtype)
    kv = sched_config.num_gpu_blocks * per_block if kv_known else 0
    swap, offload = sched_config.num_cpu_blocks * per_block, sched_config.num_offload_blocks * per_block
    sizes = weight_sizes(model, model_config, dtype) if model is not None else None
    host = host_available()
    fewer, smaller = "--num-gpu-blocks / --num-cpu-blocks", "--kv-cache-gb / --swap-space"
    if offload:
        fewer, smaller = f"{fewer} / --num-offload-blocks", f"{smaller} / --kv-offloading-size"
    kv_hint = f"fewer {fewer}, or a smaller {smaller}"
    cache_words = "the KV cache, swap space and offload store" if offload else "the KV cache and swap space"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        _refuse_over(free, "free on the GPU", sizes, [("the KV cache", kv)], kv_hint, on_host=False)
        host_parts = [("the swap space and offload store" if offload else "the swap space", swap + offload)]
        if host is not None:
            _refuse_over(host.bytes, host.where, sizes, host_parts, kv_hint, on_host=True)
    elif host is not None:
        _refuse_over(host.bytes, host.where, sizes, [(cache_words, kv + swap + offload)], kv_hint, on_host=None)


def _refuse_over(have: int, where: str, sizes: WeightSizes | None, cache: list[tuple[str, int]], kv_hint: str, *,
                 on_host: bool | None) -> None:
    """Raise when the peak exceeds ``have``. ``on_host``: None for a CPU run (one memory for
    everything), False for the GPU's memory (the weights' there), True for the host beside a GPU
    (the staging there, the weights not)."""
    cache_bytes = sum(b for _, b in cache)
    if sizes is None:
        weights = extra = 0
    elif on_host is None:
        weights = sizes.weights_bytes
        extra = max(0, sizes.staging_bytes + sizes.build_bytes - weights - cache_bytes)
    elif on_host:
        weights, extra = 0, max(0, sizes.staging_bytes - cache_bytes)
    else:
        weights = sizes.weights_bytes
        extra = max(0, sizes.build_bytes - weights - cache_bytes)
    need = weights + cache_bytes + extra
    if need <= have:
        return
    parts = []
    if weights:
        parts.append(f"{gib(weights)} for the weights ({sizes.describe()})")
    parts += [f"{gib(b)} for {what}" for what, b in cache if b]
    words = " + ".join(parts) or "nothing"
    if extra:
        how = {None: f"loaded ({sizes.staging_words}, then built in float32 and cast)", True: sizes.staging_words,
               False: "built in float32 and cast"}[on_host]
        words += f", and {gib(extra)} more while the weights are {how}"
    hint = kv_hint if cache_bytes >= weights + extra else \
        "a smaller --model, or a smaller --dtype: float32 takes 4 bytes a parameter, bfloat16 2"
    raise ValueError(f"the model and its KV cache do not fit: need {words}; {gib(have)} is {where} ({hint})")
