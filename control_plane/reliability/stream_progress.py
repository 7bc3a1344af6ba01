"""What the client of one request has received so far: the point a moved request resumes at.

A delta can carry tokens whose text the engine still holds (the first bytes of a
multi-byte character). Such deltas wait here until a later delta carries text (or the
request ends): if the actor is lost meanwhile, the next actor generates those tokens
again and shows their text, and the client never got them twice. So every token the
client has is one the resumed request keeps in its prompt, and each is counted once
(``dynask_output_tokens``, usage).
"""

from __future__ import annotations

import dataclasses

from dynask.actors.api.outputs import RequestOutput


@dataclasses.dataclass
class StreamProgress:
    """The tokens and text one request's client has, and the deltas held back from it."""

    prompt_ids: list[int]
    max_tokens: int
    sent: list[int] = dataclasses.field(default_factory=list)  # token ids handed out
    text: list[str] = dataclasses.field(default_factory=list)  # text handed out
    held: list[RequestOutput] = dataclasses.field(default_factory=list)  # not out yet

    def release(self, outputs: list[RequestOutput]) -> list[RequestOutput]:
        """The deltas that may go to the client now (through the last one that carries
        text, or the final one); the rest wait for the next call."""
        if not self.held and outputs and (outputs[-1].text or outputs[-1].finished):
            out = outputs  # the common case, once per streamed token: nothing is held back
        else:
            self.held.extend(outputs)
            out = self._releasable()
        for output in out:
            self.sent.extend(output.token_ids)
            self.text.append(output.text)
        return out

    def _releasable(self) -> list[RequestOutput]:
        cut = max(
            (i + 1 for i, output in enumerate(self.held) if output.text or output.finished),
            default=0,
        )
        out, self.held = self.held[:cut], self.held[cut:]
        return out

    def drop_held(self) -> None:
        """Forgets the held deltas: their actor is lost and the next one regenerates them."""
        self.held.clear()

    def resume_prompt(self) -> list[int]:
        return self.prompt_ids + self.sent

    @property
    def shown_text(self) -> str:
        return "".join(self.text)

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.sent)
