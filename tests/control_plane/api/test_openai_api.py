"""The OpenAI API end to end: the official ``openai`` client against a real server.

The server is ``dynask run`` in its own process: an embedded LocalCluster of two worker
processes, one engine actor each, the tiny random Llama model.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

MODEL = "tiny"
PROMPT = [{"role": "user", "content": "Tell me a story about a fox."}]


@pytest.fixture(scope="module")
def client(tiny_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_chat_completion_with_usage(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=7, temperature=0, extra_body={"ignore_eos": True}
    )

    assert reply.object == "chat.completion" and reply.model == MODEL
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and reply.usage.completion_tokens == 7
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 7


def test_streamed_chat_equals_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs = dict(
        model=MODEL, messages=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    whole = client.chat.completions.create(**kwargs)  # type: ignore[call-overload]

    chunks = list(
        client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
    )  # type: ignore[call-overload]

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12


def test_completions_streaming_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=6,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    streamed = client.completions.create(
        model=MODEL,
        prompt="Once upon a time",
        max_tokens=6,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )

    assert whole.object == "text_completion" and whole.usage is not None
    assert whole.usage.completion_tokens == 6
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text


def test_seed_gives_the_same_sample(client: openai.OpenAI) -> None:
    def sample() -> str | None:
        reply = client.completions.create(
            model=MODEL,
            prompt="Hello",
            max_tokens=10,
            seed=7,
            temperature=1.0,
            extra_body={"ignore_eos": True},
        )
        return reply.choices[0].text

    assert sample() == sample()


def test_concurrent_streams_each_get_their_own_tokens(
    client: openai.OpenAI, tiny_server: str
) -> None:
    prompts = [f"Request number {i} says" for i in range(8)]
    expected = [
        client.completions.create(
            model=MODEL, prompt=p, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
        for p in prompts
    ]

    async def stream_all() -> list[str]:
        aclient = openai.AsyncOpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0)

        async def one(prompt: str) -> str:
            stream = await aclient.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=10,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            return "".join([c.choices[0].text async for c in stream])

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    assert asyncio.run(stream_all()) == expected


def test_client_disconnect_aborts_and_frees_blocks(tiny_server: str) -> None:
    body = {
        "model": MODEL,
        "prompt": "Go on forever",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }

    def generated() -> dict[str, int]:  # per engine, since it started (earlier tests count)
        engines = httpx.get(f"{tiny_server}/v1/engines", timeout=10).json()
        return {e["name"]: e["stats"]["generated_tokens"] for e in engines}

    before = generated()
    with httpx.stream("POST", f"{tiny_server}/v1/completions", json=body, timeout=30) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in received)

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        engines = httpx.get(f"{tiny_server}/v1/engines", timeout=10).json()
        if all(e["stats"]["num_running"] == 0 and e["stats"]["kv_usage"] == 0.0 for e in engines):
            break
        time.sleep(0.2)
    assert [(e["stats"]["num_running"], e["stats"]["kv_usage"]) for e in engines] == [(0, 0.0)] * 2
    after = generated()
    assert max(after[engine] - before[engine] for engine in before) < 400


def test_health_live_metrics_openapi(tiny_server: str) -> None:
    health = httpx.get(f"{tiny_server}/health").json()
    assert health["status"] == "ready" and len(health["engines"]) == 2
    ready = httpx.get(f"{tiny_server}/ready").json()
    assert ready == {
        "status": "ready",
        "deployments": [{"name": "default", "replicas": 2, "ready": 2}],
    }
    assert httpx.get(f"{tiny_server}/live").json() == {"status": "live"}
    metrics = httpx.get(f"{tiny_server}/metrics").text
    assert 'dynask_requests_total{endpoint="chatcmpl",model="tiny",status="ok"}' in metrics
    assert "dynask_time_to_first_token_seconds_bucket" in metrics
    paths = httpx.get(f"{tiny_server}/openapi.json").json()["paths"]
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(paths)


# ---- bad requests: OpenAI-shaped 4xx, never reaching an actor ------------------------------


def _post(base: str, path: str, content: bytes | str) -> httpx.Response:
    return httpx.post(
        f"{base}{path}", content=content, headers={"content-type": "application/json"}
    )


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-9", messages=PROMPT)
    error = caught.value.body
    assert isinstance(error, dict) and error["code"] == "model_not_found"
    assert "the model 'gpt-9' does not exist" in error["message"] and "tiny" in error["message"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ('{"model": "tiny", "messages": [', "body", "the request body is not valid JSON"),
        (
            '{"model": "tiny", "messages": [], "max_tokens": 5}',
            "messages",
            "'messages' must be a non-empty array",
        ),
        (
            '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}',
            "max_tokens",
            "'max_tokens' has value -3; expected an integer >= 1",
        ),
        (
            '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
            '"temperature": "hot"}',
            "temperature",
            "'temperature' has value 'hot'; expected a number in [0, 2]",
        ),
        (
            '{"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]}',
            "messages[0].role",
            "'messages[0].role' has value 'robot'",
        ),
        (
            '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 17}',
            "n",
            "'n' has value 17; expected an integer in [1, 16]",
        ),
        (
            '{"model": 5, "messages": [{"role": "user", "content": "hi"}]}',
            "model",
            "'model' is required",
        ),
        ("[1, 2]", "body", "the request body must be a JSON object"),
    ],
)
def test_bad_chat_requests_are_400(tiny_server: str, body: str, param: str, message: str) -> None:
    response = _post(tiny_server, "/v1/chat/completions", body)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message in error["message"]


def test_prompt_longer_than_the_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[5] * 600, max_tokens=4)
    assert "this model's context is 512 tokens, but the prompt has 600 tokens" in str(caught.value)


def test_max_tokens_beyond_the_context_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[5] * 500, max_tokens=50)
    assert "ask for at most 12 tokens" in str(caught.value)


def test_unknown_route_is_an_openai_shaped_404(tiny_server: str) -> None:
    response = httpx.get(f"{tiny_server}/v1/nothing")
    assert response.status_code == 404
    assert json.loads(response.text)["error"]["code"] == "http_404"


def test_stop_string_ends_the_reply_before_it(client: openai.OpenAI) -> None:
    kwargs = dict(
        model=MODEL,
        prompt="The weather today",
        max_tokens=20,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    full = client.completions.create(**kwargs).choices[0].text  # type: ignore[call-overload]
    start = next(i for i in range(4, len(full) - 3) if full[i : i + 3] not in full[: i + 2])
    stop = full[start : start + 3]

    stopped = client.completions.create(stop=[stop], **kwargs).choices[0]  # type: ignore[call-overload]

    assert stopped.text == full[: full.index(stop)]
    assert stopped.finish_reason == "stop"


# ---- inputs found by schemathesis (test_fuzz_openapi.py): 4xx, never a 5xx -------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "seed",
            2**70,
            "'seed' has value 1180591620717411303424; expected an integer in "
            "[-9223372036854775808, 9223372036854775807]",
        ),
        (
            "seed",
            -(2**63) - 1,
            "'seed' has value -9223372036854775809; expected an integer in "
            "[-9223372036854775808, 9223372036854775807]",
        ),
        (
            "top_k",
            2**70,
            "'top_k' has value 1180591620717411303424; expected an integer in "
            "[-1, 9223372036854775807]",
        ),
        ("max_tokens", 2**70, "max_tokens is 1180591620717411303424; ask for at most 511 tokens"),
    ],
)
def test_out_of_range_integers_are_400(
    tiny_server: str, field: str, value: int, message: str
) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: value}

    response = httpx.post(f"{tiny_server}/v1/completions", json=body, timeout=30)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    overflow = field == "max_tokens"  # beyond the context: OpenAI's code for that (issue 16)
    assert error["param"] == field
    assert error["code"] == ("context_length_exceeded" if overflow else "invalid_value")
    assert message in error["message"]


def test_deeply_nested_json_is_400(tiny_server: str) -> None:
    response = _post(tiny_server, "/v1/completions", "[" * 100_000 + "]" * 100_000)

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("body", "invalid_json")
    assert "nested too deeply" in error["message"]


def test_integral_floats_are_integers(tiny_server: str) -> None:
    # JSON Schema (and so /openapi.json) counts 3.0 as an integer; schemathesis sent such
    # values for top_k and seed and got a 400.
    body = {
        "model": MODEL,
        "prompt": [1.0, 2.0],
        "max_tokens": 3.0,
        "top_k": 5.0,
        "seed": 7.0,
        "ignore_eos": True,
    }

    response = httpx.post(f"{tiny_server}/v1/completions", json=body, timeout=30)

    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (2, 3)
