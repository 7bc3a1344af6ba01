"""``<think>`` blocks to reasoning, whole and split at every character."""

from __future__ import annotations

import pytest

from dynask.control_plane.api.reasoning import ReasoningStream, prompt_opens_block


def _split(text: str, step: int, opens: bool = False) -> tuple[str, str]:
    stream = ReasoningStream(opens)
    reasoning = content = ""
    for start in range(0, len(text), step):
        delta = stream.feed(text[start : start + step])
        reasoning, content = reasoning + delta.reasoning, content + delta.content
    rest = stream.finish()
    return reasoning + rest.reasoning, content + rest.content


@pytest.mark.parametrize("step", [1, 2, 7, 1000])
@pytest.mark.parametrize(
    ("text", "opens", "expected"),
    [
        ("<think>Paris is in France.</think>\n\nParis.", False, ("Paris is in France.", "Paris.")),
        ("\n<think>a < b</think>c", False, ("a < b", "c")),
        ("Just text <think> later", False, ("", "Just text <think> later")),
        ("<thin", False, ("", "<thin")),
        ("I reason.</think>The answer.", True, ("I reason.", "The answer.")),
        ("Never closed <", True, ("Never closed <", "")),
    ],
)
def test_reasoning_split(text: str, opens: bool, expected: tuple[str, str], step: int) -> None:
    assert _split(text, step, opens) == expected


def test_template_that_opens_the_block() -> None:
    assert prompt_opens_block("<｜Assistant｜><think>\n")
    assert not prompt_opens_block("<|im_start|>assistant\n")
