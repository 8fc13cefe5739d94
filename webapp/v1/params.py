"""An OpenAI-style request body -> what the core runs (`Ask`), or an ApiError naming the field.

Messages go through the chat page's own PromptBuilder (few-shot priming, the seed's turn markers, the
oldest turns dropped to fit); /v1/completions takes a raw prompt, text or token ids, with no template.
Fields that would change the reply but that Glassbox cannot honour (top_p below 1, penalties, n > 1,
tools, ...) are refused by name rather than ignored; fields that change nothing (user, metadata, ...)
and unknown ones are ignored, as llama.cpp's server does. docs/api.md lists them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from webapp.chat.decode.odds import TOP_ALTERNATIVES
from webapp.chat.decode.types import SamplingParams
from webapp.chat.model.edits import Edit
from webapp.chat.model.prompt import PromptTooLong
from webapp.chat.registry import DEFAULT_NAME
from webapp.v1.errors import ApiError

DEFAULT_TOP_K = SamplingParams().top_k  # the chat page's default, so a request without top_k is answered alike
MAX_STOPS = 4  # as OpenAI
MAX_TOP_LOGPROBS = 20  # accepted as OpenAI does; at most TOP_ALTERNATIVES (10) are returned
MAX_TEXT_LOGPROBS = 5  # /v1/completions' `logprobs`, as OpenAI
TEXT_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
SEED_MIN, SEED_MAX = -2**63, 2**64 - 1  # what torch.Generator.manual_seed takes
SYSTEM_ROLES = ("system", "developer")  # "developer" is OpenAI's newer name for the system message
ROLES = (*SYSTEM_ROLES, "user", "assistant")


@dataclass(frozen=True)
class Ask:
    """One request, checked: the prompt's token ids and how to sample and report the reply."""

    kind: str  # "chat" or "text"
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage
    stops: tuple[str, ...] = ()
    logprobs: int | None = None  # alternatives to report per token; None: no logprobs asked for
    model: str = DEFAULT_NAME  # the registry name of the model that answers
    edit: Edit | None = None  # directions added to the residual stream (`glassbox.steer`), in every forward


# -- fields ------------------------------------------------------------------------------------
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a decimal", str: "a string", list: "an array",
               dict: "an object", type(None): "null"}


def _type_error(name: str, expected: str, value) -> ApiError:
    return ApiError(400, f"Invalid type for '{name}': expected {expected}, but got "
                         f"{_TYPE_NAMES.get(type(value), type(value).__name__)} instead.", param=name)


def _range_error(name: str, value, low, high) -> ApiError:
    shown = f"{str(value)[:20]}… ({len(str(abs(value)))} digits)" if isinstance(value, int) and abs(value) > 10**20 \
        else value
    if low is not None and value < low:
        return ApiError(400, f"Invalid '{name}': below minimum value. Expected a value >= {low}, "
                             f"but got {shown} instead.", param=name)
    return ApiError(400, f"Invalid '{name}': above maximum value. Expected a value <= {high}, "
                         f"but got {shown} instead.", param=name)


def valid_text(value: str, name: str) -> str:
    """JSON's "\\ud800" escape decodes to a lone surrogate, which is not text: no tokenizer (and no UTF-8) takes it."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"Invalid '{name}': it holds a lone surrogate (a \\ud800–\\udfff escape without its "
                            "pair), which is not text.", param=name) from None
    return value


def integer(body: dict, name: str, default, low=None, high=None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):  # JSON true is not 1
        raise _type_error(name, "an integer", value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise _range_error(name, value, low, high)
    return value


def number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    # an int is compared as it is: float() of a 400-digit integer overflows
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise _type_error(name, "a decimal", value)
    if not low <= value <= high:
        raise _range_error(name, value, low, high)
    return float(value)


def boolean(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean", value)
    return value


def _refuse_unless(body: dict, name: str, fine, why: str) -> None:
    value = body.get(name)
    if value is not None and not fine(value):
        raise ApiError(400, f"Unsupported value for '{name}': {why}", param=name, code="unsupported_value")


def requested_model(body, names: list[str]) -> str:
    """The registry name a request's `model` picks (none given: the first, the default). 404 naming the
    models there are."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _type_error("model", "a string", model)
    if model is None:
        return names[0]
    if model not in names:
        raise unknown_model(model, names)
    return model


