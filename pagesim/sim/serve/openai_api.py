"""vLLM 0.33's OpenAI-compatible API at its edges: request bodies, errors, chunks and responses.

What a client sees is vLLM's (read from vllm/entrypoints/openai/{completion,chat_completion}/ and
vllm/entrypoints/serve/ in the 0.33.0 wheel; none of its code is here):

- **Requests** are pydantic models that allow unknown fields (vLLM's ``extra="allow"``: an unknown
  field is ignored). A body that is not JSON, or a field of the wrong type, is FastAPI's
  ``RequestValidationError``, which vLLM answers 400 with type ``"Bad Request"`` and a message
  listing the errors (``validation_error``).
- **Errors** are ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status in
  ``code`` (``ApiError``). vLLM's own checks are ``BadRequestError`` whose message ends
  ``" (parameter=X, value=Y)"``; an unknown model is 404 ``NotFoundError``.
- **Limits**: ``max_tokens`` over ``max_model_len`` is refused; a prompt of ``max_model_len`` tokens or
  more is refused; otherwise ``max_tokens`` is cut to what the context leaves (vLLM clamps it
  silently); completions default to 16 tokens, chat to the rest of the context.
- **Chunks**: ``data: <json>\\n\\n`` events, one choice each, the last token and its
  ``finish_reason`` in one chunk, a usage chunk with empty ``choices`` when
  ``stream_options.include_usage``, then ``data: [DONE]``.

pagesim's outputs are synthetic: every generated token is the text ``TOKEN_TEXT`` (one token in the
common BPE vocabularies, so a client that counts tokens by re-tokenizing the text counts them
right), ``stop`` strings are accepted and never match, and what it cannot simulate (logprobs,
echo, beam search, guided decoding, tools) is refused by name rather than answered with made-up
values.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

VLLM_VERSION = "0.33.0"  # the vLLM whose API this speaks (GET /version says it)
TOKEN_TEXT = " the"
MAX_ERROR_INPUT_CHARS = 200  # vLLM's bounds on a validation error's text
MAX_ERROR_CHARS = 1000
MAX_REPORTED_ERRORS = 10
MAX_N = 16384  # VLLM_MAX_N_SEQUENCES' default
COMPLETION_DEFAULT_MAX_TOKENS = 16
# Chat prompts without a chat template: the messages' contents plus what Llama 3's template adds
# (a header and an end-of-turn per message, a BOS, the assistant's header), stated at startup.
CHAT_TOKENS_PER_MESSAGE = 5
CHAT_TOKENS_ADDED = 5


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    n: int = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0  # lower is sooner, under --scheduling-policy priority (fcfs ignores it, as vLLM 0.33)
    logprobs: Any = None
    prompt_logprobs: int | None = None
    use_beam_search: bool = False
    response_format: Any = None
    user: str | None = None


class CompletionBody(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    max_tokens: int | None = COMPLETION_DEFAULT_MAX_TOKENS
    echo: bool | None = False
    suffix: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    tools: Any = None


class ApiError(Exception):
    """A vLLM error response: ``status`` and the body ``body()`` gives."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.message, self.param = status, kind, message, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def bad_request(message: str, parameter: str | None = None, value: Any = None) -> ApiError:
    """vLLM's ``VLLMValidationError``: 400 ``BadRequestError``, the parameter and value appended."""
    parts = [f"parameter={parameter}" if parameter is not None else None, f"value={value}" if value is not None else None]
    suffix = ", ".join(p for p in parts if p)
    return ApiError(400, "BadRequestError", f"{message} ({suffix})" if suffix else message, parameter)


def validation_error(errors: list[dict]) -> ApiError:
    """FastAPI's ``RequestValidationError`` as vLLM answers it (400 ``Bad Request``)."""
    if not errors:
        return ApiError(400, "Bad Request", "Validation error")
    param = _dotted(errors[0].get("loc"))
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    for err in errors[:MAX_REPORTED_ERRORS]:
        shown = {k: v for k, v in err.items() if k != "url"}
        if "input" in shown:
            shown["input"] = _summarized(shown["input"])
        if isinstance(shown.get("loc"), (tuple, list)):
            shown["loc"] = _dotted(shown["loc"])
        if "ctx" in shown and isinstance(shown["ctx"], dict):
            shown["ctx"] = {k: str(v) if isinstance(v, Exception) else v for k, v in shown["ctx"].items()}
        text = str(shown)
        lines.append("  " + (text[:MAX_ERROR_CHARS] + "...[truncated]" if len(text) > MAX_ERROR_CHARS else text))
    if len(errors) > MAX_REPORTED_ERRORS:
        lines.append(f"  ...and {len(errors) - MAX_REPORTED_ERRORS} more {label}")
    return ApiError(400, "Bad Request", "\n".join(lines), param)


