"""The engine's model (execution side, torch): a Llama decoder with pluggable attention.

``config`` (shapes and hyper-parameters), ``llama`` (the network), ``weights`` (random init,
Hugging Face folders), ``dense`` (the no-paging reference the engine is checked against).
"""

from pagesim.engine.model.config import LlamaConfig, ModelConfigError
from pagesim.engine.model.dense import DenseSequence, logits_of
from pagesim.engine.model.llama import LlamaForCausalLM
from pagesim.engine.model.weights import load_model, load_pretrained, model_config, random_model, save_pretrained

__all__ = [
    "DenseSequence",
    "LlamaConfig",
    "LlamaForCausalLM",
    "ModelConfigError",
    "load_model",
    "load_pretrained",
    "logits_of",
    "model_config",
    "random_model",
    "save_pretrained",
]
