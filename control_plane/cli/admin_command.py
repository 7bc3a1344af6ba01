"""``dynask admin set-password [USERNAME]``: the admin UI's password, without a start.

The password is read from the terminal (not echoed) or, when stdin is not one, from its
first line (``echo "$PW" | dynask admin set-password``); never from an argument, which
would show in the process list and the shell history.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from dynask.control_plane.state.admin_users import ADMIN_USERNAME, AdminUsers
from dynask.control_plane.state.database import default_database_url, make_engine, upgrade


def add_admin_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    admin = commands.add_parser("admin", help="accounts of the admin UI")
    actions = admin.add_subparsers(dest="admin_action", required=True, metavar="ACTION")
    set_password = actions.add_parser("set-password", help="set an account's password")
    set_password.add_argument("username", nargs="?", default=ADMIN_USERNAME)
    set_password.add_argument(
        "--database-url", default=None, help="default: $DYNASK_DATABASE_URL or SQLite"
    )


def admin_command(args: argparse.Namespace) -> int:
    password = _read_password()
    engine = make_engine(args.database_url or default_database_url())
    try:
        upgrade(engine)
        user = AdminUsers(engine).set_password(args.username, password)
    finally:
        engine.dispose()
    print(f"dynask: the admin UI account '{user.username}' has a new password")
    return 0


def _read_password() -> str:
    if sys.stdin.isatty():
        password = getpass.getpass("new password: ")
        if getpass.getpass("again: ") != password:
            raise ValueError("the two passwords differ; nothing was changed")
        return password
    return sys.stdin.readline().rstrip("\n")