def _dotted(loc) -> str | None:
    if not loc:
        return None
    parts = [str(p) for p in loc if not any(c in str(p) for c in "[](){}")]
    return ".".join(parts or [str(p) for p in loc])


def _summarized(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= MAX_ERROR_INPUT_CHARS else value[:MAX_ERROR_INPUT_CHARS] + "...[truncated]"
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = str(value)
    return text if len(text) <= MAX_ERROR_INPUT_CHARS else text[:MAX_ERROR_INPUT_CHARS] + "...[truncated]"


def check_model(asked: str | None, served: str) -> None:
    if asked not in (None, "", served):
        raise ApiError(404, "NotFoundError", f"The model `{asked}` does not exist. Valid aliases: {served}.", "model")


def check_sampling(body: _Sampling) -> None:
    """vLLM's checks of the sampling parameters (``SamplingParams._verify_args``), and refusals of
    what pagesim does not simulate."""
    if body.stream_options is not None and not body.stream:
        raise bad_request("Stream options can only be defined when `stream=True`.", "stream_options")
    if body.n < 1:
        raise ApiError(400, "BadRequestError", f"n must be at least 1, got {body.n}.")
    if body.n > MAX_N:
        raise ApiError(400, "BadRequestError", f"n must be at most {MAX_N}, got {body.n}. To increase this limit, "
                       "set the VLLM_MAX_N_SEQUENCES environment variable.")
    if body.temperature is not None and not 0 <= body.temperature <= 2:
        raise bad_request(f"temperature must be in [0, 2], got {body.temperature}.", "temperature", body.temperature)
    if body.n > 1 and body.temperature == 0:
        raise ApiError(400, "BadRequestError", f"n must be 1 when using greedy sampling, got {body.n}.")
    if body.top_p is not None and not 0 < body.top_p <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {body.top_p}.", "top_p", body.top_p)
    if body.top_k is not None and body.top_k < -1:  # (-1: disabled, as older clients send it)
        raise ApiError(400, "BadRequestError", f"top_k must be 0 (disable), or at least 1, got {body.top_k}.")
    if body.min_p is not None and not 0 <= body.min_p <= 1:
        raise ApiError(400, "BadRequestError", f"min_p must be in [0, 1], got {body.min_p}.")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(body, name)
        if value is not None and not -2 <= value <= 2:
            raise bad_request(f"{name} must be in [-2, 2], got {value}.", name, value)
    if body.repetition_penalty is not None and not body.repetition_penalty > 0:
        raise bad_request(f"repetition_penalty must be greater than zero, got {body.repetition_penalty}.",
                          "repetition_penalty", body.repetition_penalty)
    if body.min_tokens < 0:
        raise bad_request(f"min_tokens must be greater than or equal to 0, got {body.min_tokens}.", "min_tokens",
                          body.min_tokens)
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    if "" in stops:
        raise bad_request("stop cannot contain an empty string.", "stop")
    if body.stream and body.use_beam_search:
        raise bad_request("Streaming is not currently supported with beam search", "stream")
    if body.stream and body.prompt_logprobs is not None:
        raise bad_request("`prompt_logprobs` are not available when `stream=True`.", "prompt_logprobs")
    unsupported = [("logprobs", body.logprobs not in (None, False, 0)), ("prompt_logprobs", body.prompt_logprobs is not None),
                   ("use_beam_search", body.use_beam_search), ("response_format", body.response_format is not None),
                   ("echo", bool(getattr(body, "echo", False))), ("tools", getattr(body, "tools", None) is not None)]
    for name, asked in unsupported:
        if asked:
            raise bad_request(f"pagesim serve does not simulate {name}: its outputs are synthetic tokens", name,
                              json.dumps(getattr(body, name)))


def output_budget(prompt_len: int, asked: int | None, max_model_len: int, name: str = "max_tokens",
                  min_tokens: int = 0) -> int:
    """The tokens a request may generate (vLLM's checks and ``get_max_tokens``' clamp)."""
    if asked is not None and asked > max_model_len:
        raise bad_request(f"{name}={asked} cannot be greater than max_model_len={max_model_len}. "
                          "Please request fewer output tokens.", name, asked)
    if prompt_len > max_model_len:
        raise prompt_too_long(prompt_len, max_model_len)
    budget = max_model_len - prompt_len if asked is None else min(asked, max_model_len - prompt_len)
    if budget < 1:
        raise bad_request(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
    if min_tokens > budget:
        raise bad_request(f"min_tokens must be less than or equal to max_tokens={budget}, got {min_tokens}.",
                          "min_tokens", min_tokens)
    return budget


def prompt_too_long(prompt_len: int, max_model_len: int) -> ApiError:
    return bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
                       f"{prompt_len} input tokens, which exceeds this limit even without any output tokens. Please "
                       "reduce the length of the input prompt.", "input_tokens", prompt_len)


def prompts_of(body: CompletionBody) -> list[str | list[int]]:
    """A completions body's prompts: texts or token-id lists."""
    prompt = body.prompt
    if prompt is None or prompt == "" or prompt == []:
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    if any(p == "" or p == [] for p in prompt):
        raise bad_request("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    return list(prompt)


def chat_text(messages: list[ChatMessage]) -> tuple[str, int]:
    """The messages' text, and the template tokens counted beside it (module constants)."""
    parts = []
    for message in messages:
        content = message.content
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        parts.append(content or "")
    return "\n".join(parts), CHAT_TOKENS_PER_MESSAGE * len(messages) + CHAT_TOKENS_ADDED


# ---------------------------------------------------------------------- responses
def random_id() -> str:
    """vLLM's ``random_uuid()``: 16 lowercase hex digits."""
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"


def request_id(kind: str, header: str | None) -> str:
    return f"{kind}-{header or random_id()}"


def sse(payload: dict | str) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


DONE = b"data: [DONE]\n\n"


def usage(prompt_tokens: int, completion_tokens: int, *, full: bool = False) -> dict:
    out = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
           "completion_tokens": completion_tokens}
    if full:
        out.update(prompt_tokens_details=None, completion_tokens_details=None)
    return out


def completion_chunk(rid: str, created: int, model: str, index: int, text: str, finish: str | None,
                     chunk_usage: dict | None = None, fingerprint: str | None = None) -> dict:
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                          "prompt_token_ids": None, "token_ids": None, "weight_versions": None}]}
    if chunk_usage is not None:
        chunk["usage"] = chunk_usage
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    chunk["kv_transfer_params"] = None
    return chunk


