"""The column and key names pagesim knows in trace files: those of the fixed formats
(``AZURE_COLUMNS``, ``BURSTGPT_COLUMNS``, ``MOONCAKE_KEYS``: how ``detect_format`` tells them
apart by a first line) and those the generic loaders recognise without a ``--columns`` map
(``ALIASES``).

An error about a file's columns or keys names only these and the user's own
(``known_column_names``, through ``pagesim.traces.loaders.columns.names_said``); any other name
in the file is counted, never quoted.
"""

from __future__ import annotations

from collections.abc import Iterable

MOONCAKE_KEYS = {"timestamp", "input_length", "output_length", "hash_ids"}
AZURE_COLUMNS = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
BURSTGPT_COLUMNS = {"Timestamp", "Model", "Request tokens", "Response tokens", "Log Type"}

# field -> column names recognised without a map (first match wins)
ALIASES: dict[str, tuple[str, ...]] = {
    "arrival": ("arrival_s", "arrival_time", "arrival", "timestamp", "time"),
    "prompt": ("prompt_len", "input_length", "input_len", "prompt_tokens", "input_tokens",
               "num_prefill_tokens", "context_tokens", "prompt_length"),
    "output": ("output_len", "output_length", "output_tokens", "num_decode_tokens",
               "generated_tokens", "response_tokens", "completion_tokens"),
    "prefix_ids": ("prefix_ids", "hash_ids"),
    "n": ("n",),
    "beam_width": ("beam_width",),
    "priority": ("priority",),
    "conversation_id": ("conversation_id",),
    "turn": ("turn",),
}


def known_column_names(given: Iterable[str] = ()) -> set[str]:
    """Column and key names an error may quote: those of the formats pagesim reads, the names it
    recognises (``ALIASES``) and ``given`` (the user's ``--columns``)."""
    return {*AZURE_COLUMNS, *BURSTGPT_COLUMNS, *MOONCAKE_KEYS, *given,
            *(name for names in ALIASES.values() for name in names)}
