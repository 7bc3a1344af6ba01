"""Token-id prompts take a path in C (type and range checks over the whole array), and
still read and refuse exactly as the per-id path does."""

from __future__ import annotations

import pytest

from dynask.actors.api.engine_inputs import check_prompt
from dynask.control_plane.api.errors import APIError
from dynask.control_plane.api.request_fields import check_encodable
from dynask.control_plane.api.request_schema import parse_completion


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ([7, 3, 0], [7, 3, 0]),
        ([7.0, 3], [7, 3]),  # 7.0 is an integer (JSON Schema)
        ([[1, 2], [3]], [1, 2]),  # several prompts: the first is the request's
    ],
)
def test_token_ids_are_read_as_ints(prompt: list[object], expected: list[int]) -> None:
    read = parse_completion({"model": "m", "prompt": prompt}).prompt

    assert read == expected and all(type(t) is int for t in read)


@pytest.mark.parametrize("prompt", [[1, True], [1, 2.5], [1, "2"], [1, None]])
def test_a_token_id_array_with_a_non_integer_is_refused(prompt: list[object]) -> None:
    with pytest.raises(APIError) as caught:
        parse_completion({"model": "m", "prompt": prompt})

    assert (caught.value.status, caught.value.param) == (400, "prompt")


def test_a_list_of_numbers_is_passed_over_and_the_string_after_it_is_found() -> None:
    body = {"prompt": [1, 2.0, True, None], "stop": ["ok", "\ud800"]}

    with pytest.raises(APIError) as caught:
        check_encodable(body)

    assert (caught.value.param, caught.value.code) == ("stop[1]", "invalid_encoding")


@pytest.mark.parametrize(
    ("prompt", "expected"), [([5, 0, 7], [5, 0, 7]), ((5.0, 1), [5, 1]), ([True, 2], [1, 2])]
)
def test_the_engine_takes_any_integers_as_plain_ints(
    prompt: list[object], expected: list[int]
) -> None:
    ids = check_prompt(prompt, max_model_len=16, vocab_size=8)  # type: ignore[arg-type]

    assert ids == expected and all(type(t) is int for t in ids)


@pytest.mark.parametrize(("prompt", "bad"), [([5, 9, -1], 9), ([5, -1, 9], -1), ([8], 8)])
def test_the_engine_names_the_first_id_outside_the_vocabulary(prompt: list[int], bad: int) -> None:
    with pytest.raises(
        ValueError, match=rf"^prompt token id {bad} is outside the vocabulary \[0, 8\)$"
    ):
        check_prompt(prompt, max_model_len=16, vocab_size=8)


def test_an_id_too_big_for_64_bits_is_named_as_outside_the_vocabulary() -> None:
    with pytest.raises(ValueError, match=r"^prompt token id 18446744073709551616 is outside"):
        check_prompt([3, 2**64], max_model_len=16, vocab_size=8)
