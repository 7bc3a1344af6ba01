"""Validation of OpenAI request bodies into the serving pipeline's ``GenerationRequest``.

The parameters of chat and completions are declared once, as ``request_fields.Field``s
(``CHAT_FIELDS``, ``COMPLETION_FIELDS``): this module reads bodies with them and
``openapi_document`` shows them. Every rule names the parameter and the bad value, so a
client sees exactly what to fix. Nothing is dropped silently: OpenAI parameters dynask
does not serve (tools, response_format, suffix …) pass only at their neutral values
and are refused by name otherwise, and a key no field declares is refused by name too.
Informational ones (``user``, ``metadata`` …) are accepted; they change no output. The
sampling features (penalties, logit_bias, min_tokens, logprobs, n, best_of, echo) are
declared in ``sampling.sampling_fields``; completions take a list of prompts (a choice per
prompt and ``n``).
Strings that cannot be encoded as UTF-8 (a lone surrogate such as ``"\\ud800"``) are a
400 naming where they are. Extensions: ``ignore_eos``, ``top_k`` and ``router_mode``
(this request's routing mode, overriding the server's ``--router-mode``),
``repetition_penalty`` and ``min_tokens``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dynask.control_plane.api.chat_messages import MESSAGE_SCHEMA, read_messages
from dynask.control_plane.api.errors import invalid
from dynask.control_plane.api.request_fields import (
    Accepted,
    Boolean,
    Choice,
    Custom,
    Field,
    Integer,
    Number,
    Refused,
    Text,
    check_encodable,
    is_int,
    read_body,
    shown,
)
from dynask.control_plane.api.sampling.sampling_fields import (
    CHAT_LOGPROBS,
    COMPLETION_CHOICES,
    SAMPLING_FIELDS,
    best_of,
    sampling_features,
)
from dynask.control_plane.api.structured_output_fields import parse_structured_output
from dynask.control_plane.routing.kv_router import ROUTING_MODES
from dynask.control_plane.serving.request import GenerationRequest

# Integers cross to the actor as msgpack and seed a torch.Generator: both stop at 64 bits.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP = 4
MAX_PROMPTS = 16  # prompts in one completions request (times n: the choices)


# ---- readers of the parameters that are more than a type and bounds -----------------------


def _prompts(value: Any) -> tuple[str | list[int], ...]:
    """One prompt, or a list of them (strings or token-id arrays)."""
    if isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        if len(value) > MAX_PROMPTS:
            raise invalid("prompt", f"'prompt' has {len(value)} prompts; at most {MAX_PROMPTS}")
        return tuple(_prompt(p) for p in value)
    return (_prompt(value),)


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value:
        if set(map(type, value)) == {int}:  # the usual token-id array, checked in C
            return value
        if all(is_int(t) for t in value):  # 5.0 is an integer too (JSON Schema)
            return [int(t) for t in value]
    raise invalid(
        "prompt",
        "'prompt' must be a non-empty string, an array of token ids, or an array of those",
    )


def _stop(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP
        or not all(isinstance(s, str) and s for s in value)
    ):
        raise invalid(
            "stop", f"'stop' must be a non-empty string or an array of up to {MAX_STOP} of them"
        )
    return tuple(value)


_STREAM_OPTIONS = (Boolean("include_usage", "a last chunk with the request's usage"),)


def _stream_options(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid("stream_options", "'stream_options' must be an object")
    unknown = [k for k in value if k != "include_usage"]
    if unknown:
        raise invalid(
            f"stream_options.{unknown[0]}",
            f"'stream_options' has the key {shown(unknown[0])}; only 'include_usage' is served",
            code="unknown_parameter",
        )
    return {"include_usage": _STREAM_OPTIONS[0].read(value)}


# ---- the declarations -----------------------------------------------------------------------

_NO_TOOLS = "deprecated by OpenAI; send 'tools' and 'tool_choice'"


def _as_sent(value: Any) -> Any:
    """Structured-output fields are read together (``parse_structured_output``)."""
    return value


# Structured outputs: OpenAI's response_format, vLLM's guided_* and structured_outputs.
STRUCTURED_OUTPUT_FIELDS: tuple[Field, ...] = tuple(
    Custom(name, description, json_schema=schema, reader=_as_sent)
    for name, description, schema in (
        ("response_format", "text, json_object or json_schema", {"type": "object"}),
        ("guided_json", "vLLM: a JSON schema the output follows", {"type": ["object", "string"]}),
        ("guided_regex", "vLLM: a regex the output matches", {"type": "string"}),
        ("guided_choice", "vLLM: the output is one of these", {"type": "array"}),
        ("guided_grammar", "vLLM: an EBNF or Lark grammar", {"type": "string"}),
        (
            "structured_outputs",
            "vLLM: json, regex, choice, grammar or json_object",
            {"type": "object"},
        ),
        ("guided_whitespace_pattern", "vLLM: refused (JSON is compact)", {"type": "string"}),
        ("guided_decoding_backend", "vLLM: refused (xgrammar is used)", {"type": "string"}),
    )
)

COMMON_FIELDS: tuple[Field, ...] = (
    *STRUCTURED_OUTPUT_FIELDS,
    Text("model", "the served model's name (GET /v1/models)", required=True),
    Integer("max_tokens", "the most tokens to generate (default: the rest of the context)", low=1),
    Integer("max_completion_tokens", "same as max_tokens (it wins when both are given)", low=1),
    Number("temperature", "sampling temperature; 0 is greedy", high=2.0),
    Number(
        "top_p",
        "nucleus sampling: the smallest set of tokens with this much probability",
        low_exclusive=True,
    ),
    Integer(
        "top_k",
        "extension: sample among the k likeliest tokens (0 or -1: all)",
        low=-1,
        high=INT64_MAX,
    ),
    Integer(
        "seed",
        "makes sampling reproducible (and a moved request continue exactly)",
        low=INT64_MIN,
        high=INT64_MAX,
    ),
    Custom(
        "stop",
        f"up to {MAX_STOP} strings that end the reply (not included)",
        default=(),
        json_schema={
            "oneOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "maxItems": MAX_STOP,
                },
            ]
        },
        reader=_stop,
    ),
    Boolean("stream", "answer as server-sent events, one per delta, then data: [DONE]"),
    Custom(
        "stream_options",
        "with stream=true only: include_usage adds a last chunk with the usage",
        json_schema={
            "type": "object",
            "properties": {f.name: f.document() for f in _STREAM_OPTIONS},
            "additionalProperties": False,
        },
        reader=_stream_options,
    ),
    Boolean("ignore_eos", "extension: generate max_tokens tokens, past the end-of-sequence token"),
    Choice(
        "router_mode",
        "extension: this request's routing mode (default: the server's --router-mode)",
        choices=ROUTING_MODES,
        hint="or leave it out for the server's default",
    ),
    *SAMPLING_FIELDS,
    Accepted(
        "user",
        "an end-user id: names the request's tenant when it has no API key of its own "
        "(limited by the server's --tenant-* flags); changes nothing else",
        json_schema={"type": "string"},
    ),
    Accepted("metadata", "tags for the caller; changes nothing", json_schema={"type": "object"}),
    Accepted(
        "safety_identifier", "an end-user id; changes nothing", json_schema={"type": "string"}
    ),
    Accepted(
        "prompt_cache_key",
        "prefix caching is automatic here; changes nothing",
        json_schema={"type": "string"},
    ),
    Refused(
        "store",
        "storing completions for later retrieval",
        neutral=(False,),
        hint="dynask stores no completions; leave it out",
    ),
    Refused(
        "service_tier",
        "processing tier",
        neutral=("auto", "default"),
        hint="use 'auto' or 'default', or leave it out",
    ),
)

CHAT_FIELDS: tuple[Field, ...] = (
    Custom(
        "messages",
        "the conversation so far",
        json_schema={"type": "array", "minItems": 1, "items": MESSAGE_SCHEMA},
        reader=read_messages,
        required=True,
    ),
    *COMMON_FIELDS,
    *CHAT_LOGPROBS,
    # The tool fields are validated by ``tools.tool_request`` (the routes read them).
    Custom(
        "tools",
        "function tools the model may call",
        json_schema={"type": "array", "items": {"type": "object"}},
        reader=lambda value: value,
    ),
    Custom(
        "tool_choice",
        "none, auto, required, or {type: function, function: {name}}",
        json_schema={"oneOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
        reader=lambda value: value,
    ),
    Accepted(
        "parallel_tool_calls",
        "false: at most one tool call per reply",
        json_schema={"type": "boolean"},
    ),
    Refused("functions", "deprecated tool definitions", neutral=([],), hint=_NO_TOOLS),
    Refused("function_call", "deprecated tool choice", neutral=("none",), hint=_NO_TOOLS),
    Refused("modalities", "output modalities", neutral=(["text"],), hint="only text is served"),
    Refused("audio", "audio output", neutral=(), hint="only text is served"),
    Refused("prediction", "predicted outputs", neutral=()),
    Refused("reasoning_effort", "reasoning effort", neutral=()),
    Refused("verbosity", "reply verbosity", neutral=()),
    Refused("web_search_options", "web search", neutral=()),
)

_ONE_PROMPT_TEXT = {"type": "string", "minLength": 1}
_ONE_PROMPT_IDS = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0},
    "minItems": 1,
    "description": "token ids, each below the model's vocabulary size",
}

COMPLETION_FIELDS: tuple[Field, ...] = (
    Custom(
        "prompt",
        "the text to continue, or its token ids, or a list of those (a choice per prompt)",
        json_schema={
            "oneOf": [
                _ONE_PROMPT_TEXT,
                _ONE_PROMPT_IDS,
                {
                    "type": "array",
                    "items": {"oneOf": [_ONE_PROMPT_TEXT, _ONE_PROMPT_IDS]},
                    "minItems": 1,
                    "maxItems": MAX_PROMPTS,
                    "description": "several prompts: a choice (n of them) per prompt",
                },
            ]
        },
        reader=_prompts,
        required=True,
    ),
    *COMMON_FIELDS,
    *COMPLETION_CHOICES,
    Refused("suffix", "text after the completion", neutral=("",)),
)


# ---- reading a body -------------------------------------------------------------------------


def parse_chat(body: Any) -> GenerationRequest:
    values = read_body(CHAT_FIELDS, _object(body))
    request = _request(values, messages=values["messages"], prompt=None)
    features = sampling_features(values, chat=True)
    n = values["n"]
    return dataclasses.replace(request, sampling={**request.sampling, **features}, n=n, best_of=n)


def parse_completion(body: Any) -> GenerationRequest:
    values = read_body(COMPLETION_FIELDS, _object(body))
    prompts = values["prompt"]
    request = _request(values, messages=None, prompt=prompts[0])
    return dataclasses.replace(
        request,
        sampling={**request.sampling, **sampling_features(values, chat=False)},
        n=values["n"],
        best_of=best_of(values),
        echo=values["echo"],
        prompts=prompts,
    )


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("body", f"the request body must be a JSON object, not {type(body).__name__}")
    check_encodable(body)
    return body


def _request(
    values: dict[str, Any], messages: list[dict[str, Any]] | None, prompt: str | list[int] | None
) -> GenerationRequest:
    stream, options = values["stream"], values["stream_options"]
    if options is not None and not stream:
        raise invalid("stream_options", "'stream_options' is only allowed when 'stream' is true")
    return GenerationRequest(
        model=values["model"],
        messages=messages,
        prompt=prompt,
        max_tokens=values["max_completion_tokens"] or values["max_tokens"],
        sampling=_sampling(values),
        stream=stream,
        include_usage=bool(options and options["include_usage"]),
        router_mode=values["router_mode"],
        user=user if isinstance(user := values["user"], str) and user else None,
    )


def _sampling(values: dict[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {
        name: values[name] for name in ("temperature", "top_p", "seed") if values[name] is not None
    }
    if values["top_k"] is not None:
        sampling["top_k"] = max(0, values["top_k"])
    sampling["stop"] = values["stop"]
    sampling["ignore_eos"] = values["ignore_eos"]
    structured_output = parse_structured_output(values)  # response_format, guided_* …
    if structured_output is not None:
        sampling["structured_output"] = structured_output
    return sampling
