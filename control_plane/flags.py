"""Command-line options declared once, on the options dataclasses' own fields.

An options class (``RoutingOptions``, ``ReliabilityOptions``, ``DisaggOptions``,
``PlannerConfig``, ``ServerOptions``) marks a field as a flag with ``flag(...)``: the
field's default is the flag's default, and the flag's name, help and argument type sit
beside it. The CLI builds its argument groups from the class (``add_flags``) and the
options object from the parsed arguments (``options_from``), so an option is written in
one place instead of three (field, ``add_argument``, args → options).

The argument types here name the bad value they refuse, as argparse prints it:
``argument --max-queue: has value '0'; expected an integer >= 1``.
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

OptionsT = TypeVar("OptionsT")
_KEY = "dynask_flag"
NO_LIMIT = "none"


@dataclass(frozen=True)
class Flag:
    """How one option appears on the command line. ``help`` may say ``{default}`` (or
    ``{default:g}``): it becomes the default the option is added with."""

    name: str  # "--migration-limit"
    help: str | None = None
    type: Callable[[str], Any] | None = None
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    action: str | builtins.type[argparse.Action] | None = None  # "store_true", ...

    @property
    def dest(self) -> str:
        """The attribute argparse stores it under (``--kv-transport`` → ``kv_transport``)."""
        return self.name.lstrip("-").replace("-", "_")

    def add_to(self, group: Any, default: Any, *, help: str | None = None) -> None:
        """Adds the option to an argparse parser or group, with ``default``."""
        kwargs: dict[str, Any] = {"default": default}
        text = help or self.help
        if text:
            # "{default}" in a help text is the default it is added with: written once.
            kwargs["help"] = text.format(default=default) if "{default" in text else text
        if self.type is not None:
            kwargs["type"] = self.type
        if self.choices is not None:
            kwargs["choices"] = self.choices() if callable(self.choices) else self.choices
        if self.action is not None:
            kwargs["action"] = self.action
        group.add_argument(self.name, **kwargs)


def flag(
    name: str,
    default: Any,
    help: str | None = None,
    *,
    type: Callable[[str], Any] | None = None,
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
    action: str | type[argparse.Action] | None = None,
) -> Any:
    """A dataclass field with ``default`` that is also the command-line option ``name``."""
    declared = Flag(name, help, type, choices, action)
    return dataclasses.field(default=default, metadata={_KEY: declared})


def flags_of(options: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of ``options`` that are flags, in declaration order."""
    return [(f, f.metadata[_KEY]) for f in dataclasses.fields(options) if _KEY in f.metadata]


def add_flags(
    group: Any,
    options: type,
    *,
    skip: Sequence[str] = (),
    defaults: dict[str, Any] | None = None,
    helps: dict[str, str] | None = None,
) -> None:
    """Adds every flag of ``options`` to ``group`` but the fields in ``skip``; ``defaults``
    and ``helps`` (by field name) override the declared ones (``dynask serve`` asks for an
    API key by default, ``run`` does not)."""
    for field, declared in flags_of(options):
        if field.name in skip:
            continue
        default = (defaults or {}).get(field.name, field.default)
        declared.add_to(group, default, help=(helps or {}).get(field.name))


def options_from(
    args: argparse.Namespace, options: builtins.type[OptionsT], **extra: Any
) -> OptionsT:
    """``options`` made of the parsed flags (those parsed; absent ones keep their default)
    and ``extra``; its ``__post_init__`` checks the combination (a ValueError)."""
    values = {
        field.name: getattr(args, declared.dest)
        for field, declared in flags_of(options)
        if hasattr(args, declared.dest)
    }
    return options(**values, **extra)


# ---- argument types -------------------------------------------------------------------------


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected an integer >= 0")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected an integer >= 1")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected a number >= 0")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"has value {text!r}; expected a number of seconds > 0")
    return value


def origins(text: str) -> tuple[str, ...]:
    """Comma-separated browser origins (``scheme://host[:port]``) or ``*``."""
    found = tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    for origin in found:
        if origin != "*" and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise argparse.ArgumentTypeError(
                f"has value {text!r}; {origin!r} is not an origin such as "
                "'https://app.example.com' or 'http://localhost:3000' (or '*': any)"
            )
    return found


def limit(text: str) -> int | None:
    """A positive integer, or ``none`` for no limit (None)."""
    if text.lower() == NO_LIMIT:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"has value {text!r}; expected an integer >= 1 or '{NO_LIMIT}'"
        )
    return value
