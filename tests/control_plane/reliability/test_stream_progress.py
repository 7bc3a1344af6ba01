"""Where a moved request resumes, and the text across the point (no cluster needed)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from dynask.actors.api.outputs import FinishReason, RequestOutput, Usage
from dynask.actors.api.sampling_params import SamplingParams
from dynask.control_plane.reliability.migration import whole_request_usage
from dynask.control_plane.reliability.resume_text import StopCarry, held_back_text
from dynask.control_plane.reliability.stream_progress import StreamProgress


def _delta(text: str, *tokens: int) -> RequestOutput:
    return RequestOutput("r", text, tokens)


def test_deltas_without_text_wait_for_the_next_text() -> None:
    progress = StreamProgress(prompt_ids=[1, 2, 3], max_tokens=10)
    first = progress.release([_delta("a", 11), _delta("b", 12), _delta("", 13)])
    second = progress.release([_delta("", 14)])  # half a character, held back

    assert [o.token_ids for o in first] == [(11,), (12,)] and second == []
    assert progress.sent == [11, 12] and progress.shown_text == "ab"
    assert progress.resume_prompt() == [1, 2, 3, 11, 12]
    assert progress.remaining == 8  # 13 and 14 are generated again, then their text shows


def test_held_deltas_go_out_with_the_text_that_follows_them() -> None:
    progress = StreamProgress(prompt_ids=[1], max_tokens=4)
    progress.release([_delta("", 5)])
    released = progress.release([_delta("é", 6)])

    assert [o.token_ids for o in released] == [(5,), (6,)]
    assert progress.resume_prompt() == [1, 5, 6] and progress.remaining == 2


def test_the_final_delta_goes_out_without_text() -> None:
    progress = StreamProgress(prompt_ids=[1], max_tokens=4)
    final = RequestOutput("r", "", (7,), FinishReason.STOP, usage=Usage(1, 1, 0))
    assert progress.release([final]) == [final]


def test_a_lost_actors_held_deltas_are_dropped() -> None:
    progress = StreamProgress(prompt_ids=[1], max_tokens=10)
    progress.release([_delta("a", 11), _delta("", 12)])
    progress.drop_held()  # moved: 12 is generated again by the next actor
    progress.release([_delta("bc", 12), _delta("", 13)])
    progress.drop_held()  # moved again

    assert progress.sent == [11, 12]
    assert progress.resume_prompt() == [1, 11, 12] and progress.remaining == 8


def test_a_resumed_requests_usage_counts_the_whole_request() -> None:
    progress = StreamProgress(prompt_ids=[1, 2, 3], max_tokens=10)
    final = RequestOutput("r-m1", "z", (9,), FinishReason.LENGTH, usage=Usage(7, 6, 5))

    usage = whole_request_usage(final, progress).usage

    assert usage == Usage(prompt_tokens=3, completion_tokens=10, cached_tokens=3)


def test_held_back_text_is_what_the_tokens_say_beyond_what_was_shown(
    tokenizer_folder: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    prompt = tokenizer.encode("Say it:")
    output = tokenizer.encode(" hello world")

    assert held_back_text(tokenizer, prompt, output, " hello wor") == "ld"
    assert held_back_text(tokenizer, prompt, output, " hello world") == ""
    assert held_back_text(tokenizer, prompt, output, " goodbye") == ""  # not a prefix: none
    cut = tokenizer.encode("𝄞")[:2]  # two of the three tokens of one character
    assert held_back_text(tokenizer, prompt, output + cut, " hello world") == ""


def test_a_stop_string_straddling_the_migration_point_ends_the_request() -> None:
    carry = StopCarry("a", ("ab",))  # the lost engine held back "a"
    usage = Usage(3, 5, 0)

    out = carry.apply(RequestOutput("r-m1", "bcd", (40,)), usage)

    assert (out.text, out.finish_reason, out.stop_reason, out.usage) == (
        "",
        FinishReason.STOP,
        "ab",
        usage,
    )


def test_held_back_text_shows_when_it_does_not_become_a_stop_string() -> None:
    carry = StopCarry("a", ("ab", "xyz"))
    first = carry.apply(RequestOutput("r-m1", "cx", (40,)), Usage(3, 5, 0))
    second = carry.apply(RequestOutput("r-m1", "y", (41,)), Usage(3, 6, 0))
    final = carry.apply(
        RequestOutput("r-m1", "w", (42,), FinishReason.LENGTH, usage=Usage(3, 7, 0)),
        Usage(3, 7, 0),
    )

    assert [first.text, second.text, final.text] == ["ac", "", "xyw"]
    assert final.finish_reason is FinishReason.LENGTH and final.usage == Usage(3, 7, 0)


def test_greedy_means_temperature_zero_or_top_k_one() -> None:
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=0.7, top_k=1).greedy
    assert not SamplingParams(temperature=0.7, seed=3).greedy
    assert not SamplingParams().greedy  # the default temperature is 1
