"""Counting tokens the way ``vllm bench serve`` counts them, or a stated estimate without a tokenizer.

vLLM 0.33's datasets count a text's tokens as ``len(tokenizer(text).input_ids)``
(``ShareGPTDataset.sample``, datasets.py:1375-1378; ``CustomDataset.sample``, :2530;
``ConversationDataset.sample``, :3168-3171). A Hugging Face tokenizer called like that adds the
tokenizer's special tokens (``add_special_tokens=True`` is its default: a BOS for Llama-style
tokenizers). ``HFTokenizer.encode`` therefore runs ``tokenizer.json``'s post-processor too
(``tokenizers.Tokenizer.encode``'s default), so its counts are vLLM's counts.

Without a tokenizer, ``EstimateTokenizer`` gives one token per 4 characters (rounded up) and a
pseudo-id per 4-character piece (a hash of the piece), so equal texts give equal ids and
prompts that start alike share their first ids. It is an estimate, and every trace says so in
``metadata["tokenizer"]``.

Two guards: no tokenizer is handed a text longer than ``MAX_TEXT_CHARS`` (the datasets refuse
one by its entry first; ``tokenizers`` aborts the process on some 60 MB texts), and
``warn_if_one_id`` warns when a tokenizer maps most of the prompts' tokens to one id (a
tokenizer for another vocabulary turns nearly every word into ``[UNK]``: every prompt then
looks alike, and prefix caching hits on text that shares nothing).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import numpy as np

from pagesim.engine.files import InputFileError, read_small_text
from pagesim.traces.errors import warn
from pagesim.traces.loaders.stream import MAX_LINE_CHARS, limit_text
from pagesim.traces.tokens import splitmix64

CHARS_PER_TOKEN = 4  # the estimate's characters per token
MAX_TOKENIZER_BYTES = 256 * 2**20  # tokenizer.json files are a few MiB (Llama 3's: 9 MB)
# The longest text a tokenizer is handed: a trace's line cap. (``tokenizers`` aborts the process on
# some 60 MB texts; vLLM would drop any prompt that long as over 1024 tokens anyway.)
MAX_TEXT_CHARS = MAX_LINE_CHARS
ONE_ID_SHARE = 0.5  # a tokenizer that gives one id this share of the tokens is warned about ...
ONE_ID_MIN_TOKENS = 100  # ... once it has given this many (the commonest word of English text: ~5%)
ONE_ID_SAMPLE = 2**17  # tokens judged: enough to tell, cheap on a whole ShareGPT file
_PSEUDO_ID_MASK = np.uint64(2**31 - 1)  # estimate ids lie in [0, 2**31)


class Tokenizer(Protocol):
    describe: str  # what counted the tokens, for a trace's metadata
    num_special_tokens: int  # special tokens encode() adds to one text (vLLM's num_special_tokens_to_add)

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list: ...  # each text's ids (a list or an int64 array)

    def count_batch(self, texts: list[str]) -> list[int]: ...


class EstimateTokenizer:
    """One token per ``CHARS_PER_TOKEN`` characters (ceil); ids are hashes of the pieces."""

    describe = f"estimate: 1 token per {CHARS_PER_TOKEN} characters (no --tokenizer given)"
    num_special_tokens = 0

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0].tolist()

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Each text's int64 ids, one per 4-character piece: the piece's code points mixed by
        splitmix64 (all texts in one numpy pass)."""
        texts = _bounded(texts)
        lengths = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        pieces = -(-lengths // CHARS_PER_TOKEN)
        offsets = np.zeros(len(texts) + 1, np.int64)
        np.cumsum(pieces, out=offsets[1:])
        points = np.frombuffer("".join(texts).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        within = np.arange(len(points)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        piece = np.repeat(offsets[:-1], lengths) + within // CHARS_PER_TOKEN
        # NOTE: 0x110000 is above every code point, so a short last piece differs from any full one
        matrix = np.full((int(offsets[-1]), CHARS_PER_TOKEN), 0x110000, np.uint64)
        matrix[piece, within % CHARS_PER_TOKEN] = points
        mixed = np.zeros(len(matrix), np.uint64)
        with np.errstate(over="ignore"):
            for k in range(CHARS_PER_TOKEN):
                mixed = splitmix64(mixed ^ matrix[:, k])
        ids = (mixed & _PSEUDO_ID_MASK).astype(np.int64)
        return np.split(ids, offsets[1:-1])

    @staticmethod
    def count(text: str) -> int:
        return -(-len(text) // CHARS_PER_TOKEN)

    def count_batch(self, texts: list[str]) -> list[int]:
        return [-(-len(text) // CHARS_PER_TOKEN) for text in texts]


class HFTokenizer:
    """A Hugging Face fast tokenizer (``tokenizer.json``) loaded with the ``tokenizers`` package."""

    def __init__(self, file: Path):
        from tokenizers import Tokenizer as _Tokenizer

        # read here, not by the library: a regular file of bounded size only
        self._tokenizer = _Tokenizer.from_str(read_small_text(file, limit_bytes=MAX_TOKENIZER_BYTES,
                                                              what="tokenizer.json"))
        self.path = file
        self.num_special_tokens = int(self._tokenizer.num_special_tokens_to_add(False))
        self.describe = f"tokenizer.json: {file} (special tokens added, as vLLM's tokenizer(text).input_ids)"

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(_bounded([text])[0]).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self._tokenizer.encode_batch(_bounded(texts))]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_batch(self, texts: list[str]) -> list[int]:
        return [len(ids) for ids in self.encode_batch(texts)]


def _bounded(texts: list[str]) -> list[str]:
    """``texts``, each at most ``MAX_TEXT_CHARS`` long (a ``ValueError`` otherwise: the datasets
    refuse a longer text by its entry before it gets here)."""
    if any(len(text) > MAX_TEXT_CHARS for text in texts):
        raise ValueError(f"a text longer than {limit_text(MAX_TEXT_CHARS)} was about to be tokenized; "
                         "no tokenizer is handed one")
    return texts


def warn_if_one_id(tokenizer: Tokenizer, prompt_ids: list, path) -> None:
    """A ``TraceWarning`` about ``path`` when ``tokenizer`` (a Hugging Face one: the estimate
    hashes text, it has no vocabulary) gave one id more than ``ONE_ID_SHARE`` of the tokens of
    ``prompt_ids`` (each prompt's ids; the first ``ONE_ID_SAMPLE`` tokens are judged), special
    tokens it adds to every text left out."""
    if not isinstance(tokenizer, HFTokenizer) or not prompt_ids:
        return
    judged, total = [], 0
    for ids in prompt_ids:  # the first prompts (in sampling order) holding ONE_ID_SAMPLE tokens
        judged.append(np.asarray(ids, dtype=np.int64))
        total += len(ids)
        if total >= ONE_ID_SAMPLE:
            break
    ids = np.concatenate(judged)
    added = tokenizer.num_special_tokens * len(judged)  # (a BOS per prompt is not the text's)
    if len(ids) - added < ONE_ID_MIN_TOKENS:
        return
    values, counts = np.unique(ids, return_counts=True)
    top = int(np.argmax(counts))
    share = (int(counts[top]) - added) / (len(ids) - added)
    if share > ONE_ID_SHARE:
        warn(path, f"the tokenizer {tokenizer.path} maps {share:.0%} of the prompts' tokens to one id "
             f"({int(values[top])}), so prompts look alike (and share cached prefixes) whatever their text; "
             "is it the model's tokenizer?")


def load_tokenizer(path: str | os.PathLike[str] | None) -> Tokenizer:
    """The tokenizer at ``path`` (a folder holding ``tokenizer.json``, or that file), or the
    4-characters-per-token estimate when ``path`` is None.

    vLLM's ``--tokenizer`` also takes a hub name; here nothing is downloaded, so a path that is
    not on disk is a ``ValueError`` naming it.
    """
    if path is None:
        return EstimateTokenizer()
    given = Path(path)
    file = given / "tokenizer.json" if given.is_dir() else given
    if not os.path.lexists(file):
        where = f"{given} has no tokenizer.json" if given.is_dir() else f"{given}: no such file"
        raise ValueError(f"--tokenizer: {where} (give a Hugging Face tokenizer folder or its tokenizer.json; "
                         "nothing is downloaded)")
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        raise ValueError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
    try:
        return HFTokenizer(file)
    except InputFileError as exc:  # not a regular file, too large, not UTF-8
        raise ValueError(f"--tokenizer: {exc}") from None
    except Exception as exc:  # tokenizers raises its own Exception type for a bad file
        reason = " ".join(str(exc).split())
        reason = reason if len(reason) <= 80 else reason[:79] + "…"
        raise ValueError(f"--tokenizer: cannot load {file} as a tokenizer.json ({reason})") from None
