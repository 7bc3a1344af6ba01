"""Engines that sample no logits refuse the logits features by name (out=echo here).

``out=echo`` makes its tokens from the prompt: a penalty, a bias, ``min_tokens`` or
logprobs would mean nothing there, so each is a 400 naming the field and the engine;
``n`` (separate engine requests) is served.
"""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.slow  # a real server
MODEL = "tiny"


@pytest.fixture(scope="module")
def client(echo_server: str) -> openai.OpenAI:
    """The session's ``dynask run out=echo``, serving ``tiny``."""
    return openai.OpenAI(base_url=f"{echo_server}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("presence_penalty", 0.5),
        ("frequency_penalty", -0.5),
        ("repetition_penalty", 1.2),
        ("logit_bias", {"17": 3}),
        ("min_tokens", 2),
        ("logprobs", True),
    ],
)
def test_logits_features_are_refused_by_name(
    client: openai.OpenAI, field: str, value: object
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            extra_body={field: value},
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == field
    assert f"'{field}' is not supported by out=echo" in error["message"]


def test_n_is_served(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="one two three", max_tokens=3, n=2)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.choices[0].text == reply.choices[1].text  # echo: the prompt's own tokens