def chat_chunk(rid: str, created: int, model: str, index: int, delta: dict, finish: str | None,
               chunk_usage: dict | None = None, fingerprint: str | None = None) -> dict:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice.update(stop_reason=None, token_ids=None, weight_versions=None)
    elif "role" not in delta:
        choice["token_ids"] = None
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    if chunk_usage is not None:
        chunk["usage"] = chunk_usage
    if "role" in delta:
        chunk.update(prompt_token_ids=None, prompt_text=None)
        return chunk
    if fingerprint is not None:
        chunk["system_fingerprint"] = fingerprint
    chunk["kv_transfer_params"] = None
    return chunk


def usage_chunk(rid: str, created: int, model: str, obj: str, prompt_tokens: int, completion_tokens: int,
                fingerprint: str) -> dict:
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(prompt_tokens, completion_tokens), "system_fingerprint": fingerprint}


def completion_response(rid: str, created: int, model: str, choices: list[tuple[int, str]],
                        prompt_tokens: int, completion_tokens: int, fingerprint: str) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": i, "text": TOKEN_TEXT * count, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None, "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None,
                         "routed_experts": None, "weight_versions": None}
                        for i, (count, finish) in enumerate(choices)],
            "service_tier": None, "system_fingerprint": fingerprint,
            "usage": usage(prompt_tokens, completion_tokens, full=True),
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


def chat_response(rid: str, created: int, model: str, choices: list[tuple[int, str]],
                  prompt_tokens: int, completion_tokens: int, fingerprint: str) -> dict:
    return {"id": rid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": TOKEN_TEXT * count, "refusal": None,
                                                 "annotations": None, "audio": None, "function_call": None,
                                                 "reasoning": None},
                         "logprobs": None, "finish_reason": finish, "stop_reason": None, "token_ids": None,
                         "routed_experts": None, "weight_versions": None}
                        for i, (count, finish) in enumerate(choices)],
            "service_tier": None, "system_fingerprint": fingerprint,
            "usage": usage(prompt_tokens, completion_tokens, full=True),
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


def model_card(name: str, root: str, max_model_len: int, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root, "parent": None,
            "max_model_len": max_model_len,
            "permission": [{"id": f"modelperm-{random_id()}", "object": "model_permission",
                            "created": created, "allow_create_engine": False, "allow_sampling": True,
                            "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                            "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False}]}


def now_s() -> int:
    return int(time.time())
