"""Finding a model by the name a user types: catalog names, Hugging Face ids, a config.json.

``normalise`` turns what people write into a catalog key: lower case, the organisation dropped
(``meta-llama/Llama-3.1-8B-Instruct`` -> ``llama-3.1-8b-instruct``), spaces and underscores as
dashes, the chat-tuning suffixes ``-instruct``, ``-it``, ``-chat`` and ``-hf`` dropped (they change
weights, not shapes), ``meta-`` and the dash of ``llama-3`` / ``llama-2`` dropped
(``llama3.1-8b``). A path that exists (a ``config.json``, or a folder holding one) is read first;
anything else unknown is an error that lists the nearest names.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path

from pagesim.engine.catalog.model import ModelPreset
from pagesim.engine.catalog.models import ALIASES, MODEL_PRESETS

_DROPPED_WORDS = {"instruct", "it", "chat", "hf"}


def normalise(name: str) -> str:
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    key = key.rsplit("/", 1)[-1]
    key = "-".join(word for word in key.split("-") if word and word not in _DROPPED_WORDS)
    key = key.removeprefix("meta-")
    # "llama-3-8b" -> "llama3-8b" (a version number), but "llama-350m" is a size and stays
    return re.sub(r"^llama-(\d+(?:\.\d+)?)(?=-|$)", r"llama\1", key)


def resolve_model_name(name: str) -> str | None:
    """The catalog name ``name`` stands for, or ``None``."""
    key = normalise(name)
    if key in MODEL_PRESETS:
        return key
    return ALIASES.get(key)


def nearest_names(name: str, n: int = 4) -> list[str]:
    key = normalise(name)
    candidates = {**{k: k for k in MODEL_PRESETS}, **ALIASES}
    found = difflib.get_close_matches(key, list(candidates), n=2 * n, cutoff=0.5)
    return list(dict.fromkeys(candidates[k] for k in found))[:n]


def get_model_preset(name_or_path: str | Path) -> ModelPreset:
    """A preset by catalog name or alias (see ``normalise``), or one read from a Hugging Face
    ``config.json`` (a path to it, or a folder holding one).

    Raises ValueError for an unknown name (one line, naming the nearest presets) or an
    unreadable/incomplete config file.
    """
    from pagesim.engine.catalog.hf_config import preset_from_hf_config

    # A path that exists is read, even when its name looks like a model's (a folder called
    # Meta-Llama-3-8B holds that model's own config, which may differ from the catalog's).
    # Anything there that is not a folder (a FIFO, a device too) is read as the config, which
    # refuses it by name, rather than called an unknown model.
    path = Path(name_or_path).expanduser()
    if path.is_dir() and os.path.lexists(path / "config.json"):
        return preset_from_hf_config(path / "config.json")
    if os.path.lexists(path) and not path.is_dir():
        return preset_from_hf_config(path)
    resolved = resolve_model_name(str(name_or_path))
    if resolved is not None:
        return MODEL_PRESETS[resolved]
    near = nearest_names(str(name_or_path))
    hint = f"did you mean {', '.join(near)}? " if near else ""
    raise ValueError(
        f"unknown model {str(name_or_path)!r}: not a preset and not a config.json path; {hint}"
        f"presets: {', '.join(MODEL_PRESETS)} (pagesim presets lists them)"
    )
