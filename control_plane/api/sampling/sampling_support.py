"""Which engine kinds serve which sampling features; the rest are refused by name.

The built-in engine (``torch``), vLLM and ``openai`` (forwarded to a vLLM-compatible
server) serve them all. ``mocker``, ``echo`` and
``python`` make their tokens without logits, so a penalty, a bias, ``min_tokens`` or
logprobs would be silently meaningless there: each is a 400 naming the field and the
engine. Choices (``n``, ``best_of``, prompt lists, ``echo``) are separate engine
requests, so every kind serves them.
"""

from __future__ import annotations

from dynask.control_plane.api.errors import invalid
from dynask.control_plane.serving.request import GenerationRequest, ServedModel

LOGITS_ENGINES = frozenset({"torch", "vllm", "openai"})  # kinds that sample from logits
LOGITS_FEATURES = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "logprobs",
)


def check_sampling_support(model: ServedModel, request: GenerationRequest) -> None:
    """A 400 for the first feature the model's engines cannot serve, or a bad token id.

    Its actors' ``info.engine`` names their kind.
    """
    asked = [name for name in LOGITS_FEATURES if name in request.sampling]
    if not asked:
        return
    kinds = {actor.info.engine for actor in model.actors}
    unable = sorted(kinds - LOGITS_ENGINES)
    if unable:
        name = asked[0]
        raise invalid(
            name,
            f"'{name}' is not supported by out={unable[0]} (it samples no logits); "
            f"leave it out, or serve the model with out=torch or out=vllm",
        )
    vocab = len(model.tokenizer)
    bad = next((t for t, _ in request.sampling.get("logit_bias", ()) if t >= vocab), None)
    if bad is not None:
        raise invalid("logit_bias", f"'logit_bias' names token id {bad}, outside [0, {vocab})")
