"""The ``dynask`` command.

``dynask run [MODEL] [in=http|text|batch:FILE.jsonl] [out=torch|vllm|echo|mocker|python:FILE.py]``
runs everything embedded; ``dynask serve --scheduler tcp://HOST:8786 [-f deploy.yaml]``
is the control plane of an existing Dask cluster; ``dynask keys create NAME`` makes an
API key; ``dynask db upgrade`` migrates the database. NVIDIA Dynamo's ``in=``/``out=``
syntax and plain flags both work. A wrong argument gets a message that says what was
wrong and the right form.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from dynask.control_plane.cli.admin_command import add_admin_parser, admin_command
from dynask.control_plane.cli.chat_flags import add_chat_args
from dynask.control_plane.cli.commands import ENGINE_FORMS, IN_MODES, run_command, serve_command
from dynask.control_plane.cli.disagg_flags import add_disagg_arguments
from dynask.control_plane.cli.engine_flags import add_engine_flags
from dynask.control_plane.cli.keys_command import add_keys_parser, keys_command
from dynask.control_plane.cli.planner_flags import add_planner_args
from dynask.control_plane.cli.reliability_flags import add_reliability_args
from dynask.control_plane.cluster.ssh_settings import SSHOptions
from dynask.control_plane.flags import Flag, add_flags
from dynask.control_plane.observability.tracing import TracingOptions
from dynask.control_plane.routing.routing_options import RoutingOptions
from dynask.control_plane.serving.errors import ServingError

LOG_LEVEL = Flag("--log-level")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynask", description="LLM serving on Dask.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(commands.add_parser("run", help="run a model with everything embedded"))
    _add_serve(commands.add_parser("serve", help="the control plane of an existing Dask cluster"))
    add_keys_parser(commands)
    add_admin_parser(commands)
    db = commands.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=["upgrade", "current"], help="upgrade to the newest schema")
    db.add_argument("--database-url", default=None, help="default: $DYNASK_DATABASE_URL or SQLite")
    return parser


def _add_common(cmd: argparse.ArgumentParser, require_api_key: bool) -> None:
    from dynask.control_plane.server import ServerOptions

    on_off = "on" if require_api_key else "off"
    add_flags(
        cmd,
        ServerOptions,
        defaults={"require_api_key": require_api_key},
        helps={
            "require_api_key": "/v1 needs 'Authorization: Bearer KEY' (see `dynask keys`; "
            f"default: {on_off})"
        },
    )
    LOG_LEVEL.add_to(cmd, "WARNING")
    routing = cmd.add_argument_group(
        'routing (a request may override --router-mode with "router_mode" in its body)'
    )
    add_flags(routing, RoutingOptions)
    add_reliability_args(cmd)
    add_flags(cmd.add_argument_group("tracing (OpenTelemetry over OTLP/HTTP)"), TracingOptions)
    add_flags(cmd.add_argument_group("workers on other hosts (SSH, admin UI)"), SSHOptions)
    add_chat_args(cmd)
    add_planner_args(cmd)


def _add_run(run: argparse.ArgumentParser) -> None:
    run.add_argument(
        "model",
        nargs="?",
        default=None,
        help="HF folder, .gguf file or hub id (default: bundled SmolLM2-135M)",
    )
    run.add_argument("--in", dest="input", default="http", help=" | ".join(IN_MODES))
    run.add_argument("--out", dest="engine", default="torch", help=" | ".join(ENGINE_FORMS))
    run.add_argument("--model-path", dest="model_path", default=None, help="same as MODEL")
    run.add_argument("--model-name", default=None, help="the name clients use")
    run.add_argument(
        "--workers", type=int, default=1, help="local worker processes (1 engine each)"
    )
    run.add_argument(
        "--engines-per-gpu",
        type=int,
        default=None,
        help="engines sharing one GPU (default 1: one GPU per worker, round robin; "
        "each gets --gpu-memory-utilization, default 0.9 / N)",
    )
    run.add_argument(
        "--scheduler",
        default=None,
        help="tcp://HOST:8786, the cluster of in=dyn://POOL (this node joins POOL) or "
        "out=dyn://POOL (serve POOL's engines)",
    )
    add_engine_flags(run)
    run.add_argument("--max-tokens", type=int, default=512, help="per reply (in=text/batch)")
    run.add_argument(
        "--temperature", type=float, default=None, help="in=text/batch (default: the model's)"
    )
    _add_common(run, require_api_key=False)
    add_disagg_arguments(run, embedded=True)


def _add_serve(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "graph",
        nargs="?",
        default=None,
        help="an inference graph, MODULE:Component (e.g. deploy/graphs/agg.py:Frontend); "
        "then -f is its CONFIG.yaml",
    )
    serve.add_argument("--scheduler", required=True, help="tcp://HOST:8786")
    serve.add_argument(
        "-f", "--file", dest="deploy_file", default=None, help="deploy.yaml, or a graph's YAML"
    )
    _add_common(serve, require_api_key=True)
    serve.set_defaults(port=None)  # None: the graph's Frontend port, else 8000
    add_disagg_arguments(serve, embedded=False)


def normalize_dynamo_args(argv: Sequence[str]) -> list[str]:
    """Turns ``in=X`` / ``out=Y`` into ``--in X`` / ``--out Y``."""
    result: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in ("in", "out") and not arg.startswith("-"):
            result += [f"--{key}", value]
        else:
            result.append(arg)
    return result


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` (without the program name) as ``dynask`` reads it; exits on a mistake."""
    return _parser().parse_args(normalize_dynamo_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    _let_ctrl_c_stop_this_process()
    logging.basicConfig(
        level=args.log_level.upper() if hasattr(args, "log_level") else "WARNING",
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command in ("run", "serve"):
            # The composition root: the admin UI (``web``) plugs into the control plane here.
            from dynask.web.mount import admin_extension

            command = run_command if args.command == "run" else serve_command
            return command(args, extensions=[admin_extension])
        if args.command == "keys":
            return keys_command(args)
        if args.command == "admin":
            return admin_command(args)
        return _db_command(args)
    except (ValueError, FileNotFoundError, KeyError, ServingError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"dynask: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _let_ctrl_c_stop_this_process() -> None:
    """A shell starts ``dynask run ... &`` with SIGINT ignored, and Python then never
    raises KeyboardInterrupt; a server is stopped with Ctrl-C (SIGINT) all the same."""
    if threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _db_command(args: argparse.Namespace) -> int:
    from dynask.control_plane.state.database import current_revision, default_database_url, upgrade

    url = args.database_url or default_database_url()
    if args.action == "upgrade":
        upgrade(url)
    print(f"{url}: schema revision {current_revision(url)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