def unknown_model(model: str, names: list[str]) -> ApiError:
    there = (f"This server has one model: '{names[0]}'." if len(names) == 1
             else "This server has these models: " + ", ".join(f"'{n}'" for n in names) + ".")
    return ApiError(404, f"The model '{model}' does not exist. {there}", param="model", code="model_not_found")


def _common(body: dict, names: list[str]) -> dict:
    """What both endpoints take alike: the model, sampling, stop sequences, streaming; refusals."""
    model = requested_model(body, names)
    _refuse_unless(body, "n", lambda v: v == 1, "Glassbox generates one choice per request (n=1); "
                   "send several requests, with different seeds, for more.")
    _refuse_unless(body, "top_p", lambda v: v == 1, "nucleus sampling is not implemented; leave top_p at 1 "
                   "and use top_k (a Glassbox extension) to cut the tail.")
    for penalty in ("presence_penalty", "frequency_penalty"):
        _refuse_unless(body, penalty, lambda v: v == 0, "penalties are not implemented; leave it at 0.")
    _refuse_unless(body, "logit_bias", lambda v: v == {}, "logit_bias is not implemented.")
    stop = body.get("stop")
    if stop is None:
        stops = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOPS:
            raise ApiError(400, f"Invalid 'stop': at most {MAX_STOPS} stop sequences, got {len(stop)}.", param="stop")
        stops = stop
    else:
        raise _type_error("stop", "a string or an array of strings", stop)
    stream = boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       param="stream_options")
    if options is not None and not isinstance(options, dict):
        raise _type_error("stream_options", "an object", options)
    return {"temperature": number(body, "temperature", 1.0, 0.0, 2.0),
            "top_k": integer(body, "top_k", DEFAULT_TOP_K, 0),
            "seed": integer(body, "seed", None, SEED_MIN, SEED_MAX),
            # an empty stop sequence would end every reply at once
            "stops": tuple(valid_text(s, "stop") for s in stops if s),
            "stream": stream,
            "include_usage": boolean(options or {}, "include_usage"), "model": model}


def _ask(kind: str, ids, max_tokens: int, common: dict, logprobs: int | None) -> Ask:
    params = SamplingParams(max_tokens, common["temperature"], common["top_k"], common["seed"])
    return Ask(kind, tuple(ids), params, common["stream"], common["include_usage"], common["stops"], logprobs,
               common["model"])


# -- /v1/chat/completions ------------------------------------------------------------------------
def parse_chat(body, loaded, settings, names: list[str] | None = None) -> Ask:
    """`loaded`: the model `body` asks for, among `names` (the registry's; None: the one default)."""
    common = _common(body, names or [DEFAULT_NAME])
    _refuse_unless(body, "tools", lambda v: v == [], "tools are not implemented.")
    _refuse_unless(body, "functions", lambda v: v == [], "functions are not implemented.")
    _refuse_unless(body, "response_format", lambda v: isinstance(v, dict) and v.get("type") == "text",
                   "only plain text replies ({\"type\": \"text\"}).")
    turns = chat_turns(_messages(body, settings))
    limit = loaded.prompt.max_new_tokens_limit()
    # max_completion_tokens is OpenAI's newer name; it wins when both are sent
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = integer(body, name, min(settings.max_new_tokens, limit), 1)
    if max_tokens > limit:
        raise ApiError(400, f"{name} is too large: {max_tokens}. This model supports at most {limit} completion "
                            f"tokens (its window of {loaded.block_size}, less the priming and a one-token message), "
                            f"whereas you provided {max_tokens}.", param=name)
    logprobs = boolean(body, "logprobs")
    top = integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise ApiError(400, "Invalid 'top_logprobs': 'logprobs' must be true when 'top_logprobs' is set.",
                       param="top_logprobs")
    try:
        ids = loaded.prompt.build(turns, max_tokens)
    except PromptTooLong as error:
        raise ApiError(400, str(error), param="messages", code="context_length_exceeded") from None
    return _ask("chat", ids, max_tokens, common, min(top or 0, TOP_ALTERNATIVES) if logprobs else None)


