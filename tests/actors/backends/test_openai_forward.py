"""``out=openai:URL`` without a server: its arguments, the engine spec, the request body
it sends and the stream events it reads. The engine against a real ``vllm serve`` is in
``tests/control_plane/serving/test_openai_forward.py``."""

from __future__ import annotations

import json

import pytest

from dynask.actors.api.outputs import TokenLogprob
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.structured_output import StructuredOutput
from dynask.actors.backends.openai_forward.args import ForwardArgs, api_base
from dynask.actors.backends.openai_forward.wire import (
    Chunk,
    UpstreamError,
    completion_body,
    parse_event,
    refusal,
)
from dynask.actors.runtime.engine_factory import EngineSpec, build_engine, parse_engine
from dynask.control_plane.cluster.plan import engine_spec
from dynask.control_plane.state.deployment import DeploymentSpec


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://gpu-1:8000", "http://gpu-1:8000/v1"),
        ("http://gpu-1:8000/", "http://gpu-1:8000/v1"),
        ("http://gpu-1:8000/v1", "http://gpu-1:8000/v1"),
        ("https://api.example.com/v1/", "https://api.example.com/v1"),
        ("http://10.0.0.2:8000/openai", "http://10.0.0.2:8000/openai/v1"),
    ],
)
def test_api_base_accepts_the_url_with_or_without_v1(url: str, base: str) -> None:
    assert api_base(url) == base


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("gpu-1:8000", "expected http(s)://HOST[:PORT][/v1]"),
        ("ftp://gpu-1", "expected http(s)://HOST[:PORT][/v1]"),
        ("http://", "expected http(s)://HOST[:PORT][/v1]"),
        ("http://gpu-1:8000/v1?key=x", "a query or fragment is not allowed"),
        ("http://gpu-1:70000", "Port out of range"),
    ],
)
def test_api_base_names_a_bad_url(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"out=openai:URL has URL") as refused:
        api_base(url)
    assert message in str(refused.value)


def test_parse_engine_splits_off_the_url() -> None:
    assert parse_engine("openai:http://gpu-1:8000/v1") == ("openai", "http://gpu-1:8000/v1")
    with pytest.raises(ValueError, match="names no server; write openai:URL"):
        parse_engine("openai")
    with pytest.raises(ValueError, match="out=openai:URL has URL 'gpu-1'"):
        parse_engine("openai:gpu-1")


def test_deployment_keeps_the_url_where_python_keeps_its_file() -> None:
    deployment = DeploymentSpec(
        name="remote",
        engine="openai",
        engine_file="http://gpu-1:8000/v1",
        engine_args={"kv_events_endpoint": "tcp://gpu-1:5557"},
    )
    spec = engine_spec(deployment)
    assert (spec.kind, spec.url, spec.python_file) == ("openai", "http://gpu-1:8000/v1", None)
    assert spec.engine_args == {"kv_events_endpoint": "tcp://gpu-1:5557"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"kind": "openai"}, "out=openai needs the server's address: write openai:URL"),
        (
            {"kind": "echo", "url": "http://x:1"},
            "EngineSpec 'url' has value 'http://x:1', but only out=openai takes a URL, "
            "not out=echo",
        ),
        (
            {"kind": "openai", "url": "http://x:1", "engine_args": {"dtype": "float32"}},
            "engine argument 'dtype' is not known to out=openai; known: api_key_env, "
            "block_size, connect_timeout_s, kv_events_endpoint, max_connections, "
            "max_model_len, read_timeout_s, upstream_model",
        ),
        (
            {"kind": "openai", "url": "http://x:1", "engine_args": {"block_size": 0}},
            "ForwardArgs 'block_size' has value 0; expected an int >= 1",
        ),
        (
            {"kind": "openai", "url": "http://x:1", "engine_args": {"read_timeout_s": 0.0}},
            "ForwardArgs 'read_timeout_s' has value 0.0; expected seconds > 0",
        ),
    ],
)
def test_engine_spec_refuses_by_name(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError) as refused:
        EngineSpec(**fields)  # type: ignore[arg-type]
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "endpoint", ["gpu-1:5557", "tcp://*:5557", "tcp://gpu-1", "udp://gpu-1:5557", "tcp://"]
)
def test_kv_events_endpoint_must_be_connectable(endpoint: str) -> None:
    with pytest.raises(ValueError, match="expected tcp://HOST:PORT"):
        ForwardArgs(kv_events_endpoint=endpoint)


def test_kv_events_endpoint_accepts_tcp_and_ipc() -> None:
    assert ForwardArgs(kv_events_endpoint="tcp://10.0.0.2:5557").kv_events_endpoint
    assert ForwardArgs(kv_events_endpoint="ipc:///tmp/vllm-kv").kv_events_endpoint


def test_a_server_that_does_not_answer_fails_the_build_with_its_address() -> None:
    from tests.control_plane.server_process import free_port

    url = f"http://127.0.0.1:{free_port()}"
    spec = EngineSpec("openai", url=url, engine_args={"connect_timeout_s": 2.0})
    with pytest.raises(RuntimeError, match=rf"out=openai: {url}/v1/models did not answer"):
        build_engine(spec)


