"""Where the benchmarks find the repository and the workspace's shared folder."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shared_path(*parts: str) -> Path:
    """``../shared/PARTS`` of the checkout: the nearest ``shared`` folder beside the
    repository or above it (a git worktree may sit one level deeper than the checkout)."""
    for folder in REPO.parents:
        candidate = folder / "shared"
        if candidate.is_dir():
            return candidate.joinpath(*parts)
    return REPO.parent.joinpath("shared", *parts)
