"""The ``dynask`` command: ``dynask run [MODEL] [in=text|batch:FILE.jsonl] [out=torch] ...``.

Accepts NVIDIA Dynamo's ``in=``/``out=`` syntax and plain flags alike (``--in text``).
A wrong argument gets a message that says what was wrong and what the right form is,
never a bare usage dump.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from dynask.actors.engine.config import EngineConfig

IN_MODES = ("text", "batch:FILE.jsonl")
ENGINES = ("torch",)


class CLIError(ValueError):
    """A command-line mistake; the message says what to type instead."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynask", description="LLM serving on Dask.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a model with everything embedded")
    run.add_argument(
        "model",
        nargs="?",
        default=None,
        help="HF folder, .gguf file or hub id (default: bundled SmolLM2-135M)",
    )
    run.add_argument("--in", dest="input", default="text", help="text | batch:FILE.jsonl")
    run.add_argument("--out", dest="engine", default="torch", help="engine: torch")
    run.add_argument("--model-path", dest="model_path", default=None, help="same as MODEL")
    run.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    run.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    run.add_argument("--kv-cache-gib", type=float, default=1.0, help="KV cache size on a CPU")
    run.add_argument("--max-model-len", type=int, default=None)
    run.add_argument("--max-num-seqs", type=int, default=64)
    run.add_argument("--max-tokens", type=int, default=512, help="per reply")
    run.add_argument("--temperature", type=float, default=0.7)
    run.add_argument("--log-level", default="WARNING")
    return parser


def normalize_dynamo_args(argv: Sequence[str]) -> list[str]:
    """Turns ``in=X`` / ``out=Y`` into ``--in X`` / ``--out Y``; checks their values."""
    result: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in ("in", "out") and not arg.startswith("-"):
            result += [f"--{key}", value]
        else:
            result.append(arg)
    return result


def _check_choices(args: argparse.Namespace) -> None:
    if args.input != "text" and not args.input.startswith("batch:"):
        raise CLIError(
            f"in={args.input} is not an input mode; use one of: "
            + ", ".join(f"in={m}" for m in IN_MODES)
        )
    if args.input == "batch:":
        raise CLIError("in=batch: needs a file, e.g. in=batch:prompts.jsonl")
    if args.engine not in ENGINES:
        raise CLIError(
            f"out={args.engine} is not an engine available here; use one of: "
            + ", ".join(f"out={e}" for e in ENGINES)
        )
    if args.model and args.model_path and args.model != args.model_path:
        raise CLIError(f"two models given ({args.model!r} and --model-path {args.model_path!r})")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model or args.model_path,
        device=args.device,
        dtype=args.dtype,
        kv_cache_gib=args.kv_cache_gib,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = normalize_dynamo_args(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        _check_choices(args)
        return _run(args)
    except (CLIError, ValueError, FileNotFoundError) as exc:
        print(f"dynask: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    from dynask.actors.engine.engine import LLMEngine
    from dynask.actors.engine.sampling import SamplingParams

    config = engine_config(args)
    print(f"loading {config.model or 'the bundled SmolLM2-135M-Instruct'} ...", file=sys.stderr)
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    engine.start()
    try:
        if args.input.startswith("batch:"):
            from dynask.control_plane.batch_input import run_batch

            return run_batch(engine, args.input.removeprefix("batch:"), params)
        from dynask.control_plane.text_chat import run_text_chat

        return run_text_chat(engine, params)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    sys.exit(main())