def test_api_key_env_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynask.actors.backends.openai_forward.upstream import auth_headers

    monkeypatch.delenv("DYNASK_TEST_UPSTREAM_KEY", raising=False)
    with pytest.raises(ValueError, match="'DYNASK_TEST_UPSTREAM_KEY', which is not set"):
        auth_headers("DYNASK_TEST_UPSTREAM_KEY")
    monkeypatch.setenv("DYNASK_TEST_UPSTREAM_KEY", "sk-1")
    assert auth_headers("DYNASK_TEST_UPSTREAM_KEY") == {"Authorization": "Bearer sk-1"}


# ---- the request body ----------------------------------------------------------------


def test_a_plain_request_sends_only_openai_fields_and_return_token_ids() -> None:
    body = completion_body("m", [1, 2, 3], SamplingParams(max_tokens=16), 16)
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "temperature": 1.0,
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }


def test_every_sampling_field_is_forwarded_under_vllms_name() -> None:
    params = SamplingParams(
        max_tokens=50,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        seed=7,
        stop=("END", "\n\n"),
        stop_token_ids=(2,),
        ignore_eos=True,
        skip_special_tokens=False,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        logit_bias=((42, -100.0), (7, 3.5)),
        min_tokens=4,
        logprobs=3,
    )
    body = completion_body("m", [5], params, 30)
    assert {k: v for k, v in body.items() if k not in ("model", "prompt", "stream")} == {
        "max_tokens": 30,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "temperature": 0.7,
        "top_p": 0.9,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "seed": 7,
        "stop": ["END", "\n\n"],
        "logit_bias": {"42": -100.0, "7": 3.5},
        "logprobs": 3,
        "return_tokens_as_token_ids": True,
        "top_k": 20,
        "stop_token_ids": [2],
        "ignore_eos": True,
        "skip_special_tokens": False,
        "repetition_penalty": 1.1,
        "min_tokens": 4,
    }
    json.dumps(body)  # what httpx sends


def test_greedy_by_top_k_one_is_sent_as_temperature_zero() -> None:
    body = completion_body("m", [5], SamplingParams(temperature=0.8, top_k=1), 4)
    assert (body["temperature"], body["top_k"]) == (0.0, 1)


def test_refusals_name_the_field() -> None:
    assert refusal(SamplingParams()) is None
    grammar = SamplingParams(structured_output=StructuredOutput("json_object", ""))
    assert str(refusal(grammar)).startswith("'response_format' (structured outputs)")
    salted = SamplingParams(extra_keys=("lora-a",))
    assert str(refusal(salted)).startswith("'extra_keys' (LoRA adapters, cache salts)")


# ---- the stream events ---------------------------------------------------------------


def _event(**choice: object) -> str:
    return json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": "", **choice}]})


def test_a_token_event() -> None:
    chunk = parse_event(_event(text=" Paris", token_ids=[7042], finish_reason=None), None)
    assert chunk == Chunk(token_ids=(7042,), text=" Paris")


def test_the_last_token_event_and_the_usage_event() -> None:
    last = parse_event(_event(text=".", token_ids=[30], finish_reason="length"), None)
    usage = json.dumps(
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 96,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
        }
    )
    assert last == Chunk(token_ids=(30,), text=".", finish_reason="length")
    assert parse_event(usage, None) == Chunk(
        prompt_tokens=96, completion_tokens=2, cached_tokens=64
    )
    no_details = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
    assert parse_event(no_details, None) == Chunk(prompt_tokens=3, completion_tokens=1)


def test_done_ends_the_stream() -> None:
    assert parse_event(" [DONE]", None) is None


def test_a_text_only_server_is_read_as_text() -> None:
    assert parse_event(_event(text="hi"), None) == Chunk(token_ids=None, text="hi")


def test_logprobs_come_as_token_ids_and_keep_the_top_k() -> None:
    logprobs = {
        "tokens": ["token_id:7042"],
        "token_logprobs": [-0.25],
        "top_logprobs": [{"token_id:260": -2.75, "token_id:7042": -0.25, "token_id:9": -3.0}],
    }
    chunk = parse_event(_event(text=" Paris", token_ids=[7042], logprobs=logprobs), 2)
    assert chunk is not None
    assert chunk.logprobs == (TokenLogprob(7042, -0.25, ((7042, -0.25), (260, -2.75))),)


def test_logprobs_named_as_text_are_refused() -> None:
    logprobs = {"tokens": [" Paris"], "token_logprobs": [-0.25], "top_logprobs": [{}]}
    with pytest.raises(UpstreamError, match="honours return_tokens_as_token_ids"):
        parse_event(_event(token_ids=[7042], logprobs=logprobs), 1)


def test_error_events_and_garbage_raise_with_the_servers_message() -> None:
    error = json.dumps({"error": {"message": "out of KV blocks", "code": 500}})
    with pytest.raises(UpstreamError, match="mid-stream: out of KV blocks"):
        parse_event(error, None)
    with pytest.raises(UpstreamError, match="not JSON"):
        parse_event("{oops", None)
    with pytest.raises(UpstreamError, match="not an object"):
        parse_event("[1, 2]", None)


def test_the_context_is_at_most_the_servers() -> None:
    from dynask.actors.backends.openai_forward.upstream import context_length

    assert context_length(None, 2048) == 2048
    assert context_length(1024, 2048) == 1024
    assert context_length(4096, 2048) == 2048
    assert context_length(None, None) == 8192  # backend_kit's default: the server says nothing
    assert context_length(512, None) == 512
