"""What enters an engine besides a sequence: the prompt check every engine applies before
a request enters, and the abort item of an engine's inbox.

Torch-free, so the backends without a model (echo, python, openai) and the control plane
can use them without loading torch.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass


@dataclass(frozen=True)
class AbortRequest:
    """An engine inbox item: cancel ``request_id`` at the start of the next step."""

    request_id: str


def check_prompt(prompt: list[int], max_model_len: int, vocab_size: int) -> list[int]:
    """The prompt as plain ints; ``ValueError`` (as the built-in engine words it) if bad.

    Prompts run to 100k+ ids, so the conversion and the range check stay in C (an
    ``array`` of them, numpy's ``min``/``max``): per element in Python they cost ~2 ms per
    1k ids.
    """
    try:
        packed: array[int] | None = array("q", prompt)
    except (TypeError, OverflowError):  # floats, numpy scalars, huge ints: one by one
        packed = None
    ids = [int(t) for t in prompt] if packed is None else packed.tolist()
    if not ids:
        raise ValueError("the prompt is empty; send at least one token")
    if len(ids) >= max_model_len:
        raise ValueError(
            f"the prompt has {len(ids)} tokens, but this engine's context is "
            f"{max_model_len} tokens (prompt plus output); shorten the prompt"
        )
    if packed is None:
        low, high = min(ids), max(ids)
    else:  # in C: 0.7 ms less per 20k ids than min() and max() of the list
        import numpy as np  # here: importing this module stays cheap for the control plane

        values = np.frombuffer(packed, dtype=np.int64)
        low, high = int(values.min()), int(values.max())
    if low < 0 or high >= vocab_size:
        bad = next(t for t in ids if not 0 <= t < vocab_size)
        raise ValueError(f"prompt token id {bad} is outside the vocabulary [0, {vocab_size})")
    return ids
