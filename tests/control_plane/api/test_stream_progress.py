"""Where a moved request resumes, and what it may resume as (no cluster needed)."""

from __future__ import annotations

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.control_plane.reliability.migration import (
    StreamProgress,
    whole_request_usage,
)


def _delta(text: str, *tokens: int) -> RequestOutput:
    return RequestOutput("r", text, tokens)


def test_the_resume_point_is_after_the_last_delta_that_showed_text() -> None:
    progress = StreamProgress(prompt_ids=[1, 2, 3], max_tokens=10)
    progress.note([_delta("a", 11), _delta("b", 12)])
    progress.note([_delta("", 13), _delta("", 14)])  # half a character, held back

    assert progress.sent == [11, 12, 13, 14]
    assert progress.shown == 2
    assert progress.resume_prompt() == [1, 2, 3, 11, 12]
    assert progress.remaining == 8  # 13 and 14 are generated again, then their text shows


def test_a_second_move_resumes_from_what_the_client_saw_after_the_first() -> None:
    progress = StreamProgress(prompt_ids=[1], max_tokens=10)
    progress.note([_delta("a", 11), _delta("", 12)])
    progress.rewind()  # moved: 12 is generated again by the next actor
    progress.note([_delta("bc", 12), _delta("", 13)])
    progress.rewind()  # moved again

    assert progress.sent == [11, 12]
    assert progress.resume_prompt() == [1, 11, 12] and progress.remaining == 8


def test_text_after_held_back_tokens_moves_the_resume_point_past_them() -> None:
    progress = StreamProgress(prompt_ids=[1], max_tokens=4)
    progress.note([_delta("", 5), _delta("é", 6)])

    assert progress.resume_prompt() == [1, 5, 6] and progress.remaining == 2


def test_greedy_means_temperature_zero_or_top_k_one() -> None:
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=0.7, top_k=1).greedy
    assert not SamplingParams(temperature=0.7, seed=3).greedy
    assert not SamplingParams().greedy  # the default temperature is 1


def test_a_resumed_requests_usage_counts_the_whole_request() -> None:
    progress = StreamProgress(prompt_ids=[1, 2, 3], max_tokens=10)
    final = RequestOutput("r-m1", "z", (9,), FinishReason.LENGTH, usage=Usage(7, 6, 5))

    usage = whole_request_usage(final, progress).usage

    assert usage == Usage(prompt_tokens=3, completion_tokens=10, cached_tokens=3)
