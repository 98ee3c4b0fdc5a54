"""Model presets: the public face of the model catalog (``pagesim.engine.catalog``).

``MODEL_PRESETS`` (name -> ``ModelPreset``), ``get_model_preset`` (a catalog name, an alias such as
``meta-llama/Llama-3.1-8B-Instruct``, or a Hugging Face ``config.json`` / folder) and
``preset_from_hf_config``; see ``pagesim.engine.catalog.model`` for what a preset holds and how KV bytes
per token and parameter counts follow from it.
"""

from __future__ import annotations

from pagesim.engine.catalog.hf_config import DTYPE_BYTES, preset_from_hf_config
from pagesim.engine.catalog.lookup import get_model_preset, nearest_names, resolve_model_name
from pagesim.engine.catalog.model import MlaShape, ModelPreset, MoeShape
from pagesim.engine.catalog.models import ALIASES, MODEL_PRESETS

__all__ = [
    "ALIASES", "DTYPE_BYTES", "MODEL_PRESETS", "MlaShape", "ModelPreset", "MoeShape", "format_params",
    "get_model_preset", "nearest_names", "preset_from_hf_config", "resolve_model_name",
]


def format_params(num_params: int) -> str:
    """Human-readable parameter count: 8.03B, 125.2M."""
    if num_params >= 10**9:
        return f"{num_params / 1e9:.2f}B"
    if num_params >= 10**6:
        return f"{num_params / 1e6:.1f}M"
    return f"{num_params:,}"