def _messages(body: dict, settings) -> list[tuple[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty array of messages.", param="messages")
    if len(messages) > settings.max_messages:
        raise ApiError(400, f"Too many messages: {len(messages)}; at most {settings.max_messages}.", param="messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _type_error(where, "an object", message)
        role = message.get("role")
        if role not in ROLES:
            raise ApiError(400, f"Invalid value for '{where}.role': Glassbox takes {', '.join(map(repr, ROLES))}; "
                                f"got {role!r}.", param=f"{where}.role")
        content = _content(message.get("content"), where, role)
        if len(content) > settings.max_message_chars:
            raise ApiError(400, f"'{where}.content' has {len(content):,} characters; at most "
                                f"{settings.max_message_chars:,}.", param=f"{where}.content")
        out.append((role, content))
    return out


def _content(value, where: str, role: str) -> str:
    if value is None and role == "assistant":
        return ""
    if isinstance(value, str):
        return valid_text(value, f"{where}.content")
    if isinstance(value, list):  # content parts: text only (the model reads nothing else)
        texts = []
        for j, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ApiError(400, f"Invalid '{where}.content[{j}]': Glassbox reads text parts only "
                                    "({\"type\": \"text\", \"text\": ...}).", param=f"{where}.content")
            texts.append(valid_text(part["text"], f"{where}.content[{j}].text"))
        return "\n".join(texts)
    raise _type_error(f"{where}.content", "a string or an array of text parts", value)


def chat_turns(messages: list[tuple[str, str]]) -> list[dict]:
    """The seed's template has user and assistant turns only. A system (or developer) message's text
    goes before the next user message's, a blank line between; with no user message after it, it
    becomes a user turn of its own. webapp/chat/model/hf.py's chat template does the same."""
    turns, pending = [], []
    for role, content in messages:
        if role in SYSTEM_ROLES:
            pending.append(content)
            continue
        if role == "user" and pending:
            content, pending = "\n\n".join([*pending, content]), []
        turns.append({"role": role, "content": content})
    if pending:
        turns.append({"role": "user", "content": "\n\n".join(pending)})
    return turns


# -- /v1/completions -------------------------------------------------------------------------------
def parse_text(body, loaded, settings, names: list[str] | None = None) -> Ask:
    common = _common(body, names or [DEFAULT_NAME])
    _refuse_unless(body, "best_of", lambda v: v == 1, "Glassbox generates one choice per request (best_of=1).")
    _refuse_unless(body, "echo", lambda v: v is False, "echo is not implemented.")
    _refuse_unless(body, "suffix", lambda v: v == "", "suffix (insertion) is not implemented.")
    ids = _prompt_ids(body.get("prompt"), loaded.tokenizer)
    block = loaded.block_size
    room = block - len(ids)
    max_tokens = integer(body, "max_tokens", min(TEXT_DEFAULT_MAX_TOKENS, max(room, 1)), 1)
    if len(ids) + max_tokens > block:
        raise ApiError(400, f"This model's maximum context length is {block} tokens, however you requested "
                            f"{len(ids) + max_tokens} tokens ({len(ids)} in your prompt; {max_tokens} for the "
                            "completion). Please reduce your prompt; or completion length.",
                       param="max_tokens", code="context_length_exceeded")
    logprobs = integer(body, "logprobs", None, 0, MAX_TEXT_LOGPROBS)
    return _ask("text", ids, max_tokens, common, logprobs)


def _prompt_ids(value, tokenizer) -> list[int]:
    """A string (encoded without any template or special token), or token ids (specials allowed: a
    raw prompt may spell the chat markers out). A batch of one prompt is taken as that prompt."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        ids = tokenizer.encode_ordinary(valid_text(value, "prompt"))
    elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        bad = next((t for t in value if not 0 <= t < tokenizer.n_vocab), None)
        if bad is not None:
            raise ApiError(400, f"Invalid 'prompt': token id {bad} is outside this tokenizer's ids "
                                f"0..{tokenizer.n_vocab - 1}.", param="prompt")
        ids = list(value)
    elif isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise ApiError(400, "Glassbox completes one prompt per request; send the prompts one at a time.",
                       param="prompt", code="unsupported_value")
    else:
        raise _type_error("prompt", "a string or an array of token ids", value)
    if not ids:
        raise ApiError(400, "The prompt is empty: give at least one character or token id.", param="prompt")
    return ids
