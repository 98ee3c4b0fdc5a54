"""Model weights: seeded random initialisation, and Hugging Face folders (``config.json`` plus
``*.safetensors``) written and read with the standard Llama tensor names.

Random weights are drawn on the CPU in float32 from one ``torch.Generator`` seeded by ``seed``,
parameter by parameter in name order (normal, std 0.02, as transformers initialises Llama; norms
are ones), then cast: the same seed gives the same model on any device and in any dtype, up to
that cast.

Loading checks the folder against the config before any tensor is copied: every expected tensor
present, none unexpected, every shape right. A mismatch is a ``ModelConfigError`` naming the
tensor, never a half-loaded model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pagesim.engine.catalog.hf_config import read_config_json
from pagesim.engine.files import InputFileError, require_regular_file
from pagesim.engine.model.config import LlamaConfig, ModelConfigError
from pagesim.engine.model.llama import LlamaForCausalLM

INIT_STD = 0.02
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Buffers some older checkpoints carry; recomputed here, so ignored when present.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def random_model(config: LlamaConfig, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """A model of ``config``'s shapes with seeded random weights."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, param in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            state[name] = torch.ones(param.shape)
        else:
            state[name] = torch.empty(param.shape).normal_(0.0, INIT_STD, generator=generator)
    return _materialise(config, state, dtype, device)


def save_pretrained(model: LlamaForCausalLM, folder: str | Path) -> Path:
    """Write ``config.json`` and ``model.safetensors`` (transformers' layout and names)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_hf(dtype_name(model.dtype))
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return folder


def load_pretrained(folder: str | Path, *, dtype: torch.dtype | None = None,
                    device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """Load a Hugging Face Llama folder; ``dtype`` defaults to the config's ``torch_dtype``."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder.is_dir():
        raise ModelConfigError(f"{folder}: not a folder (a model folder holds config.json and *.safetensors)")
    config = LlamaConfig.from_hf(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelConfigError(f"{folder}: no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            require_regular_file(path, what="safetensors file")  # a FIFO would block the reader
        except InputFileError as exc:
            raise ModelConfigError(str(exc)) from None
        try:
            tensors = load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError) as exc:
            raise ModelConfigError(f"{path}: not a readable safetensors file ({exc})") from None
        for name, tensor in tensors.items():
            if name in state:
                raise ModelConfigError(f"{folder}: tensor {name!r} appears in more than one file")
            if not name.endswith(_IGNORED_SUFFIXES):
                state[name] = tensor
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the embedding is the head
    if dtype is None:
        raw = read_config_json(folder / "config.json")
        declared = raw.get("torch_dtype", raw.get("dtype", "float32"))  # transformers >= 4.56 says "dtype"
        dtype = DTYPES.get(declared, torch.float32)
    return _materialise(config, state, dtype, device, source=str(folder))


def _materialise(config: LlamaConfig, state: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: str | torch.device, *, source: str = "random init") -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}  # tied: listed once
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelConfigError(f"{source}: missing tensor(s) {', '.join(missing[:3])}{more}")
    if unexpected:
        more = f" and {len(unexpected) - 3} more" if len(unexpected) > 3 else ""
        raise ModelConfigError(f"{source}: tensor(s) not in a Llama model of this config: "
                               f"{', '.join(unexpected[:3])}{more}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise ModelConfigError(f"{source}: tensor {name} has shape {tuple(state[name].shape)} but config.json "
                                   f"implies {shape}")
    model = model.to_empty(device=device).to(dtype)
    if config.tie_word_embeddings:  # to_empty gives each module its own tensor: tie them again
        model.lm_head.weight = model.model.embed_tokens.weight
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in expected:
            params[name].copy_(state[name].to(device=device, dtype=dtype))
    return model.eval().requires_grad_(False)


def model_config(spec: str) -> LlamaConfig:
    """The config ``spec`` names: a Hugging Face folder's, or a preset's (without loading weights)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return LlamaConfig.from_hf(path)
    if "/" in spec or spec.startswith(("~", ".")):
        raise ModelConfigError(f"--model {spec}: no such folder")
    return LlamaConfig.named(spec)


def load_model(spec: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """``spec`` is a preset name (random weights from ``seed``) or a Hugging Face folder."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return load_pretrained(path, dtype=dtype, device=device)
    return random_model(model_config(spec), seed=seed, dtype=dtype, device=device)
