"""The actor boundary is typed: no string-keyed reads of actor info or stats past it.

An engine actor's info and stats cross into the control plane once, decoded
(``ActorInfo.from_dict``, ``EngineStats.from_dict`` in ``ActorHandle``); everything after
reads attributes, so a renamed required field fails loudly instead of silently showing 0
(an unknown one is logged by name, ``actors/api/wire_fields``). This
scans ``control_plane/`` and ``web/`` for the string-keyed forms: ``x.stats[...]``,
``x.stats.get(...)``, ``x.info[...]``, ``x.info.get(...)`` and ``stats[...]`` /
``stats.get(...)`` on a plain name.

The sources are parsed in a separate interpreter, as in ``test_import_rules`` (CPython
gh-106905: the AST converter's recursion counter is shared by threads).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("control_plane", "web")

_FIND_KEYED_READS = """
import ast, json, sys
FIELDS = ("stats", "info")
found = []

def keyed(node):
    '''The name of the actor field ``node`` reads by key, or None.'''
    if isinstance(node, ast.Attribute) and node.attr in FIELDS:
        return "." + node.attr
    if isinstance(node, ast.Name) and node.id == "stats":
        return "stats"
    return None

for path in sys.argv[1:]:
    source = open(path).read()
    for node in ast.walk(ast.parse(source, path)):
        what = None
        if isinstance(node, ast.Subscript):
            what = keyed(node.value)
            form = "[...]"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
        ):
            what = keyed(node.func.value)
            form = ".get(...)"
        if what is not None:
            found.append((path, node.lineno, f"{path}:{node.lineno}: {what}{form}"))
print(json.dumps([line for _, _, line in sorted(found)]))
"""


def _keyed_reads(paths: list[Path]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", _FIND_KEYED_READS, *map(str, paths)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: list[str] = json.loads(out)
    return [line.removeprefix(str(ROOT) + "/") for line in found]


def test_no_string_keyed_reads_of_actor_info_or_stats() -> None:
    paths = sorted(p for package in SCANNED for p in (ROOT / package).rglob("*.py"))
    assert paths
    assert _keyed_reads(paths) == []


def test_the_scan_finds_each_keyed_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "a = handle.stats['kv_usage']\n"
        "b = handle.stats.get('num_running', 0)\n"
        "c = handle.info['worker']\n"
        "d = handle.info.get('engine')\n"
        "e = stats.get('num_steps')\n"
        "f = handle.stats.kv_usage + handle.info.max_model_len\n"  # typed: fine
        "log.info('x'); g = scheduler_info['workers']\n"  # not actor fields
    )
    assert [line.rsplit(":", 2)[-2:] for line in _keyed_reads([sample])] == [
        ["1", " .stats[...]"],
        ["2", " .stats.get(...)"],
        ["3", " .info[...]"],
        ["4", " .info.get(...)"],
        ["5", " stats.get(...)"],
    ]
