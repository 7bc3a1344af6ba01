"""Sampling features over HTTP with the official ``openai`` client: logprobs (chat and
completions shapes), ``n`` and ``best_of``, prompt lists, ``echo``, ``logit_bias``.

The server is the session's ``dynask run`` over the tiny random Llama (two engine actors).
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

MODEL = "tiny"
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def client(tiny_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server}/v1", api_key="unused", max_retries=0)


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_chat_logprobs_cover_the_content(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=_chat("logprobs, please"),
        max_tokens=9,
        logprobs=True,
        top_logprobs=3,
        **GREEDY,
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert reply.usage is not None and len(entries) == reply.usage.completion_tokens == 9
    assert b"".join(bytes(e.bytes or []) for e in entries).decode() == choice.message.content
    for entry in entries:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the likeliest
        assert entry.top_logprobs[0].logprob == entry.logprob <= 0.0


def test_streamed_chat_logprobs_equal_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        messages=_chat("stream them"),
        max_tokens=8,
        logprobs=True,
        top_logprobs=2,
        **GREEDY,
    )
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    assert whole.logprobs is not None and whole.logprobs.content is not None
    assert [e.token for e in streamed] == [e.token for e in whole.logprobs.content]
    assert [e.logprob for e in streamed] == pytest.approx(
        [e.logprob for e in whole.logprobs.content], abs=1e-4
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == whole.message.content
    )


def test_completion_logprobs_offsets_and_stream(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL, prompt="Offsets of", max_tokens=7, logprobs=2, **GREEDY
    )
    choice = client.completions.create(**kwargs).choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.text_offset is not None
    assert len(logprobs.tokens) == 7 and "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(7)]
    assert logprobs.top_logprobs is not None
    assert all(len(top) <= 2 and max(top.values()) <= 0.0 for top in logprobs.top_logprobs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    tokens = [
        t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens or []
    ]
    offsets = [
        o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset or []
    ]
    assert tokens == logprobs.tokens and offsets == logprobs.text_offset


def _prefix_hits(base: str) -> int:
    engines = httpx.get(f"{base}/v1/engines", timeout=30).json()
    return sum(int(e["stats"]["prefix_hit_tokens"]) for e in engines)


def test_n_choices_are_reproducible_distinct_and_share_the_prompt(
    client: openai.OpenAI, tiny_server: str
) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        messages=_chat("three different stories about owls"),
        max_tokens=6,
        n=3,
        seed=11,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    hits_before = _prefix_hits(tiny_server)
    first = client.chat.completions.create(**kwargs)
    hits_after = _prefix_hits(tiny_server)
    again = client.chat.completions.create(**kwargs)

    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert len(set(texts)) == 3 and texts == [c.message.content for c in again.choices]
    usage = first.usage
    assert usage is not None and usage.completion_tokens == 3 * 6
    prompt = usage.prompt_tokens  # counted once
    details = usage.prompt_tokens_details
    cached = details.cached_tokens or 0 if details else 0  # sibling 0's (the chat template)
    # Siblings 1 and 2 reuse every full block of the prompt that sibling 0 computed.
    assert hits_after - hits_before == cached + 2 * ((prompt - 1) // 16 * 16)


def test_streamed_n_choices_equal_the_whole_reply(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        prompt="Choices streamed",
        max_tokens=5,
        n=2,
        seed=3,
        temperature=0.8,
        extra_body={"ignore_eos": True},
    )
    whole = client.completions.create(**kwargs)
    chunks = list(
        client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == [c.text for c in whole.choices]
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 10


def test_a_prompt_list_with_echo(client: openai.OpenAI) -> None:
    prompts = ["The first", "A second one"]
    reply = client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=4, n=2, echo=True, **GREEDY
    )
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    alone = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=4, **GREEDY).choices[0].text
        for p in prompts
    ]
    assert [c.text for c in reply.choices] == [
        p + t for p, t in zip(prompts, alone, strict=True) for _ in range(2)
    ]
    assert reply.usage is not None and reply.usage.completion_tokens == 16


def test_best_of_returns_the_likeliest_candidate(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model=MODEL,
        prompt="Best of three",
        max_tokens=5,
        seed=21,
        temperature=1.0,
        extra_body={"ignore_eos": True},
    )
    candidates = client.completions.create(n=3, logprobs=0, **kwargs).choices
    best = client.completions.create(best_of=3, **kwargs)
    scored = max(
        candidates, key=lambda c: sum(c.logprobs.token_logprobs or []) if c.logprobs else 0
    )
    assert [c.text for c in best.choices] == [scored.text] and best.choices[0].logprobs is None
    assert best.usage is not None and best.usage.completion_tokens == 15  # all are billed


def test_logit_bias_forces_a_token(client: openai.OpenAI, tiny_server: str) -> None:
    reply = client.completions.create(
        model=MODEL, prompt="Anything", max_tokens=4, logit_bias={"5000": 100}, **GREEDY
    )
    forced = client.completions.create(
        model=MODEL, prompt=[5000] * 4, max_tokens=1, echo=True, **GREEDY
    )
    assert reply.choices[0].text == forced.choices[0].text[: len(reply.choices[0].text)]
    assert reply.usage is not None and reply.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"top_logprobs": 2}, "top_logprobs", "'top_logprobs' needs 'logprobs': true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "expected an integer in [0, 20]"),
        ({"presence_penalty": 2.5}, "presence_penalty", "expected a number in [-2, 2]"),
        ({"logit_bias": {"x": 1}}, "logit_bias", "'logit_bias' key 'x' is not a token id"),
        ({"logit_bias": {"999999": 1}}, "logit_bias", "names token id 999999"),
        ({"best_of": 2}, "best_of", "'best_of' is a completions parameter"),
    ],
)
def test_bad_sampling_fields_are_400(
    tiny_server: str, body: dict[str, Any], param: str, message: str
) -> None:
    request = {"model": MODEL, "messages": _chat("hi"), "max_tokens": 2, **body}
    response = httpx.post(f"{tiny_server}/v1/chat/completions", json=request, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"]
