"""Benchmark of tool calling on the bundled model: how often it calls validly, how soon.

What it measures, on a real ``dynask run`` (built-in engine, bundled SmolLM2-135M-Instruct,
CPU), over a fixed set of tool prompts sent one at a time, greedy, streamed:

* ``auto``: ``tool_choice: auto``. Share of prompts answered with a tool call, share of
  calls that are valid (a known function, arguments that parse and validate against its
  JSON schema with jsonschema), and the time to the first tool-call delta. Once the model
  opens a call, the grammar holds its arguments to the schema.
* ``required``: ``tool_choice: required``: the same numbers when a call is forced by the
  grammar; ``named``: ``tool_choice`` names the function the prompt asks for.
* ``no tools``: the same prompts without tools, the baseline: time to the first delta.

Per-step cost, two ways, each against a baseline of the same run:

* over HTTP, milliseconds per output token of each mode and its ratio to ``no tools``
  (a longer prompt with the tool descriptions, parsing, and the grammar);
* in the engine alone (``LLMEngine`` in this process, after the server stops): the same
  prompts decoded under the ``required`` grammar and again without it for exactly as
  many tokens, at batch 1 and 8, alternating (medians of 3), and the time the runner's
  mask takes per step (``TimedMask`` of ``bench.engine.structured_output``).

Run it from the repository root::

    .venv/bin/python -m bench.serving.tool_calls            # a few minutes on 2 cores
    .venv/bin/python -m bench.serving.tool_calls --model PATH

It prints a table and writes JSON to ``bench/results/tool_calls.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from bench.common.processes import free_port
from bench.common.report import write_json

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "search_web",
        "description": "Search the web for a query",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
CALCULATOR: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
TOOLS = [WEATHER, SEARCH, CALCULATOR]
# Each prompt, and the function it asks for (``named`` forces that one).
ASKS = [
    ("What is the weather in Paris right now?", "get_weather"),
    ("Is it raining in London today? Use the weather tool.", "get_weather"),
    ("Search the web for the latest news about the Mars rover.", "search_web"),
    ("What is 1234 * 5678? Use the calculator.", "calculate"),
    ("Tell me the temperature in Tokyo in fahrenheit.", "get_weather"),
    ("Find information about the Eiffel Tower on the web.", "search_web"),
    ("Calculate 2 to the power of 10.", "calculate"),
    ("How warm is it in Berlin?", "get_weather"),
]
PROMPTS = [prompt for prompt, _ in ASKS]


@dataclass
class Mode:
    name: str
    requests: int = 0
    with_call: int = 0
    valid_calls: int = 0
    calls: int = 0
    expected_calls: int = 0  # calls of the function the prompt asks for
    cut_calls: int = 0  # the last call of an answer that max_tokens ended (incomplete)
    first_call_delta_s: list[float] = field(default_factory=list)
    first_delta_s: list[float] = field(default_factory=list)
    ms_per_token: list[float] = field(default_factory=list)

    def row(self, baseline_ms: float) -> dict[str, Any]:
        ms = statistics.median(self.ms_per_token) if self.ms_per_token else float("nan")
        return {
            "mode": self.name,
            "requests": self.requests,
            "answered_with_a_call": self.with_call,
            "calls": self.calls,
            "valid_calls": self.valid_calls,
            "valid_share": self.valid_calls / self.calls if self.calls else 0.0,
            "cut_by_max_tokens": self.cut_calls,
            "valid_share_of_complete_calls": (
                self.valid_calls / (self.calls - self.cut_calls)
                if self.calls > self.cut_calls
                else 0.0
            ),
            "expected_function_share": self.expected_calls / self.calls if self.calls else 0.0,
            "first_call_delta_p50_s": _median(self.first_call_delta_s),
            "first_delta_p50_s": _median(self.first_delta_s),
            "ms_per_token_p50": ms,
            "ms_per_token_vs_no_tools": ms / baseline_ms if baseline_ms else float("nan"),
        }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _valid(call: dict[str, Any]) -> bool:
    tool = next((t for t in TOOLS if t["function"]["name"] == call["name"]), None)
    if tool is None:
        return False
    try:
        jsonschema.validate(json.loads(call["arguments"]), tool["function"]["parameters"])
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return False
    return True


def _one(
    client: httpx.Client,
    model: str,
    ask: tuple[str, str],
    mode: Mode,
    tools: dict[str, Any],
) -> None:
    prompt, expected = ask
    if tools.get("tool_choice") == "named":
        tools = {**tools, "tool_choice": {"type": "function", "function": {"name": expected}}}
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": 64,
        **tools,
    }
    started = time.monotonic()
    first = first_call = None
    calls: dict[int, dict[str, Any]] = {}
    tokens, finish = 0, None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                delta = choice["delta"]
                finish = choice.get("finish_reason") or finish
                if delta.get("content") or delta.get("tool_calls"):
                    first = first or time.monotonic()
                for piece in delta.get("tool_calls") or []:
                    first_call = first_call or time.monotonic()
                    call = calls.setdefault(piece["index"], {"name": "", "arguments": ""})
                    call["name"] = piece["function"].get("name") or call["name"]
                    call["arguments"] += piece["function"].get("arguments", "")
    elapsed = time.monotonic() - started
    mode.requests += 1
    if first is not None:
        mode.first_delta_s.append(first - started)
    if first_call is not None:
        mode.with_call += 1
        mode.first_call_delta_s.append(first_call - started)
    mode.calls += len(calls)
    if finish == "length" and calls and not _valid(calls[max(calls)]):
        mode.cut_calls += 1  # max_tokens ended the last call before it was complete
    mode.valid_calls += sum(_valid(c) for c in calls.values())
    mode.expected_calls += sum(c["name"] == expected for c in calls.values())
    if tokens:
        mode.ms_per_token.append(1000 * elapsed / tokens)


def grammar_step_cost(model: str | None, repeats: int = 3) -> list[dict[str, Any]]:
    """The ``required`` grammar's cost per step in the engine alone, at batch 1 and 8: the
    same prompts decoded under it and without it for exactly as many tokens, alternating
    ``repeats`` times (medians), and the time the runner's mask itself takes per step."""
    from bench.engine.structured_output import TimedMask
    from dynask.actors.api.sampling_params import SamplingParams
    from dynask.actors.api.structured_output import StructuredOutput
    from dynask.actors.engine.config import EngineConfig
    from dynask.actors.engine.engine import LLMEngine
    from dynask.actors.engine.model_runner import ModelRunner
    from dynask.actors.models.model_source import resolve_model
    from dynask.control_plane.api.chat_output import ChatOptions, plan_chat
    from dynask.control_plane.api.tools.tool_request import parse_tool_request

    engine = LLMEngine(EngineConfig(model=str(resolve_model(model).folder), device="cpu"))
    runner = engine.parts.runner
    assert isinstance(runner, ModelRunner)
    mask = TimedMask(runner.grammar_mask)
    runner.grammar_mask = mask
    tools = parse_tool_request({"tools": TOOLS, "tool_choice": "required"})

    def run(prompts: list[list[int]], params: list[SamplingParams]) -> tuple[float, int]:
        streams = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
        steps, started = 0, time.perf_counter()
        while not all(s.finished for s in streams):
            engine.step()
            steps += 1
        return time.perf_counter() - started, steps

    rows = []
    for batch in (1, 8):
        prompts, spec = [], None
        for prompt in (PROMPTS * 2)[:batch]:
            messages = [{"role": "user", "content": prompt}]
            text, plan = plan_chat(engine.tokenizer, messages, tools, ChatOptions(), "m", {"torch"})
            prompts.append(engine.tokenizer.encode(text, add_special_tokens=False))
            spec = StructuredOutput.from_wire(plan.sampling["structured_output"])
        held = [SamplingParams(max_tokens=48, temperature=0.0, structured_output=spec)] * batch
        lengths = [len(o.token_ids) for o in engine.generate(prompts, held[0])]  # warm
        free = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in lengths]
        grammar_ms, free_ms, mask_ms = [], [], []
        for _ in range(repeats):
            mask.seconds = 0.0
            seconds, steps = run(prompts, held)
            grammar_ms.append(1000 * seconds / steps)
            mask_ms.append(1000 * mask.seconds / steps)
            seconds, steps = run(prompts, free)
            free_ms.append(1000 * seconds / steps)
        free_p50, grammar_p50 = statistics.median(free_ms), statistics.median(grammar_ms)
        rows.append(
            {
                "batch": batch,
                "tokens": sum(lengths),
                "free_ms_per_step": free_p50,
                "grammar_ms_per_step": grammar_p50,
                "ratio": grammar_p50 / free_p50,
                "mask_ms_per_step": statistics.median(mask_ms),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the prompts")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "tool_calls.json"))
    args = parser.parse_args()
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="dynask-bench-tools-"))
    argv = [str(BIN / "dynask"), "run", *([args.model] if args.model else [])]
    argv += ["--port", str(port), "--database-url", f"sqlite:///{folder / 'state.db'}"]
    log = (folder / "run.log").open("wb")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        client = httpx.Client(base_url=base, timeout=300)
        deadline = time.monotonic() + 300
        while True:
            try:
                if client.get("/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                print((folder / "run.log").read_text()[-2000:], file=sys.stderr)
                return 1
            time.sleep(0.5)
        model = client.get("/v1/models").json()["data"][0]["id"]
        modes = {
            "no tools": ({}, Mode("no tools")),
            "auto": ({"tools": TOOLS, "tool_choice": "auto"}, Mode("auto")),
            "required": ({"tools": TOOLS, "tool_choice": "required"}, Mode("required")),
            "named": ({"tools": TOOLS, "tool_choice": "named"}, Mode("named")),
        }
        for tools, _ in modes.values():  # first requests load caches and compile grammars
            _one(client, model, ASKS[0], Mode("warm-up"), tools)
        for _ in range(args.rounds):
            for ask in ASKS:
                for tools, mode in modes.values():
                    _one(client, model, ask, mode, tools)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    baseline = statistics.median(modes["no tools"][1].ms_per_token)
    rows = [mode.row(baseline) for _, mode in modes.values()]
    print(
        f"{'mode':<10} {'calls':>5} {'valid':>6} {'share':>6} {'1st call s':>10} "
        f"{'1st delta s':>11} {'ms/tok':>7} {'vs none':>7} {'asked fn':>8} {'cut':>4} "
        f"{'complete valid':>14}"
    )
    for r in rows:
        first_call = r["first_call_delta_p50_s"]
        print(
            f"{r['mode']:<10} {r['calls']:>5} {r['valid_calls']:>6} {r['valid_share']:>6.0%} "
            f"{'-' if first_call is None else f'{first_call:.3f}':>10} "
            f"{r['first_delta_p50_s'] or 0:>11.3f} {r['ms_per_token_p50']:>7.1f} "
            f"{r['ms_per_token_vs_no_tools']:>7.2f} {r['expected_function_share']:>8.0%} "
            f"{r['cut_by_max_tokens']:>4} "
            f"{r['valid_share_of_complete_calls']:>14.0%}"
        )
    steps = grammar_step_cost(args.model)
    head = f"{'batch':>5} {'free ms/step':>12} {'grammar ms/step':>15} {'ratio':>6} {'mask ms':>8}"
    print("\n" + head)
    for r in steps:
        print(
            f"{r['batch']:>5} {r['free_ms_per_step']:>12.2f} "
            f"{r['grammar_ms_per_step']:>15.2f} {r['ratio']:>6.3f} {r['mask_ms_per_step']:>8.2f}"
        )
    result = {
        "when": datetime.now(UTC).isoformat(),
        "model": model,
        "prompts": PROMPTS,
        "rows": rows,
        "grammar_step_cost": steps,
    }
    write_json(Path(args.out), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
