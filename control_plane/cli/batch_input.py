"""``in=batch:FILE.jsonl``: run every line of a file, write results beside it.

Each input line is ``{"prompt": "..."}`` or ``{"messages": [...]}`` (optionally with
``max_tokens`` and ``temperature``); the output file ``FILE.results.jsonl`` holds one line
per input line, in the same order, with the text, finish reason and token counts.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.api.streams import RequestStream
from dynask.actors.engine.engine import LLMEngine


def results_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".jsonl") + ".results.jsonl")


def run_batch(engine: LLMEngine, file: str, params: SamplingParams) -> int:
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"batch file '{file}' does not exist")
    items = [(number, _parse_line(line, number)) for number, line in _lines(path)]
    streams = [(number, _submit(engine, item, params)) for number, item in items]
    out_path = results_path(path)
    with out_path.open("w") as out, tqdm(total=len(streams), desc="batch", unit="req") as bar:
        for number, stream in streams:
            stream.wait()
            out.write(json.dumps(_result(number, stream)) + "\n")
            bar.update(1)
    print(f"wrote {len(streams)} results to {out_path}", file=sys.stderr)
    return 0


def _lines(path: Path) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]


def _parse_line(line: str, number: int) -> dict[str, Any]:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"batch line {number} is not valid JSON: {exc.msg}") from exc
    if not isinstance(item, dict) or not ("prompt" in item or "messages" in item):
        raise ValueError(f'batch line {number} needs a "prompt" or a "messages" field')
    return item


def _submit(engine: LLMEngine, item: dict[str, Any], params: SamplingParams) -> RequestStream:
    overrides = {k: item[k] for k in ("max_tokens", "temperature") if k in item}
    request_params = replace(params, **overrides) if overrides else params
    if "messages" in item:
        return engine.add_request(engine.apply_chat_template(item["messages"]), request_params)
    return engine.add_request(str(item["prompt"]), request_params)


def _result(number: int, stream: RequestStream) -> dict[str, Any]:
    usage = stream.usage
    return {
        "line": number,
        "text": stream.text,
        "finish_reason": stream.finish_reason,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
    }
