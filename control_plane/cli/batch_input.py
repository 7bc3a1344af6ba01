"""``in=batch:FILE.jsonl``: run every line of a file, write results beside it.

Each input line is ``{"prompt": "..."}`` or ``{"messages": [...]}`` (optionally with
``max_tokens`` and ``temperature``); the output file ``FILE.results.jsonl`` holds one line
per input line, in the same order, with the text, finish reason and token counts. The
lines are checked before any engine starts, then all go through the serving pipeline at
once (its admission and routing pace them). A progress bar on stderr counts finished
requests and shows the output tokens/s so far (``BatchProgress``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dynask.actors.api.outputs import RequestOutput
from dynask.control_plane.cli.local_pipeline import LocalPipeline
from dynask.control_plane.serving.errors import InvalidRequestError
from dynask.control_plane.serving.request import PreparedRequest


def results_path(path: Path) -> Path:
    return path.with_name(path.name.removesuffix(".jsonl") + ".results.jsonl")


def read_batch(file: str) -> list[tuple[int, dict[str, Any]]]:
    """The file's lines (numbered from 1, blank ones skipped); a bad line is a
    ``ValueError`` naming it."""
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"batch file '{file}' does not exist")
    return [(number, _parse_line(line, number)) for number, line in _lines(path)]


async def run_batch(
    pipeline: LocalPipeline, file: str, items: list[tuple[int, dict[str, Any]]]
) -> int:
    requests = [(number, _prepared(pipeline, item, number)) for number, item in items]
    out_path = results_path(Path(file))
    with BatchProgress(len(requests)) as progress:
        tasks = [
            asyncio.create_task(_collect(pipeline, prepared, progress)) for _, prepared in requests
        ]
        try:
            with out_path.open("w") as out:
                for (number, _), task in zip(requests, tasks, strict=True):
                    out.write(json.dumps(_result(number, await task)) + "\n")
        finally:
            for task in tasks:
                task.cancel()
    print(
        f"wrote {len(tasks)} results to {out_path} ({progress.tokens} output tokens, "
        f"{progress.tokens_per_s():.1f} tokens/s)",
        file=sys.stderr,
    )
    return 0


class BatchProgress:
    """A tqdm bar of finished requests, its postfix the output tokens/s since the start
    (redrawn as tokens arrive, at most every ``mininterval`` s: tqdm throttles it)."""

    def __init__(self, total: int, file: Any = None) -> None:
        self.bar = tqdm(total=total, desc="batch", unit="req", file=file or sys.stderr)
        self.tokens = 0
        self._start = time.perf_counter()

    def tokens_per_s(self) -> float:
        elapsed = time.perf_counter() - self._start
        return self.tokens / elapsed if elapsed > 0 else 0.0

    def generated(self, tokens: int) -> None:
        self.tokens += tokens
        self.bar.set_postfix_str(f"{self.tokens_per_s():.1f} tok/s", refresh=False)
        self.bar.update(0)  # redraws once mininterval has passed

    def finished(self) -> None:
        self.bar.set_postfix_str(f"{self.tokens_per_s():.1f} tok/s", refresh=False)
        self.bar.update(1)

    def __enter__(self) -> BatchProgress:
        return self

    def __exit__(self, *_: object) -> None:
        self.bar.close()


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


def _prepared(pipeline: LocalPipeline, item: dict[str, Any], number: int) -> PreparedRequest:
    """The line as a prepared request: a refused line fails before any line runs."""
    max_tokens = _optional(item, "max_tokens", (int,), number)
    temperature = _optional(item, "temperature", (int, float), number)
    request = pipeline.request(
        messages=item.get("messages"),
        prompt=None if "messages" in item else str(item["prompt"]),
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=None if temperature is None else float(temperature),
    )
    try:
        return pipeline.prepare(request)
    except InvalidRequestError as exc:
        raise ValueError(f"batch line {number}: {exc.message}") from exc


def _optional(item: dict[str, Any], name: str, types: tuple[type, ...], number: int) -> Any:
    value = item.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
        expected = " or ".join(t.__name__ for t in types)
        raise ValueError(f"batch line {number}: '{name}' has value {value!r}; expected {expected}")
    return value


async def _collect(
    pipeline: LocalPipeline, prepared: PreparedRequest, progress: BatchProgress
) -> list[RequestOutput]:
    outputs = []
    async for output in pipeline.generate(prepared):
        outputs.append(output)
        progress.generated(len(output.token_ids))
    progress.finished()
    return outputs


def _result(number: int, outputs: list[RequestOutput]) -> dict[str, Any]:
    last = outputs[-1]
    usage = last.usage
    return {
        "line": number,
        "text": "".join(o.text for o in outputs),
        "finish_reason": last.finish_reason.value if last.finish_reason else None,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "completion_tokens": usage.completion_tokens if usage else None,
    }
