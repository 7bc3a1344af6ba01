"""The request types of the serving pipeline: asked for, then prepared for an actor.

``GenerationRequest`` is what a front end asks for (the HTTP layer builds it from an
OpenAI body in ``api/request_schema``; ``in=text`` and ``in=batch`` build it directly).
``PreparedRequest`` is it tokenized and checked against its model, with its sampling
parameters built and validated once. ``ServedModel`` is a model and its actors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from dynask.actors.api.sampling_params import SamplingParams
from dynask.control_plane.routing.model_routing import ModelRouting
from dynask.control_plane.serving.actor_handle import ActorHandle
from dynask.control_plane.state.deployment import Role


@dataclass(frozen=True)
class GenerationRequest:
    """What the control plane needs from a chat or completions request."""

    model: str
    messages: list[dict[str, Any]] | None  # chat
    prompt: str | list[int] | None  # completions
    max_tokens: int | None
    sampling: dict[str, Any]  # keyword arguments of SamplingParams (without max_tokens)
    stream: bool
    include_usage: bool
    router_mode: str | None = None  # None: the server's default
    prompt_field: str | None = None  # the field errors about the prompt name (chat: messages)
    user: str | None = None  # the ``user`` field: names the tenant of a request without a key

    @property
    def prompt_param(self) -> str:
        """The request field the prompt came from, named by errors about its length."""
        if self.prompt_field is not None:
            return self.prompt_field
        return "messages" if self.messages is not None else "prompt"

    n: int = 1  # choices per prompt
    best_of: int = 1  # completions: candidates per prompt, the best n returned (>= n)
    echo: bool = False  # completions: the prompt's text before each choice's
    prompts: tuple[str | list[int], ...] = ()  # completions: every prompt of a list

    def text_bytes(self) -> int:
        """UTF-8 bytes of the prompt's text (0 for token ids): a cheap bound on its tokens."""
        if self.messages is not None:
            return sum(_content_bytes(m.get("content")) for m in self.messages)
        return len(self.prompt.encode()) if isinstance(self.prompt, str) else 0


@dataclass
class ServedModel:
    name: str
    tokenizer: Any
    routing: ModelRouting
    actors: list[ActorHandle] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))
    # For the sampling fields a request leaves out (its engine's generation config).
    sampling_defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def max_model_len(self) -> int:
        return min(a.max_model_len for a in self.actors) if self.actors else 0

    @property
    def prefill_actors(self) -> list[ActorHandle]:
        return [a for a in self.actors if a.role == Role.PREFILL]

    @property
    def serving_actors(self) -> list[ActorHandle]:
        """The actors requests are routed to: all but the prefill-only ones (or, if a
        model has nothing else, those too, prefilling and decoding by themselves)."""
        return [a for a in self.actors if a.role != Role.PREFILL] or self.actors


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request turned into what an actor takes."""

    request_id: str
    model: ServedModel
    prompt_ids: list[int]
    params: SamplingParams  # built and validated once, by ``ServingService.prepare``
    router_mode: str | None = None  # the request's own choice; None: the server's


def _content_bytes(content: Any) -> int:
    """UTF-8 bytes of a message's text: a string, a list of parts, or none (tool calls)."""
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):
        return sum(_content_bytes(part.get("text")) for part in content if isinstance(part, dict))
    return 0
