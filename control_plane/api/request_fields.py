"""Request fields declared once: the validator reads them, the OpenAPI document shows them.

Each ``Field`` is one body (or query) parameter: its name, its JSON Schema, its default and
a description, and ``read(body)``, which returns the validated value (or the default) and
raises an OpenAI-shaped 400 naming the field and the bad value. ``request_schema`` lists
the fields of chat and completions; ``openapi_document`` turns the same lists into the
document's request bodies. A rule changes in one place, so the two cannot drift.

Kinds: ``Integer``, ``Number``, ``Boolean``, ``Choice`` (one of fixed strings), ``Text``,
``Custom`` (its own schema and reader, for ``messages``, ``prompt``, ``stop`` …),
``Accepted`` (allowed and without effect on the output, like ``user``) and ``Refused``
(an OpenAI parameter dynask does not serve: only its neutral values pass, anything else is
a 400 naming it). A body key that no field declares is refused by name too.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynask.control_plane.api.errors import APIError, invalid

Body = Mapping[str, Any]
Schema = dict[str, Any]


@dataclass(frozen=True)
class Field:
    """One parameter. Subclasses say what values it takes (``schema``, ``check``)."""

    name: str
    description: str
    default: Any = None

    def schema(self) -> Schema:
        raise NotImplementedError

    def document(self) -> Schema:
        """The parameter's JSON Schema with its description (and default, if any)."""
        schema = {**self.schema(), "description": self.description}
        if self.default is not None:
            schema["default"] = self.default
        return schema

    def read(self, body: Body) -> Any:
        value = body.get(self.name)
        return self.default if value is None else self.check(value)

    def check(self, value: Any) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class Integer(Field):
    low: int = 0
    high: int | None = None  # None: no upper bound

    def schema(self) -> Schema:
        bounds = {"minimum": self.low} | ({} if self.high is None else {"maximum": self.high})
        return {"type": "integer", **bounds}

    def check(self, value: Any) -> int:
        high = self.high
        if not is_int(value) or value < self.low or (high is not None and value > high):
            expected = f">= {self.low}" if high is None else f"in [{self.low}, {high}]"
            raise invalid(
                self.name, f"'{self.name}' has value {shown(value)}; expected an integer {expected}"
            )
        return int(value)


@dataclass(frozen=True)
class Number(Field):
    low: float = 0.0
    high: float = 1.0
    low_exclusive: bool = False  # (low, high] instead of [low, high]

    def schema(self) -> Schema:
        bound = "exclusiveMinimum" if self.low_exclusive else "minimum"
        return {"type": "number", bound: self.low, "maximum": self.high}

    def check(self, value: Any) -> float:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not self.low <= value <= self.high or self._at_open_end(value):
            bracket = "(" if self.low_exclusive else "["
            raise invalid(
                self.name,
                f"'{self.name}' has value {shown(value)}; expected a number in "
                f"{bracket}{self.low:g}, {self.high:g}]",
            )
        return float(value)

    def _at_open_end(self, value: float) -> bool:
        return self.low_exclusive and value == self.low


@dataclass(frozen=True)
class Boolean(Field):
    default: bool = False

    def schema(self) -> Schema:
        return {"type": "boolean"}

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise invalid(
                self.name, f"'{self.name}' has value {shown(value)}; expected true or false"
            )
        return value


@dataclass(frozen=True)
class Choice(Field):
    choices: tuple[str, ...] = ()
    hint: str = ""  # said after the choices, e.g. "or leave it out for the server's default"

    def schema(self) -> Schema:
        return {"type": "string", "enum": list(self.choices)}

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise invalid(
                self.name,
                f"'{self.name}' has value {shown(value)}; use one of {', '.join(self.choices)}"
                + (f", {self.hint}" if self.hint else ""),
            )
        return value


@dataclass(frozen=True)
class Text(Field):
    """A non-empty string; ``required`` fields answer a 400 when left out."""

    required: bool = False

    def schema(self) -> Schema:
        return {"type": "string", "minLength": 1}

    def read(self, body: Body) -> Any:
        if self.required and body.get(self.name) is None:
            raise invalid(self.name, f"'{self.name}' is required and must be a non-empty string")
        return super().read(body)

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            required = "is required and " if self.required else ""
            raise invalid(self.name, f"'{self.name}' {required}must be a non-empty string")
        return value


@dataclass(frozen=True)
class Custom(Field):
    """A parameter with its own schema and reader (``reader(value)`` gets it non-null)."""

    json_schema: Schema = field(default_factory=dict)
    reader: Callable[[Any], Any] | None = None
    required: bool = False

    def schema(self) -> Schema:
        return dict(self.json_schema)

    def read(self, body: Body) -> Any:
        value = body.get(self.name)
        if value is None and not self.required:
            return self.default
        return self.check(value)

    def check(self, value: Any) -> Any:
        assert self.reader is not None, f"Custom field {self.name!r} has no reader"
        return self.reader(value)


