"""Which engines can constrain output to a grammar, and the refusal for the others.

The request fields are parsed and the grammar checked in ``api/structured_output_fields``;
what depends on the model is checked here, when the request is prepared: a model served
by ``out=echo``, ``out=mocker`` or ``out=python`` cannot follow a grammar, so such a
request is refused before it reaches an actor.
"""

from __future__ import annotations

from dynask.control_plane.serving.errors import InvalidRequestError

# The engines that constrain their output to a grammar (``ActorInfo.engine``).
SERVING_ENGINES = ("torch", "vllm")


class StructuredOutputUnsupportedError(InvalidRequestError):
    """The model's engines cannot constrain output to a grammar (a 400)."""

    def __init__(self, message: str) -> None:
        super().__init__("response_format", message)
        self.code = "structured_output_unsupported"


def refuse_unless_served(engines: list[str]) -> None:
    """Raises unless every engine of the model constrains output to a grammar."""
    unserved = sorted({kind for kind in engines if kind not in SERVING_ENGINES})
    if unserved:
        kinds = ", ".join(f"out={kind}" for kind in unserved)
        raise StructuredOutputUnsupportedError(
            f"this model is served by {kinds}, which cannot constrain its output to a grammar; "
            "structured outputs (response_format json_object/json_schema, guided_*, "
            "structured_outputs) need out=torch or out=vllm"
        )
