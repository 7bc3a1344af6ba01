"""Whether a model argument can be loaded on this host, without loading it: a hub id, or
a path to an HF folder or a ``.gguf`` file (``model_source`` resolves them at load).

Design decisions:

- A path is read where the engine will read it, on a worker. The admin UI asks this
  host first (an embedded cluster's workers share its disk, and the answer is
  immediate); a path missing here is asked of every worker of the cluster
  (``Client.run``), and one worker that has it is enough: on a cluster the models live
  on the GPU hosts, not on the control plane's. Pinning a deployment to the workers
  that hold its model is placement's concern, not this check's.
- ``model_problem`` is a plain function of this small module, so a worker imports it
  without the control plane; the control plane asks it of the workers.
"""

from __future__ import annotations

import re
from pathlib import Path

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def names_a_path(model: str) -> bool:
    """Whether ``model``, which exists on no path here, names a path rather than a hub id
    (``owner/name`` of letters, digits, ``.``, ``_`` and ``-``). ``model_source`` reads
    an argument the same way."""
    return (
        model.startswith((".", "/", "~")) or model.endswith(".gguf") or not _HUB_ID.fullmatch(model)
    )


def folder_problem(folder: Path) -> str | None:
    """What keeps an existing folder from being an HF model folder the engines read
    (config.json and *.safetensors weights), or None."""
    if not (folder / "config.json").is_file():
        return "has no config.json; it is not an HF model folder"
    if not any(folder.glob("*.safetensors")):
        return "has no *.safetensors weights (other formats are not read)"
    return None


def model_problem(model: str) -> str | None:
    """Why ``model`` cannot be loaded on this host, or None when it can (a hub id is
    taken as loadable: the engine reports a hub failure when it loads; the empty string
    is the bundled model)."""
    if not model:
        return None
    path = Path(model).expanduser()
    if path.is_dir():
        problem = folder_problem(path)
        return None if problem is None else f"the folder '{model}' {problem}"
    if path.is_file():
        if path.suffix != ".gguf":
            return f"the file '{model}' is not a .gguf file; pass a .gguf file or a folder"
        return None
    if names_a_path(model):
        return (
            f"'{model}' is neither an existing folder or .gguf file nor a hub id such as "
            "'HuggingFaceTB/SmolLM2-135M-Instruct'"
        )
    return None
