"""Which sampling defaults keep the bundled SmolLM2-135M-Instruct on topic.

Five fixed questions with a known answer, each asked with four seeds at each candidate
setting (chat template, up to 48 new tokens, the built-in engine on the CPU). A reply is
on topic when it contains the answer's keyword (case-insensitive). Temperature 0 is the
baseline (one reply per question: greedy has no seed). Prints a table and writes JSON to
``bench/results/sampling_defaults.json``::

    .venv/bin/python -m bench.engine.sampling_defaults            # every setting
    .venv/bin/python -m bench.engine.sampling_defaults --only 4,2 # settings 4 and 2 of SETTINGS
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.common.report import write_json
from dynask.actors.api.sampling_params import SamplingParams
from dynask.actors.engine.config import EngineConfig
from dynask.actors.engine.engine import LLMEngine

QUESTIONS = {
    "What is the capital of France?": "paris",
    "Who wrote Romeo and Juliet?": "shakespeare",
    "What is the largest planet in our solar system?": "jupiter",
    "What gas do plants absorb from the air?": "carbon dioxide",
    "How many days are in a week?": "seven",
}
SETTINGS: dict[str, dict[str, Any]] = {
    "greedy (temperature 0)": {"temperature": 0.0},
    "OpenAI default (temperature 1)": {"temperature": 1.0},
    "admin chat (temperature 0.7)": {"temperature": 0.7},
    "temperature 0.3, top_p 0.9": {"temperature": 0.3, "top_p": 0.9},
    "temperature 0.2, top_p 0.9": {"temperature": 0.2, "top_p": 0.9},
    "temperature 0.2, top_p 0.9, repetition 1.1": {
        "temperature": 0.2,
        "top_p": 0.9,
        "repetition_penalty": 1.1,
    },
}
SEEDS = range(4)
OUT = Path(__file__).resolve().parents[1] / "results" / "sampling_defaults.json"


def on_topic(reply: str, keyword: str) -> bool:
    return keyword in reply.lower() or (keyword == "seven" and "7" in reply)


def run_setting(engine: LLMEngine, setting: dict[str, Any]) -> dict[str, Any]:
    seeds = [None] if setting["temperature"] == 0.0 else list(SEEDS)
    jobs = []
    for question, keyword in QUESTIONS.items():
        prompt = engine.apply_chat_template([{"role": "user", "content": question}])
        for seed in seeds:
            params = SamplingParams(max_tokens=48, seed=seed, **setting)
            jobs.append((question, keyword, engine.add_request(prompt, params)))
    while not all(stream.finished for _, _, stream in jobs):
        engine.step()
    replies = [(q, on_topic(s.text, k), s.text) for q, k, s in jobs]
    return {
        "on_topic": sum(ok for _, ok, _ in replies),
        "replies": len(replies),
        "examples": {q: text for q, _, text in replies[:: len(seeds)]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="comma-separated setting numbers (0-based) to run")
    args = parser.parse_args()
    chosen = list(SETTINGS.items())
    if args.only:
        chosen = [chosen[int(i)] for i in args.only.split(",")]
    engine = LLMEngine(EngineConfig(max_num_seqs=64))
    results = {}
    print(f"{'setting':46} on topic")
    for name, setting in chosen:
        started = time.monotonic()
        result = run_setting(engine, setting)
        result["setting"], result["seconds"] = setting, round(time.monotonic() - started, 1)
        results[name] = result
        share = result["on_topic"] / result["replies"]
        print(f"{name:46} {result['on_topic']:3}/{result['replies']:<3} ({share:.0%})")
    for name, result in results.items():
        print(f"\n{name}: {result['examples']['What is the capital of France?']!r}")
    OUT.parent.mkdir(exist_ok=True)
    if OUT.exists():  # runs of other settings stay
        results = {**json.loads(OUT.read_text()), **results}
    write_json(OUT, results)
    print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
