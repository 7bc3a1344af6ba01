"""``dynask keys create NAME | list | revoke PREFIX_OR_ID | limits PREFIX_OR_ID``: the API
keys of ``/v1`` and their tenant limits (``--requests-per-s``, ``--max-concurrent``,
``--tokens-per-minute``, ``--priority``; on ``create`` and ``limits``).

``create`` prints the key alone on stdout (``KEY=$(dynask keys create ci)`` works) and a
note on stderr; the key is shown this once and only its hash is stored.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from dynask.control_plane.state.api_keys import PRIORITIES, ApiKey, ApiKeys, TenantLimits
from dynask.control_plane.state.database import default_database_url, make_engine, upgrade

WHO = "cli"


def add_keys_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = commands.add_parser("keys", help="API keys of the OpenAI API (/v1)")
    actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="make a key; it is printed once")
    create.add_argument("name", help="who or what uses the key, e.g. ci or team-search")
    actions.add_parser("list", help="the keys: id, prefix, name, created, last used, state")
    revoke = actions.add_parser("revoke", help="refuse a key from now on")
    revoke.add_argument("key", metavar="PREFIX_OR_ID", help="its id or prefix (see list)")
    limits = actions.add_parser("limits", help="set a key's tenant limits (omitted: none)")
    limits.add_argument("key", metavar="PREFIX_OR_ID", help="its id or prefix (see list)")
    for action in (create, limits):
        add_limit_flags(action)
    for action in (create, actions.choices["list"], revoke, limits):
        action.add_argument(
            "--database-url", default=None, help="default: $DYNASK_DATABASE_URL or SQLite"
        )


def add_limit_flags(parser: argparse.ArgumentParser) -> None:
    """The tenant-limit flags (``TenantLimits``'s fields)."""
    parser.add_argument("--requests-per-s", type=float, default=None, help="request rate limit")
    parser.add_argument("--max-concurrent", type=int, default=None, help="requests at once")
    parser.add_argument(
        "--tokens-per-minute",
        type=int,
        default=None,
        help="prompt + max_tokens admitted per minute",
    )
    parser.add_argument(
        "--priority",
        choices=PRIORITIES,
        default="normal",
        help="priority class when the server is busy (default normal)",
    )


def limits_from_args(args: argparse.Namespace) -> TenantLimits:
    return TenantLimits(
        args.requests_per_s, args.max_concurrent, args.tokens_per_minute, args.priority
    )


def keys_command(args: argparse.Namespace) -> int:
    engine = make_engine(args.database_url or default_database_url())
    try:
        upgrade(engine)
        keys = ApiKeys(engine)
        if args.keys_action == "create":
            made = keys.create(args.name, WHO, limits_from_args(args))
            print(made.key)
            print(
                f"dynask: created API key {made.record.prefix}… ({made.record.name!r}; "
                f"{made.record.limits.describe()}); it is shown this once. Send it as "
                "'Authorization: Bearer KEY'.",
                file=sys.stderr,
            )
        elif args.keys_action == "limits":
            changed = keys.set_limits(args.key, limits_from_args(args), WHO)
            print(f"API key {changed.prefix}… ({changed.name!r}): {changed.limits.describe()}")
        elif args.keys_action == "list":
            print(format_keys(keys.list()))
        else:
            revoked = keys.revoke(args.key, WHO)
            print(f"revoked API key {revoked.prefix}… ({revoked.name!r})")
        return 0
    finally:
        engine.dispose()


def format_keys(keys: list[ApiKey]) -> str:
    """A plain table, one key a line, the newest first."""
    if not keys:
        return "no API keys; create one with `dynask keys create NAME`"
    rows = [("ID", "PREFIX", "NAME", "CREATED", "LAST USED", "STATE", "LIMITS")]
    for key in keys:
        rows.append(
            (
                str(key.id),
                key.prefix,
                key.name,
                _when(key.created_at),
                _when(key.last_used_at),
                "active" if key.active else f"revoked {_when(key.revoked_at)}",
                key.limits.describe(),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")
