"""Structured outputs in the built-in engine: every output matches its grammar.

The tiny random models pick tokens at random, so only the grammar makes their output
JSON: a schema they satisfy is satisfied because of the mask, never by chance.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
import xgrammar as xgr

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.structured_output import StructuredOutput
from dynask.actors.engine.engine import LLMEngine
from dynask.actors.engine.grammar.structured_output import LogitsMask, _mask_on_cpu
from tests.actors.engine.helpers import make_engine, prompts_of_lengths

SCHEMAS: dict[str, dict[str, Any]] = {
    "nested objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"},
                },
                "required": ["id", "email"],
            },
        },
        "required": ["user"],
    },
    "arrays": {
        "type": "object",
        "properties": {
            "digits": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
                "minItems": 1,
                "maxItems": 4,
            },
            "pairs": {
                "type": "array",
                "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
                "maxItems": 2,
            },
        },
        "required": ["digits", "pairs"],
    },
    "enums": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L"]},
            "ok": {"type": "boolean"},
        },
        "required": ["color", "size", "ok"],
    },
    "bounded numbers": {
        "type": "object",
        "properties": {
            "t": {"type": "number", "minimum": -5, "maximum": 5},
            "n": {"type": "integer", "minimum": 10, "maximum": 20},
            "p": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 4},
        },
        "required": ["t", "n", "p"],
    },
    "string patterns": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "word": {"type": "string", "maxLength": 6},
        },
        "required": ["code", "word"],
    },
}


@pytest.fixture(scope="module", params=["tiny_llama_folder", "tiny_qwen3_folder"])
def engine(request: pytest.FixtureRequest) -> LLMEngine:
    folder: Path = request.getfixturevalue(request.param)
    return make_engine(folder, block_size=8)


def constrained(kind: str, spec: Any, **overrides: Any) -> SamplingParams:
    text = spec if isinstance(spec, str) else json.dumps(spec)
    defaults: dict[str, Any] = {"max_tokens": 200, "temperature": 0.0}
    return SamplingParams(
        **{**defaults, **overrides}, structured_output=StructuredOutput(kind, text)
    )


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_output_validates_against_its_schema(engine: LLMEngine, name: str) -> None:
    schema = SCHEMAS[name]
    prompts = prompts_of_lengths([5, 9, 14], seed=len(name))
    outputs = engine.generate(prompts, constrained("json_schema", schema))  # greedy
    for seed in (1, 2):  # and sampled, each with its own seed
        sampled = constrained("json_schema", schema, temperature=1.0, seed=seed)
        outputs += engine.generate([prompts[0]], sampled)
    for output in outputs:
        assert output.finish_reason == "stop", output.text
        jsonschema.validate(json.loads(output.text), schema)


def test_bounded_strings_admit_no_raw_control_character(engine: LLMEngine) -> None:
    """xgrammar 0.2.8 writes a length-bounded string's characters as ``[^"\\\r\n]``, which
    admits a raw tab or U+0019 (JSON refuses both); ``build_grammar`` repairs it."""
    schema = {"type": "object", "properties": {"w": {"type": "string", "maxLength": 6}}}
    tab = engine.tokenizer.convert_tokens_to_ids("ĉ")  # the byte-level token of a tab
    letter = engine.tokenizer.convert_tokens_to_ids("a")
    vocab = engine.structured_outputs.vocab_size

    def allowed_after_quote(compiled: Any) -> np.ndarray:
        matcher = xgr.GrammarMatcher(compiled)
        assert matcher.accept_string('{"w": "')
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        matcher.fill_next_token_bitmask(bitmask)
        words = bitmask.numpy().view(np.uint8)
        return np.unpackbits(words, axis=1, bitorder="little")[0, :vocab].astype(bool)

    ours = allowed_after_quote(
        engine.structured_outputs.compiled(StructuredOutput("json_schema", json.dumps(schema)))
    )
    assert ours[letter] and not ours[tab]
    compiler = engine.structured_outputs._get_compiler()
    upstream = allowed_after_quote(compiler.compile_json_schema(json.dumps(schema)))
    assert upstream[tab], "xgrammar no longer admits a raw tab: drop _json_strings_fixed"


def test_json_object_mode_gives_an_object(engine: LLMEngine) -> None:
    spec = {"type": "object", "maxProperties": 0}  # an object the random model must end
    [output] = engine.generate(prompts_of_lengths([7]), constrained("json_schema", spec))
    assert json.loads(output.text) == {}
    [loose] = engine.generate(
        prompts_of_lengths([7]),
        constrained("json_object", "", max_tokens=12, temperature=1.0, seed=3),
    )
    assert loose.text.startswith("{")


def test_regex_and_choice_outputs_match(engine: LLMEngine) -> None:
    regex = r"[0-9]{3}-[a-z]{2,4}( ok)?"
    choices = ["Paris", "London", 'Rome "the eternal"', "Zürich"]
    prompts = prompts_of_lengths([6, 11], seed=4)
    for output in engine.generate(prompts, constrained("regex", regex, temperature=1.0, seed=8)):
        assert re.fullmatch(regex, output.text), output.text
        assert output.finish_reason == "stop"
    for output in engine.generate(prompts, constrained("choice", json.dumps(choices))):
        assert output.text in choices
    grammar = 'root ::= "(" digits ")"\ndigits ::= [0-9] | [0-9] digits'
    [output] = engine.generate(prompts[:1], constrained("grammar", grammar, max_tokens=40))
    assert re.fullmatch(r"\([0-9]+\)", output.text) or output.finish_reason == "length"


def test_requests_without_a_grammar_are_untouched_in_a_mixed_batch(engine: LLMEngine) -> None:
    free = SamplingParams(max_tokens=20, temperature=0.8, seed=11, ignore_eos=True)
    prompt, other = prompts_of_lengths([9, 12], seed=21)
    alone = engine.generate([prompt], free)[0]
    streams = [
        engine.add_request(other, constrained("json_schema", SCHEMAS["enums"])),
        engine.add_request(prompt, free),
    ]
    while not all(s.finished for s in streams):
        engine.step()
    assert streams[1].token_ids == alone.token_ids
    jsonschema.validate(json.loads(streams[0].text), SCHEMAS["enums"])


def test_a_resumed_request_continues_its_grammar_exactly(engine: LLMEngine) -> None:
    """Migration: the prompt ends with tokens already generated; the grammar replays them."""
    schema = SCHEMAS["nested objects"]
    prompt = prompts_of_lengths([10], seed=31)[0]
    whole = engine.generate([prompt], constrained("json_schema", schema))[0].token_ids
    for shown in (1, len(whole) // 2, len(whole) - 1):
        spec = StructuredOutput("json_schema", json.dumps(schema), resumed_tokens=shown)
        params = SamplingParams(max_tokens=200, temperature=0.0, structured_output=spec)
        rest = engine.generate([prompt + whole[:shown]], params)[0].token_ids
        assert whole[:shown] + rest == whole


def test_resumed_tokens_that_break_the_grammar_are_refused(engine: LLMEngine) -> None:
    token = engine.tokenizer.encode("x")[-1]  # JSON cannot start with x
    spec = StructuredOutput("json_schema", json.dumps(SCHEMAS["enums"]), resumed_tokens=1)
    with pytest.raises(ValueError, match="do not match the grammar: token"):
        engine.add_request([5, 6, token], SamplingParams(structured_output=spec))


def test_compiled_grammars_are_cached_by_spec(tiny_llama_folder: Path) -> None:
    engine = make_engine(tiny_llama_folder, block_size=8)
    prompts = prompts_of_lengths([5, 6])
    for _ in range(2):
        engine.generate(prompts, constrained("regex", "[ab]{2}"))
    assert engine.structured_outputs.compiles == 1
    engine.generate(prompts[:1], constrained("regex", "[ab]{3}"))
    assert engine.structured_outputs.compiles == 2


def test_the_cpu_mask_equals_xgrammars_kernel() -> None:
    generator = torch.Generator().manual_seed(0)
    vocab = 1000
    bitmask = torch.randint(-(2**31), 2**31 - 1, (6, 32), dtype=torch.int32, generator=generator)
    logits = torch.randn(6, vocab, generator=generator)
    for rows in ([0], [1, 2, 3], [0, 2, 5]):
        ours, theirs = logits.clone(), logits.clone()
        _mask_on_cpu(ours, bitmask, rows, vocab)
        xgr.apply_token_bitmask_inplace(theirs, bitmask, vocab_size=vocab, indices=rows)
        assert torch.equal(ours, theirs)
        untouched = [r for r in range(6) if r not in rows]
        assert torch.equal(ours[untouched], logits[untouched])
    assert np.isinf(ours.numpy()).any()


def test_a_mask_of_rows_without_grammars_does_nothing() -> None:
    class Row:
        grammar = None

    logits = torch.randn(3, 50)
    before = logits.clone()
    LogitsMask(50).mask_logits(logits, [Row(), Row(), Row()])  # type: ignore[list-item]
    assert torch.equal(logits, before)


@pytest.mark.slow
def test_smollm2_answers_a_schema_with_valid_json(smollm2_folder: Path) -> None:
    engine = make_engine(smollm2_folder)
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "country": {"type": "string", "maxLength": 40},
            "population_millions": {"type": "number", "minimum": 0, "maximum": 100},
        },
        "required": ["city", "country", "population_millions"],
    }
    prompt = engine.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    )
    [output] = engine.generate([prompt], constrained("json_schema", schema))
    answer = json.loads(output.text)
    jsonschema.validate(answer, schema)
    assert output.finish_reason == "stop"
    assert "Paris" in answer["city"]
