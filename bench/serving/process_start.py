"""How long a ``dynask`` process takes to start, this tree against a baseline tree.

Every end-to-end test starts ``dynask`` processes (and Dask workers, which re-import the
CLI's module), so their start time is much of the suite's time. Measured, alternating
baseline and new in the same run (ratios are the numbers to compare on a shared host):

- ``import``: ``python -c "import dynask.control_plane.cli.main"`` (what ``dynask keys``,
  ``dynask db`` and every spawned worker pay before doing anything);
- ``run out=echo``: ``dynask run MODEL out=echo --workers 1`` until ``/v1/engines`` lists
  the engine (server, cluster, one worker, the tokenizer on both sides);
- ``run out=torch``: the same with the built-in engine (the worker must load torch);

and whether each process ended up with torch mapped. The baseline is another checkout
of the repository (``git archive main | tar x -C DIR``): it runs with the same virtual
environment, its packages put first on ``PYTHONPATH`` through a ``dynask`` namespace of
symlinks.

    .venv/bin/python -m bench.serving.process_start --baseline /tmp/base --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common.processes import free_port, group_pids, spawned
from bench.common.report import code_version, machine_facts, write_json
from bench.common.trees import dynask_namespace

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def namespace_env(tree: Path, scratch: Path) -> dict[str, str]:
    """The environment that makes ``dynask.*`` resolve to ``tree``'s folders."""
    if tree.resolve() == REPO:
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": str(dynask_namespace(tree, scratch))}


def import_seconds(env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", "import dynask.control_plane.cli.main"], env=env, check=True
    )
    return time.monotonic() - started


def _maps_torch(pid: int) -> bool:
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


def run_seconds(
    env: dict[str, str], model: str, engine: str, scratch: Path
) -> tuple[float, list[bool]]:
    """Seconds from ``dynask run`` to its engine listed; torch mapped, per process."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(dir=scratch))
    argv = [str(BIN / "dynask"), "run", model, f"out={engine}", "--workers", "1"]
    argv += ["--port", str(port), "--database-url", f"sqlite:///{folder / 'state.db'}"]
    started = time.monotonic()
    with spawned(f"run-{engine}", argv, folder, env) as process:
        deadline = started + 600
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"dynask run exited:\n{process.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/engines", timeout=2).json():
                    break
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        else:
            raise TimeoutError(f"no engine after 600 s:\n{process.log_tail()}")
        seconds = time.monotonic() - started
        return seconds, [_maps_torch(pid) for pid in group_pids(process.pid)]


def measure(trees: dict[str, Path], model: str, repeats: int) -> dict[str, Any]:
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    torch_maps: dict[str, dict[str, list[bool]]] = {name: {} for name in trees}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        envs = {name: namespace_env(tree, scratch) for name, tree in trees.items()}
        for _ in range(repeats):
            for name in trees:  # alternating: both see the same load over the run
                env = envs[name]
                samples[name].setdefault("import", []).append(import_seconds(env))
                for engine in ("echo", "torch"):
                    seconds, maps = run_seconds(env, model, engine, scratch)
                    samples[name].setdefault(f"run out={engine}", []).append(seconds)
                    torch_maps[name][f"run out={engine}"] = maps
    return {"samples": samples, "torch_mapped": torch_maps}


def medians(samples: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    """One row per kind of start: the median seconds of each tree and their ratio."""
    rows = []
    for what in samples["new"]:
        base, new = (statistics.median(samples[n][what]) for n in ("baseline", "new"))
        rows.append({"start": what, "baseline_s": base, "new_s": new, "new_over_base": new / base})
    return rows


def table(result: dict[str, Any]) -> str:
    lines = [f"{'what':<16} {'baseline s':>11} {'new s':>8} {'new/base':>9}  torch (base | new)"]
    for row in medians(result["samples"]):
        what = row["start"]
        maps = {n: result["torch_mapped"][n].get(what) for n in ("baseline", "new")}
        shown = " | ".join(_marks(m) for m in maps.values())
        lines.append(
            f"{what:<16} {row['baseline_s']:>11.2f} {row['new_s']:>8.2f} "
            f"{row['new_over_base']:>9.2f}  {shown}"
        )
    return "\n".join(lines)


def _marks(mapped: list[bool] | None) -> str:
    return "-" if mapped is None else "".join("T" if t else "." for t in mapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="default: the bundled SmolLM2 folder")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/process-start.json")
    args = parser.parse_args()
    from dynask.actors.models.model_source import resolve_model

    model = args.model or str(resolve_model(None).folder)
    load_start = os.getloadavg()
    result = measure({"baseline": args.baseline, "new": REPO}, model, args.repeats)
    print(table(result))
    print("torch: one mark per process of the run (server, Dask helpers, worker); T = mapped")
    document = {
        "benchmark": "process_start",
        "code": code_version(REPO),
        "baseline": str(args.baseline),
        "machine": machine_facts(load_start),
        "repeats": args.repeats,
        "rows": medians(result["samples"]),
        **result,
    }
    write_json(args.out, document, picture=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
