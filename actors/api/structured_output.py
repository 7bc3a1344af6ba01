"""Structured outputs: a request's grammar as it travels, and its translation to xgrammar.

A request that must produce JSON of a schema, text matching a regex, one of a list of
choices, or any text of an EBNF/Lark grammar carries a ``StructuredOutput``: the kind and
the spec as text. It crosses the Dask boundary as a plain dict (msgpack), and each side
builds what it needs from it: the control plane builds the grammar once to refuse one
that cannot compile with a 400 naming the problem; the engine compiles it against its
tokenizer (cached by spec) and masks the logits of the request's rows with it each step.

Design decisions:

* One grammar library, xgrammar (vLLM's, SGLang's and TRT-LLM's default). Its grammar
  (``build_grammar``) does not depend on a tokenizer, so the control plane can check it
  without the model; only the engine compiles it against the vocabulary.
* JSON is generated compact and in the schema's property order (``any_whitespace`` off):
  a model, small ones especially, may otherwise emit whitespace until ``max_tokens``.
  Properties the schema does not declare are not generated (xgrammar's strict mode),
  for ``strict`` and non-strict schemas alike, as vLLM does: both outputs validate.
* ``resumed_tokens``: a request that moves to another engine mid-stream (migration)
  arrives with the tokens it had already generated at the end of its prompt. The new
  engine replays them into a fresh matcher, so the grammar continues where it was.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "structural_tag")
_XGRAMMAR_LOCATION = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")
# The JSON of ``{"type": "object"}``: what json_object mode asks for.
JSON_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarError(ValueError):
    """A structured-output spec that cannot become a grammar; the message says why."""


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must match.

    ``spec`` by ``kind``: ``json_schema`` the schema as JSON text; ``json_object`` empty
    (any JSON object); ``regex`` the pattern; ``choice`` a JSON array of the strings;
    ``grammar`` EBNF (GBNF: rules with ``::=``, the root rule ``root``) or Lark;
    ``structural_tag`` an xgrammar structural tag as JSON text (how tool calls are held to
    their functions' schemas: free text until a trigger, then a tag's schema).
    """

    kind: str
    spec: str = ""
    resumed_tokens: int = 0  # the prompt's last tokens were generated under this grammar

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"StructuredOutput 'kind' has value {self.kind!r}; expected one of "
                f"{', '.join(KINDS)}"
            )
        if not isinstance(self.spec, str):
            raise ValueError(f"StructuredOutput 'spec' has value {self.spec!r}; expected text")
        if isinstance(self.resumed_tokens, bool) or self.resumed_tokens < 0:
            raise ValueError(
                f"StructuredOutput 'resumed_tokens' has value {self.resumed_tokens!r}; "
                "expected an integer >= 0"
            )

    @classmethod
    def from_wire(cls, value: StructuredOutput | dict[str, Any] | None) -> StructuredOutput | None:
        """The spec from what crossed a wire (a dict), or as it is."""
        if value is None or isinstance(value, StructuredOutput):
            return value
        if not isinstance(value, dict):
            raise ValueError(
                f"SamplingParams 'structured_output' has value {value!r}; expected an object "
                "with 'kind' and 'spec'"
            )
        return cls(**value)

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"kind": self.kind, "spec": self.spec}
        if self.resumed_tokens:
            wire["resumed_tokens"] = self.resumed_tokens
        return wire

    def resumed_after(self, generated_tokens: int) -> StructuredOutput:
        """The spec of a continuation whose prompt ends with ``generated_tokens`` more
        tokens generated under this grammar (migration)."""
        return StructuredOutput(self.kind, self.spec, self.resumed_tokens + generated_tokens)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the compiled grammar (the resume point does not)."""
        return (self.kind, self.spec)

    def choices(self) -> list[str]:
        """The strings of a ``choice`` spec."""
        values = json.loads(self.spec)
        if (
            not isinstance(values, list)
            or not values
            or not all(isinstance(v, str) for v in values)
        ):
            raise GrammarError("a choice needs a non-empty array of strings")
        return values


def build_grammar(output: StructuredOutput) -> Any:
    """The xgrammar ``Grammar`` of ``output``; ``GrammarError`` naming what is wrong."""
    import xgrammar as xgr

    try:
        if output.kind == "json_schema":
            return _json_strings_fixed(
                xgr.Grammar.from_json_schema(output.spec, any_whitespace=False)
            )
        if output.kind == "json_object":
            return xgr.Grammar.from_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=False)
        if output.kind == "regex":
            return xgr.Grammar.from_regex(output.spec)
        if output.kind == "choice":
            alternatives = " | ".join(_ebnf_literal(c) for c in output.choices())
            return xgr.Grammar.from_ebnf(f"root ::= {alternatives}")
        if output.kind == "structural_tag":
            return _json_strings_fixed(xgr.Grammar.from_structural_tag(output.spec))
        if "::=" in output.spec:
            return xgr.Grammar.from_ebnf(output.spec)
        return xgr.Grammar.from_lark(output.spec)
    except (RuntimeError, ValueError, TypeError) as exc:
        if isinstance(exc, GrammarError):
            raise
        raise GrammarError(f"the {_NOUNS[output.kind]} cannot be compiled: {_reason(exc)}") from exc


# xgrammar (0.2.8) writes the characters of a JSON string with a length bound
# (``minLength``/``maxLength``) as ``[^"\\\r\n]``: that admits the raw control characters
# U+0000-U+001F other than CR and LF, which JSON forbids inside a string (a sampled tab or
# U+0019 made the output unparseable). Its unbounded strings exclude them, as here.
_LOOSE_STRING_CHARACTER = r"[^\"\\\r\n]"
_JSON_STRING_CHARACTER = r"[^\0-\x1f\"\\]"


def _json_strings_fixed(grammar: Any) -> Any:
    """``grammar`` with its length-bounded JSON strings held to JSON's characters."""
    import xgrammar as xgr

    text = str(grammar)
    if _LOOSE_STRING_CHARACTER not in text:
        return grammar
    return xgr.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHARACTER, _JSON_STRING_CHARACTER))


def repaired_ebnf(output: StructuredOutput) -> str | None:
    """The grammar of ``output`` as EBNF text when ``build_grammar`` had to repair what
    xgrammar builds from the spec (engines that compile the spec themselves, such as vLLM,
    take this text instead), else None."""
    if output.kind not in ("json_schema", "structural_tag"):
        return None
    text = str(build_grammar(output))
    return text if _JSON_STRING_CHARACTER in text else None


_NOUNS = {
    "json_schema": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice list",
    "grammar": "grammar",
    "structural_tag": "structural tag",
}


def _ebnf_literal(text: str) -> str:
    """``text`` as an EBNF string literal (JSON's escapes are EBNF's)."""
    if not text:
        raise GrammarError("a choice cannot be the empty string")
    return json.dumps(text, ensure_ascii=False)


def _reason(exc: Exception) -> str:
    """xgrammar's message without its timestamp and C++ source location."""
    message = str(exc).strip()
    return _XGRAMMAR_LOCATION.sub("", message) or type(exc).__name__