@dataclass(frozen=True)
class Accepted(Field):
    """Allowed, and without effect on the output (``user``, ``metadata`` …)."""

    json_schema: Schema = field(default_factory=dict)

    def schema(self) -> Schema:
        return dict(self.json_schema)

    def check(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Refused(Field):
    """An OpenAI parameter dynask does not serve: only its ``neutral`` values pass."""

    neutral: tuple[Any, ...] = ()
    hint: str = "leave it out"
    json_schema: Schema = field(default_factory=dict)  # of the neutral values

    def schema(self) -> Schema:
        if self.json_schema:
            return dict(self.json_schema)
        return {"enum": [*self.neutral, None]}  # null: left out

    def check(self, value: Any) -> None:
        if not any(_same(value, n) for n in self.neutral):
            raise invalid(
                self.name,
                f"'{self.name}' is not supported by dynask (got {shown(value)}); {self.hint}",
            )
        return None


def _same(value: Any, neutral: Any) -> bool:
    """Equal and of the same JSON type (``True`` is not ``1``, ``[]`` is not ``{}``)."""
    return type(value) is type(neutral) and value == neutral


def read_body(fields: tuple[Field, ...], body: Body) -> dict[str, Any]:
    """Every field's value by name; a key no field declares is a 400 naming it."""
    declared = {f.name for f in fields}
    unknown = [key for key in body if key not in declared]
    if unknown:
        name = unknown[0]
        raise invalid(
            name,
            f"Unrecognized request argument supplied: {shown(name)}; dynask does not serve it "
            "(see /openapi.json for the parameters it does)",
            code="unknown_parameter",
        )
    return {f.name: f.read(body) for f in fields}


def body_schema(fields: tuple[Field, ...], required: tuple[str, ...]) -> Schema:
    """The JSON Schema of a body made of ``fields``."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {f.name: f.document() for f in fields},
        "additionalProperties": False,
    }


def is_int(value: Any) -> bool:
    """An integer as JSON Schema has it: ``5`` and ``5.0`` are both integers."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


SHOWN_CHARS = 80


def shown(value: Any) -> str:
    """``value`` quoted for a message as Python writes it, in ASCII (a lone surrogate or a
    NUL cannot break the answer's encoding), cut to about ``SHOWN_CHARS``."""
    if isinstance(value, str) and len(value) > SHOWN_CHARS:
        return ascii(value[:SHOWN_CHARS]) + "..."
    text = ascii(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def served_model(value: str | None, served: Collection[str]) -> str | None:
    """A ``model`` query field: None (every model) or the name of a model served; any
    other name is a 404 that lists the models served."""
    if value is None or value in served:
        return value
    available = ", ".join(sorted(served)) or "none"
    raise APIError(
        f"the model {shown(value)} is not served; available: {available}",
        status=404,
        param="model",
        code="model_not_found",
    )


_SCALARS = frozenset({int, float, bool, type(None)})  # JSON values that hold no string


def check_encodable(body: Any) -> None:
    """A 400 naming the first string (key or value) that UTF-8 cannot encode: JSON may
    carry a lone surrogate (``"\\ud800"``), which no tokenizer or response can hold.

    Iterative (a deeply nested body cannot exhaust the stack) and lazy about paths: one is
    formatted only for the string at fault, and a list of numbers only (token ids) is
    passed over by one type check in C: a 16k-id prompt cost 26 ms in the Python loop."""
    stack: list[tuple[Any, Any, Any]] = [(None, None, body)]  # (parent entry, key, value)
    while stack:
        entry = stack.pop()
        _, _, value = entry
        if isinstance(value, str):
            if not _encodes(value):
                _not_encodable(_path(entry), value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _encodes(key):
                    _not_encodable(_path(entry), key)
                if isinstance(item, (str, dict, list)):
                    stack.append((entry, key, item))
        elif isinstance(value, list) and not _SCALARS.issuperset(map(type, value)):
            for index, item in enumerate(value):
                if isinstance(item, (str, dict, list)):
                    stack.append((entry, index, item))


def _path(entry: tuple[Any, Any, Any]) -> str:
    parts: list[str] = []
    while entry[0] is not None:
        parent, key, _ = entry
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
        entry = parent
    return "".join(reversed(parts)).removeprefix(".") or "body"


def _encodes(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _not_encodable(where: str, text: str) -> None:
    param = where.encode("utf-8", "backslashreplace").decode()
    raise invalid(
        param,
        f"'{param}' holds a string that is not valid Unicode ({shown(text)}: a lone surrogate "
        "cannot be encoded as UTF-8); send the text as UTF-8",
        code="invalid_encoding",
    )
